#include "stoker/media/audio.h"

extern "C" {
#include <libavutil/opt.h>
#include <libswresample/swresample.h>
}

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <span>
#include <utility>

#include "media/av_input.h"
#include "media/wav.h"
#include "stoker/core/error.h"

namespace stoker::media {

using detail::CodecPtr;
using detail::FramePtr;
using detail::PacketPtr;
using detail::throw_av;

namespace {

// How far soxr's filter (python-soxr's HQ: 20 bits, linear phase) reaches on each side of an
// output sample, in samples of the lower of the two rates, with a margin: a window resampled
// with 128 of them on both sides equals the whole stream resampled within 2e-7 (48 and 44.1 kHz
// to 16 kHz, 16 kHz to 48 kHz; 64 of them: within 2e-5). 256 of 16 kHz on each side, and up to
// 441 samples of 44.1 kHz to reach the grid, are 42 ms more of the recording a window: within
// the measurement's noise of its cost (benchmarks/media.py --audio-context).
constexpr int64_t kResamplerReach = 256;

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
  rc = swr_alloc_set_opts2(&raw, &layout, AV_SAMPLE_FMT_FLTP, out_rate, &layout, in_format, in_rate,
                           0, nullptr);
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
  std::optional<detail::PcmWav> wav;         // a PCM WAV, read directly (media/wav.h)
  std::optional<detail::MemoryInput> input;  // anything else, through FFmpeg
  CodecPtr codec;
  int stream = -1;
  AVRational time_base{0, 1};
  // Where the stream's first sample lies on its time line, in samples: its first frame's time
  // plus the samples the decoder drops there (mp3's encoder delay, Opus' pre-skip). A frame's
  // samples are placed by their time less this.
  int64_t origin = 0;
  // What FFmpeg's trimming of the stream's last frame counts too many: FFmpeg 5.1 times some
  // Ogg Vorbis streams (those whose start its demuxer leaves unknown) a short block late, their
  // first frame at 128 or 256, and trims their end by as many samples more than libvorbis
  // does (or, past the last frame's length, not at all).
  int64_t trim_excess = 0;
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
      info.frames = wav->frames;
      info.duration_seconds = static_cast<double>(wav->frames) / wav->sample_rate;
      check_info();
      return;
    }
    input.emplace(data, l, AVMEDIA_TYPE_AUDIO);
    stream = input->stream();
    codec = new_decoder();
    const AVStream* s = input->format()->streams[stream];
    time_base = s->time_base;
    STOKER_CHECK(time_base.num > 0 && time_base.den > 0, ErrorCode::kCorruptData,
                 "an audio stream without a time base");
    info.sample_rate = codec->sample_rate;
    info.channels = codec->ch_layout.nb_channels;
    info.codec = codec->codec->name;
    if (s->duration != AV_NOPTS_VALUE) {
      info.duration_seconds = static_cast<double>(s->duration) * av_q2d(time_base);
    } else if (input->format()->duration != AV_NOPTS_VALUE) {
      info.duration_seconds = static_cast<double>(input->format()->duration) / AV_TIME_BASE;
    }
    check_info();
    // The samples the decoder gives: the stated duration less the encoder's padding the
    // decoder drops (Opus' pre-skip); mp3's encoder delay and padding (the LAME header's) FFmpeg
    // 5.1 counts in the stream's duration and states nowhere else.
    if (s->duration != AV_NOPTS_VALUE && s->duration > 0) {
      info.frames = av_rescale_q(s->duration, time_base, AVRational{1, info.sample_rate});
    } else if (info.duration_seconds > 0) {
      info.frames = std::llround(info.duration_seconds * info.sample_rate);
    }
    const AVCodecParameters* p = s->codecpar;
    info.frames = std::max<int64_t>(
        0, info.frames - std::max(p->initial_padding, 0) - std::max(p->trailing_padding, 0));
    const int64_t start = s->start_time != AV_NOPTS_VALUE ? samples_at(s->start_time) : 0;
    origin = start;
    if (input->next_frame(codec.get(), packet.get(), frame.get(), "audio")) {
      if (frame->best_effort_timestamp != AV_NOPTS_VALUE) {
        origin = samples_at(frame->best_effort_timestamp) + skipped(*frame).first;
        trim_excess = std::max<int64_t>(0, origin - start);
      }
      av_frame_unref(frame.get());
    }
  }

  // A decoder that leaves the samples to drop to us (skipped()), so that the end's trimming can
  // be corrected by trim_excess.
  CodecPtr new_decoder() const { return input->new_decoder(1, AV_CODEC_FLAG2_SKIP_MANUAL); }

  // `pts` (in the stream's time base) in samples.
  int64_t samples_at(int64_t pts) const {
    return av_rescale_q(pts, time_base, AVRational{1, info.sample_rate});
  }

  // The samples of `f` to drop at its start and at its end, as the demuxer asks (the encoder's
  // delay and padding; mp3's from its LAME header, Ogg's from the last page's granule).
  static std::pair<int64_t, int64_t> skipped(const AVFrame& f) {
    const AVFrameSideData* d = av_frame_get_side_data(&f, AV_FRAME_DATA_SKIP_SAMPLES);
    if (d == nullptr || d->size < 8) return {0, 0};
    const auto le32 = [](const uint8_t* b) {
      return int64_t{b[0]} | int64_t{b[1]} << 8 | int64_t{b[2]} << 16 | int64_t{b[3]} << 24;
    };
    return {le32(d->data), le32(d->data + 4)};
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
    STOKER_CHECK(
        std::isfinite(info.duration_seconds) && info.duration_seconds <= limits.max_seconds,
        ErrorCode::kResourceLimit,
        "the audio is longer than max_seconds (" + std::to_string(limits.max_seconds) + ")");
  }

  // The container opened afresh and a new decoder (no state of an earlier read carries over),
  // positioned at the packet before `sample` (<= 0: the stream's start).
  void seek_before(int64_t sample) {
    input->reopen();
    codec = new_decoder();
    if (sample <= 0) return;
    const int64_t ts = av_rescale_q(origin + sample, AVRational{1, info.sample_rate}, time_base);
    const int rc = av_seek_frame(input->format(), stream, ts, AVSEEK_FLAG_BACKWARD);
    if (rc < 0) throw_av(rc, "cannot seek in the audio");
  }

  // Decodes from the current position into `planes` the samples [first, first + count) (count
  // < 0: to the end). From the stream's start (`from_start`), the first sample kept is the
  // stream's first (at `origin`: a window from 0 of an Ogg Vorbis stream timed late was read
  // as empty when its first frame's time placed it). After a seek, the frames' times place the
  // samples: false if the first frame has none, or the samples start after `first`.
  bool decode(int64_t first, int64_t count, bool from_start,
              std::vector<std::vector<float>>& planes) {
    const int channels = info.channels;
    planes.assign(static_cast<size_t>(channels), {});
    SwrPtr convert;
    AVSampleFormat converting = AV_SAMPLE_FMT_NONE;
    std::vector<float> buffer;
    const int64_t end = count < 0 ? INT64_MAX : first + count;
    const int64_t most = limits.max_decoded_bytes / (4 * int64_t{channels});
    int64_t position = 0;      // of the next sample kept, once placed
    bool placed = from_start;  // whether `position` is known
    int64_t carried = 0;       // samples still to drop at the start (a delay over one frame)
    // After a seek, until placed: every sample kept goes to `planes` (`held` of them), each
    // frame saying, by its time, where the first of them lies. FFmpeg 5.1 times a Vorbis frame
    // that follows a long block with a short one 448 samples late (and the next one right, in
    // the same streams a sequential decode counts right): the first two frames that agree
    // place them, or the earliest any of the first kPlacingFrames says.
    constexpr int kPlacingFrames = 4;
    int64_t held = 0, start = 0;
    int frames_seen = 0;
    bool agreed = false;
    while (!placed || position < end) {
      if (!input->next_frame(codec.get(), packet.get(), frame.get(), "audio")) break;
      STOKER_CHECK(
          frame->ch_layout.nb_channels == channels && frame->sample_rate == info.sample_rate,
          ErrorCode::kUnsupported, "an audio stream that changes its format midway");
      const int64_t pts = frame->best_effort_timestamp;
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
      // The samples kept: [head, tail) of the frame's.
      const auto [drop_head, drop_tail] = skipped(*frame);
      const int64_t head = std::min<int64_t>(drop_head + carried, got);
      carried = drop_head + carried - head;
      const int64_t tail = got - std::clamp<int64_t>(drop_tail - trim_excess, 0, got - head);
      // Where this frame's samples go: all of them while unplaced, else those in the window.
      const int64_t at = placed ? position : 0;
      const int64_t from = placed ? std::max<int64_t>(first, at) : 0;
      const int64_t to = placed ? std::min<int64_t>(end, at + (tail - head)) : tail - head;
      if (to > from) {
        STOKER_CHECK(static_cast<int64_t>(planes[0].size()) + (to - from) <= most,
                     ErrorCode::kResourceLimit,
                     "the audio window is over max_decoded_bytes (" +
                         std::to_string(limits.max_decoded_bytes) + ")");
        for (int c = 0; c < channels; ++c) {
          const float* p = buffer.data() + size_t(c) * n + head + (from - at);
          planes[static_cast<size_t>(c)].insert(planes[static_cast<size_t>(c)].end(), p,
                                                p + (to - from));
        }
      }
      av_frame_unref(frame.get());
      if (placed) {
        position += tail - head;
        continue;
      }
      if (pts == AV_NOPTS_VALUE) return false;
      const int64_t says = samples_at(pts) + head - origin - held;
      agreed = frames_seen > 0 && says == start;
      start = frames_seen == 0 ? says : std::min(start, says);
      held += tail - head;
      if (agreed || ++frames_seen == kPlacingFrames) {
        if (!place(start, held, first, end, planes)) return false;
        position = start + held;
        placed = true;
      }
    }
    return placed || (frames_seen > 0 && place(start, held, first, end, planes));
  }

  // The `held` samples in `planes`, from position `start`, cut to [first, end): false if they
  // start after `first`.
  static bool place(int64_t start, int64_t held, int64_t first, int64_t end,
                    std::vector<std::vector<float>>& planes) {
    if (start > first) return false;
    const int64_t keep_from = std::min(held, first - start);
    const int64_t keep_to = std::clamp<int64_t>(end - start, keep_from, held);
    for (auto& p : planes) {
      p.resize(static_cast<size_t>(keep_to));
      p.erase(p.begin(), p.begin() + keep_from);
    }
    return true;
  }
};

