// Where a sample's image goes in the output: drawn once per sample by an Image field and applied
// exactly to every field that follows it (masks, boxes, other images).
//
// The model: the part `box` of the source image (in source pixels, edges not centres, possibly
// fractional) is resampled onto the output rectangle `rect` (whole output pixels); output pixels
// outside `rect` are fill; then the whole output is mirrored by the flips. Every geometry stoker
// offers is one such mapping:
//   RandomResizedCrop    box = a random crop, rect = the whole output
//   ResizeCenterCrop     box = the centre crop of the resized image, mapped back to the source
//   Resize               box = the whole image, rect = the whole output (aspect not kept)
//   Letterbox            box = the whole image, rect = the largest centred rectangle of its
//                        aspect ratio; the rest is fill (detectors' "letterbox")
//   RandomCrop(padding)  the source padded by `padding` on every side, a random window of the
//                        output size: box = the window's part inside the image, rect = where
//                        that part lands (scale 1)
//   CoverCrop            the image resized to cover the output (aspect kept), then the output's
//                        window of it: box = that window mapped back, at a random place along
//                        the side with slack (training) or centred; what aspect buckets use
#pragma once

#include <cstdint>

#include "stoker/core/random.h"
#include "stoker/transform/crop.h"
#include "stoker/transform/resize.h"

namespace stoker::fields {

enum class GeometryKind : uint8_t {
  kRandomResizedCrop,
  kResizeCenterCrop,
  kResize,
  kLetterbox,
  kRandomCrop,
  kCoverCrop,
};

struct GeometryOptions {
  GeometryKind kind = GeometryKind::kRandomResizedCrop;
  transform::RandomResizedCropOptions crop;  // kRandomResizedCrop: scale and ratio
  int resize_size = 0;  // kResizeCenterCrop: the shorter side; 0: round(min(h, w) * 256 / 224)
  int padding = 0;      // kRandomCrop: on every side
  bool random_position = true;  // kCoverCrop: the window drawn along the slack, else centred
  double hflip = 0.0;           // probability of mirroring left-right
  double vflip = 0.0;           // probability of mirroring top-bottom
};

struct Geometry {
  int source_width = 0, source_height = 0;
  transform::Box box;         // the part of the source shown
  transform::PixelRect rect;  // where it lands in the output, before flips; may be empty
  int out_width = 0, out_height = 0;
  bool hflip = false, vflip = false;
  // The resampler sees only the box's pixels (torchvision crops, then resizes), rather than the
  // image around it too (Resize, then CenterCrop).
  bool crop_first = true;

  double scale_x() const { return rect.width() / box.width(); }
  double scale_y() const { return rect.height() / box.height(); }
  // `rect` after the flips: where the box's pixels are in the final output.
  transform::PixelRect flipped_rect() const;
};

// Draws the geometry of one sample from `rng` (KeyedRandom(seed, epoch, sample)). Draw order, kept
// for reproducibility: the crop (RandomResizedCrop's tries, or RandomCrop's top then left), then
// hflip, then vflip (each one uniform draw, taken even at probability 0).
Geometry draw_geometry(const GeometryOptions& options, int source_width, int source_height,
                       int out_width, int out_height, KeyedRandom& rng);

// Maps a point of the source image to the final output (before clipping), flips included.
inline void map_point(const Geometry& g, double x, double y, double& out_x, double& out_y) {
  out_x = g.rect.x0 + (x - g.box.x0) * g.scale_x();
  out_y = g.rect.y0 + (y - g.box.y0) * g.scale_y();
  if (g.hflip) out_x = g.out_width - out_x;
  if (g.vflip) out_y = g.out_height - out_y;
}

}  // namespace stoker::fields
