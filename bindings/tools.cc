// Single-image entry points: the same code the loader runs, for tests, packing and benchmarks.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "bindings.h"
#include "stoker/core/crc32c.h"
#include "stoker/core/error.h"
#include "stoker/core/random.h"
#include "stoker/decode/image_decoder.h"
#include "stoker/io/shard_file.h"
#include "stoker/pipeline/sample_processor.h"
#include "stoker/transform/crop.h"
#include "stoker/transform/resize.h"

namespace nb = nanobind;

namespace stoker::bindings {

namespace {

using Pixels = nb::ndarray<nb::numpy, uint8_t, nb::ndim<3>, nb::c_contig>;

Pixels to_numpy(std::vector<uint8_t>&& pixels, size_t h, size_t w) {
  auto* owned = new std::vector<uint8_t>(std::move(pixels));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  return Pixels(owned->data(), {h, w, 3}, owner);
}

std::vector<uint8_t> copy_region(const decode::DecodedRegion& r) {
  std::vector<uint8_t> out(static_cast<size_t>(r.width) * r.height * 3);
  for (int y = 0; y < r.height; ++y)
    std::memcpy(&out[static_cast<size_t>(y) * r.width * 3], r.pixels + y * r.stride,
                static_cast<size_t>(r.width) * 3);
  return out;
}

// The whole decoded image resampled to w x h (antialiased bilinear, Pillow's).
std::vector<uint8_t> resample_to(const decode::DecodedRegion& r, int w, int h) {
  std::vector<uint8_t> out(static_cast<size_t>(w) * h * 3);
  transform::Resampler resampler;
  resampler.resize(fields::region_view(r), {0, 0, double(r.width), double(r.height)}, out.data(), w,
                   h, w * 3, false);
  return out;
}

// Downscales the image decoded in `r` (at any DCT scale) so that the longer side is max_side
// (PIL-equivalent antialiased bilinear). w x h is the source's size on entry, the output's on
// return: the proportions are the source's, not those of the scaled decode, whose size libjpeg
// rounds up.
std::vector<uint8_t> shrink(const decode::DecodedRegion& r, int max_side, int& w, int& h) {
  const double s = static_cast<double>(max_side) / std::max(w, h);
  w = std::max(1, static_cast<int>(std::lround(w * s)));
  h = std::max(1, static_cast<int>(std::lround(h * s)));
  return resample_to(r, w, h);
}

}  // namespace

void register_tools(nb::module_& m) {
  m.def("crc32c", [](nb::bytes data) { return crc32c(data.data(), data.size()); });
  m.def(
      "file_crc32c",
      [](const std::string& path) {
        nb::gil_scoped_release release;
        const io::ShardFile file(path);
        std::vector<uint8_t> chunk;
        uint32_t crc = 0;
        constexpr uint64_t kChunk = uint64_t{4} << 20;
        for (uint64_t at = 0; at < file.size(); at += kChunk) {
          file.read(at, std::min(kChunk, file.size() - at), chunk);
          crc = crc32c(chunk.data(), chunk.size(), crc);
        }
        return crc;
      },
      nb::arg("path"), "The CRC32C of a whole file (an array pack's column, a token shard).");

  m.def("image_info", [](nb::bytes data) {
    decode::ImageDecoder d;
    const decode::ImageInfo& info = d.open(static_cast<const uint8_t*>(data.data()), data.size());
    nb::dict out;
    out["format"] = std::string(image_format_extension(info.format));
    out["width"] = info.width;
    out["height"] = info.height;
    out["components"] = info.components;
    out["progressive"] = info.progressive;
    out["ycbcr"] = info.ycbcr;
    out["starts"] = d.starts();
    return out;
  });

  m.def(
      "decode_image",
      [](nb::bytes data) {
        std::vector<uint8_t> px;
        int w, h;
        {
          nb::gil_scoped_release release;
          decode::ImageDecoder d;
          d.open(static_cast<const uint8_t*>(data.data()), data.size());
          const decode::DecodedRegion& r = d.decode_full();
          px = copy_region(r);
          w = r.width, h = r.height;
        }
        return to_numpy(std::move(px), h, w);
      },
      "Decodes a whole JPEG or PNG to RGB8, HxWx3.");

  m.def(
      "decode_region",
      [](nb::bytes data, int scale_denom, int x0, int y0, int x1, int y1) {
        std::vector<uint8_t> px;
        int w, h, ox, oy;
        {
          nb::gil_scoped_release release;
          decode::ImageDecoder d;
          d.open(static_cast<const uint8_t*>(data.data()), data.size());
          const decode::DecodedRegion& r = d.decode(scale_denom, x0, y0, x1, y1);
          px = copy_region(r);
          w = r.width, h = r.height, ox = r.origin_x, oy = r.origin_y;
        }
        return nb::make_tuple(to_numpy(std::move(px), h, w), ox, oy);
      },
      nb::arg("data"), nb::arg("scale_denom"), nb::arg("x0"), nb::arg("y0"), nb::arg("x1"),
      nb::arg("y1"),
      "Decodes at least [x0, x1) x [y0, y1) of the image scaled by 1/scale_denom, as the "
      "loader's decoder does (a JPEG's whole MCUs): (HxWx3 pixels, origin x, origin y) of the "
      "region decoded.");

  m.def(
      "transform_image",
      [](nb::bytes data, int size, bool train, uint64_t seed, int64_t epoch, int64_t index,
         int resize_size, bool dct_scaling) {
        pipeline::TransformOptions t;
        t.size = size;
        t.train = train;
        t.resize_size = resize_size;
        t.allow_dct_scaling = dct_scaling;
        std::vector<uint8_t> out(static_cast<size_t>(size) * size * 3);
        int denom;
        {
          nb::gil_scoped_release release;
          pipeline::SampleProcessor p(t, {});
          pipeline::StageTimes times;
          p.process(static_cast<const uint8_t*>(data.data()), data.size(), seed, epoch, index,
                    out.data(), times);
          denom = p.last_scale_denom();
        }
        return nb::make_tuple(to_numpy(std::move(out), size, size), denom);
      },
      nb::arg("data"), nb::arg("size") = 224, nb::arg("train") = false, nb::arg("seed") = 0,
      nb::arg("epoch") = 0, nb::arg("index") = 0, nb::arg("resize_size") = 0,
      nb::arg("dct_scaling") = true,
      "One sample through the loader's decode + crop + resize: (HxWx3 pixels, DCT scale used).");

  m.def(
      "resize_box",
      [](nb::ndarray<const uint8_t, nb::ndim<3>, nb::c_contig, nb::device::cpu> src, double x0,
         double y0, double x1, double y1, int width, int height) {
        const int h = static_cast<int>(src.shape(0)), w = static_cast<int>(src.shape(1));
        if (src.shape(2) != 3) throw nb::value_error("expected HxWx3 RGB pixels");
        std::vector<uint8_t> out(static_cast<size_t>(width) * height * 3);
        transform::RegionView v{src.data(), w, h, w * 3, 0, 0, w, h};
        transform::Resampler().resize(v, {x0, y0, x1, y1}, out.data(), width, height, width * 3,
                                      false);
        return to_numpy(std::move(out), height, width);
      },
      "PIL-equivalent Image.resize((width, height), BILINEAR, box=(x0, y0, x1, y1)).");

  nb::class_<KeyedRandom>(m, "KeyedRandom")
      .def(nb::init<uint64_t, uint64_t, uint64_t>(), nb::arg("seed"), nb::arg("stream"),
           nb::arg("index"))
      .def("uniform", nb::overload_cast<double, double>(&KeyedRandom::uniform))
      .def("below", &KeyedRandom::below);

  m.def(
      "random_resized_crop",
      [](int width, int height, KeyedRandom& rng, double scale_min, double scale_max,
         double ratio_min, double ratio_max) {
        const transform::Box b = transform::random_resized_crop(
            width, height, rng, {scale_min, scale_max, ratio_min, ratio_max, 10});
        return nb::make_tuple(b.x0, b.y0, b.x1, b.y1);
      },
      nb::arg("width"), nb::arg("height"), nb::arg("rng"), nb::arg("scale_min") = 0.08,
      nb::arg("scale_max") = 1.0, nb::arg("ratio_min") = 3.0 / 4.0,
      nb::arg("ratio_max") = 4.0 / 3.0);

  m.def(
      "prepare_image",
      [](nb::bytes data, int max_side, int quality, int restart_interval, const std::string& codec,
         int size_width, int size_height) {
        if (codec != "source" && codec != "raw" && codec != "jpeg")
          throw stoker::Error(stoker::ErrorCode::kInvalidArgument,
                              "codec must be 'source', 'raw' or 'jpeg', not '" + codec + "'");
        if (quality < 1 || quality > 100)
          throw stoker::Error(stoker::ErrorCode::kInvalidArgument, "quality must be 1-100");
        std::vector<uint8_t> out;
        int width, height;
        bool reencoded = false;
        std::string format;
        {
          nb::gil_scoped_release release;
          decode::ImageDecoder d;
          const auto* p = static_cast<const uint8_t*>(data.data());
          const decode::ImageInfo info = d.open(p, data.size());
          width = info.width, height = info.height;
          format = std::string(image_format_extension(info.format));
          if (codec == "raw") {
            // Decoded pixels (a binary PPM): at one size, or shrunk to max_side, decoded at the
            // smallest DCT scale that still covers the size kept.
            int w = width, h = height;
            if (size_width > 0) {
              w = size_width, h = size_height;
            } else if (max_side > 0 && std::max(width, height) > max_side) {
              const double s = static_cast<double>(max_side) / std::max(width, height);
              w = std::max(1, static_cast<int>(std::lround(width * s)));
              h = std::max(1, static_cast<int>(std::lround(height * s)));
            }
            int denom = 1;
            while (denom * 2 <= d.max_scale_denom() && width / (denom * 2) >= w &&
                   height / (denom * 2) >= h)
              denom *= 2;
            const decode::DecodedRegion& r = d.decode(
                denom, 0, 0, decode::scaled_size(width, denom), decode::scaled_size(height, denom));
            std::vector<uint8_t> pixels;
            if (w == r.width && h == r.height && r.stride == ptrdiff_t{w} * 3) {
              pixels.assign(r.pixels, r.pixels + static_cast<size_t>(w) * h * 3);
            } else {
              pixels = resample_to(r, w, h);
            }
            const std::string header =
                "P6\n" + std::to_string(w) + " " + std::to_string(h) + "\n255\n";
            out.assign(header.begin(), header.end());
            out.insert(out.end(), pixels.begin(), pixels.end());
            width = w, height = h;
            format = "ppm";
            reencoded = true;
            restart_interval = 0;
          } else if (codec == "jpeg" || (max_side > 0 && std::max(width, height) > max_side)) {
            // Shrunk to max_side (decoded at the smallest DCT scale that still covers it, then
            // resampled), or with codec="jpeg" every image re-encoded at `quality` (FFCV's
            // writer): a JPEG at `quality` either way.
            const bool smaller = max_side > 0 && std::max(width, height) > max_side;
            int denom = 1;
            while (smaller && denom * 2 <= d.max_scale_denom() &&
                   std::max(width, height) / (denom * 2) >= max_side)
              denom *= 2;
            const decode::DecodedRegion& r = d.decode(
                denom, 0, 0, decode::scaled_size(width, denom), decode::scaled_size(height, denom));
            std::vector<uint8_t> pixels;
            if (smaller) {
              pixels = shrink(r, max_side, width, height);
            } else {
              pixels.resize(static_cast<size_t>(width) * height * 3);
              for (int y = 0; y < height; ++y)
                std::copy(r.pixels + y * r.stride, r.pixels + y * r.stride + width * 3,
                          pixels.begin() + static_cast<ptrdiff_t>(y) * width * 3);
            }
            out = decode::encode_jpeg(pixels.data(), width, height, width * 3, quality);
            format = "jpg";
            reencoded = true;
          } else {
            // Prove it decodes: every scan, every row (the loader may need any of them).
            d.decode_full();
          }
          if (restart_interval > 0 && format == "jpg") {
            const auto* src = reencoded ? out.data() : p;
            const size_t n = reencoded ? out.size() : data.size();
            std::vector<uint8_t> marked;
            try {
              if (decode::add_restart_markers(src, n, restart_interval, marked)) {
                out = std::move(marked);
                reencoded = true;
              }
            } catch (const Error&) {
              // Decodes (with libjpeg warnings) but does not transcode: keep it as it is.
            }
          }
        }
        nb::bytes result = reencoded
                               ? nb::bytes(reinterpret_cast<const char*>(out.data()), out.size())
                               : nb::borrow<nb::bytes>(data);
        return nb::make_tuple(result, format, width, height, reencoded);
      },
      nb::arg("data"), nb::arg("max_side") = 0, nb::arg("quality") = 90,
      nb::arg("restart_interval") = 0, nb::arg("codec") = "source", nb::arg("size_width") = 0,
      nb::arg("size_height") = 0,
      "Checks that an image decodes; if max_side is set and exceeded, returns it shrunk and "
      "re-encoded as JPEG (codec='jpeg': every image re-encoded as JPEG at quality, shrunk "
      "or not); with restart_interval, baseline JPEGs are rewritten losslessly with "
      "restart markers every that many MCUs. codec='raw': its decoded pixels as a binary PPM, "
      "at size_width x size_height when given, else shrunk to max_side. (bytes, format, width, "
      "height, rewritten).");

  m.def(
      "decode_throughput",
      [](const std::vector<nb::bytes>& images, int threads, int repeats) {
        std::vector<std::pair<const uint8_t*, size_t>> items;
        for (const auto& b : images)
          items.emplace_back(static_cast<const uint8_t*>(b.data()), b.size());
        double seconds;
        {
          nb::gil_scoped_release release;
          std::atomic<size_t> next{0};
          const size_t total = items.size() * static_cast<size_t>(repeats);
          const auto t0 = std::chrono::steady_clock::now();
          std::vector<std::thread> pool;
          for (int t = 0; t < threads; ++t)
            pool.emplace_back([&] {
              decode::ImageDecoder d;
              for (size_t i; (i = next++) < total;) {
                const auto& [p, n] = items[i % items.size()];
                try {
                  d.open(p, n);
                  d.decode_full();
                } catch (const std::exception&) {
                }
              }
            });
          for (auto& t : pool) t.join();
          seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        return seconds;
      },
      nb::arg("images"), nb::arg("threads"), nb::arg("repeats") = 1,
      "Seconds to fully decode every image `repeats` times on `threads` threads: the ceiling "
      "that a loader decoding at full size cannot beat.");
}

}  // namespace stoker::bindings
