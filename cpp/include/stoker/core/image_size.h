// An image's width and height from the first bytes of its file (JPEG's first frame header, PNG's
// IHDR, WebP's VP8/VP8L/VP8X header, a PPM/PGM header), without a decoder: what the shard index
// records for every image member (docs/FORMAT.md, index version 3), and what is read once for
// packs written before it. Every input is untrusted; nothing is allocated.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker {

// The largest side an index records (a larger image is recorded as unknown, 0 x 0). Decoders
// refuse far smaller images (max_pixels); the bound only keeps every recorded value small.
inline constexpr uint32_t kMaxRecordedSide = uint32_t{1} << 24;

struct ImageSize {
  uint32_t width = 0, height = 0;  // 0 x 0: unknown (not an image, or not recorded)
  bool known() const { return width > 0 && height > 0; }
  friend bool operator==(const ImageSize&, const ImageSize&) = default;
};

enum class ImageSizeStatus {
  kFound,     // width and height are the file's
  kNeedMore,  // the header goes on past the bytes given: read more of the file
  kInvalid,   // not an image this reader knows, or its header is malformed
};

struct ImageSizeResult {
  ImageSizeStatus status = ImageSizeStatus::kInvalid;
  ImageSize size;
};

// Reads the size from [data, data + size). JPEG: the first SOFn marker's frame header (the one
// libjpeg decodes); a frame with height 0 (set later by a DNL marker) is kInvalid. Sides above
// kMaxRecordedSide are kInvalid.
ImageSizeResult read_image_size(const uint8_t* data, size_t size);

}  // namespace stoker
