#include "stoker/media/video.h"

extern "C" {
#include <libavutil/imgutils.h>
#include <libswscale/swscale.h>
}

#include <algorithm>
#include <cmath>
#include <cstring>

#include "media/av_input.h"
#include "media/yuv.h"
#include "stoker/core/error.h"

namespace stoker::media {

using detail::CodecPtr;
using detail::FramePtr;
using detail::PacketPtr;
using detail::throw_av;
using detail::WantedPackets;

namespace {

struct SwsFreer {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};

struct IndexedFrame {
  int64_t pts;  // presentation time, in the stream's time base
  int64_t dts;  // decode time (the pts where the container gives none)
  bool key;
};

// An enum field of FFmpeg's as the int it holds, whatever that is.
template <typename Enum>
int enum_value(const Enum& field) {
  static_assert(sizeof(Enum) == sizeof(int));
  int value;
  std::memcpy(&value, &field, sizeof value);
  return value;
}

}  // namespace

struct VideoReader::State {
  MediaLimits limits;
  detail::MemoryInput input;
  CodecPtr codec;
  int stream = -1;
  AVRational time_base{0, 1};
  std::vector<IndexedFrame> frames;  // presentation order
  // Whether every packet had a presentation time. Where some had none (avi with B-frames), the
  // frames are numbered as the decoder hands them out, from the stream's start: after a seek,
  // an open GOP's first frames would not come out, and the count would slip.
  bool has_pts = true;
  VideoInfo info;
  PacketPtr packet{av_packet_alloc()};
  FramePtr frame{av_frame_alloc()};
  std::unique_ptr<SwsContext, SwsFreer> sws;
  std::vector<uint8_t> rgb;

  int threads = 1;
  int64_t packets_read = 0;  // by the last read_frames

  State(std::span<const uint8_t> bytes, const MediaLimits& l, int decoder_threads)
      : limits(l), input(bytes, l, AVMEDIA_TYPE_VIDEO), threads(decoder_threads) {
    STOKER_CHECK(packet && frame, ErrorCode::kResourceLimit, "out of memory for a decoder");
    stream = input.stream();
    // Frame threads only for large frames: below 1280x720 their hand-offs cost more than they
    // give (640x360 H.264 on 2 cores: 10.6 clips/s with 2 against 11.8 with 1; 1920x1080: 4.55
    // against 4.05, a loader thread each).
    const AVCodecParameters* p = input.format()->streams[stream]->codecpar;
    if (int64_t{p->width} * p->height < int64_t{1280} * 720) threads = 1;
    codec = input.new_decoder(threads);
    const AVStream* s = input.format()->streams[stream];
    time_base = s->time_base;
    STOKER_CHECK(time_base.num > 0 && time_base.den > 0, ErrorCode::kCorruptData,
                 "a video stream without a time base");
    index();
    info.width = codec->width;
    info.height = codec->height;
    STOKER_CHECK(info.width >= 0 && info.height >= 0 &&
                     int64_t{info.width} * info.height <= limits.max_pixels,
                 ErrorCode::kResourceLimit,
                 "video frames of " + std::to_string(info.width) + "x" +
                     std::to_string(info.height) + " are over max_pixels");
    info.frames = static_cast<int64_t>(frames.size());
    info.codec = codec->codec->name;
    const AVRational rate = s->avg_frame_rate;
    info.frames_per_second = rate.num > 0 && rate.den > 0 ? av_q2d(rate) : 0.0;
  }

