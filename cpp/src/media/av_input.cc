#include "media/av_input.h"

#include <algorithm>
#include <cstring>
#include <mutex>

namespace stoker::media::detail {

namespace {
constexpr int kIoBufferBytes = 64 * 1024;
// What probing may read and analyse: bounded, whatever the container claims.
constexpr int64_t kProbeBytes = 5 * 1000 * 1000;
constexpr int64_t kAnalyzeMicroseconds = 5 * 1000 * 1000;
constexpr int kProbePackets = 4;
}  // namespace

std::string av_reason(int code) {
  char text[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(code, text, sizeof text);
  return text;
}

void throw_av(int code, const std::string& what) {
  ErrorCode kind = ErrorCode::kCorruptData;
  if (code == AVERROR(ENOMEM)) kind = ErrorCode::kResourceLimit;
  if (code == AVERROR_DECODER_NOT_FOUND || code == AVERROR_DEMUXER_NOT_FOUND ||
      code == AVERROR_PATCHWELCOME || code == AVERROR(ENOSYS)) {
    kind = ErrorCode::kUnsupported;
  }
  throw_error(kind, what + ": " + av_reason(code));
}

void FormatCloser::operator()(AVFormatContext* f) const { avformat_close_input(&f); }

void IoFreer::operator()(AVIOContext* io) const {
  av_freep(&io->buffer);
  avio_context_free(&io);
}

MemoryInput::MemoryInput(std::span<const uint8_t> bytes, const MediaLimits& limits,
                         AVMediaType type)
    : bytes_(bytes) {
  // FFmpeg's own messages stay quiet: a failure reaches the caller as an Error with its reason.
  // And no single allocation of FFmpeg's may pass 256 MiB (a 16-bit plane of max_pixels' 64
  // MP): some demuxers allocate what a header claims before reading it (a wav's LIST chunk
  // claiming 4 GB, found by fuzz_audio), which then fails as out of memory, a ResourceLimit.
  // The cap is the process's, for the FFmpeg this module links (PyAV's own copy is apart).
  static std::once_flag once;
  std::call_once(once, [] {
    av_log_set_level(AV_LOG_QUIET);
    av_max_alloc(size_t{1} << 28);
  });
  open();
  check_streams(limits);  // probing decodes a few frames: sizes first
  // Probing the streams (decoding their first frames) only where the container's header does
  // not say what the stream of `type` is: mp4, mkv, wav, flac and mp3 headers do, and probing
  // a 10 s wav took 1.3 ms of a 1.7 ms open.
  if (!described(type)) {
    if (int rc = avformat_find_stream_info(format_.get(), nullptr); rc < 0) {
      throw_av(rc, "cannot read the container's streams");
    }
    check_streams(limits);
  }
  stream_ = av_find_best_stream(format_.get(), type, -1, -1, &decoder_, 0);
  if (stream_ == AVERROR_STREAM_NOT_FOUND) {
    throw_error(ErrorCode::kCorruptData,
                std::string("the container has no ") + av_get_media_type_string(type) + " stream");
  }
  if (stream_ < 0) throw_av(stream_, "cannot choose a stream");
  if (decoder_ == nullptr) {
    throw_error(ErrorCode::kUnsupported, "no decoder for the stream's codec");
  }
  parameters_.reset(avcodec_parameters_alloc());
  STOKER_CHECK(parameters_ != nullptr, ErrorCode::kResourceLimit, "out of memory");
  if (int rc = avcodec_parameters_copy(parameters_.get(), format_->streams[stream_]->codecpar);
      rc < 0) {
    throw_av(rc, "cannot copy the stream's parameters");
  }
  new_decoder(1);  // a stream whose decoder cannot open is refused now, not at the first read
}

WantedPackets::WantedPackets(std::vector<int64_t> times, bool drain_after)
    : pts(std::move(times)), drain(drain_after) {
  std::sort(pts.begin(), pts.end());
  pts.erase(std::unique(pts.begin(), pts.end()), pts.end());
  sent.assign(pts.size(), false);
  left = pts.size();
}

bool WantedPackets::take(int64_t time) {
  const auto at = std::lower_bound(pts.begin(), pts.end(), time);
  if (at == pts.end() || *at != time) return false;
  const auto k = static_cast<size_t>(at - pts.begin());
  if (!sent[k]) {
    sent[k] = true;
    --left;
  }
  return true;
}

bool MemoryInput::mp4_or_matroska() const {
  const char* container = format_->iformat->name;
  return std::strstr(container, "mp4") != nullptr || std::strstr(container, "matroska") != nullptr;
}

bool MemoryInput::described(AVMediaType type) const {
  // An MP4's or Matroska file's header has each video stream's codec, size, decoder setup and
  // (MP4) reordering delay; its pixel format, which the decoder finds in the stream's first
  // headers anyway, is all that probing would add, by decoding frames: 4.1 ms of a 4.7 ms open
  // of a 12 s 640x360 H.264 mp4.
  const bool header_describes_video = mp4_or_matroska();
  for (unsigned i = 0; i < format_->nb_streams; ++i) {
    const AVCodecParameters* p = format_->streams[i]->codecpar;
    if (p->codec_type != type || p->codec_id == AV_CODEC_ID_NONE) continue;
    if (p->format < 0 && !(type == AVMEDIA_TYPE_VIDEO && header_describes_video)) continue;
    if (type == AVMEDIA_TYPE_VIDEO && p->width > 0 && p->height > 0) return true;
    if (type == AVMEDIA_TYPE_AUDIO && p->sample_rate > 0 && p->ch_layout.nb_channels > 0)
      return true;
  }
  return false;
}

void MemoryInput::open() {
  format_.reset();
  io_.reset();
  position_ = 0;
  packets_sent_ = 0;
  auto* buffer = static_cast<uint8_t*>(av_malloc(kIoBufferBytes));
  STOKER_CHECK(buffer != nullptr, ErrorCode::kResourceLimit, "out of memory for a read buffer");
  io_.reset(avio_alloc_context(buffer, kIoBufferBytes, 0, this, &MemoryInput::read, nullptr,
                               &MemoryInput::seek));
  if (io_ == nullptr) {
    av_free(buffer);
    throw_error(ErrorCode::kResourceLimit, "out of memory for a reader");
  }
  AVFormatContext* format = avformat_alloc_context();
  STOKER_CHECK(format != nullptr, ErrorCode::kResourceLimit, "out of memory for a container");
  format->pb = io_.get();
  // GENPTS: a packet without a presentation time (an MPEG program stream's keyframe after
  // B-frames) is given the one its reordering implies, as `ffmpeg -fflags +genpts` does.
  format->flags |= AVFMT_FLAG_CUSTOM_IO | AVFMT_FLAG_GENPTS;
  format->probesize = kProbeBytes;
  format->max_analyze_duration = kAnalyzeMicroseconds;
  // A demuxer that asks for its streams' codecs to be probed (wav's PCM, for a DTS or AC-3
  // stream inside) runs every format's probe over its packets as they are read, in doubling
  // steps up to probesize: 5 ms to open a 10 s wav, 8 ms more on every read of it, to read 4 s
  // in 0.4. The first open probes kProbePackets packets (16 kB of a wav); opened again, the
  // streams are the first open's (and the decoder is made from what it found): one.
  format->max_probe_packets = container_ != nullptr && !streams_in_packets_ ? 1 : kProbePackets;
  // On failure avformat_open_input frees the context (not our AVIOContext).
  if (int rc = avformat_open_input(&format, nullptr, container_, nullptr); rc < 0) {
    throw_av(rc, "not a media container stoker can read");
  }
  format_.reset(format);
  if (container_ == nullptr) streams_in_packets_ = (format_->ctx_flags & AVFMTCTX_NOHEADER) != 0;
  container_ = format_->iformat;
}

void MemoryInput::reopen() {
  const unsigned streams = format_->nb_streams;
  open();
  if (streams_in_packets_) {
    if (int rc = avformat_find_stream_info(format_.get(), nullptr); rc < 0) {
      throw_av(rc, "cannot read the container's streams");
    }
  }
  STOKER_CHECK(stream_ < static_cast<int>(format_->nb_streams) && format_->nb_streams == streams &&
                   format_->streams[stream_]->codecpar->codec_id == parameters_->codec_id,
               ErrorCode::kCorruptData, "the container's streams changed when opened again");
}

CodecPtr MemoryInput::new_decoder(int threads, int flags2) const {
  CodecPtr codec(avcodec_alloc_context3(decoder_));
  STOKER_CHECK(codec != nullptr, ErrorCode::kResourceLimit, "out of memory for a decoder");
  if (int rc = avcodec_parameters_to_context(codec.get(), parameters_.get()); rc < 0) {
    throw_av(rc, "cannot set up the decoder");
  }
  codec->thread_count = std::max(1, threads);
  codec->flags2 |= flags2;
  codec->pkt_timebase = format_->streams[stream_]->time_base;
  if (int rc = avcodec_open2(codec.get(), decoder_, nullptr); rc < 0) {
    throw_av(rc, std::string("cannot open the ") + decoder_->name + " decoder");
  }
  return codec;
}

bool MemoryInput::next_frame(AVCodecContext* codec, AVPacket* packet, AVFrame* frame,
                             const char* what, WantedPackets* wanted) {
  while (true) {
    int rc = avcodec_receive_frame(codec, frame);
    if (rc == 0) return true;
    if (rc == AVERROR_EOF) return false;
    if (rc != AVERROR(EAGAIN)) throw_av(rc, std::string("cannot decode the ") + what);
    if (wanted && wanted->drain && wanted->left == 0) {
      wanted->drained = true;
      rc = avcodec_send_packet(codec, nullptr);
      if (rc == AVERROR_EOF) return false;
      if (rc < 0) throw_av(rc, std::string("cannot decode the ") + what);
      continue;
    }
    rc = av_read_frame(format_.get(), packet);
    if (rc == AVERROR_EOF) {
      // The container's end: the decoder gives out what it holds, then AVERROR_EOF. Sent once
      // already (AVERROR_EOF back), a decoder still asking for input has nothing left.
      rc = avcodec_send_packet(codec, nullptr);
      if (rc == AVERROR_EOF) return false;
    } else if (rc < 0) {
      throw_av(rc, std::string("cannot read the ") + what);
    } else {
      if (packet->stream_index == stream_) {
        // Checked per picture by the decoders that can (H.264, MPEG-2, MPEG-4, VP8, ...): a frame
        // no output needs and no other frame refers to is not decoded at all.
        if (wanted) {
          const bool want = packet->pts == AV_NOPTS_VALUE ||
                            (!(packet->flags & AV_PKT_FLAG_DISCARD) && wanted->take(packet->pts));
          codec->skip_frame = want ? AVDISCARD_DEFAULT : AVDISCARD_NONREF;
        }
        rc = avcodec_send_packet(codec, packet);
        ++packets_sent_;
      }
      av_packet_unref(packet);
    }
    if (rc < 0) throw_av(rc, std::string("cannot decode the ") + what);
  }
}

void MemoryInput::check_streams(const MediaLimits& limits) const {
  for (unsigned i = 0; i < format_->nb_streams; ++i) {
    const AVCodecParameters* p = format_->streams[i]->codecpar;
    if (p->codec_type == AVMEDIA_TYPE_VIDEO) {
      const int64_t pixels = int64_t{p->width} * p->height;
      STOKER_CHECK(p->width >= 0 && p->height >= 0, ErrorCode::kCorruptData,
                   "a video stream of negative size");
      STOKER_CHECK(pixels <= limits.max_pixels, ErrorCode::kResourceLimit,
                   "video frames of " + std::to_string(p->width) + "x" + std::to_string(p->height) +
                       " are over max_pixels (" + std::to_string(limits.max_pixels) + ")");
    } else if (p->codec_type == AVMEDIA_TYPE_AUDIO) {
      STOKER_CHECK(p->sample_rate >= 0 && p->sample_rate <= limits.max_sample_rate,
                   ErrorCode::kResourceLimit,
                   "an audio sample rate of " + std::to_string(p->sample_rate) +
                       " Hz is over max_sample_rate (" + std::to_string(limits.max_sample_rate) +
                       ")");
      STOKER_CHECK(p->ch_layout.nb_channels >= 0 && p->ch_layout.nb_channels <= limits.max_channels,
                   ErrorCode::kResourceLimit,
                   std::to_string(p->ch_layout.nb_channels) +
                       " audio channels are over max_channels (" +
                       std::to_string(limits.max_channels) + ")");
    }
  }
}

int MemoryInput::read(void* opaque, uint8_t* buf, int size) {
  auto* self = static_cast<MemoryInput*>(opaque);
  const int64_t left = static_cast<int64_t>(self->bytes_.size()) - self->position_;
  if (left <= 0) return AVERROR_EOF;
  const int n = static_cast<int>(std::min<int64_t>(left, size));
  std::memcpy(buf, self->bytes_.data() + self->position_, static_cast<size_t>(n));
  self->position_ += n;
  return n;
}

int64_t MemoryInput::seek(void* opaque, int64_t offset, int whence) {
  auto* self = static_cast<MemoryInput*>(opaque);
  const auto size = static_cast<int64_t>(self->bytes_.size());
  if (whence & AVSEEK_SIZE) return size;
  int64_t target = 0;
  switch (whence & ~AVSEEK_FORCE) {
    case SEEK_SET: target = offset; break;
    case SEEK_CUR: target = self->position_ + offset; break;
    case SEEK_END: target = size + offset; break;
    default: return AVERROR(EINVAL);
  }
  if (target < 0 || target > size) return AVERROR(EINVAL);
  self->position_ = target;
  return target;
}

}  // namespace stoker::media::detail
