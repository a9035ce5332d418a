#include "stoker/decode/mask_decoder.h"

#include <spng.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>

#include "decode/detail/decoders.h"
#include "stoker/core/error.h"
#include "stoker/core/image_format.h"

namespace stoker::decode {

namespace {

constexpr size_t kKeepBufferBytes = size_t{64} << 20;

struct SpngContextFree {
  void operator()(spng_ctx* ctx) const { spng_ctx_free(ctx); }
};

std::string colour_type_name(const spng_ihdr& ihdr) {
  const std::string bits = std::to_string(ihdr.bit_depth) + "-bit ";
  switch (ihdr.color_type) {
    case SPNG_COLOR_TYPE_GRAYSCALE: return bits + "grey";
    case SPNG_COLOR_TYPE_TRUECOLOR: return bits + "RGB";
    case SPNG_COLOR_TYPE_INDEXED: return bits + "palette";
    case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA: return bits + "grey+alpha";
    case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA: return bits + "RGBA";
    default: return "colour type " + std::to_string(ihdr.color_type);
  }
}

// Spreads rows of packed samples (`bits` per sample, the first in the high bits of a byte, PNG's
// order) to one byte per sample, in place: the packed rows of `row_bytes` start the buffer, the
// result has rows of `width` bytes. Backwards from the last sample, every write lands at or after
// the byte it reads, and after every byte still to be read.
void unpack_in_place(uint8_t* buf, size_t width, size_t height, size_t row_bytes, int bits) {
  const unsigned mask = (1u << bits) - 1;
  for (size_t y = height; y-- > 0;) {
    const uint8_t* in = buf + y * row_bytes;
    uint8_t* out = buf + y * width;
    for (size_t x = width; x-- > 0;) {
      const size_t bit = x * static_cast<size_t>(bits);
      const int shift = 8 - bits - static_cast<int>(bit % 8);
      out[x] = static_cast<uint8_t>((in[bit / 8] >> shift) & mask);
    }
  }
}

}  // namespace

MaskDecoder::MaskDecoder(DecodeOptions options) : options_(options) {}

MaskImage MaskDecoder::decode(const uint8_t* data, size_t size) {
  // One huge mask must not pin its buffer for the rest of the run.
  if (values_.capacity() > kKeepBufferBytes) std::vector<uint8_t>().swap(values_);
  const ImageFormat format = sniff_image_format(data, size);
  if (format == ImageFormat::kJpeg || format == ImageFormat::kWebp)
    throw_error(ErrorCode::kUnsupported, "masks must be PNG (lossless)");
  if (format != ImageFormat::kPng) {
    if (size == 0) throw_error(ErrorCode::kCorruptData, "empty file");
    throw_error(ErrorCode::kUnsupported, "not a PNG mask (unrecognised first bytes)");
  }

  std::unique_ptr<spng_ctx, SpngContextFree> ctx(spng_ctx_new(0));
  STOKER_CHECK(ctx, ErrorCode::kResourceLimit, "cannot allocate a PNG decoder");
  detail::configure_spng(ctx.get(), data, size, options_.max_pixels, "mask PNG");
  spng_ihdr ihdr{};
  if (int rc = spng_get_ihdr(ctx.get(), &ihdr)) detail::throw_spng(rc, "mask PNG header");

  const bool grey_or_palette =
      ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE || ihdr.color_type == SPNG_COLOR_TYPE_INDEXED;
  if (!grey_or_palette || ihdr.bit_depth > 8)
    throw_error(
        ErrorCode::kUnsupported,
        "a mask must be a grey or palette PNG of at most 8 bits, not " + colour_type_name(ihdr));
  const size_t width = ihdr.width, height = ihdr.height;  // at most 2^31 - 1 each (libspng)
  const std::string size_text = std::to_string(width) + "x" + std::to_string(height);
  const uint64_t pixels = uint64_t{ihdr.width} * ihdr.height;
  if (pixels > static_cast<uint64_t>(std::max<int64_t>(options_.max_pixels, 0)))
    throw_error(ErrorCode::kResourceLimit, "mask of " + size_text + " exceeds max_pixels=" +
                                               std::to_string(options_.max_pixels));
  // Deflate cannot compress better than 1032:1: a file smaller than its filtered rows / 1032
  // cannot hold them (a bomb, or a truncation), and is refused before zlib runs for nothing.
  const size_t row_bytes = (width * ihdr.bit_depth + 7) / 8;
  const uint64_t raw_bytes = (uint64_t{row_bytes} + 1) * height;
  if (size < raw_bytes / 1032)
    throw_error(ErrorCode::kCorruptData,
                "a " + size_text + " mask PNG needs at least " + std::to_string(raw_bytes / 1032) +
                    " bytes of compressed data, the file has " + std::to_string(size) +
                    " (truncated, or a decompression bomb)");
  // The one buffer holds the packed rows, then the unpacked ones; libspng adds two rows of
  // scanlines (three when interlaced).
  const uint64_t decode_bytes = pixels + 3 * (uint64_t{row_bytes} + 32);
  if (decode_bytes > static_cast<uint64_t>(options_.max_decode_memory))
    throw_error(ErrorCode::kResourceLimit, "a " + size_text + " mask PNG needs " +
                                               std::to_string(decode_bytes) +
                                               " bytes to decode, more than max_decode_memory=" +
                                               std::to_string(options_.max_decode_memory));

  size_t packed_bytes = 0;
  if (int rc = spng_decoded_image_size(ctx.get(), SPNG_FMT_RAW, &packed_bytes))
    detail::throw_spng(rc, "mask PNG");
  STOKER_CHECK(packed_bytes == row_bytes * height, ErrorCode::kInternal,
               "unexpected mask PNG buffer size");
  values_.resize(width * height);
  // libspng deinterlaces packed samples by OR-ing each into its byte: those must start at zero.
  if (ihdr.interlace_method != 0 && ihdr.bit_depth < 8)
    std::fill(values_.begin(), values_.begin() + static_cast<ptrdiff_t>(packed_bytes), 0);
  // SPNG_FMT_RAW: the samples as stored (palette indices, grey levels unscaled), deinterlaced.
  if (int rc = spng_decode_image(ctx.get(), values_.data(), values_.size(), SPNG_FMT_RAW, 0))
    detail::throw_spng(rc, "mask PNG data");
  if (ihdr.bit_depth < 8) unpack_in_place(values_.data(), width, height, row_bytes, ihdr.bit_depth);
  return MaskImage{values_.data(), static_cast<int>(width), static_cast<int>(height)};
}

}  // namespace stoker::decode
