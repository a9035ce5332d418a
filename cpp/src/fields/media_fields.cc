// Video and Audio: a clip or a window of a sample's media member. The media plugin
// (core/media_plugin.h: stoker._media, linked with FFmpeg) demuxes, decodes and resamples; the
// clip's frames are rendered here, one geometry drawn per clip and applied to every frame through
// the image path's resampler (PIL-exact, as an Image's crop is).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "fields/detail/decoders.h"
#include "stoker/core/clock.h"
#include "stoker/core/error.h"
#include "stoker/core/random.h"
#include "stoker/fields/image_renderer.h"

namespace stoker::fields {

namespace {
std::atomic<const StokerMediaPlugin*> installed_plugin{nullptr};
}  // namespace

void install_media_plugin(const StokerMediaPlugin* plugin) {
  STOKER_CHECK(plugin != nullptr, ErrorCode::kInvalidArgument, "no media plugin given");
  if (plugin->version != STOKER_MEDIA_PLUGIN_VERSION)
    throw Error(ErrorCode::kUnsupported,
                "stoker's media module speaks plugin version " + std::to_string(plugin->version) +
                    ", this engine version " + std::to_string(STOKER_MEDIA_PLUGIN_VERSION) +
                    ": reinstall stoker so that both come from one build");
  installed_plugin.store(plugin);
}

const StokerMediaPlugin* media_plugin() { return installed_plugin.load(); }

int64_t AudioOptions::samples() const { return std::llround(seconds * sample_rate); }

namespace detail {

namespace {

constexpr size_t kReasonBytes = 512;
// Media fields draw from their own streams, keyed by the field's index (an Image's streams are
// keyed by its rank among Images: they never meet).
constexpr uint64_t kMediaStream = 0x6d656469612d7331ull;

[[noreturn]] void throw_plugin_error(int code, const char* reason) {
  const ErrorCode c = code >= 0 && code <= static_cast<int>(ErrorCode::kInternal)
                          ? static_cast<ErrorCode>(code)
                          : ErrorCode::kInternal;
  throw Error(c, reason[0] ? reason : "the media plugin failed without a reason");
}

const StokerMediaPlugin& require_plugin(FieldKind kind) {
  const StokerMediaPlugin* p = media_plugin();
  if (p == nullptr)
    throw Error(ErrorCode::kUnsupported,
                std::string(field_kind_name(kind)) +
                    " fields need stoker's media module (stoker._media), which links FFmpeg's "
                    "libraries: it is built by a development install (make install) where "
                    "libavformat, libavcodec, libswscale and libswresample (5.x) are installed; "
                    "the wheel does not carry it (docs/ARCHITECTURE.md, \"Media\")");
  return *p;
}

StokerMediaLimits plugin_limits(const MediaLimitOptions& o, int64_t max_decoded_bytes,
                                int decoder_threads = 1) {
  return StokerMediaLimits{o.max_pixels,         o.max_frames,   o.max_seconds,
                           o.max_sample_rate,    o.max_channels, max_decoded_bytes,
                           o.max_decoded_frames, decoder_threads};
}

KeyedRandom media_random(const SampleContext& c, int field) {
  return KeyedRandom(c.seed ^ mix64(kMediaStream + static_cast<uint64_t>(field)),
                     static_cast<uint64_t>(c.epoch), static_cast<uint64_t>(c.sample));
}

// Where a clip or window of `span` starts in a stream of `length` (span <= length).
template <typename T>
T draw_start(MediaStart start, T length, T span, KeyedRandom& rng) {
  if constexpr (std::is_integral_v<T>) {
    const T room = std::max(T(0), length - span);
    switch (start) {
      case MediaStart::kRandom: return static_cast<T>(rng.below(static_cast<uint64_t>(room) + 1));
      case MediaStart::kCenter: return room / 2;
      case MediaStart::kStart: return 0;
    }
  } else {
    const T room = std::max(T(0), length - span);
    switch (start) {
      case MediaStart::kRandom: return rng.uniform(0.0, room);
      case MediaStart::kCenter: return room / 2;
      case MediaStart::kStart: return 0;
    }
  }
  return 0;
}

// A plugin handle, closed on every way out.
struct Handle {
  void* handle = nullptr;
  void (*close)(void*) = nullptr;
  ~Handle() {
    if (handle) close(handle);
  }
};

class VideoField final : public FieldDecoder {
 public:
  VideoField(const FieldSpec& spec, int field)
      : plugin_(require_plugin(FieldKind::kVideo)), options_(spec.video), field_(field) {
    limits_ = plugin_limits(options_.limits, int64_t{1} << 31, options_.decoder_threads);
  }

