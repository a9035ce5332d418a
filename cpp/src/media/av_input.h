#pragma once

// What the media readers share: a container read from memory through a custom AVIOContext,
// FFmpeg's error codes as stoker's Errors, and the owners of FFmpeg's objects.

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
}

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "stoker/core/error.h"
#include "stoker/media/limits.h"

namespace stoker::media::detail {

// FFmpeg's reason for `code` (an AVERROR).
std::string av_reason(int code);
// An Error for an FFmpeg failure of `what`: corrupt data, unsupported, or out of memory.
[[noreturn]] void throw_av(int code, const std::string& what);

struct FormatCloser {
  void operator()(AVFormatContext* f) const;
};
struct IoFreer {  // a custom AVIOContext and the buffer it holds now
  void operator()(AVIOContext* io) const;
};
struct CodecCloser {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct PacketFreer {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct FrameFreer {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
using CodecPtr = std::unique_ptr<AVCodecContext, CodecCloser>;
using PacketPtr = std::unique_ptr<AVPacket, PacketFreer>;
using FramePtr = std::unique_ptr<AVFrame, FrameFreer>;

struct ParametersFreer {
  void operator()(AVCodecParameters* p) const { avcodec_parameters_free(&p); }
};

// The packets a read wants, by presentation time. Any other the decoder discards where no frame
// refers to it (AVCodecContext.skip_frame AVDISCARD_NONREF); and once every wanted one has been
// sent, with `drain`, the decoder is drained instead of given the packets after them: what its
// reordering holds back comes out without a frame more decoded (the 2 to 16 a reordering delay
// asks for, the level's largest where the stream states none).
struct WantedPackets {
  explicit WantedPackets(std::vector<int64_t> times, bool drain_after = true);
  // Whether a packet of `time` is wanted; its first sight counted as sent.
  bool take(int64_t time);

  std::vector<int64_t> pts;  // sorted, distinct
  std::vector<bool> sent;
  size_t left;
  bool drain;
  bool drained = false;  // the decoder was drained after the last wanted packet
};

// A container opened from memory: its format context reads `bytes` through its own AVIOContext.
// A read that must not depend on what was read before (every read: a sample's batch is the same
// whatever happened before) starts from `reopen()` and a decoder from `new_decoder()`: seeking
// back and flushing leave state behind in some demuxers and decoders (ogg's pre-skip, mpeg4's
// packed B-frames), which the fuzz targets caught as a clip read twice giving two answers.
class MemoryInput {
 public:
  // Opens the container, checks every stream's stated sizes against `limits` before and after
  // probing them, and chooses the best stream of `type` and its decoder.
  MemoryInput(std::span<const uint8_t> bytes, const MediaLimits& limits, AVMediaType type);
  ~MemoryInput() = default;
  MemoryInput(const MemoryInput&) = delete;
  MemoryInput& operator=(const MemoryInput&) = delete;

  AVFormatContext* format() const { return format_.get(); }
  // Whether the container is an MP4 (mov, mp4, m4a, ...) or Matroska (mkv, webm) file.
  bool mp4_or_matroska() const;
  int stream() const { return stream_; }
  // The container opened again from its first byte, as the container format the first open
  // found (not probed again: probing runs every demuxer's test over the file's first
  // megabytes, more than reading a whole window of it); the streams are those the first open
  // found, in the same order (a container whose streams appear as their packets do, MPEG-PS:
  // probed again from the start, as the first open did, so they are created in that order).
  void reopen();
  // A decoder of the stream, as new, with `threads` threads and AVCodecContext.flags2 `flags2`.
  CodecPtr new_decoder(int threads, int flags2 = 0) const;
  // The stream's next frame out of `codec` into `frame`, its packets read as the decoder asks
  // for them (the other streams' skipped): true, or false once the decoder is drained at the
  // container's end, or after the last of `wanted`'s packets. `what` ("video", "audio") names a
  // failure.
  bool next_frame(AVCodecContext* codec, AVPacket* packet, AVFrame* frame, const char* what,
                  WantedPackets* wanted = nullptr);
  // The stream's packets handed to a decoder by next_frame since the container was (re)opened.
  int64_t packets_sent() const { return packets_sent_; }

 private:
  void open();
  // Whether the header already states a stream of `type`: its codec, sample format and size
  // (MP4 and Matroska: codec and size, the pixel format the decoder's to find).
  bool described(AVMediaType type) const;
  void check_streams(const MediaLimits& limits) const;
  static int read(void* opaque, uint8_t* buf, int size);
  static int64_t seek(void* opaque, int64_t offset, int whence);

  std::span<const uint8_t> bytes_;
  int64_t position_ = 0;
  int64_t packets_sent_ = 0;
  // Declared before the format context, which reads through it: destroyed after it (also when
  // the constructor throws).
  std::unique_ptr<AVIOContext, IoFreer> io_;
  std::unique_ptr<AVFormatContext, FormatCloser> format_;
  int stream_ = -1;
  const AVCodec* decoder_ = nullptr;
  std::unique_ptr<AVCodecParameters, ParametersFreer> parameters_;  // the first open's
  const AVInputFormat* container_ = nullptr;                        // the first open's (probed)
  bool streams_in_packets_ = false;  // AVFMTCTX_NOHEADER: no header lists the streams
};

}  // namespace stoker::media::detail
