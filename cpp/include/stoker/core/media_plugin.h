// The video and audio decoders the Video and Audio fields (fields/) call, as a table of C
// functions that the media module (media/, linked with FFmpeg; Python's stoker._media) fills in
// and hands to the engine at run time (fields::install_media_plugin): the engine (_core) never
// links FFmpeg, so it imports without it and a wheel need not carry a GPL build
// (docs/ARCHITECTURE.md, "Media"). Nothing crosses the boundary but C:
// every function returns 0, or a stoker::ErrorCode value with its reason written to `error`
// (NUL-terminated, at most `error_size` bytes); no exception leaves either side.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

// Bumped whenever a struct or a function below changes: the engine refuses another version.
#define STOKER_MEDIA_PLUGIN_VERSION 4

// What a file may make the decoders allocate or decode (stoker/media/limits.h's MediaLimits).
struct StokerMediaLimits {
  int64_t max_pixels;
  int64_t max_frames;
  double max_seconds;
  int64_t max_sample_rate;
  int64_t max_channels;
  int64_t max_decoded_bytes;
  int64_t max_decoded_frames;
  // A video's decoder threads (FFmpeg's frame threads; 1: none, the engine decodes clips in
  // parallel instead). Not a limit: how video_open decodes.
  int64_t decoder_threads;
};

struct StokerVideoInfo {
  int32_t width, height;
  int64_t frames;  // every frame of the stream, in presentation order
  double frames_per_second;
  double duration_seconds;
};

struct StokerAudioInfo {
  int32_t sample_rate;
  int32_t channels;
  int64_t frames;           // samples per channel, as the container states them (0: none)
  double duration_seconds;  // as the container states it (0: it states none)
};

// One decoded frame: packed RGB rows (width * 3 bytes each), valid during the call; where the
// read named a region, only its pixels are set. Returns 0 to go on, or an ErrorCode with its
// reason in `error` to stop the read with that error.
typedef int (*StokerFrameSink)(void* context, int64_t index, double seconds, const uint8_t* rgb,
                               int32_t width, int32_t height, char* error, size_t error_size);

struct StokerMediaPlugin {
  uint32_t version;     // STOKER_MEDIA_PLUGIN_VERSION
  const char* library;  // what decodes: "FFmpeg libavcodec 59.37.100 (GPL)"

  // A video held in memory (`data` must outlive the handle): its frames indexed.
  int (*video_open)(const uint8_t* data, size_t size, const StokerMediaLimits* limits,
                    void** handle, StokerVideoInfo* info, char* error, size_t error_size);
  // Frames first, first + stride, ... (count of them, all inside the stream), in order, to
  // `sink`; decoding starts at the keyframe before `first` and stops after the last. `region`
  // (x0, y0, x1, y1; null: the whole frame): the pixels the caller reads, the only ones
  // converted to RGB.
  int (*video_read)(void* handle, int64_t first, int64_t count, int64_t stride,
                    const int32_t* region, StokerFrameSink sink, void* context, char* error,
                    size_t error_size);
  // The same for frames frames[0], frames[1], ... (count of them, in order, repeats allowed):
  // decoding starts at the keyframe before the first and stops after the last.
  int (*video_read_list)(void* handle, const int64_t* frames, int64_t count, const int32_t* region,
                         StokerFrameSink sink, void* context, char* error, size_t error_size);
  // Every frame's presentation time in seconds from the first frame, in presentation order;
  // `count` must be the video's frames.
  int (*video_times)(void* handle, double* seconds, int64_t count, char* error, size_t error_size);
  void (*video_close)(void* handle);

  int (*audio_open)(const uint8_t* data, size_t size, const StokerMediaLimits* limits,
                    void** handle, StokerAudioInfo* info, char* error, size_t error_size);
  // Up to `capacity` frames from frame `first` of the stream resampled as a whole to
  // `sample_rate`, with `channels` (1: the mean of the file's channels; else the file's own
  // count), planar float32: out[c * capacity + i]. `*frames` receives the frames written (fewer
  // where the stream ends first).
  int (*audio_read)(void* handle, int64_t first, int64_t capacity, int32_t sample_rate,
                    int32_t channels, float* out, int64_t* frames, char* error, size_t error_size);
  void (*audio_close)(void* handle);
};

}  // extern "C"