  // Every packet of the stream, read once without decoding: the frames in presentation order.
  void index() {
    AVFormatContext* format = input.format();
    int64_t last_end = 0;
    while (true) {
      const int rc = av_read_frame(format, packet.get());
      if (rc == AVERROR_EOF) break;
      if (rc < 0) throw_av(rc, "cannot read the container's packets");
      // A packet an mp4 edit list cuts (AV_PKT_FLAG_DISCARD) is decoded as a reference, never
      // shown: it is no frame of the video.
      if (packet->stream_index == stream && !(packet->flags & AV_PKT_FLAG_DISCARD)) {
        if (packet->pts == AV_NOPTS_VALUE) has_pts = false;
        int64_t pts = packet->pts != AV_NOPTS_VALUE ? packet->pts : packet->dts;
        const int64_t dts = packet->dts != AV_NOPTS_VALUE ? packet->dts : pts;
        if (pts == AV_NOPTS_VALUE) {
          // No timestamps at all (some raw streams): number the frames in decode order.
          pts = frames.empty() ? 0 : frames.back().pts + std::max<int64_t>(1, packet->duration);
        }
        STOKER_CHECK(static_cast<int64_t>(frames.size()) < limits.max_frames,
                     ErrorCode::kResourceLimit,
                     "the video has more than max_frames (" + std::to_string(limits.max_frames) +
                         ") frames");
        frames.push_back(
            {pts, dts == AV_NOPTS_VALUE ? pts : dts, (packet->flags & AV_PKT_FLAG_KEY) != 0});
        last_end = std::max(last_end, pts + std::max<int64_t>(0, packet->duration));
      }
      av_packet_unref(packet.get());
    }
    STOKER_CHECK(!frames.empty(), ErrorCode::kCorruptData, "the video stream has no frames");
    std::stable_sort(frames.begin(), frames.end(),
                     [](const IndexedFrame& a, const IndexedFrame& b) { return a.pts < b.pts; });
    if (!std::any_of(frames.begin(), frames.end(), [](const auto& f) { return f.key; })) {
      frames.front().key = true;  // a stream that marks no keyframe: decode from its start
    }
    const double seconds = static_cast<double>(last_end - frames.front().pts) * av_q2d(time_base);
    STOKER_CHECK(
        std::isfinite(seconds) && seconds <= limits.max_seconds, ErrorCode::kResourceLimit,
        "the video is longer than max_seconds (" + std::to_string(limits.max_seconds) + ")");
    info.duration_seconds = std::max(0.0, seconds);
  }

  // Frame `index`'s time from the stream's first frame. Where some packets carry no time (an
  // MPEG program stream gives only some frames a PTS), the index's times are partly decode
  // times, a frame early for reordered pictures: a constant-rate stream's frames are then
  // timed by their number.
  double seconds(int64_t index) const {
    if (!has_pts && info.frames_per_second > 0) {
      return static_cast<double>(index) / info.frames_per_second;
    }
    return static_cast<double>(frames[static_cast<size_t>(index)].pts - frames.front().pts) *
           av_q2d(time_base);
  }

  // MP4 and Matroska: containers whose packets carry their own times (where FFmpeg makes some
  // up, AVFMT_FLAG_GENPTS for MPEG streams, a packet's after a seek may not be the index's) and
  // whose keyframes are sync samples (MPEG-2's open GOPs start with frames that refer to the
  // GOP before).
  bool packets_have_own_times() const { return input.mp4_or_matroska(); }

  // The keyframe at or before frame `index`, and before that, `back` keyframes earlier.
  int64_t keyframe_before(int64_t index, int back) const {
    if (!has_pts) return -1;
    for (int64_t k = index; k >= 0; --k) {
      if (frames[static_cast<size_t>(k)].key && back-- == 0) return k;
    }
    return -1;
  }

  // The container opened afresh and a new decoder (no state of an earlier read carries over),
  // positioned at the keyframe (-1: the stream's start).
  void seek_to(int64_t keyframe) {
    input.reopen();
    codec = input.new_decoder(threads);
    if (keyframe < 0) return;
    // MP4 and Matroska: by the keyframe's presentation time, backward, which lands on it (mkv
    // indexes by presentation time; mp4 by decode time less the edit list's first presentation
    // time, below which the keyframe's decode time falls: a whole GOP earlier, 50 frames of
    // H.264 with B-frames decoded for nothing). Others (MPEG streams, AVI): by its decode time,
    // backward, on it or earlier. A seek that lands after it is caught by decode_targets and
    // tried a keyframe earlier.
    const IndexedFrame& k = frames[static_cast<size_t>(keyframe)];
    const int64_t at = packets_have_own_times() ? k.pts : std::min(k.dts, k.pts);
    const int rc = av_seek_frame(input.format(), stream, at, AVSEEK_FLAG_BACKWARD);
    if (rc < 0) throw_av(rc, "cannot seek in the video");
  }

