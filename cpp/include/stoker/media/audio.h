#pragma once

// Audio from a container held in memory (wav, flac, mp3, ogg/opus, m4a), decoded with FFmpeg's
// libavcodec and resampled with libswresample's soxr engine (the resampler python-soxr wraps).
// A window of the stream is read from the packet before its start; every size the file states
// is checked against MediaLimits first (docs/RELIABILITY.md).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "stoker/media/limits.h"

namespace stoker::media {

struct AudioInfo {
  int sample_rate = 0;
  int channels = 0;
  double duration_seconds = 0.0;  // as the container states it (0 where it states none)
  std::string codec;
};

class AudioReader {
 public:
  // `bytes` must outlive the reader (it is read in place).
  explicit AudioReader(std::span<const uint8_t> bytes, const MediaLimits& limits = {});
  ~AudioReader();
  AudioReader(const AudioReader&) = delete;
  AudioReader& operator=(const AudioReader&) = delete;

  const AudioInfo& info() const;

  // The samples from `start` seconds (from the stream's first sample) for `seconds` (< 0: to the
  // end), at `sample_rate` (0: the file's own) with `channels` (0: the file's; 1: the mean of
  // its channels), planar float32 in [-1, 1]: out[c * frames + i]. Returns the frames (samples
  // per channel), fewer than asked where the stream ends first.
  int64_t read(double start, double seconds, int sample_rate, int channels,
               std::vector<float>& out);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace stoker::media
