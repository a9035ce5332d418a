// WebP through libwebp's advanced decoding API (WebPDecode with a WebPDecoderConfig): the header
// with WebPGetFeatures, then one WebPDecode per image, cropped to the rectangle the caller needs,
// written as RGB straight into the decoder's reused pixel buffer.
//
// Exactness: Pillow decodes WebP with libwebp's WebPAnimDecoder (RGBA, options left at their
// defaults, so fancy chroma upsampling on), which for a still image is one WebPDecode into RGBA;
// convert("RGB") then drops alpha. MODE_RGB with the same defaults gives the same RGB bytes.
#include <algorithm>
#include <string>

#include "decode/detail/decoders.h"
#include "stoker/core/error.h"

namespace stoker::decode {

namespace {

constexpr int kLossless = 2;  // WebPBitstreamFeatures::format: 1 lossy, 2 lossless

[[noreturn]] void throw_webp(VP8StatusCode status, const char* what) {
  switch (status) {
    case VP8_STATUS_NOT_ENOUGH_DATA:
      throw_error(ErrorCode::kCorruptData, std::string(what) + ": truncated (not enough data)");
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      throw_error(ErrorCode::kUnsupported,
                  std::string(what) + ": a feature libwebp does not support");
    case VP8_STATUS_OUT_OF_MEMORY:
      throw_error(ErrorCode::kResourceLimit, std::string(what) + ": libwebp ran out of memory");
    case VP8_STATUS_INVALID_PARAM:
    case VP8_STATUS_USER_ABORT:
      throw_error(ErrorCode::kInternal, std::string(what) +
                                            ": libwebp refused the decoder's call (" +
                                            std::to_string(static_cast<int>(status)) + ")");
    default:  // VP8_STATUS_BITSTREAM_ERROR, and SUSPENDED, which WebPDecode never returns
      throw_error(ErrorCode::kCorruptData, std::string(what) + ": corrupt bitstream");
  }
}

std::string size_text(int width, int height) {
  return std::to_string(width) + "x" + std::to_string(height);
}

}  // namespace

ImageInfo detail::WebpDecoder::read_header(const uint8_t* data_in, size_t size_in,
                                           const DecodeOptions& options) {
  (void)options;  // the pixel limit is ImageDecoder::open's, the memory limit decode()'s
  data = data_in;
  size = size_in;
  features = WebPBitstreamFeatures{};
  // Parses the RIFF, VP8X, VP8 or VP8L headers only: nothing is allocated, and a file cut after
  // its headers passes here and fails in decode().
  if (const VP8StatusCode rc = WebPGetFeatures(data, size, &features); rc != VP8_STATUS_OK)
    throw_webp(rc, "WebP header");
  if (features.has_animation)
    throw_error(ErrorCode::kUnsupported, "animated WebP is not supported (" +
                                             size_text(features.width, features.height) +
                                             " canvas)");
  // libwebp's allocations besides the output, from its sources (1.2-1.6): a lossless image is
  // decoded whole into 32-bit ARGB (4 bytes per pixel), with transform and entropy images of up
  // to a quarter of that; a lossy one keeps ~130 bytes per column of row caches and, with an
  // alpha plane, three width x height byte planes. 1 MiB covers the tables. An estimate from
  // above, in 64 bits: sides are at most 2^24.
  const uint64_t w = static_cast<uint64_t>(std::max(features.width, 0));
  const uint64_t h = static_cast<uint64_t>(std::max(features.height, 0));
  working_bytes = features.format == kLossless ? 5 * w * h + 256 * w
                                               : 256 * w + (features.has_alpha ? 3 * w * h : 0);
  working_bytes += uint64_t{1} << 20;

  ImageInfo info;
  info.format = ImageFormat::kWebp;
  info.width = features.width;
  info.height = features.height;
  info.components = 3;  // alpha, if any, is dropped
  info.progressive = false;
  return info;
}

void detail::WebpDecoder::decode(int x0, int y0, int x1, int y1, const DecodeOptions& options,
                                 std::vector<uint8_t>& pixels, DecodedRegion& out) {
  const int width = features.width, height = features.height;
  // The rectangle libwebp decodes, [left, right) x [top, bottom), and inside it the part whose
  // pixels equal the whole-image decode, [ex0, ex1) x [ey0, ey1).
  int left = x0, top = y0, right = x1, bottom = y1;
  int ex0 = x0, ey0 = y0, ex1 = x1, ey1 = y1;
  if (features.format != kLossless) {
    // A lossy crop starts on the 2x2 grid of the chroma planes (libwebp would round it down
    // itself), and libwebp's fancy upsampler treats a crop's first and last rows and columns as
    // image edges, mirroring chroma where the whole image has a neighbour: those pixels differ.
    // Decode one more pixel on each side inside the image, and leave it out of the result.
    left = std::max(0, x0 - 1) & ~1;
    top = std::max(0, y0 - 1) & ~1;
    right = std::min(width, x1 + 1);
    bottom = std::min(height, y1 + 1);
    ex0 = left > 0 ? left + 1 : 0;
    ey0 = top > 0 ? top + 1 : 0;
    ex1 = right < width ? right - 1 : width;
    ey1 = bottom < height ? bottom - 1 : height;
  }
  const int crop_width = right - left, crop_height = bottom - top;
  const uint64_t out_bytes = static_cast<uint64_t>(crop_width) * crop_height * 3;
  if (working_bytes + out_bytes > static_cast<uint64_t>(options.max_decode_memory))
    throw_error(ErrorCode::kResourceLimit, "a " + size_text(width, height) + " WebP needs about " +
                                               std::to_string(working_bytes + out_bytes) +
                                               " bytes to decode, more than max_decode_memory=" +
                                               std::to_string(options.max_decode_memory));
  pixels.resize(out_bytes);

  WebPDecoderConfig config;
  STOKER_CHECK(WebPInitDecoderConfig(&config), ErrorCode::kInternal,
               "libwebp's decoder ABI differs from its header's");
  // Cropping saves the rows below the rectangle (lossy and lossless) and the colour conversion
  // of the columns beside it; rows above must still be decoded (prediction runs through them).
  config.options.use_cropping = left > 0 || top > 0 || right < width || bottom < height;
  config.options.crop_left = left;
  config.options.crop_top = top;
  config.options.crop_width = crop_width;
  config.options.crop_height = crop_height;
  config.options.use_threads = 0;  // one decoder per worker thread already
  config.output.colorspace = MODE_RGB;
  config.output.is_external_memory = 1;
  config.output.u.RGBA.rgba = pixels.data();
  config.output.u.RGBA.stride = crop_width * 3;
  config.output.u.RGBA.size = pixels.size();
  const VP8StatusCode rc = WebPDecode(data, size, &config);
  WebPFreeDecBuffer(&config.output);  // frees nothing of ours (external memory); for symmetry
  if (rc != VP8_STATUS_OK) throw_webp(rc, "WebP data");
  STOKER_CHECK(config.output.width == crop_width && config.output.height == crop_height,
               ErrorCode::kInternal, "libwebp decoded another rectangle than the one asked for");

  const ptrdiff_t stride = static_cast<ptrdiff_t>(crop_width) * 3;
  out.pixels = pixels.data() + (ey0 - top) * stride + (ex0 - left) * 3;
  out.width = ex1 - ex0;
  out.height = ey1 - ey0;
  out.stride = stride;
  out.origin_x = ex0;
  out.origin_y = ey0;
  out.scaled_width = width;
  out.scaled_height = height;
  out.scale_denom = 1;
}

}  // namespace stoker::decode
