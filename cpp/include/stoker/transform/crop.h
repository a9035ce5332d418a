// Where to crop: torchvision's RandomResizedCrop parameter sampling and Resize + CenterCrop,
// expressed as boxes in source pixels so that the decoder can decode only what they need.
#pragma once

#include "stoker/core/random.h"

namespace stoker::transform {

// A box in source pixel coordinates, edges not centres (PIL's resize(box=...) convention):
// the output covers [x0, x1) x [y0, y1). Fractional boxes are allowed.
struct Box {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  double width() const { return x1 - x0; }
  double height() const { return y1 - y0; }
};

struct RandomResizedCropOptions {
  double scale_min = 0.08;
  double scale_max = 1.0;
  double ratio_min = 3.0 / 4.0;
  double ratio_max = 4.0 / 3.0;
  int tries = 10;
};

// torchvision.transforms.RandomResizedCrop.get_params, step for step: up to `tries` draws of
// (area fraction, log aspect ratio) and a position; then the centre-crop fallback. Python's
// round-half-to-even is kept. Returns an integer box inside the image.
Box random_resized_crop(int width, int height, KeyedRandom& rng,
                        const RandomResizedCropOptions& options = {});

// torchvision Resize(resize_size) (shorter side to resize_size, the longer one truncated as
// torchvision does) followed by CenterCrop(crop_size), as the box of the source that the crop
// shows.
Box resize_center_crop(int width, int height, int resize_size, int crop_size);
// The same with a crop_width x crop_height crop; refused (kInvalidArgument) where the crop is
// larger than the resized image.
Box resize_center_crop(int width, int height, int resize_size, int crop_width, int crop_height);

}  // namespace stoker::transform
