#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace stoker {

// Stored as one byte in a version-1 shard index (docs/FORMAT.md). kPnm: binary PPM (P6, RGB) or
// PGM (P5, grey), 8 bits: decoded pixels, what `stoker pack --codec raw` stores. kRaw: pixels
// with no header at all (an array pack's image row); never stored.
enum class ImageFormat : uint8_t {
  kUnknown = 0,
  kJpeg = 1,
  kPng = 2,
  kWebp = 3,
  kPnm = 4,
  kRaw = 5
};

// Guesses the format from the first bytes (magic numbers), not from a file name.
inline ImageFormat sniff_image_format(const uint8_t* data, size_t size) {
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return ImageFormat::kJpeg;
  static constexpr uint8_t kPngMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (size >= 8) {
    bool png = true;
    for (int i = 0; i < 8; ++i) png = png && data[i] == kPngMagic[i];
    if (png) return ImageFormat::kPng;
  }
  // A RIFF container (4-byte size in between) whose form type is WEBP.
  if (size >= 12 && data[0] == 'R' && data[1] == 'I' && data[2] == 'F' && data[3] == 'F' &&
      data[8] == 'W' && data[9] == 'E' && data[10] == 'B' && data[11] == 'P')
    return ImageFormat::kWebp;
  if (size >= 3 && data[0] == 'P' && (data[1] == '5' || data[1] == '6') &&
      (data[2] == ' ' || data[2] == '\t' || data[2] == '\n' || data[2] == '\r'))
    return ImageFormat::kPnm;
  return ImageFormat::kUnknown;
}

// The tar member extension for a format ("jpg", "png", "webp").
inline std::string_view image_format_extension(ImageFormat f) {
  switch (f) {
    case ImageFormat::kJpeg: return "jpg";
    case ImageFormat::kPng: return "png";
    case ImageFormat::kWebp: return "webp";
    case ImageFormat::kPnm: return "ppm";
    default: return "bin";
  }
}

}  // namespace stoker
