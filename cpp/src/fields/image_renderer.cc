#include "stoker/fields/image_renderer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "stoker/core/clock.h"
#include "stoker/core/error.h"

namespace stoker::fields {

namespace {

// libjpeg's fancy upsampling treats a cropped region's border as an image border, so pixels within
// two of a crop edge may differ from a full decode; decoding this much extra keeps them unused.
constexpr int kCropMargin = 2;

// Pillow's RGB -> L: ITU-R 601-2 luma in 16-bit fixed point (Convert.c, L24).
inline uint8_t luma(const uint8_t* p) {
  return static_cast<uint8_t>((p[0] * 19595 + p[1] * 38470 + p[2] * 7471 + 0x8000) >> 16);
}

}  // namespace

transform::RegionView region_view(const decode::DecodedRegion& region) {
  return {region.pixels,   region.width,    region.height,       region.stride,
          region.origin_x, region.origin_y, region.scaled_width, region.scaled_height};
}

int choose_scale_denom(const transform::Box& box, int out_width, int out_height, int max_denom) {
  int denom = 1;
  while (denom * 2 <= max_denom && box.width() / (denom * 2) >= out_width &&
         box.height() / (denom * 2) >= out_height)
    denom *= 2;
  return denom;
}

void fill_outside(uint8_t* out, int width, int height, int channels,
                  const transform::PixelRect& rect, uint8_t fill) {
  const size_t row = static_cast<size_t>(width) * channels;
  if (rect.width() <= 0 || rect.height() <= 0) {
    std::memset(out, fill, row * height);
    return;
  }
  std::memset(out, fill, row * rect.y0);
  std::memset(out + row * rect.y1, fill, row * (height - rect.y1));
  for (int y = rect.y0; y < rect.y1; ++y) {
    uint8_t* r = out + row * y;
    std::memset(r, fill, static_cast<size_t>(rect.x0) * channels);
    std::memset(r + static_cast<size_t>(rect.x1) * channels, fill,
                static_cast<size_t>(width - rect.x1) * channels);
  }
}

void flip_rows(uint8_t* out, int height, size_t row_bytes) {
  for (int top = 0, bottom = height - 1; top < bottom; ++top, --bottom) {
    uint8_t* a = out + row_bytes * top;
    std::swap_ranges(a, a + row_bytes, out + row_bytes * bottom);
  }
}

void ImageRenderer::render(const Geometry& g, int channels, uint8_t fill, bool allow_dct_scaling,
                           uint8_t* out, int64_t& decode_ns, int64_t& transform_ns) {
  STOKER_CHECK(channels == 1 || channels == 3, ErrorCode::kInvalidArgument,
               "channels must be 1 or 3");
  const int64_t t0 = monotonic_ns();
  const int W = g.out_width, H = g.out_height;
  const transform::PixelRect rect = g.flipped_rect();
  if (rect.width() <= 0 || rect.height() <= 0) {  // the output shows no part of the image
    fill_outside(out, W, H, channels, rect, fill);
    decode_ns += monotonic_ns() - t0;
    return;
  }
  const int rw = rect.width(), rh = rect.height();
  const transform::Box& box = g.box;
  const int denom =
      allow_dct_scaling ? choose_scale_denom(box, rw, rh, decoder_.max_scale_denom()) : 1;
  last_scale_denom_ = denom;
  const transform::Box scaled{box.x0 / denom, box.y0 / denom, box.x1 / denom, box.y1 / denom};
  const int scaled_w = decode::scaled_size(g.source_width, denom);
  const int scaled_h = decode::scaled_size(g.source_height, denom);
  transform::RegionView view;
  transform::Box resample_box = scaled;
  if (g.crop_first) {
    // torchvision crops, then resizes: the filter sees only the crop's pixels, so the crop
    // (rounded out to whole pixels of the scaled image) is the image the resampler works on.
    const transform::PixelRect crop{std::max(0, static_cast<int>(std::floor(scaled.x0))),
                                    std::max(0, static_cast<int>(std::floor(scaled.y0))),
                                    std::min(scaled_w, static_cast<int>(std::ceil(scaled.x1))),
                                    std::min(scaled_h, static_cast<int>(std::ceil(scaled.y1)))};
    const decode::DecodedRegion& region =
        decoder_.decode(denom, crop.x0 - kCropMargin, crop.y0 - kCropMargin, crop.x1 + kCropMargin,
                        crop.y1 + kCropMargin);
    view.pixels = region.pixels +
                  static_cast<ptrdiff_t>(crop.y0 - region.origin_y) * region.stride +
                  static_cast<ptrdiff_t>(crop.x0 - region.origin_x) * 3;
    view.width = view.image_width = crop.width();
    view.height = view.image_height = crop.height();
    view.stride = region.stride;
    resample_box = {scaled.x0 - crop.x0, scaled.y0 - crop.y0, scaled.x1 - crop.x0,
                    scaled.y1 - crop.y0};
  } else {
    // Resize-then-crop reads pixels around the crop too: decode the filter's whole support.
    const transform::PixelRect need =
        transform::resample_support(scaled, rw, rh, scaled_w, scaled_h);
    const decode::DecodedRegion& region =
        decoder_.decode(denom, need.x0 - kCropMargin, need.y0 - kCropMargin, need.x1 + kCropMargin,
                        need.y1 + kCropMargin);
    view = region_view(region);
  }
  const int64_t t1 = monotonic_ns();
  if (channels == 3) {
    uint8_t* dst = out + (static_cast<size_t>(rect.y0) * W + rect.x0) * 3;
    resampler_.resize(view, resample_box, dst, rw, rh, static_cast<ptrdiff_t>(W) * 3, g.hflip);
  } else {
    rgb_.resize(static_cast<size_t>(rw) * rh * 3);
    resampler_.resize(view, resample_box, rgb_.data(), rw, rh, static_cast<ptrdiff_t>(rw) * 3,
                      g.hflip);
    for (int y = 0; y < rh; ++y) {
      const uint8_t* s = rgb_.data() + static_cast<size_t>(y) * rw * 3;
      uint8_t* d = out + static_cast<size_t>(rect.y0 + y) * W + rect.x0;
      for (int x = 0; x < rw; ++x) d[x] = luma(s + 3 * x);
    }
  }
  if (rw != W || rh != H) fill_outside(out, W, H, channels, rect, fill);
  // vflip: rect is already mirrored vertically, the rows inside it are not yet.
  if (g.vflip) flip_rows(out + static_cast<size_t>(rect.y0) * W * channels, rh,
                         static_cast<size_t>(W) * channels);
  const int64_t t2 = monotonic_ns();
  decode_ns += t1 - t0;
  transform_ns += t2 - t1;
}

}  // namespace stoker::fields
