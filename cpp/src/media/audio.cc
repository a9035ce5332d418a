#include "stoker/media/audio.h"

extern "C" {
#include <libavutil/opt.h>
#include <libswresample/swresample.h>
}

#include <algorithm>
#include <cmath>
#include <optional>
#include <span>

#include "media/av_input.h"
#include "media/wav.h"
#include "stoker/core/error.h"

namespace stoker::media {

using detail::CodecPtr;
using detail::FramePtr;
using detail::PacketPtr;
using detail::throw_av;

namespace {

struct SwrFreer {
  void operator()(SwrContext* s) const { swr_free(&s); }
};
using SwrPtr = std::unique_ptr<SwrContext, SwrFreer>;

// A resampler (or, at one rate, a converter) to planar float32 with `channels` channels.
SwrPtr make_swr(const AVChannelLayout& in_layout, AVSampleFormat in_format, int in_rate,
                int out_rate, bool soxr) {
  SwrContext* raw = nullptr;
  AVChannelLayout layout{};  // FFmpeg 5's signature takes it mutable
  int rc = av_channel_layout_copy(&layout, &in_layout);
  if (rc < 0) throw_av(rc, "cannot set up the audio conversion");
  rc = swr_alloc_set_opts2(&raw, &layout, AV_SAMPLE_FMT_FLTP, out_rate, &layout, in_format,
                           in_rate, 0, nullptr);
  av_channel_layout_uninit(&layout);
  SwrPtr swr(raw);
  if (rc < 0) throw_av(rc, "cannot set up the audio conversion");
  if (soxr) {
    // python-soxr's default quality (HQ): soxr at 20 bits of precision.
    av_opt_set(swr.get(), "resampler", "soxr", 0);
    av_opt_set_int(swr.get(), "precision", 20, 0);
  }
  if (rc = swr_init(swr.get()); rc < 0) throw_av(rc, "cannot set up the audio conversion");
  return swr;
}

}  // namespace

struct AudioReader::State {
  MediaLimits limits;
  std::span<const uint8_t> bytes;
  std::optional<detail::PcmWav> wav;  // a PCM WAV, read directly (media/wav.h)
  std::optional<detail::MemoryInput> input;  // anything else, through FFmpeg
  CodecPtr codec;
  int stream = -1;
  AVRational time_base{0, 1};
  int64_t start_pts = 0;
  AudioInfo info;
  PacketPtr packet{av_packet_alloc()};
  FramePtr frame{av_frame_alloc()};

  State(std::span<const uint8_t> data, const MediaLimits& l)
      : limits(l), bytes(data), wav(detail::parse_pcm_wav(data)) {
    STOKER_CHECK(packet && frame, ErrorCode::kResourceLimit, "out of memory for a decoder");
    if (wav) {
      info.sample_rate = wav->sample_rate;
      info.channels = wav->channels;
      info.codec = wav->codec;
      info.duration_seconds = static_cast<double>(wav->frames) / wav->sample_rate;
      check_info();
      return;
    }
    input.emplace(data, l, AVMEDIA_TYPE_AUDIO);
    stream = input->stream();
    codec = input->new_decoder(1);
    const AVStream* s = input->format()->streams[stream];
    time_base = s->time_base;
    STOKER_CHECK(time_base.num > 0 && time_base.den > 0, ErrorCode::kCorruptData,
                 "an audio stream without a time base");
    start_pts = s->start_time != AV_NOPTS_VALUE ? s->start_time : 0;
    info.sample_rate = codec->sample_rate;
    info.channels = codec->ch_layout.nb_channels;
    info.codec = codec->codec->name;
    if (s->duration != AV_NOPTS_VALUE) {
      info.duration_seconds = static_cast<double>(s->duration) * av_q2d(time_base);
    } else if (input->format()->duration != AV_NOPTS_VALUE) {
      info.duration_seconds = static_cast<double>(input->format()->duration) / AV_TIME_BASE;
    }
    check_info();
  }

  // The stream as the decoder (or the wav header) states it, within the limits.
  void check_info() const {
    STOKER_CHECK(info.sample_rate > 0 && info.channels > 0, ErrorCode::kCorruptData,
                 "an audio stream without a sample rate or channels");
    STOKER_CHECK(info.sample_rate <= limits.max_sample_rate, ErrorCode::kResourceLimit,
                 "an audio sample rate of " + std::to_string(info.sample_rate) +
                     " Hz is over max_sample_rate (" + std::to_string(limits.max_sample_rate) +
                     ")");
    STOKER_CHECK(info.channels <= limits.max_channels, ErrorCode::kResourceLimit,
                 std::to_string(info.channels) + " audio channels are over max_channels (" +
                     std::to_string(limits.max_channels) + ")");
    STOKER_CHECK(std::isfinite(info.duration_seconds) &&
                     info.duration_seconds <= limits.max_seconds,
                 ErrorCode::kResourceLimit,
                 "the audio is longer than max_seconds (" + std::to_string(limits.max_seconds) +
                     ")");
  }

