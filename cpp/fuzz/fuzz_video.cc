// Fuzz target: a video container and stream through media::VideoReader (libavformat,
// libavcodec, swscale), as a sample's member reaches it. Invariants, besides no crash, leak or
// blow-up past the limits:
//   - a reader that opened states at least one frame, of a size within max_pixels;
//   - a clip of frames hands out exactly the frames asked, in order, each of the size the
//     decoder gave and within max_pixels, or fails with stoker::Error;
//   - the same clip read again on the same reader is the same pixels (the keyframe index and
//     the seek give what they gave);
//   - read for a region of its frames only, a clip's pixels there are the whole frames'.
//
// Input: kParamBytes of options (the clip's first frame as a fraction /256 of the video, its
// stride 1-4), then the file.
#include <algorithm>
#include <vector>

#include "fuzz_util.h"
#include "stoker/core/error.h"
#include "stoker/media/video.h"

using namespace stoker;

namespace {

constexpr size_t kParamBytes = 2;

std::vector<std::vector<uint8_t>> clip(media::VideoReader& reader, int64_t first, int64_t count,
                                       int64_t stride, const media::MediaLimits& limits) {
  std::vector<std::vector<uint8_t>> frames;
  reader.read_frames(first, count, stride, [&](const media::RgbFrame& f) {
    FUZZ_CHECK(f.index == first + static_cast<int64_t>(frames.size()) * stride);
    FUZZ_CHECK(f.width > 0 && f.height > 0 && int64_t{f.width} * f.height <= limits.max_pixels);
    FUZZ_CHECK(f.row_bytes == f.width * 3);
    frames.emplace_back(f.pixels, f.pixels + size_t(f.row_bytes) * size_t(f.height));
  });
  FUZZ_CHECK(static_cast<int64_t>(frames.size()) == count);
  return frames;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kParamBytes) return 0;
  media::MediaLimits limits;
  limits.max_pixels = int64_t{1} << 20;  // 1 MP: frames stay small under the RSS limit
  limits.max_frames = 4096;
  limits.max_decoded_frames = 1024;
  limits.max_seconds = 3600;
  const int stride = 1 + data[1] % 4;
  std::span<const uint8_t> file(data + kParamBytes, size - kParamBytes);
  try {
    media::VideoReader reader(file, limits);
    const media::VideoInfo& info = reader.info();
    FUZZ_CHECK(info.frames >= 1 && info.frames <= limits.max_frames);
    FUZZ_CHECK(int64_t{info.width} * info.height <= limits.max_pixels);
    const int64_t first = info.frames * data[0] / 256;
    const int64_t count = std::min<int64_t>(4, (info.frames - 1 - first) / stride + 1);
    const auto once = clip(reader, first, count, stride, limits);
    FUZZ_CHECK(clip(reader, first, count, stride, limits) == once);
    const media::FrameRegion region{info.width / 4, info.height / 3, info.width * 3 / 4 + 1,
                                    info.height * 2 / 3 + 1};
    size_t k = 0;
    reader.read_frames(
        first, count, stride,
        [&](const media::RgbFrame& f) {
          FUZZ_CHECK(k < once.size());
          const std::vector<uint8_t>& whole = once[k++];
          FUZZ_CHECK(whole.size() == size_t(f.row_bytes) * size_t(f.height));
          const int x0 = std::min(region.x0, f.width), x1 = std::min(region.x1, f.width);
          for (int y = region.y0; y < std::min(region.y1, f.height); ++y) {
            const size_t row = size_t(y) * size_t(f.row_bytes);
            FUZZ_CHECK(std::equal(f.pixels + row + 3 * x0, f.pixels + row + 3 * x1,
                                  whole.begin() + long(row + 3 * x0)));
          }
        },
        region);
    FUZZ_CHECK(k == once.size());
  } catch (const Error&) {
  }
  return 0;
}
