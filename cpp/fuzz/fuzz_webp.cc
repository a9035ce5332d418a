// Fuzz target, differential: WebP through ImageDecoder (libwebp), a whole-image decode against a
// region decode (libwebp's cropping, widened where its chroma upsampling needs it). The region
// is claimed exact (image_decoder.h), so this target checks pixels, not just the absence of
// crashes:
//   - a full decode has the header's size, origin 0, and every byte of it is read;
//   - a region covers the rectangle asked for and lies inside the image;
//   - when the whole image decoded, the region decodes too, and each of its pixels equals the
//     whole-image decode's; the same region decoded again, on the same decoder, is the same.
//
// Input: kParamBytes of options, then a WebP file:
//   [0..3] the rectangle, as fractions /256 of the image: x0, y0, then width, height of what is
//   left
#include <algorithm>
#include <vector>

#include "fuzz_util.h"
#include "stoker/core/error.h"
#include "stoker/decode/image_decoder.h"

using namespace stoker;

namespace {

constexpr size_t kParamBytes = 4;
constexpr int64_t kMaxPixels = int64_t{1} << 22;  // 4 MP: a lossless one takes ~20 MB in libwebp

decode::DecodeOptions options() {
  decode::DecodeOptions o;
  o.max_pixels = kMaxPixels;
  o.max_decode_memory = int64_t{128} << 20;
  return o;
}

// The region's pixels, row after row, every byte read.
std::vector<uint8_t> copy_region(const decode::DecodedRegion& r) {
  FUZZ_CHECK(r.width > 0 && r.height > 0 && r.stride >= ptrdiff_t{r.width} * 3);
  std::vector<uint8_t> out(static_cast<size_t>(r.width) * r.height * 3);
  for (int y = 0; y < r.height; ++y)
    std::copy(r.pixels + y * r.stride, r.pixels + y * r.stride + r.width * 3,
              out.begin() + static_cast<ptrdiff_t>(y) * r.width * 3);
  fuzz::touch(out.data(), out.size());
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kParamBytes) return 0;
  const uint8_t* p = data;
  data += kParamBytes;
  size -= kParamBytes;
  if (sniff_image_format(data, size) != ImageFormat::kWebp) return 0;  // fuzz_decode's business

  decode::ImageDecoder decoder(options());
  decode::ImageInfo info;
  try {
    info = decoder.open(data, size);
  } catch (const Error&) {
    return 0;
  }
  FUZZ_CHECK(info.format == ImageFormat::kWebp && info.components == 3);
  FUZZ_CHECK(info.width > 0 && info.height > 0);
  FUZZ_CHECK(int64_t{info.width} * info.height <= kMaxPixels);
  FUZZ_CHECK(decoder.max_scale_denom() == 1);

  std::vector<uint8_t> whole;  // empty when the whole image does not decode
  try {
    const decode::DecodedRegion& r = decoder.decode_full();
    FUZZ_CHECK(r.width == info.width && r.height == info.height);
    FUZZ_CHECK(r.origin_x == 0 && r.origin_y == 0 && r.scale_denom == 1);
    FUZZ_CHECK(r.scaled_width == info.width && r.scaled_height == info.height);
    whole = copy_region(r);
  } catch (const Error&) {
  }

  const int w = info.width, h = info.height;
  const int x0 = p[0] * w / 256, y0 = p[1] * h / 256;
  const int x1 = x0 + 1 + p[2] * (w - x0 - 1) / 255;
  const int y1 = y0 + 1 + p[3] * (h - y0 - 1) / 255;
  std::vector<uint8_t> first;
  for (int round = 0; round < 2; ++round) {
    decode::DecodedRegion r;
    try {
      decoder.open(data, size);  // it opened before: no error now
      r = decoder.decode(1, x0, y0, x1, y1);
    } catch (const Error& e) {
      if (!whole.empty()) {
        std::fprintf(stderr, "region (%d,%d)-(%d,%d) of a %dx%d WebP that decodes whole: %s\n", x0,
                     y0, x1, y1, w, h, e.what());
        FUZZ_CHECK(whole.empty());
      }
      FUZZ_CHECK(first.empty());  // the first round failed too
      return 0;
    }
    FUZZ_CHECK(r.origin_x <= x0 && r.origin_y <= y0);
    FUZZ_CHECK(r.origin_x + r.width >= x1 && r.origin_y + r.height >= y1);
    FUZZ_CHECK(r.origin_x >= 0 && r.origin_y >= 0);
    FUZZ_CHECK(r.origin_x + r.width <= w && r.origin_y + r.height <= h);
    FUZZ_CHECK(r.scaled_width == w && r.scaled_height == h && r.scale_denom == 1);
    const std::vector<uint8_t> region = copy_region(r);
    if (round == 0) first = region;
    FUZZ_CHECK(region == first);
    if (whole.empty()) continue;
    for (int y = 0; y < r.height; ++y) {
      const auto row = region.begin() + static_cast<ptrdiff_t>(y) * r.width * 3;
      const auto want =
          whole.begin() + (static_cast<ptrdiff_t>(r.origin_y + y) * w + r.origin_x) * 3;
      if (!std::equal(row, row + r.width * 3, want)) {
        std::fprintf(stderr,
                     "region (%d,%d)-(%d,%d), decoded as (%d,%d) %dx%d: row %d differs from the "
                     "whole-image decode\n",
                     x0, y0, x1, y1, r.origin_x, r.origin_y, r.width, r.height, r.origin_y + y);
        FUZZ_CHECK(std::equal(row, row + r.width * 3, want));
      }
    }
  }
  return 0;
}
