// The media readers behind the C table the engine calls (core/media_plugin.h): each function
// turns stoker's exceptions into a code and a reason, so none crosses the boundary.
#include "stoker/media/plugin.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

extern "C" {
#include <libavcodec/avcodec.h>
}

#include "stoker/core/error.h"
#include "stoker/media/audio.h"
#include "stoker/media/video.h"

namespace stoker::media {

namespace {

void write_reason(char* out, size_t size, const std::string& reason) {
  if (size == 0) return;
  std::snprintf(out, size, "%s", reason.c_str());
}

// Runs `body`, turning whatever it throws into a code and a reason.
template <typename F>
int guarded(char* error, size_t error_size, F&& body) {
  try {
    body();
    return 0;
  } catch (const Error& e) {
    write_reason(error, error_size, e.reason());
    return static_cast<int>(e.code());
  } catch (const std::bad_alloc&) {
    write_reason(error, error_size, "out of memory");
    return static_cast<int>(ErrorCode::kResourceLimit);
  } catch (const std::exception& e) {
    write_reason(error, error_size, e.what());
    return static_cast<int>(ErrorCode::kInternal);
  }
}

MediaLimits limits_of(const StokerMediaLimits* l) {
  MediaLimits m;
  if (l == nullptr) return m;
  m.max_pixels = l->max_pixels;
  m.max_frames = l->max_frames;
  m.max_seconds = l->max_seconds;
  m.max_sample_rate = l->max_sample_rate;
  m.max_channels = l->max_channels;
  m.max_decoded_bytes = l->max_decoded_bytes;
  m.max_decoded_frames = l->max_decoded_frames;
  return m;
}

// The sink said stop: its code and reason, carried out of the reader's callback.
struct SinkStopped {
  int code;
  std::string reason;
};

int video_open(const uint8_t* data, size_t size, const StokerMediaLimits* limits, void** handle,
               StokerVideoInfo* info, char* error, size_t error_size) {
  *handle = nullptr;
  return guarded(error, error_size, [&] {
    auto reader = std::make_unique<VideoReader>(
        std::span<const uint8_t>(data, size), limits_of(limits),
        static_cast<int>(std::clamp<int64_t>(limits ? limits->decoder_threads : 1, 1, 16)));
    const VideoInfo& i = reader->info();
    *info = StokerVideoInfo{i.width, i.height, i.frames, i.frames_per_second, i.duration_seconds};
    *handle = reader.release();
  });
}

// Reads with `read` (a VideoReader::read_frames call taking the frame callback and the region),
// handing each frame to `sink`.
template <typename Read>
int read_to_sink(const int32_t* region, StokerFrameSink sink, void* context, char* error,
                 size_t error_size, Read&& read) {
  FrameRegion wanted;
  if (region != nullptr) wanted = FrameRegion{region[0], region[1], region[2], region[3]};
  try {
    return guarded(error, error_size, [&] {
      read(
          [&](const RgbFrame& f) {
            // The reader converts into rows of width * 3 bytes: what the sink takes.
            STOKER_CHECK(f.row_bytes == f.width * 3, ErrorCode::kInternal,
                         "the video reader handed out padded rows");
            char reason[512] = {};
            if (int rc = sink(context, f.index, f.seconds, f.pixels, f.width, f.height, reason,
                              sizeof reason))
              throw SinkStopped{rc, reason};
          },
          wanted);
    });
  } catch (const SinkStopped& stop) {
    write_reason(error, error_size, stop.reason);
    return stop.code;
  }
}

int video_read(void* handle, int64_t first, int64_t count, int64_t stride, const int32_t* region,
               StokerFrameSink sink, void* context, char* error, size_t error_size) {
  auto* reader = static_cast<VideoReader*>(handle);
  return read_to_sink(region, sink, context, error, error_size, [&](auto&& on_frame, auto& wanted) {
    reader->read_frames(first, count, stride, on_frame, wanted);
  });
}

int video_read_list(void* handle, const int64_t* frames, int64_t count, const int32_t* region,
                    StokerFrameSink sink, void* context, char* error, size_t error_size) {
  auto* reader = static_cast<VideoReader*>(handle);
  return read_to_sink(region, sink, context, error, error_size, [&](auto&& on_frame, auto& wanted) {
    STOKER_CHECK(count >= 1, ErrorCode::kInvalidArgument, "a clip takes at least one frame");
    reader->read_frames(std::span<const int64_t>(frames, static_cast<size_t>(count)), on_frame,
                        wanted);
  });
}

int video_times(void* handle, double* seconds, int64_t count, char* error, size_t error_size) {
  auto* reader = static_cast<VideoReader*>(handle);
  return guarded(error, error_size, [&] {
    STOKER_CHECK(count == reader->info().frames, ErrorCode::kInvalidArgument,
                 "video_times: " + std::to_string(count) + " places for " +
                     std::to_string(reader->info().frames) + " frames");
    for (int64_t i = 0; i < count; ++i) seconds[i] = reader->frame_seconds(i);
  });
}

void video_close(void* handle) { delete static_cast<VideoReader*>(handle); }

int audio_open(const uint8_t* data, size_t size, const StokerMediaLimits* limits, void** handle,
               StokerAudioInfo* info, char* error, size_t error_size) {
  *handle = nullptr;
  return guarded(error, error_size, [&] {
    auto reader =
        std::make_unique<AudioReader>(std::span<const uint8_t>(data, size), limits_of(limits));
    const AudioInfo& i = reader->info();
    *info = StokerAudioInfo{i.sample_rate, i.channels, i.frames, i.duration_seconds};
    *handle = reader.release();
  });
}

int audio_read(void* handle, int64_t first, int64_t capacity, int32_t sample_rate, int32_t channels,
               float* out, int64_t* frames, char* error, size_t error_size) {
  auto* reader = static_cast<AudioReader*>(handle);
  *frames = 0;
  return guarded(error, error_size, [&] {
    STOKER_CHECK(capacity >= 1 && sample_rate >= 1, ErrorCode::kInvalidArgument,
                 "an audio window of at least one sample at a rate of at least 1");
    thread_local std::vector<float> samples;
    const int file_channels = reader->info().channels;
    const int64_t n = reader->read(first, capacity, sample_rate,
                                   channels == file_channels ? 0 : channels, samples);
    const int64_t kept = std::min(n, capacity);
    const int out_channels =
        n > 0 ? static_cast<int>(samples.size() / static_cast<size_t>(n)) : channels;
    STOKER_CHECK(out_channels == channels, ErrorCode::kInternal, "the reader's channels differ");
    for (int c = 0; c < channels; ++c)
      std::memcpy(out + c * capacity, samples.data() + c * n,
                  static_cast<size_t>(kept) * sizeof(float));
    *frames = kept;
  });
}

void audio_close(void* handle) { delete static_cast<AudioReader*>(handle); }

std::string library_name() {
  const unsigned v = avcodec_version();
  return "FFmpeg libavcodec " + std::to_string(v >> 16) + "." + std::to_string((v >> 8) & 255) +
         "." + std::to_string(v & 255) + " (" + avcodec_license() + ")";
}

}  // namespace

const StokerMediaPlugin* plugin() {
  static const std::string library = library_name();
  static const StokerMediaPlugin table{STOKER_MEDIA_PLUGIN_VERSION,
                                       library.c_str(),
                                       video_open,
                                       video_read,
                                       video_read_list,
                                       video_times,
                                       video_close,
                                       audio_open,
                                       audio_read,
                                       audio_close};
  return &table;
}

}  // namespace stoker::media