AudioReader::AudioReader(std::span<const uint8_t> bytes, const MediaLimits& limits)
    : state_(std::make_unique<State>(bytes, limits)) {}

AudioReader::~AudioReader() = default;

const AudioInfo& AudioReader::info() const { return state_->info; }

int64_t resampled_frames(int64_t frames, int from, int to) {
  return av_rescale_rnd(frames, to, from, AV_ROUND_NEAR_INF);
}

int64_t AudioReader::read(int64_t first, int64_t count, int sample_rate, int channels,
                          std::vector<float>& out, bool context) {
  State& s = *state_;
  const int rate = s.info.sample_rate;
  STOKER_CHECK(sample_rate >= 0 && sample_rate <= s.limits.max_sample_rate,
               ErrorCode::kInvalidArgument,
               "sample_rate " + std::to_string(sample_rate) + " is out of range");
  STOKER_CHECK(channels == 0 || channels == 1 || channels == s.info.channels,
               ErrorCode::kInvalidArgument,
               "channels: 0 (the file's " + std::to_string(s.info.channels) +
                   "), 1 (their mean) or the file's own count");
  STOKER_CHECK(first >= 0, ErrorCode::kInvalidArgument, "an audio window starts at a sample >= 0");
  const int to = sample_rate == 0 ? rate : sample_rate;
  // A window past what any stream within the limits holds is empty (and its sums cannot
  // overflow below).
  const auto most = static_cast<int64_t>(std::min(s.limits.max_seconds * to + 1, 1e15));
  if (first >= most) first = most;
  if (count >= 0) count = std::min(count, most);
  // The file's samples [from, until) (until < 0: to the end) go through the resampler: the
  // window's and, on both sides, those its filter reaches; `from` on the output grid (from * to
  // / rate a whole number), so that the resampler's output k is the whole stream's skip + k.
  int64_t from = first, until = count < 0 ? -1 : first + count, skip = 0;
  if (to != rate && !context) {
    from = av_rescale_rnd(first, rate, to, AV_ROUND_NEAR_INF);
    if (count >= 0) until = from + av_rescale_rnd(count, rate, to, AV_ROUND_NEAR_INF);
  } else if (to != rate) {
    const int64_t g = std::gcd(rate, to), period = rate / g;
    const int64_t reach = (kResamplerReach * rate + std::min(rate, to) - 1) / std::min(rate, to);
    const int64_t needed = av_rescale_rnd(first, rate, to, AV_ROUND_DOWN) - reach;
    const int64_t block = needed > 0 ? needed / period : 0;
    from = block * period;
    skip = first - block * (to / g);
    if (count >= 0) until = av_rescale_rnd(first + count, rate, to, AV_ROUND_UP) + reach;
  }
  const int64_t span = until < 0 ? -1 : until - from;
  std::vector<std::vector<float>> planes;
  if (s.wav) {
    const int64_t end = span < 0 ? s.wav->frames : std::min(s.wav->frames, from + span);
    STOKER_CHECK(
        std::max<int64_t>(0, end - from) * 4 * s.info.channels <= s.limits.max_decoded_bytes,
        ErrorCode::kResourceLimit,
        "the audio window is over max_decoded_bytes (" +
            std::to_string(s.limits.max_decoded_bytes) + ")");
    detail::read_pcm_wav(*s.wav, s.bytes, from, span, planes);
  } else {
    // From half a second before the samples (a decoder's state, mp3's bit reservoir, settles
    // by then); if the stream's seek lands after that, from the stream's start.
    const int64_t lead_in = from - rate / 2;
    if (!(lead_in > 0 && (s.seek_before(lead_in), s.decode(from, span, false, planes)))) {
      s.seek_before(0);
      s.decode(from, span, true, planes);
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
  if (to == rate || frames == 0) {
    out.resize(static_cast<size_t>(frames) * static_cast<size_t>(out_channels));
    for (int c = 0; c < out_channels; ++c) {
      std::copy(planes[size_t(c)].begin(), planes[size_t(c)].end(), out.begin() + c * frames);
    }
    return frames;
  }
  AVChannelLayout layout;
  av_channel_layout_default(&layout, out_channels);
  SwrPtr swr = make_swr(layout, AV_SAMPLE_FMT_FLTP, rate, to, true);
  av_channel_layout_uninit(&layout);
  // What the resampler makes of these samples: as many as of the whole stream from `from` on
  // (where they end at the stream's end; else more than the window needs).
  const int64_t wanted = resampled_frames(frames, rate, to);
  const int64_t capacity = wanted + 64;
  STOKER_CHECK(capacity * 4 * out_channels <= s.limits.max_decoded_bytes, ErrorCode::kResourceLimit,
               "the resampled window is over max_decoded_bytes");
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
      outs[size_t(c)] = reinterpret_cast<uint8_t*>(resampled.data() + size_t(c) * capacity + made);
    }
    const int more =
        swr_convert(swr.get(), outs.data(), static_cast<int>(capacity - made), nullptr, 0);
    if (more < 0) throw_av(more, "cannot resample the audio");
    if (more == 0) break;
    made += more;
  }
  const int64_t available = std::max<int64_t>(0, std::min(made, wanted) - skip);
  const int64_t n = count < 0 ? available : std::min(count, available);
  out.resize(static_cast<size_t>(n) * static_cast<size_t>(out_channels));
  for (int c = 0; c < out_channels; ++c) {
    const float* p = resampled.data() + size_t(c) * capacity + skip;
    std::copy(p, p + n, out.begin() + c * n);
  }
  return n;
}

}  // namespace stoker::media