  // The frame's pixels of `region` (all where it is empty) as RGB in `rgb` (the frame's size):
  // planar 8-bit YUV in BT.601 or BT.709 by yuv_to_rgb, over the region only; anything else
  // (10-bit, RGB, BT.2020, ...) whole, by swscale.
  void convert(const AVFrame* f, const FrameRegion& region) {
    const int w = f->width, h = f->height;
    STOKER_CHECK(w > 0 && h > 0 && int64_t{w} * h <= limits.max_pixels, ErrorCode::kResourceLimit,
                 "a decoded frame of " + std::to_string(w) + "x" + std::to_string(h) +
                     " is over max_pixels");
    rgb.resize(static_cast<size_t>(w) * static_cast<size_t>(h) * 3);
    const auto format = static_cast<AVPixelFormat>(f->format);
    int shift_x = -1, shift_y = 0;
    // The frame's colour fields as ints: a broken stream can put any value in them, which
    // read as their enum types is undefined (found by fuzz_video: a colour space of 65).
    const int space = enum_value(f->colorspace), range = enum_value(f->color_range);
    bool full = range == AVCOL_RANGE_JPEG;
    switch (format) {
      case AV_PIX_FMT_YUVJ420P: full = true; [[fallthrough]];
      case AV_PIX_FMT_YUV420P: shift_x = shift_y = 1; break;
      case AV_PIX_FMT_YUVJ422P: full = true; [[fallthrough]];
      case AV_PIX_FMT_YUV422P: shift_x = 1; break;
      case AV_PIX_FMT_YUVJ444P: full = true; [[fallthrough]];
      case AV_PIX_FMT_YUV444P: shift_x = 0; break;
      default: break;
    }
    const bool bt709 = space == AVCOL_SPC_BT709;
    const bool bt601 = space == AVCOL_SPC_UNSPECIFIED || space == AVCOL_SPC_BT470BG ||
                       space == AVCOL_SPC_SMPTE170M;
    if (shift_x >= 0 && (bt709 || bt601)) {
      int x0 = 0, y0 = 0, x1 = w, y1 = h;
      if (region.x1 > region.x0 && region.y1 > region.y0) {
        x0 = std::clamp(region.x0, 0, w);
        x1 = std::clamp(region.x1, x0, w);
        y0 = std::clamp(region.y0, 0, h);
        y1 = std::clamp(region.y1, y0, h);
      }
      const detail::YuvPlanes planes{f->data[0],     f->data[1],     f->data[2], f->linesize[0],
                                     f->linesize[1], f->linesize[2], w,          h,
                                     shift_x,        shift_y};
      detail::yuv_to_rgb(planes, detail::yuv_matrix(bt709, full), x0, y0, x1, y1, rgb.data(),
                         w * 3);
      return;
    }
    sws.reset(sws_getCachedContext(sws.release(), w, h, format, w, h, AV_PIX_FMT_RGB24,
                                   SWS_BILINEAR | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT, nullptr,
                                   nullptr, nullptr));
    STOKER_CHECK(sws != nullptr, ErrorCode::kUnsupported,
                 std::string("cannot convert frames of pixel format ") +
                     (av_get_pix_fmt_name(format) ? av_get_pix_fmt_name(format) : "unknown"));
    // The frame's own matrix and range (BT.601 and limited range where it states none).
    const int matrix = space == AVCOL_SPC_UNSPECIFIED ? SWS_CS_DEFAULT : space;
    sws_setColorspaceDetails(sws.get(), sws_getCoefficients(matrix), full ? 1 : 0,
                             sws_getCoefficients(SWS_CS_DEFAULT), 1, 0, 1 << 16, 1 << 16);
    uint8_t* planes[4] = {rgb.data(), nullptr, nullptr, nullptr};
    int strides[4] = {w * 3, 0, 0, 0};
    sws_scale(sws.get(), f->data, f->linesize, 0, h, planes, strides);
  }

