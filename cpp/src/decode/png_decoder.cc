#include <cstring>
#include <limits>

#include "decode/detail/decoders.h"
#include "stoker/core/error.h"

namespace stoker::decode {

using detail::throw_spng;

void detail::throw_spng(int code, const char* what) {
  const ErrorCode kind = code == SPNG_EUSER_WIDTH || code == SPNG_EUSER_HEIGHT ||
                                 code == SPNG_ECHUNK_LIMITS || code == SPNG_EOVERFLOW
                             ? ErrorCode::kResourceLimit
                             : ErrorCode::kCorruptData;
  throw_error(kind, std::string(what) + ": " + spng_strerror(code));
}

void detail::configure_spng(spng_ctx* ctx, const uint8_t* data, size_t size, int64_t max_pixels,
                            const char* what) {
  const auto max_side =
      static_cast<uint32_t>(std::min<int64_t>(max_pixels, std::numeric_limits<int32_t>::max()));
  spng_set_image_limits(ctx, max_side, max_side);
  spng_set_chunk_limits(ctx, 64u << 20, 64u << 20);
  if (int rc = spng_set_png_buffer(ctx, data, size)) throw_spng(rc, what);
}

ImageInfo detail::PngDecoder::read_header(const uint8_t* data, size_t size,
                                          const DecodeOptions& options) {
  reset();  // spng contexts are single-use
  ctx = spng_ctx_new(0);
  STOKER_CHECK(ctx, ErrorCode::kResourceLimit, "cannot allocate a PNG decoder");
  configure_spng(ctx, data, size, options.max_pixels, "PNG");
  if (int rc = spng_get_ihdr(ctx, &ihdr)) throw_spng(rc, "PNG header");
  // Deflate cannot compress better than 1032:1: a file smaller than its raw size / 1032 cannot
  // hold its image (a bomb, or a truncation), and is refused before zlib runs for nothing.
  const int channels = ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE         ? 1
                       : ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE_ALPHA ? 2
                       : ihdr.color_type == SPNG_COLOR_TYPE_TRUECOLOR       ? 3
                       : ihdr.color_type == SPNG_COLOR_TYPE_TRUECOLOR_ALPHA ? 4
                                                                            : 1;
  const uint64_t raw_bytes =
      (uint64_t{ihdr.width} * channels * ihdr.bit_depth + 7) / 8 * ihdr.height + ihdr.height;
  if (size < raw_bytes / 1032)
    throw_error(ErrorCode::kCorruptData,
                "a " + std::to_string(ihdr.width) + "x" + std::to_string(ihdr.height) +
                    " PNG needs at least " + std::to_string(raw_bytes / 1032) +
                    " bytes of compressed data, the file has " + std::to_string(size) +
                    " (truncated, or a decompression bomb)");
  // The RGBA8 buffer is allocated whole: refuse it before it is.
  const uint64_t rgba_bytes = uint64_t{ihdr.width} * ihdr.height * 4;
  if (rgba_bytes > static_cast<uint64_t>(options.max_decode_memory))
    throw_error(ErrorCode::kResourceLimit, "a " + std::to_string(ihdr.width) + "x" +
                                               std::to_string(ihdr.height) + " PNG needs " +
                                               std::to_string(rgba_bytes) +
                                               " bytes to decode, more than max_decode_memory=" +
                                               std::to_string(options.max_decode_memory));
  ImageInfo info;
  info.format = ImageFormat::kPng;
  info.width = static_cast<int>(ihdr.width);
  info.height = static_cast<int>(ihdr.height);
  info.components = ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE         ? 1
                    : ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE_ALPHA ? 2
                    : ihdr.color_type == SPNG_COLOR_TYPE_TRUECOLOR_ALPHA ? 4
                                                                         : 3;
  info.progressive = ihdr.interlace_method != 0;
  return info;
}

void detail::PngDecoder::decode(std::vector<uint8_t>& pixels, DecodedRegion& out) {
  // RGBA8 is the one output format libspng converts every PNG type to; alpha is then dropped,
  // as PIL's convert("RGB") does.
  size_t bytes = 0;
  if (int rc = spng_decoded_image_size(ctx, SPNG_FMT_RGBA8, &bytes)) throw_spng(rc, "PNG");
  const size_t width = ihdr.width, height = ihdr.height;
  STOKER_CHECK(bytes == width * height * 4, ErrorCode::kInternal, "unexpected PNG buffer size");
  pixels.resize(bytes);
  if (int rc = spng_decode_image(ctx, pixels.data(), bytes, SPNG_FMT_RGBA8, SPNG_DECODE_TRNS))
    throw_spng(rc, "PNG data");
  reset();
  uint8_t* rgb = pixels.data();
  const uint8_t* rgba = pixels.data();
  for (size_t i = 0, n = width * height; i < n; ++i, rgba += 4, rgb += 3) {
    rgb[0] = rgba[0];
    rgb[1] = rgba[1];
    rgb[2] = rgba[2];
  }
  out.pixels = pixels.data();
  out.width = static_cast<int>(width);
  out.height = static_cast<int>(height);
  out.stride = static_cast<ptrdiff_t>(width * 3);
  out.origin_x = 0;
  out.origin_y = 0;
  out.scaled_width = out.width;
  out.scaled_height = out.height;
  out.scale_denom = 1;
}

}  // namespace stoker::decode
