// Fuzz target: MaskDecoder (libspng, SPNG_FMT_RAW, stoker's own unpacking of 1, 2 and 4-bit
// samples), as a segmentation field decodes each sample's mask.
//
// Input: a PNG file, nothing before it.
//
// Beyond "no crash": a decoded mask has one byte per pixel, every byte read, each below
// 2^bit_depth (a sample of the IHDR's depth, unscaled); the same file decoded again on the same
// decoder (whose buffer now holds the first result) gives the same values, so nothing of one mask
// shows through in the next, interlaced sub-byte masks included (libspng ORs their samples in).
#include <algorithm>
#include <optional>
#include <vector>

#include "fuzz_util.h"
#include "stoker/core/error.h"
#include "stoker/decode/mask_decoder.h"

using namespace stoker;

namespace {

constexpr int64_t kMaxPixels = int64_t{1} << 22;

struct Outcome {
  std::vector<uint8_t> values;
  int width = 0, height = 0;
  std::optional<ErrorCode> error;
};

Outcome decode_once(decode::MaskDecoder& decoder, const uint8_t* data, size_t size) {
  Outcome o;
  try {
    const decode::MaskImage m = decoder.decode(data, size);
    FUZZ_CHECK(m.width > 0 && m.height > 0 && m.values != nullptr);
    FUZZ_CHECK(int64_t{m.width} * m.height <= kMaxPixels);
    o.width = m.width;
    o.height = m.height;
    o.values.assign(m.values, m.values + static_cast<size_t>(m.width) * m.height);
    fuzz::touch(o.values.data(), o.values.size());
  } catch (const Error& e) {
    o.error = e.code();
  }
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  decode::DecodeOptions options;
  options.max_pixels = kMaxPixels;
  decode::MaskDecoder decoder(options);
  const Outcome first = decode_once(decoder, data, size);
  if (!first.error) {
    FUZZ_CHECK(size >= 33);  // a signature and an IHDR were read; the bit depth is byte 24
    const int bits = data[24];
    FUZZ_CHECK(bits == 1 || bits == 2 || bits == 4 || bits == 8);
    const uint8_t max_value = static_cast<uint8_t>((1u << bits) - 1);
    FUZZ_CHECK(std::all_of(first.values.begin(), first.values.end(),
                           [&](uint8_t v) { return v <= max_value; }));
  }
  const Outcome again = decode_once(decoder, data, size);
  FUZZ_CHECK(first.error == again.error);
  FUZZ_CHECK(first.width == again.width && first.height == again.height);
  FUZZ_CHECK(first.values == again.values);
  return 0;
}
