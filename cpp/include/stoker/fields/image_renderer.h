// One image from bytes to output pixels under a Geometry: decode only what the box needs, at the
// smallest useful DCT scale (restart-interval cut, crop-only decode, partial progressive: see
// decode/image_decoder.h), then resample (PIL-exact) straight into the output. One per thread.
#pragma once

#include <cstdint>
#include <vector>

#include "stoker/decode/image_decoder.h"
#include "stoker/fields/geometry.h"
#include "stoker/transform/resize.h"

namespace stoker::fields {

// How an image is rendered under a geometry, worked out before any pixel is decoded: which
// region of the image scaled by 1/scale_denom to decode, and how the resampler maps it onto the
// output. The host renderer follows it, and decode="gpu" hands it to the device (Image's "plan"
// output), so that both decode the same pixels at the same scale and resample them with the
// same filter taps. Coordinates are pixels of the scaled image (scaled_size of the source).
struct RenderPlan {
  bool empty = true;  // the output shows no part of the image: all fill, nothing to decode
  int scale_denom = 1;
  // The region to decode (margins included, clipped to the scaled image).
  transform::PixelRect decode;
  // The image the resampler works on: the crop, in whole scaled pixels, when the geometry crops
  // first (torchvision crops, then resizes: the filter sees only the crop); otherwise the whole
  // scaled image, of which `decode` holds every filter tap.
  transform::PixelRect view;
  transform::Box box;  // the resampler's box, in the view's pixels
  // Where the resampled pixels land in the output, after the flips (Geometry::flipped_rect), and
  // whether they are mirrored: hflip in the resampler's table, vflip by reversing the rows.
  transform::PixelRect rect;
  bool hflip = false, vflip = false;
};

// The plan of `g`, decoding at the smallest DCT scale (up to max_denom) that keeps at least the
// output's pixels (choose_scale_denom).
RenderPlan plan_render(const Geometry& g, int max_denom);

class ImageRenderer {
 public:
  explicit ImageRenderer(decode::DecodeOptions options = {},
                         std::shared_ptr<decode::ScanIndexCache> scan_indexes = nullptr)
      : decoder_(options, std::move(scan_indexes)) {}

  // Reads the header of the image in [data, data + size), which must stay alive until render().
  // `key`: the sample's, for its ScanIndex (decode::ImageDecoder::open).
  const decode::ImageInfo& open(const uint8_t* data, size_t size, int64_t key = -1) {
    return decoder_.open(data, size, key);
  }
  // Pixels with no file around them (decode::ImageDecoder::open_raw).
  const decode::ImageInfo& open_raw(const uint8_t* pixels, size_t size, int width, int height,
                                    int channels) {
    return decoder_.open_raw(pixels, size, width, height, channels);
  }

  // Writes g.out_width x g.out_height pixels of `channels` (3: RGB, 1: PIL's "L") to `out`
  // (rows packed), the geometry's rect from the open image and `fill` elsewhere. `g` is in the
  // open image's pixels. Adds the decode and resample time to the counters. Returns the DCT
  // scale denominator decoded at (1, 2, 4 or 8), 0 when the output shows none of the image.
  int render(const Geometry& g, int channels, uint8_t fill, bool allow_dct_scaling, uint8_t* out,
             int64_t& decode_ns, int64_t& transform_ns);

  int last_scale_denom() const { return last_scale_denom_; }
  // The largest DCT scale denominator the open image decodes at (1 for PNG, WebP, raw pixels).
  int max_scale_denom() const { return decoder_.max_scale_denom(); }
  // Whether the open image starts decompressing (decode::ImageDecoder::starts).
  bool starts() { return decoder_.starts(); }

 private:
  decode::ImageDecoder decoder_;
  transform::Resampler resampler_;
  std::vector<uint8_t> rgb_;  // the RGB output, for grey images
  int last_scale_denom_ = 1;
};

// The decoder's output as the resampler's input: the same pixels, placed in the scaled image.
transform::RegionView region_view(const decode::DecodedRegion& region);

// The largest of 1, 2, 4, 8 (up to max_denom) at which `box` still has at least out_width x
// out_height pixels: decoding smaller would throw information away before the antialiasing
// filter.
int choose_scale_denom(const transform::Box& box, int out_width, int out_height, int max_denom);

// Fills the output outside `rect` (a rectangle of a width x height x channels image) with `fill`.
void fill_outside(uint8_t* out, int width, int height, int channels,
                  const transform::PixelRect& rect, uint8_t fill);
// Mirrors an image top to bottom, in place.
void flip_rows(uint8_t* out, int height, size_t row_bytes);

}  // namespace stoker::fields