  void decode(const uint8_t* data, size_t size, const SampleContext& c, Geometry&,
              uint8_t* const* out, std::string*, FieldTimes& times) override {
    const int64_t t0 = monotonic_ns();
    const int64_t transform_before = times.transform_ns;
    char reason[kReasonBytes] = {};
    Handle video{nullptr, plugin_.video_close};
    StokerVideoInfo info{};
    if (int rc =
            plugin_.video_open(data, size, &limits_, &video.handle, &info, reason, sizeof reason))
      throw_plugin_error(rc, reason);
    if (info.frames < 1) throw Error(ErrorCode::kCorruptData, "a video stream without frames");

    // The clip's size: the field's, or its batch's (a video bucket's).
    const int64_t T = c.out_frames > 0 ? c.out_frames : options_.frames;
    const int W = c.out_width > 0 ? c.out_width : options_.width;
    const int H = c.out_height > 0 ? c.out_height : options_.height;
    frame_bytes_ = static_cast<size_t>(H) * W * 3;
    const int64_t S = options_.stride, span = (T - 1) * S + 1;
    KeyedRandom rng = media_random(c, field_);
    // The clip's frame numbers: `wanted[t]`, the first `length` of them real.
    wanted_.assign(static_cast<size_t>(T), -1);
    int64_t length = T, first = 0, count = T, stride = S;
    if (options_.fps > 0) {
      length = plan_by_time(video.handle, info, T, rng);
    } else if (info.frames >= span) {
      first = draw_start<int64_t>(options_.start, info.frames, span, rng);
      for (int64_t t = 0; t < T; ++t) wanted_[static_cast<size_t>(t)] = first + t * S;
    } else {
      switch (options_.short_clip) {
        case ShortClip::kSkip:
          throw SkipSample{"a clip of " + std::to_string(span) + " frames from a video of " +
                           std::to_string(info.frames)};
        case ShortClip::kPad:
          length = (info.frames - 1) / S + 1;
          for (int64_t t = 0; t < length; ++t) wanted_[static_cast<size_t>(t)] = t * S;
          count = length;
          break;
        case ShortClip::kLoop:  // frames 0, S, 2S, ... counted round the stream
          for (int64_t t = 0; t < T; ++t) wanted_[static_cast<size_t>(t)] = (t * S) % info.frames;
          count = std::min<int64_t>(info.frames, span);
          stride = 1;
          break;
      }
    }
    // One crop and one flip for the whole clip, drawn after its start.
    clip_geometry_ = draw_geometry(options_.geometry, info.width, info.height, W, H, rng);

    pixels_ = out[0];
    timestamps_ = reinterpret_cast<double*>(out[1]);
    times_ = &times;
    error_ = nullptr;
    // Only the pixels the resampler reads are converted to RGB.
    const RenderPlan plan = plan_render(clip_geometry_, 1);
    const int32_t region[4] = {plan.decode.x0, plan.decode.y0, plan.decode.x1, plan.decode.y1};
    int rc = 0;
    if (options_.fps > 0) {  // the frames to read, in order: the clip's (a loop repeats some)
      order_.assign(wanted_.begin(), wanted_.begin() + length);
      std::sort(order_.begin(), order_.end());
      rc = plugin_.video_read_list(video.handle, order_.data(), static_cast<int64_t>(order_.size()),
                                   plan.empty ? nullptr : region, &VideoField::sink, this, reason,
                                   sizeof reason);
    } else {
      rc = plugin_.video_read(video.handle, first, count, stride, plan.empty ? nullptr : region,
                              &VideoField::sink, this, reason, sizeof reason);
    }
    if (error_) std::rethrow_exception(error_);
    if (rc) throw_plugin_error(rc, reason);
    for (int64_t t = 0; t < T; ++t) {
      if (t < length && wanted_[static_cast<size_t>(t)] < 0) continue;  // rendered
      if (t < length)
        throw Error(ErrorCode::kCorruptData, "the video ended before frame " +
                                                 std::to_string(wanted_[static_cast<size_t>(t)]));
      std::memset(pixels_ + static_cast<size_t>(t) * frame_bytes_, 0, frame_bytes_);
      timestamps_[t] = -1.0;
    }
    std::memcpy(out[2], &length, sizeof length);
    const int64_t elapsed = monotonic_ns() - t0;
    times.decode_ns += elapsed - (times.transform_ns - transform_before);
  }