  // The container opened afresh and a new decoder (no state of an earlier read carries over),
  // positioned at the packet before `sample` (<= 0: the stream's start).
  void seek_before(int64_t sample) {
    input->reopen();
    codec = input->new_decoder(1);
    if (sample <= 0) return;
    const int64_t ts = start_pts + av_rescale_q(sample, AVRational{1, info.sample_rate}, time_base);
    const int rc = av_seek_frame(input->format(), stream, ts, AVSEEK_FLAG_BACKWARD);
    if (rc < 0) throw_av(rc, "cannot seek in the audio");
  }

  // Decodes from the current position into `planes` the samples [first, first + count) (count
  // < 0: to the end); false if the first frame decoded starts after `first`, or, after a seek
  // (`from_start` false), has no time to place it by.
  bool decode(int64_t first, int64_t count, bool from_start,
              std::vector<std::vector<float>>& planes) {
    const int channels = info.channels;
    planes.assign(static_cast<size_t>(channels), {});
    SwrPtr convert;
    AVSampleFormat converting = AV_SAMPLE_FMT_NONE;
    std::vector<float> buffer;
    int64_t position = 0;  // of the next frame's first sample
    bool placed = false;    // whether the first frame's time has set `position`
    const int64_t end = count < 0 ? INT64_MAX : first + count;
    const int64_t most = limits.max_decoded_bytes / (4 * int64_t{channels});
    while (position < end) {
      if (!input->next_frame(codec.get(), packet.get(), frame.get(), "audio")) break;
      STOKER_CHECK(frame->ch_layout.nb_channels == channels &&
                       frame->sample_rate == info.sample_rate,
                   ErrorCode::kUnsupported, "an audio stream that changes its format midway");
      const int64_t pts = frame->best_effort_timestamp;
      if (!placed) {  // the first frame decoded: where it starts
        if (pts == AV_NOPTS_VALUE && !from_start) {
          av_frame_unref(frame.get());
          return false;
        }
        // A frame whose leading samples the decoder skipped (mp3's encoder delay) keeps its
        // packet's time, before the stream's start: its samples are the stream's first.
        position = pts == AV_NOPTS_VALUE
                       ? 0
                       : std::max<int64_t>(0, av_rescale_q(pts - start_pts, time_base,
                                                           AVRational{1, info.sample_rate}));
        placed = true;
        if (position > first) {
          av_frame_unref(frame.get());
          return false;
        }
      }
      const auto format = static_cast<AVSampleFormat>(frame->format);
      if (!convert || format != converting) {
        convert = make_swr(frame->ch_layout, format, info.sample_rate, info.sample_rate, false);
        converting = format;
      }
      const int n = frame->nb_samples;
      buffer.resize(static_cast<size_t>(n) * static_cast<size_t>(channels));
      std::vector<uint8_t*> out(static_cast<size_t>(channels));
      for (int c = 0; c < channels; ++c) {
        out[static_cast<size_t>(c)] = reinterpret_cast<uint8_t*>(buffer.data() + size_t(c) * n);
      }
      const int got = swr_convert(convert.get(), out.data(), n,
                                  const_cast<const uint8_t**>(frame->extended_data), n);
      if (got < 0) throw_av(got, "cannot convert the audio");
      const int64_t from = std::max<int64_t>(first, position);
      const int64_t to = std::min<int64_t>(end, position + got);
      if (to > from) {
        STOKER_CHECK(static_cast<int64_t>(planes[0].size()) + (to - from) <= most,
                     ErrorCode::kResourceLimit,
                     "the audio window is over max_decoded_bytes (" +
                         std::to_string(limits.max_decoded_bytes) + ")");
        for (int c = 0; c < channels; ++c) {
          const float* p = buffer.data() + size_t(c) * n + (from - position);
          planes[static_cast<size_t>(c)].insert(planes[static_cast<size_t>(c)].end(), p,
                                                p + (to - from));
        }
      }
      position += got;
      av_frame_unref(frame.get());
    }
    return true;
  }
};

AudioReader::AudioReader(std::span<const uint8_t> bytes, const MediaLimits& limits)
    : state_(std::make_unique<State>(bytes, limits)) {}

AudioReader::~AudioReader() = default;

const AudioInfo& AudioReader::info() const { return state_->info; }

int64_t AudioReader::read(double start, double seconds, int sample_rate, int channels,
                          std::vector<float>& out) {
  State& s = *state_;
  const int rate = s.info.sample_rate;
  STOKER_CHECK(std::isfinite(start) && start >= 0 && std::isfinite(seconds),
               ErrorCode::kInvalidArgument, "an audio window starts at a time >= 0");
  STOKER_CHECK(sample_rate >= 0 && sample_rate <= s.limits.max_sample_rate,
               ErrorCode::kInvalidArgument,
               "sample_rate " + std::to_string(sample_rate) + " is out of range");
  STOKER_CHECK(channels == 0 || channels == 1 || channels == s.info.channels,
               ErrorCode::kInvalidArgument,
               "channels: 0 (the file's " + std::to_string(s.info.channels) +
                   "), 1 (their mean) or the file's own count");
  const auto first = static_cast<int64_t>(std::llround(start * rate));
  const int64_t count = seconds < 0 ? -1 : static_cast<int64_t>(std::llround(seconds * rate));
  std::vector<std::vector<float>> planes;
  if (s.wav) {
    const int64_t wanted = count < 0 ? s.wav->frames : std::min(count, s.wav->frames);
    STOKER_CHECK(wanted * 4 * s.info.channels <= s.limits.max_decoded_bytes,
                 ErrorCode::kResourceLimit,
                 "the audio window is over max_decoded_bytes (" +
                     std::to_string(s.limits.max_decoded_bytes) + ")");
    detail::read_pcm_wav(*s.wav, s.bytes, first, count, planes);
  } else {
    // From half a second before the window (a decoder's state, mp3's bit reservoir, settles
    // by its start); if the stream's seek lands after that, from the stream's start.
    const int64_t lead_in = first - rate / 2;
    if (!(lead_in > 0 && (s.seek_before(lead_in), s.decode(first, count, false, planes)))) {
      s.seek_before(0);
      s.decode(first, count, true, planes);
    }
  }
  const auto frames = static_cast<int64_t>(planes[0].size());
  // A float format can hold NaN and infinities, which would reach the model as they are (and
  // through the resampler into every sample near them): a sample that is not finite is an error.
  for (const auto& plane : planes) {
    STOKER_CHECK(std::all_of(plane.begin(), plane.end(), [](float v) { return std::isfinite(v); }),
                 ErrorCode::kCorruptData, "audio samples that are not finite numbers (NaN or Inf)");
  }
  if (channels == 1 && s.info.channels > 1) {  // the mean, as numpy's x.mean(axis=0)
    std::vector<float> mean(static_cast<size_t>(frames));
    for (int64_t i = 0; i < frames; ++i) {
      double sum = 0;
      for (const auto& p : planes) sum += p[static_cast<size_t>(i)];
      mean[static_cast<size_t>(i)] = static_cast<float>(sum / static_cast<double>(planes.size()));
    }
    planes.assign(1, std::move(mean));
  }
  const int out_channels = static_cast<int>(planes.size());
  if (sample_rate == 0 || sample_rate == rate || frames == 0) {
    out.resize(static_cast<size_t>(frames) * static_cast<size_t>(out_channels));
    for (int c = 0; c < out_channels; ++c) {
      std::copy(planes[size_t(c)].begin(), planes[size_t(c)].end(), out.begin() + c * frames);
    }
    return frames;
  }
  AVChannelLayout layout;
  av_channel_layout_default(&layout, out_channels);
  SwrPtr swr = make_swr(layout, AV_SAMPLE_FMT_FLTP, rate, sample_rate, true);
  av_channel_layout_uninit(&layout);
  // The output's length: the input's duration at the new rate, rounded up.
  const int64_t wanted = av_rescale_rnd(frames, sample_rate, rate, AV_ROUND_UP);
  const int64_t capacity = wanted + 64;
  STOKER_CHECK(capacity * 4 * out_channels <= s.limits.max_decoded_bytes,
               ErrorCode::kResourceLimit, "the resampled window is over max_decoded_bytes");
  std::vector<float> resampled(static_cast<size_t>(capacity) * static_cast<size_t>(out_channels));
  std::vector<uint8_t*> outs(static_cast<size_t>(out_channels));
  std::vector<const uint8_t*> ins(static_cast<size_t>(out_channels));
  for (int c = 0; c < out_channels; ++c) {
    outs[size_t(c)] = reinterpret_cast<uint8_t*>(resampled.data() + size_t(c) * capacity);
    ins[size_t(c)] = reinterpret_cast<const uint8_t*>(planes[size_t(c)].data());
  }
  int64_t made = 0;
  const int got = swr_convert(swr.get(), outs.data(), static_cast<int>(capacity), ins.data(),
                              static_cast<int>(frames));
  if (got < 0) throw_av(got, "cannot resample the audio");
  made += got;
  while (made < capacity) {  // what the resampler still holds
    for (int c = 0; c < out_channels; ++c) {
      outs[size_t(c)] =
          reinterpret_cast<uint8_t*>(resampled.data() + size_t(c) * capacity + made);
    }
    const int more = swr_convert(swr.get(), outs.data(), static_cast<int>(capacity - made),
                                 nullptr, 0);
    if (more < 0) throw_av(more, "cannot resample the audio");
    if (more == 0) break;
    made += more;
  }
  const int64_t n = std::min(made, wanted);
  out.resize(static_cast<size_t>(n) * static_cast<size_t>(out_channels));
  for (int c = 0; c < out_channels; ++c) {
    const float* p = resampled.data() + size_t(c) * capacity;
    std::copy(p, p + n, out.begin() + c * n);
  }
  return n;
}

}  // namespace stoker::media
