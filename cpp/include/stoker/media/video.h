#pragma once

// Video clips from a container held in memory (a sample's member: mp4, mkv, webm, avi), with
// FFmpeg's libavformat and libavcodec (Debian's, for now: docs/ARCHITECTURE.md). Opening reads
// every packet of the video stream once, without decoding, into an index of frames in
// presentation order: a clip's frames are then numbered exactly, whatever the container's
// claims, and its decode starts at the keyframe before its first frame and stops at its last.
//
// Every size the file states is untrusted: the frame's pixels, the number of frames and the
// duration are checked against MediaLimits before anything is allocated for them; a broken
// container, codec or stream is an Error (kCorruptData, kUnsupported or kResourceLimit) with
// FFmpeg's reason.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "stoker/media/limits.h"

namespace stoker::media {

struct VideoInfo {
  int width = 0, height = 0;
  int64_t frames = 0;              // in the index: every frame the stream has
  double frames_per_second = 0.0;  // the stream's average rate (0 if it states none)
  double duration_seconds = 0.0;   // from the first frame's time to the last's end
  std::string codec;               // FFmpeg's codec name (h264, vp9, ...)
};

// The part of a frame a caller needs, in pixels: [x0, x1) x [y0, y1) (an empty one: all).
struct FrameRegion {
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

// One decoded frame handed to the caller: RGB, 8 bits a channel, `row_bytes` between rows. Where
// the read asked for a region, only its pixels are set.
struct RgbFrame {
  int64_t index;   // in presentation order, from 0
  double seconds;  // its presentation time, from the stream's first frame
  int width, height;
  const uint8_t* pixels;
  int row_bytes;
};

class VideoReader {
 public:
  // `bytes` must outlive the reader (it is read in place). `threads`: the decoder's own threads
  // (1: the engine decodes samples in parallel instead).
  VideoReader(std::span<const uint8_t> bytes, const MediaLimits& limits = {}, int threads = 1);
  ~VideoReader();
  VideoReader(const VideoReader&) = delete;
  VideoReader& operator=(const VideoReader&) = delete;

  const VideoInfo& info() const;
  // The presentation time of frame `index` (seconds from the first frame).
  double frame_seconds(int64_t index) const;
  // The keyframes' numbers, in presentation order, as the container marks them (the first frame
  // where it marks none).
  std::vector<int64_t> keyframes() const;

  // Frames first, first + stride, ..., `count` of them (all inside [0, frames)), each handed to
  // `on_frame` in order as it is decoded and converted to RGB (valid during the call only).
  // Decoding starts at the keyframe before `first` and stops once the last is out. With
  // `region`, only its pixels are converted to RGB (a crop's: the rest is never computed).
  void read_frames(int64_t first, int64_t count, int64_t stride,
                   const std::function<void(const RgbFrame&)>& on_frame,
                   const FrameRegion& region = {});
  // The same for any frames in order (`frames` non-decreasing; a repeated one is handed out
  // again), from the keyframe before the first.
  void read_frames(std::span<const int64_t> frames,
                   const std::function<void(const RgbFrame&)>& on_frame,
                   const FrameRegion& region = {});
  // The packets of the video stream the last read handed to the decoder (whether it then decoded
  // or skipped them): from each run's keyframe to its last frame's packet, no further.
  int64_t packets_read() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace stoker::media