 private:
  // fps: the clip's output times 1/fps apart from a start drawn so that the clip fits in the
  // stream (first frame to last frame's time), each given the source frame nearest it in
  // presentation time. A stream shorter than the clip: short_clip (a loop goes on from the
  // first frame's time after the stream's duration). Returns how many output frames are real.
  int64_t plan_by_time(void* handle, const StokerVideoInfo& info, int64_t T, KeyedRandom& rng) {
    std::vector<double> times(static_cast<size_t>(info.frames));  // at most max_frames
    char reason[kReasonBytes] = {};
    if (int rc = plugin_.video_times(handle, times.data(), info.frames, reason, sizeof reason))
      throw_plugin_error(rc, reason);
    const double step = 1.0 / options_.fps, span = static_cast<double>(T - 1) * step;
    const double last = times.back();
    auto nearest = [&](double t) {
      const auto it = std::lower_bound(times.begin(), times.end(), t);
      if (it == times.begin()) return int64_t{0};
      if (it == times.end()) return info.frames - 1;
      // The earlier frame on a tie: times 1/fps apart land exactly between two frames (0.1 s
      // between 0.08 and 0.12 at 25 fps), up to rounding, so within a nanosecond is a tie.
      const auto before = it - 1;
      return static_cast<int64_t>((t - *before <= *it - t + 1e-9 ? before : it) - times.begin());
    };
    int64_t length = T;
    double start = 0.0;
    const bool fits = last + 1e-9 >= span;  // within a nanosecond: VideoBuckets' test
    if (fits) {
      start = draw_start<double>(options_.start, last, span, rng);
    } else {
      switch (options_.short_clip) {
        case ShortClip::kSkip:
          throw SkipSample{"a clip of " + std::to_string(span) + " s from a video of " +
                           std::to_string(last) + " s between its first and last frames"};
        case ShortClip::kPad:
          length = static_cast<int64_t>(std::floor(last / step + 1e-9)) + 1;
          break;
        case ShortClip::kLoop: break;
      }
    }
    // A loop's period: the stream's duration (to its last frame's end), or one step past its last
    // frame where the container states none.
    const double period = info.duration_seconds > last ? info.duration_seconds : last + step;
    for (int64_t t = 0; t < length; ++t) {
      double at = start + static_cast<double>(t) * step;
      if (!fits && options_.short_clip == ShortClip::kLoop) at = std::fmod(at, period);
      wanted_[static_cast<size_t>(t)] = nearest(at);
    }
    return length;
  }

  const StokerMediaPlugin& plugin_;
  VideoOptions options_;
  int field_;
  StokerMediaLimits limits_{};
  size_t frame_bytes_ = 0;
  ImageRenderer renderer_;
  std::vector<int64_t> wanted_;
  std::vector<int64_t> order_;  // fps: the frames to read, sorted
  // The read under way (the sink's state).
  Geometry clip_geometry_;
  uint8_t* pixels_ = nullptr;
  double* timestamps_ = nullptr;
  FieldTimes* times_ = nullptr;
  std::exception_ptr error_;

  // Renders a decoded frame into every place of the clip that shows it (a looped clip shows a
  // frame more than once: rendered once, copied after), marking each place done (-1).
  static int sink(void* context, int64_t index, double seconds, const uint8_t* rgb, int32_t width,
                  int32_t height, char* error, size_t error_size) {
    auto* self = static_cast<VideoField*>(context);
    try {
      return self->take(index, seconds, rgb, width, height);
    } catch (...) {
      self->error_ = std::current_exception();
      std::snprintf(error, error_size, "stopped by the Video field");
      return static_cast<int>(ErrorCode::kInternal);
    }
  }

