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

RenderPlan plan_render(const Geometry& g, int max_denom) {
  RenderPlan p;
  p.rect = g.flipped_rect();
  p.hflip = g.hflip;
  p.vflip = g.vflip;
  p.empty = p.rect.width() <= 0 || p.rect.height() <= 0;
  if (p.empty) return p;
  const int rw = p.rect.width(), rh = p.rect.height();
  const transform::Box& box = g.box;
  const int denom = choose_scale_denom(box, rw, rh, max_denom);
  p.scale_denom = denom;
  const transform::Box scaled{box.x0 / denom, box.y0 / denom, box.x1 / denom, box.y1 / denom};
  const int scaled_w = decode::scaled_size(g.source_width, denom);
  const int scaled_h = decode::scaled_size(g.source_height, denom);
  transform::PixelRect need;
  if (g.crop_first) {
    // The crop rounded out to whole pixels of the scaled image is the resampler's image.
    p.view = {std::max(0, static_cast<int>(std::floor(scaled.x0))),
              std::max(0, static_cast<int>(std::floor(scaled.y0))),
              std::min(scaled_w, static_cast<int>(std::ceil(scaled.x1))),
              std::min(scaled_h, static_cast<int>(std::ceil(scaled.y1)))};
    p.box = {scaled.x0 - p.view.x0, scaled.y0 - p.view.y0, scaled.x1 - p.view.x0,
             scaled.y1 - p.view.y0};
    need = p.view;
  } else {
    // Resize-then-crop reads pixels around the crop too: decode the filter's whole support.
    p.view = {0, 0, scaled_w, scaled_h};
    p.box = scaled;
    need = transform::resample_support(scaled, rw, rh, scaled_w, scaled_h);
  }
  p.decode = {std::max(0, need.x0 - kCropMargin), std::max(0, need.y0 - kCropMargin),
              std::min(scaled_w, need.x1 + kCropMargin), std::min(scaled_h, need.y1 + kCropMargin)};
  return p;
}

int ImageRenderer::render(const Geometry& g, int channels, uint8_t fill, bool allow_dct_scaling,
                          uint8_t* out, int64_t& decode_ns, int64_t& transform_ns) {
  STOKER_CHECK(channels == 1 || channels == 3, ErrorCode::kInvalidArgument,
               "channels must be 1 or 3");
  const int64_t t0 = monotonic_ns();
  const int W = g.out_width, H = g.out_height;
  const RenderPlan plan = plan_render(g, allow_dct_scaling ? decoder_.max_scale_denom() : 1);
  const transform::PixelRect& rect = plan.rect;
  if (plan.empty) {  // the output shows no part of the image
    fill_outside(out, W, H, channels, rect, fill);
    decode_ns += monotonic_ns() - t0;
    return 0;
  }
  last_scale_denom_ = plan.scale_denom;
  const int rw = rect.width(), rh = rect.height();
  const decode::DecodedRegion& region = decoder_.decode(
      plan.scale_denom, plan.decode.x0, plan.decode.y0, plan.decode.x1, plan.decode.y1);
  // The resampler's image is the plan's view: its pixels start at (view.x0, view.y0) of the
  // scaled image, which the decoded region holds where the filter reads.
  transform::RegionView view;
  const int vx0 = std::max(plan.view.x0, region.origin_x);
  const int vy0 = std::max(plan.view.y0, region.origin_y);
  const int vx1 = std::min(plan.view.x1, region.origin_x + region.width);
  const int vy1 = std::min(plan.view.y1, region.origin_y + region.height);
  view.pixels = region.pixels + static_cast<ptrdiff_t>(vy0 - region.origin_y) * region.stride +
                static_cast<ptrdiff_t>(vx0 - region.origin_x) * 3;
  view.width = vx1 - vx0;
  view.height = vy1 - vy0;
  view.stride = region.stride;
  view.origin_x = vx0 - plan.view.x0;
  view.origin_y = vy0 - plan.view.y0;
  view.image_width = plan.view.width();
  view.image_height = plan.view.height();
  const int64_t t1 = monotonic_ns();
  if (channels == 3) {
    uint8_t* dst = out + (static_cast<size_t>(rect.y0) * W + rect.x0) * 3;
    resampler_.resize(view, plan.box, dst, rw, rh, static_cast<ptrdiff_t>(W) * 3, g.hflip);
  } else {
    rgb_.resize(static_cast<size_t>(rw) * rh * 3);
    resampler_.resize(view, plan.box, rgb_.data(), rw, rh, static_cast<ptrdiff_t>(rw) * 3, g.hflip);
    for (int y = 0; y < rh; ++y) {
      const uint8_t* s = rgb_.data() + static_cast<size_t>(y) * rw * 3;
      uint8_t* d = out + static_cast<size_t>(rect.y0 + y) * W + rect.x0;
      for (int x = 0; x < rw; ++x) d[x] = luma(s + 3 * x);
    }
  }
  if (rw != W || rh != H) fill_outside(out, W, H, channels, rect, fill);
  // vflip: rect is already mirrored vertically, the rows inside it are not yet.
  if (g.vflip)
    flip_rows(out + static_cast<size_t>(rect.y0) * W * channels, rh,
              static_cast<size_t>(W) * channels);
  const int64_t t2 = monotonic_ns();
  decode_ns += t1 - t0;
  transform_ns += t2 - t1;
  return plan.scale_denom;
}

}  // namespace stoker::fields
