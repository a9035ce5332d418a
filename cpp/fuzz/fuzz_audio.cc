// Fuzz target: an audio container and stream through media::AudioReader (libavformat,
// libavcodec, libswresample with soxr), as a sample's member reaches it. Invariants, besides no
// crash, leak or blow-up past the limits:
//   - a reader that opened states a sample rate and channels within the limits;
//   - a window read hands out at most the frames asked, channels x frames floats, all finite;
//   - a window read again is the same samples.
//
// Input: kParamBytes of options (the window's start in tenths of a second, its length in
// tenths, the output rate as a choice of 4, mono or not), then the file. The window is read in
// samples of the output rate, as the Audio field reads it.
#include <cmath>
#include <vector>

#include "fuzz_util.h"
#include "stoker/core/error.h"
#include "stoker/media/audio.h"

using namespace stoker;

namespace {
constexpr size_t kParamBytes = 4;
constexpr int kRates[] = {0, 8000, 16000, 44100};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kParamBytes) return 0;
  media::MediaLimits limits;
  limits.max_seconds = 3600;
  limits.max_decoded_bytes = int64_t{64} << 20;
  const int tenths = data[0];
  const int length = data[1] == 255 ? -1 : data[1];
  const int rate = kRates[data[2] % 4];
  const int channels = data[3] % 2;
  std::span<const uint8_t> file(data + kParamBytes, size - kParamBytes);
  try {
    media::AudioReader reader(file, limits);
    const media::AudioInfo& info = reader.info();
    FUZZ_CHECK(info.sample_rate > 0 && info.sample_rate <= limits.max_sample_rate);
    FUZZ_CHECK(info.channels > 0 && info.channels <= limits.max_channels);
    const int64_t per_second = rate == 0 ? info.sample_rate : rate;
    const int64_t first = tenths * per_second / 10;
    const int64_t count = length < 0 ? -1 : length * per_second / 10;
    std::vector<float> once, again;
    const int64_t n = reader.read(first, count, rate, channels, once);
    const int out_channels = channels == 1 ? 1 : info.channels;
    FUZZ_CHECK(n >= 0 && once.size() == size_t(n) * size_t(out_channels));
    FUZZ_CHECK(count < 0 || n <= count);
    for (float v : once) FUZZ_CHECK(std::isfinite(v));
    FUZZ_CHECK(reader.read(first, count, rate, channels, again) == n && again == once);
  } catch (const Error&) {
  }
  return 0;
}
