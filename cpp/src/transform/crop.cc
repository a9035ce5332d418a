#include "stoker/transform/crop.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "stoker/core/error.h"

namespace stoker::transform {

namespace {

// Python's round(x): round half to even, which std::nearbyint gives in the default rounding mode
// (std::round would send 2.5 to 3 where Python gives 2). The result stays a double: it can be far
// outside int's range (a crop drawn with an aspect ratio of 1e20, the resized long side of a
// 1-pixel-wide image), where converting to int is undefined behaviour. Callers convert only values
// they have bounded.
double round_half_even(double x) { return std::nearbyint(x); }

}  // namespace

Box random_resized_crop(int width, int height, KeyedRandom& rng,
                        const RandomResizedCropOptions& options) {
  STOKER_CHECK(width > 0 && height > 0, ErrorCode::kInvalidArgument,
               "random_resized_crop: image size must be positive, got " + std::to_string(width) +
                   "x" + std::to_string(height));
  STOKER_CHECK(options.scale_min > 0 && options.scale_min <= options.scale_max,
               ErrorCode::kInvalidArgument, "random_resized_crop: need 0 < scale_min <= scale_max");
  STOKER_CHECK(options.ratio_min > 0 && options.ratio_min <= options.ratio_max,
               ErrorCode::kInvalidArgument, "random_resized_crop: need 0 < ratio_min <= ratio_max");
  STOKER_CHECK(options.tries >= 0, ErrorCode::kInvalidArgument,
               "random_resized_crop: tries must not be negative");

  const double area = static_cast<double>(width) * static_cast<double>(height);
  const double log_ratio_min = std::log(options.ratio_min);
  const double log_ratio_max = std::log(options.ratio_max);
  for (int attempt = 0; attempt < options.tries; ++attempt) {
    // The draw order is part of the contract: a sample's crop is a pure function of its key.
    const double target_area = area * rng.uniform(options.scale_min, options.scale_max);
    const double aspect_ratio = std::exp(rng.uniform(log_ratio_min, log_ratio_max));
    const double w_draw = round_half_even(std::sqrt(target_area * aspect_ratio));
    const double h_draw = round_half_even(std::sqrt(target_area / aspect_ratio));
    if (0 < w_draw && w_draw <= width && 0 < h_draw && h_draw <= height) {
      const auto w = static_cast<int>(w_draw), h = static_cast<int>(h_draw);  // within the image
      const auto top = static_cast<int>(rng.below(static_cast<uint64_t>(height - h + 1)));
      const auto left = static_cast<int>(rng.below(static_cast<uint64_t>(width - w + 1)));
      return Box{static_cast<double>(left), static_cast<double>(top), static_cast<double>(left + w),
                 static_cast<double>(top + h)};
    }
  }

  // Fallback: the largest centred crop whose aspect ratio is within the allowed range.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int w = width;
  int h = height;
  // Both stay within the image: w / ratio_min < height here, and h * ratio_max < width.
  if (in_ratio < options.ratio_min) {
    h = static_cast<int>(round_half_even(w / options.ratio_min));
  } else if (in_ratio > options.ratio_max) {
    w = static_cast<int>(round_half_even(h * options.ratio_max));
  }
  // torchvision can produce an empty crop here (a 1-pixel-wide image with ratio_min > 2) and then
  // fails later; a 1-pixel edge keeps the box usable and changes nothing in any other case.
  if (w < 1) w = 1;
  if (h < 1) h = 1;
  const int top = (height - h) / 2;
  const int left = (width - w) / 2;
  return Box{static_cast<double>(left), static_cast<double>(top), static_cast<double>(left + w),
             static_cast<double>(top + h)};
}

Box resize_center_crop(int width, int height, int resize_size, int crop_size) {
  return resize_center_crop(width, height, resize_size, crop_size, crop_size);
}

Box resize_center_crop(int width, int height, int resize_size, int crop_width, int crop_height) {
  STOKER_CHECK(width > 0 && height > 0, ErrorCode::kInvalidArgument,
               "resize_center_crop: image size must be positive, got " + std::to_string(width) +
                   "x" + std::to_string(height));
  STOKER_CHECK(resize_size > 0 && crop_width > 0 && crop_height > 0, ErrorCode::kInvalidArgument,
               "resize_center_crop: resize_size and the crop size must be positive");
  // torchvision's _compute_resized_output_size: int(size * long / short) truncates, computed as
  // Python does (an exact integer product, then one true division).
  const bool portrait = width <= height;
  const int64_t short_side = portrait ? width : height;
  const int64_t long_side = portrait ? height : width;
  const auto new_long = static_cast<int64_t>(static_cast<double>(resize_size * long_side) /
                                             static_cast<double>(short_side));
  const double new_width = static_cast<double>(portrait ? resize_size : new_long);
  const double new_height = static_cast<double>(portrait ? new_long : resize_size);
  // torchvision pads with black when the crop is larger than the resized image. A box of source
  // pixels cannot express padding, so that configuration is refused.
  STOKER_CHECK(crop_width <= new_width && crop_height <= new_height, ErrorCode::kInvalidArgument,
               "resize_center_crop: a " + std::to_string(crop_width) + "x" +
                   std::to_string(crop_height) + " crop of the image resized to " +
                   std::to_string(static_cast<int64_t>(new_width)) + "x" +
                   std::to_string(static_cast<int64_t>(new_height)) + " (shorter side " +
                   std::to_string(resize_size) +
                   ") would need padding, which is not supported: raise resize_size");

  // torchvision's center_crop: int(round((size - crop) / 2.0)), rounding half to even.
  const double crop_top = round_half_even((new_height - crop_height) / 2.0);
  const double crop_left = round_half_even((new_width - crop_width) / 2.0);

  // The resize maps resized pixel edge u to source edge u * (W / newW); the crop's edges map the
  // same way, so resampling this box straight to crop_size uses the resize's own scale.
  const double scale_x = static_cast<double>(width) / new_width;
  const double scale_y = static_cast<double>(height) / new_height;
  return Box{crop_left * scale_x, crop_top * scale_y, (crop_left + crop_width) * scale_x,
             (crop_top + crop_height) * scale_y};
}

}  // namespace stoker::transform
