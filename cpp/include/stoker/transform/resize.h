// Antialiased bilinear resampling whose output matches PIL's Image.resize(size, BILINEAR, box=...):
// the same separable triangle filter widened by the downscale factor, the same coefficient
// normalisation and fixed-point rounding, horizontal pass first through an 8-bit intermediate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "stoker/transform/crop.h"

namespace stoker::transform {

// Integer pixel rectangle [x0, x1) x [y0, y1).
struct PixelRect {
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  int width() const { return x1 - x0; }
  int height() const { return y1 - y0; }
};

// RGB8 pixels of a region of a larger image: the region's top-left pixel is pixel
// (origin_x, origin_y) of an image of image_width x image_height.
struct RegionView {
  const uint8_t* pixels = nullptr;
  int width = 0, height = 0;
  ptrdiff_t stride = 0;  // bytes per row
  int origin_x = 0, origin_y = 0;
  int image_width = 0, image_height = 0;
};

// The source pixels that resampling `box` of an image_width x image_height image to
// out_width x out_height reads (the filter taps, clipped to the image). A region that covers this
// rectangle gives the same output as the whole image would.
PixelRect resample_support(const Box& box, int out_width, int out_height, int image_width,
                           int image_height);

// One per thread: keeps its coefficient tables and intermediate buffer between calls.
class Resampler {
 public:
  // Writes out_width x out_height RGB8 pixels to `dst` (rows `dst_stride` bytes apart), mirrored
  // left-right when `flip_horizontal`. `box` is in image coordinates; `src` must cover
  // resample_support(box, ...) or Error(kInternal) is thrown.
  void resize(const RegionView& src, const Box& box, uint8_t* dst, int out_width, int out_height,
              ptrdiff_t dst_stride, bool flip_horizontal);

 private:
  std::vector<int32_t> coeffs_x_, coeffs_y_;
  std::vector<int> bounds_x_, bounds_y_;
  // The horizontal table regrouped two output pixels at a time for the AVX2 kernel.
  std::vector<int32_t> pair_coeffs_x_;
  std::vector<int> pair_taps_x_;
  std::vector<uint8_t> temp_;
};

}  // namespace stoker::transform
