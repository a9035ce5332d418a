#pragma once

// What a media file may make the readers allocate or decode: every size a container or a codec
// states is checked against these before anything is allocated for it.

#include <cstdint>

namespace stoker::media {

struct MediaLimits {
  int64_t max_pixels = int64_t{1} << 26;         // width x height of one frame (8192 x 8192)
  int64_t max_frames = int64_t{1} << 21;         // frames of a video stream
  double max_seconds = 24.0 * 3600.0;            // a stream's duration
  int64_t max_sample_rate = 768000;              // audio samples per second
  int64_t max_channels = 64;                     // audio channels
  int64_t max_decoded_bytes = int64_t{1} << 31;  // what one read may decode (audio: its window)
  // Frames one clip may decode: from its keyframe to its last frame (a stream with one keyframe
  // an hour would otherwise decode the hour for a clip at its end).
  int64_t max_decoded_frames = int64_t{1} << 14;
};

}  // namespace stoker::media
