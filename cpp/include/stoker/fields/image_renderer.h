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

class ImageRenderer {
 public:
  explicit ImageRenderer(decode::DecodeOptions options = {}) : decoder_(options) {}

  // Reads the header of the image in [data, data + size), which must stay alive until render().
  const decode::ImageInfo& open(const uint8_t* data, size_t size) { return decoder_.open(data, size); }
  // Pixels with no file around them (decode::ImageDecoder::open_raw).
  const decode::ImageInfo& open_raw(const uint8_t* pixels, size_t size, int width, int height,
                                    int channels) {
    return decoder_.open_raw(pixels, size, width, height, channels);
  }

  // Writes g.out_width x g.out_height pixels of `channels` (3: RGB, 1: PIL's "L") to `out`
  // (rows packed), the geometry's rect from the open image and `fill` elsewhere. `g` is in the
  // open image's pixels. Adds the decode and resample time to the counters.
  void render(const Geometry& g, int channels, uint8_t fill, bool allow_dct_scaling, uint8_t* out,
              int64_t& decode_ns, int64_t& transform_ns);

  int last_scale_denom() const { return last_scale_denom_; }

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
