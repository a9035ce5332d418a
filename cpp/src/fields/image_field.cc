// Image and Mask fields: an image decoded under a geometry, and a mask that follows it.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "fields/detail/decoders.h"
#include "stoker/core/clock.h"
#include "stoker/core/error.h"
#include "stoker/decode/mask_decoder.h"
#include "stoker/fields/image_renderer.h"

namespace stoker::fields::detail {

Geometry rescale_geometry(const Geometry& g, int width, int height) {
  if (width == g.source_width && height == g.source_height) return g;
  Geometry out = g;
  const double sx = static_cast<double>(width) / g.source_width;
  const double sy = static_cast<double>(height) / g.source_height;
  out.box = {g.box.x0 * sx, g.box.y0 * sy, g.box.x1 * sx, g.box.y1 * sy};
  out.source_width = width;
  out.source_height = height;
  return out;
}

namespace {

class ImageField final : public FieldDecoder {
 public:
  ImageField(const FieldSpec& spec, bool follows, int stream,
             std::shared_ptr<decode::ScanIndexCache> scan_indexes)
      : options_(spec.image),
        follows_(follows),
        stream_(static_cast<uint64_t>(stream)),
        renderer_(spec.image.decode, std::move(scan_indexes)) {}

  void decode(const uint8_t* data, size_t size, const SampleContext& c, Geometry& geometry,
              uint8_t* const* out, std::string* blob, FieldTimes& times) override {
    const int64_t t0 = monotonic_ns();
    const decode::ImageInfo& info =
        c.raw ? open_raw(data, size, *c.raw) : renderer_.open(data, size, c.sample);
    times.decode_ns += monotonic_ns() - t0;
    Geometry g;
    if (follows_) {
      g = rescale_geometry(geometry, info.width, info.height);
    } else {
      geometry = draw_image_geometry(options_, static_cast<int>(stream_), c.seed, c.epoch, c.sample,
                                     info.width, info.height,
                                     c.out_width > 0 ? c.out_width : options_.width,
                                     c.out_height > 0 ? c.out_height : options_.height);
      g = geometry;
    }
    if (options_.device_decode) {
      double p[14];
      geometry_params(g, p);
      std::memcpy(out[1], p, sizeof p);
      const RenderPlan plan =
          plan_render(g, std::min(options_.device_max_scale_denom,
                                  options_.allow_dct_scaling ? renderer_.max_scale_denom() : 1));
      double q[kRenderPlanValues];
      render_plan_params(plan, q);
      std::memcpy(out[2], q, sizeof q);
      // A file libjpeg refuses before any pixel (an undefined table, a bogus Huffman table)
      // stays here, where its error meets on_error: a device's hardware engines may decode such
      // a file into something and call it decoded (docs/GPU.md, "What the hardware does").
      const bool on_device = c.device_allowed && c.raw == nullptr && device_decodable(info) &&
                             !plan.empty && renderer_.starts();
      *out[3] = on_device ? 0 : 1;
      if (on_device) {
        blob->assign(reinterpret_cast<const char*>(data), size);
        std::memset(out[0], 0, static_cast<size_t>(g.out_height) * g.out_width * options_.channels);
        return;
      }
      blob->clear();
    }
    const int denom =
        renderer_.render(g, options_.channels, options_.fill, options_.allow_dct_scaling, out[0],
                         times.decode_ns, times.transform_ns);
    if (denom > 0)
      ++times.scales[static_cast<size_t>(std::countr_zero(static_cast<unsigned>(denom)))];
    if (!options_.augment.empty()) {
      const int64_t t1 = monotonic_ns();
      augment::apply(options_.augment, {out[0], g.out_width, g.out_height}, c.seed, c.epoch,
                     c.sample);
      times.transform_ns += monotonic_ns() - t1;
    }
    if (options_.return_params && !options_.device_decode) {
      double p[14];
      geometry_params(g, p);
      std::memcpy(out[1], p, sizeof p);
    }
  }

 private:
  // An array pack's image row: uint8 [H, W, C] (C 1 or 3) or [H, W].
  const decode::ImageInfo& open_raw(const uint8_t* data, size_t size, const RawLayout& raw) {
    const auto& s = raw.shape;
    if (raw.dtype != DType::kUInt8 || s.size() < 2 || s.size() > 3 ||
        (s.size() == 3 && s[2] != 1 && s[2] != 3) || s[0] > 65535 || s[1] > 65535)
      throw Error(ErrorCode::kUnsupported,
                  "an Image field reads uint8 rows of shape (H, W, 3), (H, W, 1) or (H, W), not " +
                      std::string(dtype_name(raw.dtype)) + " of " + std::to_string(s.size()) +
                      " dimensions");
    const int channels = s.size() == 3 ? static_cast<int>(s[2]) : 1;
    return renderer_.open_raw(data, size, static_cast<int>(s[1]), static_cast<int>(s[0]), channels);
  }

  ImageOptions options_;
  bool follows_;
  uint64_t stream_;
  ImageRenderer renderer_;
};

// Nearest-neighbour sampling exactly as Pillow's resize(NEAREST, box=...) does it: the box
// arrives as C floats (single precision), the step is (float(x1) - float(x0)) / count in double,
// and the source coordinate of output pixel x is accumulated, x0 + step / 2 + x * step, one
// addition per pixel, then truncated (ImagingScaleAffine).
void nearest_table(double x0, double x1, int count, int limit, std::vector<int>& table) {
  const auto start = static_cast<double>(static_cast<float>(x0));
  const auto step = static_cast<double>(static_cast<float>(x1) - static_cast<float>(x0)) / count;
  table.resize(static_cast<size_t>(count));
  double at = start + step * 0.5;
  for (int i = 0; i < count; ++i) {
    const int v = at < 0.0 ? -1 : static_cast<int>(at);
    table[static_cast<size_t>(i)] = v < limit ? v : -1;
    at += step;
  }
}

class MaskField final : public FieldDecoder {
 public:
  explicit MaskField(const FieldSpec& spec) : options_(spec.mask), decoder_(spec.mask.decode) {}

