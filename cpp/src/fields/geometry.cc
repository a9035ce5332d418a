#include "stoker/fields/geometry.h"

#include <algorithm>
#include <cmath>

#include "stoker/core/error.h"

namespace stoker::fields {

transform::PixelRect Geometry::flipped_rect() const {
  transform::PixelRect r = rect;
  if (hflip) r = {out_width - rect.x1, r.y0, out_width - rect.x0, r.y1};
  if (vflip) r = {r.x0, out_height - rect.y1, r.x1, out_height - rect.y0};
  return r;
}

Geometry draw_geometry(const GeometryOptions& o, int width, int height, int out_width,
                       int out_height, KeyedRandom& rng) {
  STOKER_CHECK(width > 0 && height > 0, ErrorCode::kCorruptData, "image has no pixels");
  Geometry g;
  g.source_width = width;
  g.source_height = height;
  g.out_width = out_width;
  g.out_height = out_height;
  g.rect = {0, 0, out_width, out_height};
  const transform::Box whole{0, 0, static_cast<double>(width), static_cast<double>(height)};
  switch (o.kind) {
    case GeometryKind::kRandomResizedCrop:
      g.box = transform::random_resized_crop(width, height, rng, o.crop);
      g.crop_first = true;
      break;
    case GeometryKind::kResizeCenterCrop: {
      const int resize =
          o.resize_size > 0
              ? o.resize_size
              : static_cast<int>(std::lround(std::min(out_width, out_height) * 256.0 / 224.0));
      g.box = transform::resize_center_crop(width, height, resize, out_width, out_height);
      g.crop_first = false;
      break;
    }
    case GeometryKind::kResize:
      g.box = whole;
      g.crop_first = false;
      break;
    case GeometryKind::kLetterbox: {
      const double scale = std::min(static_cast<double>(out_width) / width,
                                    static_cast<double>(out_height) / height);
      const int w = std::clamp(static_cast<int>(std::lround(width * scale)), 1, out_width);
      const int h = std::clamp(static_cast<int>(std::lround(height * scale)), 1, out_height);
      const int x0 = (out_width - w) / 2, y0 = (out_height - h) / 2;
      g.box = whole;
      g.rect = {x0, y0, x0 + w, y0 + h};
      g.crop_first = false;
      break;
    }
    case GeometryKind::kRandomCrop: {
      // torchvision's RandomCrop(size, padding): a window of the output size at a uniform
      // position in the padded image (top first). Where even the padded image is smaller than
      // the window, the window starts at the padded image's corner and the rest is fill.
      const int64_t pad = o.padding;
      const int64_t top =
          rng.below(static_cast<uint64_t>(std::max<int64_t>(0, height + 2 * pad - out_height) + 1));
      const int64_t left =
          rng.below(static_cast<uint64_t>(std::max<int64_t>(0, width + 2 * pad - out_width) + 1));
      // The window in source coordinates, and its part inside the image.
      const int64_t wx0 = left - pad, wy0 = top - pad;
      const int64_t ix0 = std::max<int64_t>(wx0, 0), iy0 = std::max<int64_t>(wy0, 0);
      const int64_t ix1 = std::min<int64_t>(wx0 + out_width, width);
      const int64_t iy1 = std::min<int64_t>(wy0 + out_height, height);
      if (ix1 <= ix0 || iy1 <= iy0) {
        g.box = {0, 0, 1, 1};
        g.rect = {0, 0, 0, 0};  // the window shows padding only
      } else {
        g.box = {static_cast<double>(ix0), static_cast<double>(iy0), static_cast<double>(ix1),
                 static_cast<double>(iy1)};
        g.rect = {static_cast<int>(ix0 - wx0), static_cast<int>(iy0 - wy0),
                  static_cast<int>(ix1 - wx0), static_cast<int>(iy1 - wy0)};
      }
      g.crop_first = true;
      break;
    }
    case GeometryKind::kCoverCrop: {
      // The image resized so that it covers the output (as kohya's and diffusers' aspect
      // buckets resize: each side scaled by the larger ratio, rounded), then a window of the
      // output's size at a whole pixel of the resized image: drawn top then left (one of the
      // two has no slack), or centred as torchvision's center_crop places it.
      const double scale = std::max(static_cast<double>(out_width) / width,
                                    static_cast<double>(out_height) / height);
      const double new_w = std::max<double>(out_width, std::nearbyint(width * scale));
      const double new_h = std::max<double>(out_height, std::nearbyint(height * scale));
      const double slack_x = new_w - out_width, slack_y = new_h - out_height;
      double top, left;
      if (o.random_position) {
        top = static_cast<double>(rng.below(static_cast<uint64_t>(slack_y) + 1));
        left = static_cast<double>(rng.below(static_cast<uint64_t>(slack_x) + 1));
      } else {
        top = std::nearbyint(slack_y / 2.0);
        left = std::nearbyint(slack_x / 2.0);
      }
      const double sx = width / new_w, sy = height / new_h;
      g.box = {left * sx, top * sy, (left + out_width) * sx, (top + out_height) * sy};
      g.crop_first = false;
      break;
    }
  }
  g.hflip = rng.uniform() < o.hflip;
  g.vflip = rng.uniform() < o.vflip;
  return g;
}

}  // namespace stoker::fields
