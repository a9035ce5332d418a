// Segmentation masks: PNG, grey or palette, 1-8 bits per pixel, decoded to one byte per pixel
// holding the raw sample value (the palette index, or the grey level unscaled: a 1-bit mask gives
// 0/1, a 4-bit one 0-15). The palette's colours, tRNS and gamma are ignored: a mask's samples are
// class ids. 16-bit grey and any colour type with RGB or alpha are refused (Error kUnsupported),
// and so are JPEG and WebP (lossy compression changes class ids at their borders).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "stoker/decode/image_decoder.h"  // DecodeOptions

namespace stoker::decode {

// Rows of `width` bytes, no padding, owned by the MaskDecoder that made them and valid until its
// next decode().
struct MaskImage {
  const uint8_t* values = nullptr;
  int width = 0, height = 0;
};

// Not thread-safe: use one per thread. Reuses one buffer across masks (given back past 64 MiB).
// Of DecodeOptions, max_pixels and max_decode_memory apply: both are checked from the header,
// before anything is allocated. Errors: Error with kCorruptData (truncated, bad CRC, a
// decompression bomb), kUnsupported, kResourceLimit.
class MaskDecoder {
 public:
  explicit MaskDecoder(DecodeOptions options = {});

  MaskImage decode(const uint8_t* data, size_t size);

 private:
  DecodeOptions options_;
  std::vector<uint8_t> values_;
};

}  // namespace stoker::decode