  enum class Decoded {
    kAll,    // every target handed out
    kLate,   // the first frame decoded comes after the first target: the seek landed too late
    kShort,  // the decoder, drained after the last target's packet, gave out fewer frames
  };

  // Decodes from the current position (frame `start` of the index: counted from there where
  // the stream has no presentation times), handing out the targets from `next` on in order
  // (`next` is left at the first not handed out). With `drain`, no packet is read after the last
  // target's: the decoder is drained (WantedPackets).
  Decoded decode_targets(const std::vector<int64_t>& targets, int64_t start, bool drain,
                         size_t& next, const std::function<void(const RgbFrame&)>& on_frame,
                         const FrameRegion& region) {
    bool first = true;
    // The targets' times: any other frame's packet may be discarded when nothing refers to it,
    // and the decoder drained after the last target's. Only in containers whose packets carry
    // their own times (MP4, Matroska): where FFmpeg makes some up (AVFMT_FLAG_GENPTS: MPEG
    // streams), a packet's after a seek may not be the index's.
    std::vector<int64_t> times;
    for (size_t k = next; k < targets.size(); ++k)
      times.push_back(frames[static_cast<size_t>(targets[k])].pts);
    WantedPackets wanted(std::move(times), drain);
    WantedPackets* by_time = has_pts && packets_have_own_times() ? &wanted : nullptr;
    int64_t number = start;  // of the next frame out, where the stream has no times
    int64_t decoded = 0;
    while (next < targets.size()) {
      if (!input.next_frame(codec.get(), packet.get(), frame.get(), "video", by_time)) break;
      STOKER_CHECK(++decoded <= limits.max_decoded_frames, ErrorCode::kResourceLimit,
                   "the clip needs more than max_decoded_frames (" +
                       std::to_string(limits.max_decoded_frames) +
                       ") frames decoded from its keyframe");
      int64_t pts = frame->best_effort_timestamp;
      if (pts == AV_NOPTS_VALUE) pts = frame->pts;
      if (!has_pts) {  // the frame's number in the index stands for its time
        pts = frames[static_cast<size_t>(std::min<int64_t>(number++, int64_t(frames.size()) - 1))]
                  .pts;
      }
      const IndexedFrame& target = frames[static_cast<size_t>(targets[next])];
      if (first && pts != AV_NOPTS_VALUE && pts > target.pts) {
        av_frame_unref(frame.get());
        return Decoded::kLate;
      }
      first = false;
      // Every target at or before this frame is it (a target the decoder never gave out,
      // where a packet made no frame, gets the next frame).
      bool converted = false;
      while (next < targets.size() &&
             (pts == AV_NOPTS_VALUE || frames[static_cast<size_t>(targets[next])].pts <= pts)) {
        if (!converted) {
          convert(frame.get(), region);
          converted = true;
        }
        const int64_t index = targets[next];
        on_frame(RgbFrame{index, seconds(index), frame->width, frame->height, rgb.data(),
                          frame->width * 3});
        ++next;
        if (pts == AV_NOPTS_VALUE) break;
      }
      av_frame_unref(frame.get());
    }
    if (next < targets.size() && wanted.drained) return Decoded::kShort;
    STOKER_CHECK(next == targets.size(), ErrorCode::kCorruptData,
                 "the video ended before frame " +
                     std::to_string(next < targets.size() ? targets[next] : 0) + " of the " +
                     std::to_string(frames.size()) + " its container lists");
    return Decoded::kAll;
  }
};

VideoReader::VideoReader(std::span<const uint8_t> bytes, const MediaLimits& limits, int threads)
    : state_(std::make_unique<State>(bytes, limits, threads)) {}

VideoReader::~VideoReader() = default;

const VideoInfo& VideoReader::info() const { return state_->info; }

double VideoReader::frame_seconds(int64_t index) const {
  STOKER_CHECK(
      index >= 0 && index < state_->info.frames, ErrorCode::kInvalidArgument,
      "frame " + std::to_string(index) + " of a video of " + std::to_string(state_->info.frames));
  return state_->seconds(index);
}

int64_t VideoReader::packets_read() const { return state_->packets_read; }

std::vector<int64_t> VideoReader::keyframes() const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < state_->frames.size(); ++i)
    if (state_->frames[i].key) out.push_back(static_cast<int64_t>(i));
  return out;
}