  void decode(const uint8_t* data, size_t size, const SampleContext&, Geometry& geometry,
              uint8_t* const* out, std::string*, FieldTimes& times) override {
    const int64_t t0 = monotonic_ns();
    const decode::MaskImage mask = decoder_.decode(data, size);
    const int64_t t1 = monotonic_ns();
    const Geometry g = rescale_geometry(geometry, mask.width, mask.height);
    const int W = g.out_width, H = g.out_height;
    uint8_t* dst = out[0];
    std::memset(dst, options_.fill, static_cast<size_t>(W) * H);
    const transform::PixelRect& r = g.rect;
    if (r.width() > 0 && r.height() > 0) {
      nearest_table(g.box.x0, g.box.x1, r.width(), mask.width, xs_);
      nearest_table(g.box.y0, g.box.y1, r.height(), mask.height, ys_);
      for (int y = 0; y < r.height(); ++y) {
        const int sy = ys_[static_cast<size_t>(y)];
        if (sy < 0) continue;
        const int oy = g.vflip ? H - 1 - (r.y0 + y) : r.y0 + y;
        const uint8_t* src = mask.values + static_cast<size_t>(sy) * mask.width;
        uint8_t* row = dst + static_cast<size_t>(oy) * W;
        for (int x = 0; x < r.width(); ++x) {
          const int sx = xs_[static_cast<size_t>(x)];
          if (sx < 0) continue;
          row[g.hflip ? W - 1 - (r.x0 + x) : r.x0 + x] = src[sx];
        }
      }
    }
    times.decode_ns += t1 - t0;
    times.transform_ns += monotonic_ns() - t1;
  }

 private:
  MaskOptions options_;
  decode::MaskDecoder decoder_;
  std::vector<int> xs_, ys_;
};

}  // namespace

std::unique_ptr<FieldDecoder> make_image_decoder(
    const FieldSpec& spec, bool follows, int stream,
    std::shared_ptr<decode::ScanIndexCache> scan_indexes) {
  return std::make_unique<ImageField>(spec, follows, stream, std::move(scan_indexes));
}

std::unique_ptr<FieldDecoder> make_mask_decoder(const FieldSpec& spec) {
  return std::make_unique<MaskField>(spec);
}

}  // namespace stoker::fields::detail

namespace stoker::fields {

bool device_decodable(const decode::ImageInfo& info) {
  // A 3-component JPEG coded as RGB stays on the host: a device decoder's parser takes every
  // 3-component JPEG as YCbCr (nvJPEG's does), and its colours would come out shifted.
  return info.format == ImageFormat::kJpeg && !info.progressive &&
         (info.components == 1 || (info.components == 3 && info.ycbcr));
}

void render_plan_params(const RenderPlan& plan, double out[kRenderPlanValues]) {
  const auto d = [](int v) { return static_cast<double>(v); };
  const double p[kRenderPlanValues] = {
      d(plan.scale_denom),   d(plan.decode.x0), d(plan.decode.y0),
      d(plan.decode.x1),     d(plan.decode.y1), d(plan.view.x0),
      d(plan.view.y0),       d(plan.view.x1),   d(plan.view.y1),
      plan.box.x0,           plan.box.y0,       plan.box.x1,
      plan.box.y1,           d(plan.rect.x0),   d(plan.rect.y0),
      d(plan.rect.x1),       d(plan.rect.y1),   plan.hflip ? 1.0 : 0.0,
      plan.vflip ? 1.0 : 0.0};
  std::memcpy(out, p, sizeof p);
}

void geometry_params(const Geometry& g, double out[14]) {
  const double p[14] = {g.box.x0,
                        g.box.y0,
                        g.box.x1,
                        g.box.y1,
                        static_cast<double>(g.rect.x0),
                        static_cast<double>(g.rect.y0),
                        static_cast<double>(g.rect.x1),
                        static_cast<double>(g.rect.y1),
                        g.scale_x(),
                        g.scale_y(),
                        g.hflip ? 1.0 : 0.0,
                        g.vflip ? 1.0 : 0.0,
                        static_cast<double>(g.source_width),
                        static_cast<double>(g.source_height)};
  std::memcpy(out, p, sizeof p);
}

Geometry draw_image_geometry(const ImageOptions& options, int stream, uint64_t seed, int64_t epoch,
                             int64_t sample, int width, int height) {
  // Stream 0 is KeyedRandom(seed, epoch, sample); another image's stream differs in the seed.
  return draw_image_geometry(options, stream, seed, epoch, sample, width, height, options.width,
                             options.height);
}

Geometry draw_image_geometry(const ImageOptions& options, int stream, uint64_t seed, int64_t epoch,
                             int64_t sample, int width, int height, int out_width, int out_height) {
  KeyedRandom rng(seed + static_cast<uint64_t>(stream) * 0x9E3779B97F4A7C15ull,
                  static_cast<uint64_t>(epoch), static_cast<uint64_t>(sample));
  return draw_geometry(options.geometry, width, height, out_width, out_height, rng);
}

}  // namespace stoker::fields