  int take(int64_t index, double seconds, const uint8_t* rgb, int width, int height) {
    const uint8_t* rendered = nullptr;
    for (size_t t = 0; t < wanted_.size(); ++t) {
      if (wanted_[t] != index) continue;
      uint8_t* dst = pixels_ + t * frame_bytes_;
      if (rendered) {
        std::memcpy(dst, rendered, frame_bytes_);
      } else {
        // Only the clip's region of the frame was converted, for the size the stream states.
        if (width != clip_geometry_.source_width || height != clip_geometry_.source_height)
          throw Error(ErrorCode::kUnsupported,
                      "a frame of " + std::to_string(width) + "x" + std::to_string(height) +
                          " in a stream of " + std::to_string(clip_geometry_.source_width) + "x" +
                          std::to_string(clip_geometry_.source_height) +
                          ": videos whose frames change size are not read");
        const Geometry& g = clip_geometry_;
        renderer_.open_raw(rgb, static_cast<size_t>(width) * height * 3, width, height, 3);
        int64_t decode_ns = 0;
        renderer_.render(g, 3, options_.fill, false, dst, decode_ns, times_->transform_ns);
        times_->transform_ns += decode_ns;  // copying the frame's region: part of the transform
        rendered = dst;
      }
      timestamps_[t] = seconds;
      wanted_[t] = -1;
    }
    return 0;
  }
};

class AudioField final : public FieldDecoder {
 public:
  AudioField(const FieldSpec& spec, int field)
      : plugin_(require_plugin(FieldKind::kAudio)), options_(spec.audio), field_(field) {
    samples_ = options_.samples();
    // What one read may decode: the window at the file's rate (up to max_sample_rate), half a
    // second of lead-in, what the resampler's filter reaches on both sides (a few hundred
    // samples of the lower rate: within another second at rates of 1 kHz and more), all
    // channels, float32.
    const int64_t bytes = (samples_ * options_.limits.max_sample_rate / options_.sample_rate +
                           2 * options_.limits.max_sample_rate) *
                          4 * std::min<int64_t>(options_.limits.max_channels, 8);
    limits_ = plugin_limits(options_.limits, std::max<int64_t>(bytes, int64_t{64} << 20));
  }

  void decode(const uint8_t* data, size_t size, const SampleContext& c, Geometry&,
              uint8_t* const* out, std::string*, FieldTimes& times) override {
    const int64_t t0 = monotonic_ns();
    char reason[kReasonBytes] = {};
    Handle audio{nullptr, plugin_.audio_close};
    StokerAudioInfo info{};
    if (int rc =
            plugin_.audio_open(data, size, &limits_, &audio.handle, &info, reason, sizeof reason))
      throw_plugin_error(rc, reason);
    const int channels = options_.channels;
    if (channels != 1 && channels != info.channels)
      throw Error(ErrorCode::kUnsupported, "an audio of " + std::to_string(info.channels) +
                                               " channels read as " + std::to_string(channels) +
                                               ": channels is 1 (their mean) or the file's own");
    // The window starts on the output rate's grid, in the stream resampled as a whole: `first`
    // output samples from its start (as media::resampled_frames counts them).
    KeyedRandom rng = media_random(c, field_);
    const auto whole =
        static_cast<int64_t>((static_cast<unsigned __int128>(std::max<int64_t>(info.frames, 0)) *
                                  2 * static_cast<unsigned>(options_.sample_rate) +
                              static_cast<unsigned>(info.sample_rate)) /
                             (2 * static_cast<unsigned __int128>(info.sample_rate)));
    const int64_t first = draw_start<int64_t>(options_.start, whole, samples_, rng);
    auto* samples = reinterpret_cast<float*>(out[0]);
    int64_t frames = 0;
    if (int rc = plugin_.audio_read(audio.handle, first, samples_, options_.sample_rate, channels,
                                    samples, &frames, reason, sizeof reason))
      throw_plugin_error(rc, reason);
    frames = std::clamp<int64_t>(frames, 0, samples_);
    for (int ch = 0; ch < channels; ++ch)
      std::fill(samples + ch * samples_ + frames, samples + (ch + 1) * samples_, 0.0f);
    std::memcpy(out[1], &frames, sizeof frames);
    times.decode_ns += monotonic_ns() - t0;
  }

 private:
  const StokerMediaPlugin& plugin_;
  AudioOptions options_;
  int field_;
  int64_t samples_ = 0;
  StokerMediaLimits limits_{};
};

}  // namespace

std::unique_ptr<FieldDecoder> make_video_decoder(const FieldSpec& spec, int field) {
  return std::make_unique<VideoField>(spec, field);
}

std::unique_ptr<FieldDecoder> make_audio_decoder(const FieldSpec& spec, int field) {
  return std::make_unique<AudioField>(spec, field);
}

}  // namespace detail

}  // namespace stoker::fields