void VideoReader::read_frames(int64_t first, int64_t count, int64_t stride,
                              const std::function<void(const RgbFrame&)>& on_frame,
                              const FrameRegion& region) {
  const State& s = *state_;
  STOKER_CHECK(count >= 1 && stride >= 1, ErrorCode::kInvalidArgument,
               "a clip takes at least one frame, at a stride of at least 1");
  STOKER_CHECK(
      first >= 0 && first + (count - 1) * stride < s.info.frames, ErrorCode::kInvalidArgument,
      "frames " + std::to_string(first) + " + " + std::to_string(count - 1) + " x " +
          std::to_string(stride) + " are past the video's " + std::to_string(s.info.frames));
  std::vector<int64_t> targets;
  for (int64_t k = 0; k < count; ++k) targets.push_back(first + k * stride);
  read_frames(targets, on_frame, region);
}

void VideoReader::read_frames(std::span<const int64_t> frames,
                              const std::function<void(const RgbFrame&)>& on_frame,
                              const FrameRegion& region) {
  State& s = *state_;
  STOKER_CHECK(!frames.empty(), ErrorCode::kInvalidArgument, "a clip takes at least one frame");
  for (size_t k = 0; k < frames.size(); ++k)
    STOKER_CHECK(
        frames[k] >= 0 && frames[k] < s.info.frames && (k == 0 || frames[k] >= frames[k - 1]),
        ErrorCode::kInvalidArgument,
        "frame " + std::to_string(frames[k]) + " of a video of " + std::to_string(s.info.frames) +
            ", out of order or past its end");
  // In runs (MP4, Matroska): a frame whose keyframe comes at least kRunGap frames after the
  // frame before it starts a run of its own, read from that keyframe, so that what lies between
  // (at a low fps, seconds of frames no output needs) is not decoded. A smaller gap is decoded
  // through: opening the container again and a fresh decoder cost more (a keyframe every 16
  // frames, clips of frames 2 apart, make bench-media on 2 Xeon cores: 116 clips/s split at
  // every keyframe, 166 with this gap).
  constexpr int64_t kRunGap = 16;
  const bool runs = s.packets_have_own_times();
  s.packets_read = 0;
  size_t begin = 0;
  while (begin < frames.size()) {
    size_t end = begin + 1;
    while (end < frames.size() &&
           (!runs || s.keyframe_before(frames[end], 0) < frames[end - 1] + kRunGap))
      ++end;
    const std::vector<int64_t> targets(frames.begin() + static_cast<std::ptrdiff_t>(begin),
                                       frames.begin() + static_cast<std::ptrdiff_t>(end));
    // From the keyframe before the run's first frame; if the decoder's first frame comes after
    // it (a demuxer whose seek lands later), from one keyframe earlier, then from the start.
    // Where a drained decoder gave out fewer frames than the targets (a damaged packet made
    // none), the rest from the same keyframe again, every packet read, as the frames after it
    // stand in for the missing ones.
    size_t next = 0;
    bool drain = true;
    for (int back = 0;;) {
      const int64_t keyframe = s.keyframe_before(targets.front(), back);
      s.seek_to(keyframe);
      const State::Decoded got =
          s.decode_targets(targets, std::max<int64_t>(keyframe, 0), drain, next, on_frame, region);
      s.packets_read += s.input.packets_sent();
      if (got == State::Decoded::kAll) break;
      if (got == State::Decoded::kShort) {
        drain = false;
        continue;
      }
      STOKER_CHECK(keyframe >= 0, ErrorCode::kCorruptData,
                   "the decoded frames' times do not match the container's index");
      ++back;
    }
    begin = end;
  }
}

}  // namespace stoker::media
