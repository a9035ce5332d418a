// stoker._media: the media readers (cpp/src/media) for Python, in a module of their own. It links
// FFmpeg's shared libraries, which the wheel does not carry (Debian's are a GPL build): it is built
// where they are and loads only when imported, in the wheel against the user's own FFmpeg 5.1.
// The tests check the readers against PyAV, soundfile and python-soxr, and the engine's Video and
// Audio fields reach them through plugin(), a table of C functions (core/media_plugin.h;
// docs/ARCHITECTURE.md, "Media").
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "bindings.h"
#include "stoker/core/error.h"
#include "stoker/media/audio.h"
#include "stoker/media/plugin.h"
#include "stoker/media/video.h"

namespace nb = nanobind;

namespace stoker::bindings {
namespace {

media::MediaLimits limits(int64_t max_pixels, int64_t max_frames, double max_seconds,
                          int64_t max_decoded_frames = media::MediaLimits{}.max_decoded_frames) {
  media::MediaLimits l;
  l.max_pixels = max_pixels;
  l.max_frames = max_frames;
  l.max_seconds = max_seconds;
  l.max_decoded_frames = max_decoded_frames;
  return l;
}

// A reader and the bytes it reads in place.
struct Video {
  std::vector<uint8_t> bytes;
  std::unique_ptr<media::VideoReader> reader;
};

struct Audio {
  std::vector<uint8_t> bytes;
  std::unique_ptr<media::AudioReader> reader;
};

std::vector<uint8_t> copy(const nb::bytes& data) {
  const auto* p = static_cast<const uint8_t*>(data.data());
  return std::vector<uint8_t>(p, p + data.size());
}

}  // namespace

NB_MODULE(_media, m) {
  m.doc() = "stoker's video and audio readers (FFmpeg), for tests and tools";
  register_error_translator();
  m.def(
      "plugin",
      []() {
        return nb::capsule(static_cast<const void*>(media::plugin()), "stoker.media_plugin");
      },
      "The readers as the engine's media plugin, for stoker._core.install_media_plugin.");
  m.attr("library") = media::plugin()->library;
  nb::class_<Video>(m, "VideoReader")
      .def(
          "__init__",
          [](Video* self, const nb::bytes& data, int64_t max_pixels, int64_t max_frames,
             double max_seconds, int64_t max_decoded_frames) {
            new (self) Video{copy(data), nullptr};
            nb::gil_scoped_release release;
            self->reader = std::make_unique<media::VideoReader>(
                self->bytes, limits(max_pixels, max_frames, max_seconds, max_decoded_frames));
          },
          nb::arg("data"), nb::kw_only(), nb::arg("max_pixels") = media::MediaLimits{}.max_pixels,
          nb::arg("max_frames") = media::MediaLimits{}.max_frames,
          nb::arg("max_seconds") = media::MediaLimits{}.max_seconds,
          nb::arg("max_decoded_frames") = media::MediaLimits{}.max_decoded_frames,
          "A video file's bytes, its frames indexed in presentation order.")
      .def_prop_ro("info",
                   [](const Video& v) {
                     const media::VideoInfo& i = v.reader->info();
                     nb::dict d;
                     d["width"] = i.width;
                     d["height"] = i.height;
                     d["frames"] = i.frames;
                     d["frames_per_second"] = i.frames_per_second;
                     d["duration_seconds"] = i.duration_seconds;
                     d["codec"] = i.codec;
                     return d;
                   })
      .def("frame_seconds",
           [](const Video& v, int64_t index) { return v.reader->frame_seconds(index); })
      .def(
          "frame_times",
          [](const Video& v) {
            const int64_t n = v.reader->info().frames;
            auto* out = new std::vector<double>(static_cast<size_t>(n));
            nb::capsule owner(
                out, [](void* p) noexcept { delete static_cast<std::vector<double>*>(p); });
            for (int64_t i = 0; i < n; ++i)
              (*out)[static_cast<size_t>(i)] = v.reader->frame_seconds(i);
            return nb::ndarray<nb::numpy, double, nb::ndim<1>>(out->data(), {size_t(n)}, owner);
          },
          "Every frame's presentation time in seconds from the first, in presentation order.")
      .def_prop_ro(
          "keyframes", [](const Video& v) { return v.reader->keyframes(); },
          "The keyframes' frame numbers, in presentation order.")
      .def(
          "read_frames",
          [](Video& v, int64_t first, int64_t count, int64_t stride) {
            const int h = v.reader->info().height, w = v.reader->info().width;
            auto* out = new std::vector<uint8_t>();
            nb::capsule owner(
                out, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
            {
              nb::gil_scoped_release release;
              out->reserve(static_cast<size_t>(count) * size_t(h) * size_t(w) * 3);
              v.reader->read_frames(first, count, stride, [&](const media::RgbFrame& f) {
                STOKER_CHECK(f.width == w && f.height == h, ErrorCode::kUnsupported,
                             "a video whose frames change size");
                out->insert(out->end(), f.pixels, f.pixels + size_t(f.row_bytes) * size_t(h));
              });
            }
            return nb::ndarray<nb::numpy, uint8_t, nb::ndim<4>>(
                out->data(), {size_t(count), size_t(h), size_t(w), size_t(3)}, owner);
          },
          nb::arg("first"), nb::arg("count"), nb::arg("stride") = 1,
          "Frames first, first + stride, ... (count of them) as uint8 [count, H, W, 3] RGB. "
          "Releases the GIL.")
      .def(
          "read_list",
          [](Video& v, std::vector<int64_t> frames) {
            const int h = v.reader->info().height, w = v.reader->info().width;
            std::sort(frames.begin(), frames.end());
            auto* out = new std::vector<uint8_t>();
            nb::capsule owner(
                out, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
            {
              nb::gil_scoped_release release;
              out->reserve(frames.size() * size_t(h) * size_t(w) * 3);
              v.reader->read_frames(frames, [&](const media::RgbFrame& f) {
                STOKER_CHECK(f.width == w && f.height == h, ErrorCode::kUnsupported,
                             "a video whose frames change size");
                out->insert(out->end(), f.pixels, f.pixels + size_t(f.row_bytes) * size_t(h));
              });
            }
            return nb::ndarray<nb::numpy, uint8_t, nb::ndim<4>>(
                out->data(), {frames.size(), size_t(h), size_t(w), size_t(3)}, owner);
          },
          nb::arg("frames"),
          "These frames (numbers in presentation order, sorted here) as uint8 [n, H, W, 3] RGB, "
          "as a Video field with fps reads them: from the keyframe before the first, the "
          "frames no target needs skipped where nothing refers to them. Releases the GIL.")
      .def_prop_ro(
          "packets_read", [](const Video& v) { return v.reader->packets_read(); },
          "The video stream's packets the last read handed to the decoder (decoded or skipped): "
          "from each run's keyframe to its last frame's packet.");
  nb::class_<Audio>(m, "AudioReader")
      .def(
          "__init__",
          [](Audio* self, const nb::bytes& data, double max_seconds) {
            new (self) Audio{copy(data), nullptr};
            nb::gil_scoped_release release;
            media::MediaLimits l;
            l.max_seconds = max_seconds;
            self->reader = std::make_unique<media::AudioReader>(self->bytes, l);
          },
          nb::arg("data"), nb::kw_only(), nb::arg("max_seconds") = media::MediaLimits{}.max_seconds,
          "An audio file's bytes.")
      .def_prop_ro("info",
                   [](const Audio& a) {
                     const media::AudioInfo& i = a.reader->info();
                     nb::dict d;
                     d["sample_rate"] = i.sample_rate;
                     d["channels"] = i.channels;
                     d["frames"] = i.frames;
                     d["duration_seconds"] = i.duration_seconds;
                     d["codec"] = i.codec;
                     return d;
                   })
      .def(
          "read",
          [](Audio& a, double start, double seconds, int sample_rate, int channels, bool context) {
            if (!(std::isfinite(start) && start >= 0 && std::isfinite(seconds)))
              throw Error(ErrorCode::kInvalidArgument, "an audio window starts at a time >= 0");
            const int rate = sample_rate == 0 ? a.reader->info().sample_rate : sample_rate;
            const auto first = static_cast<int64_t>(std::llround(std::min(start * rate, 1e15)));
            const int64_t count =
                seconds < 0 ? -1
                            : static_cast<int64_t>(std::llround(std::min(seconds * rate, 1e15)));
            auto* out = new std::vector<float>();
            nb::capsule owner(out,
                              [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
            int64_t frames;
            {
              nb::gil_scoped_release release;
              frames = a.reader->read(first, count, sample_rate, channels, *out, context);
            }
            const size_t c = channels == 1 ? 1 : size_t(a.reader->info().channels);
            return nb::ndarray<nb::numpy, float, nb::ndim<2>>(out->data(), {c, size_t(frames)},
                                                              owner);
          },
          nb::arg("start") = 0.0, nb::arg("seconds") = -1.0, nb::kw_only(),
          nb::arg("sample_rate") = 0, nb::arg("channels") = 0, nb::arg("context") = true,
          "Samples from `start` for `seconds` (< 0: to the end) of the stream resampled as a "
          "whole to sample_rate (0: the file's), channels 0 (the file's) or 1 (their mean): "
          "float32 [channels, frames]. The window starts on the output rate's grid, at sample "
          "round(start * rate), and is round(seconds * rate) samples long. context=False: "
          "only the window's own samples are resampled (up to 1e-2 apart at its ends), for "
          "measuring what the context costs. Releases the GIL.");
}

}  // namespace stoker::bindings
