#pragma once

// Audio from a container held in memory (wav, flac, mp3, ogg/vorbis/opus, m4a), decoded with
// FFmpeg's libavcodec and resampled with libswresample's soxr engine (the resampler python-soxr
// wraps). A window is the stream resampled as a whole and then cut: it starts on the output
// rate's grid (a whole number of output samples from the stream's first), and the samples the
// resampler's filter reaches on both sides of it are decoded and resampled with it, from the
// packet before them; every size the file states is checked against MediaLimits first
// (docs/RELIABILITY.md).

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
  int64_t frames = 0;             // samples per channel, as the container states them (0: none)
  double duration_seconds = 0.0;  // as the container states it (0 where it states none)
  std::string codec;
};

// The samples a stream of `frames` samples at `from` Hz has at `to` Hz: frames * to / from,
// rounded to the nearest (halves up), as soxr resampling it whole (python-soxr's resample) gives.
int64_t resampled_frames(int64_t frames, int from, int to);

class AudioReader {
 public:
  // `bytes` must outlive the reader (it is read in place).
  explicit AudioReader(std::span<const uint8_t> bytes, const MediaLimits& limits = {});
  ~AudioReader();
  AudioReader(const AudioReader&) = delete;
  AudioReader& operator=(const AudioReader&) = delete;

  const AudioInfo& info() const;

  // Samples [first, first + count) (count < 0: to the end) of the stream resampled as a whole to
  // `sample_rate` (0: the file's own rate, its samples as they are), with `channels` (0: the
  // file's; 1: the mean of its channels, taken before resampling), planar float32 in [-1, 1]:
  // out[c * frames + i]. Returns the frames (samples per channel), fewer than asked where the
  // stream ends first: the whole stream has resampled_frames(its frames, its rate, sample_rate).
  // `context` false: only the window's own samples go through the resampler, from the input
  // sample nearest its start (up to 1e-2 apart from the whole stream resampled, at its ends):
  // for measuring what the context costs (benchmarks/media.py --audio-context).
  int64_t read(int64_t first, int64_t count, int sample_rate, int channels, std::vector<float>& out,
               bool context = true);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace stoker::media
