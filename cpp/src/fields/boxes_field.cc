// Boxes: read from .npy or JSON, taken through the followed image's geometry, clipped, filtered
// by visibility, written padded with their classes and count.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "fields/detail/decoders.h"
#include "stoker/core/clock.h"
#include "stoker/core/error.h"
#include "stoker/fields/box_source.h"

namespace stoker::fields::detail {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// (a, b, c, d) in `format` -> corners x0, y0, x1, y1.
void to_corners(BoxFormat format, const double* v, double* xyxy) {
  switch (format) {
    case BoxFormat::kXYXY: std::copy(v, v + 4, xyxy); return;
    case BoxFormat::kXYWH:
      xyxy[0] = v[0], xyxy[1] = v[1], xyxy[2] = v[0] + v[2], xyxy[3] = v[1] + v[3];
      return;
    case BoxFormat::kCXCYWH:
      xyxy[0] = v[0] - v[2] / 2, xyxy[1] = v[1] - v[3] / 2;
      xyxy[2] = v[0] + v[2] / 2, xyxy[3] = v[1] + v[3] / 2;
      return;
  }
}

void from_corners(BoxFormat format, const double* c, double* v) {
  switch (format) {
    case BoxFormat::kXYXY: std::copy(c, c + 4, v); return;
    case BoxFormat::kXYWH: v[0] = c[0], v[1] = c[1], v[2] = c[2] - c[0], v[3] = c[3] - c[1]; return;
    case BoxFormat::kCXCYWH:
      v[0] = (c[0] + c[2]) / 2, v[1] = (c[1] + c[3]) / 2, v[2] = c[2] - c[0], v[3] = c[3] - c[1];
      return;
  }
}

class BoxesField final : public FieldDecoder {
 public:
  BoxesField(const FieldSpec& spec, bool follows) : options_(spec.boxes), follows_(follows) {}

  void decode(const uint8_t* data, size_t size, const SampleContext& context, Geometry& geometry,
              uint8_t* const* out, std::string*, FieldTimes& times) override {
    const int64_t t0 = monotonic_ns();
    BoxLimits limits;
    limits.max_boxes = options_.max_stored_boxes;
    // By the member's extension: "boxes.npy" is numpy, anything else JSON.
    const bool npy = ends_with(context.member, "npy");
    const RawBoxes raw =
        npy ? parse_npy_boxes(data, size, limits) : parse_json_boxes(data, size, limits);
    const int64_t t1 = monotonic_ns();
    auto* boxes = reinterpret_cast<float*>(out[0]);
    auto* classes = reinterpret_cast<int64_t*>(out[1]);
    const auto max = static_cast<size_t>(options_.max_boxes);
    std::memset(boxes, 0, max * 4 * sizeof(float));
    std::fill(classes, classes + max, int64_t{-1});
    const Geometry& g = geometry;
    const double W = follows_ ? g.out_width : 1.0, H = follows_ ? g.out_height : 1.0;
    size_t kept = 0;
    for (int64_t i = 0; i < raw.count(); ++i) {
      double c[4] = {0, 0, 0, 0};
      to_corners(options_.source_format, &raw.coords[static_cast<size_t>(4 * i)], c);
      if (options_.source_normalized) {
        c[0] *= g.source_width, c[2] *= g.source_width;
        c[1] *= g.source_height, c[3] *= g.source_height;
      }
      if (follows_) {
        // Through the geometry (before flips), then clipped to where the image lands.
        const double sx = g.scale_x(), sy = g.scale_y();
        double m[4] = {g.rect.x0 + (c[0] - g.box.x0) * sx, g.rect.y0 + (c[1] - g.box.y0) * sy,
                       g.rect.x0 + (c[2] - g.box.x0) * sx, g.rect.y0 + (c[3] - g.box.y0) * sy};
        const double area = (m[2] - m[0]) * (m[3] - m[1]);
        m[0] = std::clamp(m[0], double(g.rect.x0), double(g.rect.x1));
        m[2] = std::clamp(m[2], double(g.rect.x0), double(g.rect.x1));
        m[1] = std::clamp(m[1], double(g.rect.y0), double(g.rect.y1));
        m[3] = std::clamp(m[3], double(g.rect.y0), double(g.rect.y1));
        const double visible = (m[2] - m[0]) * (m[3] - m[1]);
        if (!(m[2] > m[0] && m[3] > m[1] && area > 0) || visible < options_.min_visible * area)
          continue;
        if (g.hflip) {
          const double x0 = m[0];
          m[0] = W - m[2], m[2] = W - x0;
        }
        if (g.vflip) {
          const double y0 = m[1];
          m[1] = H - m[3], m[3] = H - y0;
        }
        std::copy(m, m + 4, c);
      }
      if (kept == max)
        throw Error(ErrorCode::kResourceLimit,
                    "more than max_boxes=" + std::to_string(max) + " boxes in the output");
      double v[4] = {0, 0, 0, 0};
      from_corners(options_.format, c, v);
      if (options_.normalized) v[0] /= W, v[1] /= H, v[2] /= W, v[3] /= H;
      for (int k = 0; k < 4; ++k) boxes[4 * kept + k] = static_cast<float>(v[k]);
      classes[kept] = raw.classes[static_cast<size_t>(i)];
      ++kept;
    }
    const auto count = static_cast<int64_t>(kept);
    std::memcpy(out[2], &count, sizeof count);
    times.decode_ns += t1 - t0;
    times.transform_ns += monotonic_ns() - t1;
  }

 private:
  BoxesOptions options_;
  bool follows_;
};

}  // namespace

std::unique_ptr<FieldDecoder> make_boxes_decoder(const FieldSpec& spec, bool follows) {
  return std::make_unique<BoxesField>(spec, follows);
}

}  // namespace stoker::fields::detail
