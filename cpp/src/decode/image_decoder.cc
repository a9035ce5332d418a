#include "stoker/decode/image_decoder.h"

#include "decode/detail/decoders.h"
#include "stoker/core/error.h"

namespace stoker::decode {

namespace {
constexpr size_t kKeepBufferBytes = size_t{64} << 20;
}  // namespace

void prepare_thread_for_decoding() {
  static const std::vector<uint8_t> tiny = [] {
    std::vector<uint8_t> rgb(16 * 16 * 3);
    for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 7);
    return encode_jpeg(rgb.data(), 16, 16, 16 * 3, 75);
  }();
  ImageDecoder decoder{DecodeOptions{}};
  decoder.open(tiny.data(), tiny.size());
  decoder.decode(1, 0, 0, 16, 16);
}

ImageDecoder::ImageDecoder(DecodeOptions options)
    : options_(options),
      jpeg_(std::make_unique<detail::JpegDecoder>()),
      png_(std::make_unique<detail::PngDecoder>()),
      webp_(std::make_unique<detail::WebpDecoder>()) {}

ImageDecoder::~ImageDecoder() = default;

const ImageInfo& ImageDecoder::open(const uint8_t* data, size_t size) {
  info_ = ImageInfo{};
  // One huge image must not pin its buffer for the rest of the run: give memory back past 64 MiB.
  if (pixels_.capacity() > kKeepBufferBytes) std::vector<uint8_t>().swap(pixels_);
  data_ = data;
  size_ = size;
  const ImageFormat format = sniff_image_format(data, size);
  if (format == ImageFormat::kJpeg) {
    info_ = jpeg_->read_header(data, size, options_);
  } else if (format == ImageFormat::kPng) {
    info_ = png_->read_header(data, size, options_);
  } else if (format == ImageFormat::kWebp) {
    info_ = webp_->read_header(data, size, options_);
  } else if (size == 0) {
    throw_error(ErrorCode::kCorruptData, "empty file");
  } else if (size >= 2 && data[0] == 0xFF && data[1] == 0xD8) {
    // djpeg would skip the junk with a warning; like PIL, stoker refuses such a file.
    throw_error(ErrorCode::kCorruptData, "JPEG start marker followed by junk instead of a marker");
  } else {
    throw_error(ErrorCode::kUnsupported,
                "not a JPEG, PNG or WebP image (unrecognised first bytes)");
  }
  if (info_.width <= 0 || info_.height <= 0)
    throw_error(ErrorCode::kCorruptData, "image has no pixels (" + std::to_string(info_.width) +
                                             "x" + std::to_string(info_.height) + ")");
  if (static_cast<int64_t>(info_.width) * info_.height > options_.max_pixels)
    throw_error(ErrorCode::kResourceLimit,
                "image of " + std::to_string(info_.width) + "x" + std::to_string(info_.height) +
                    " exceeds max_pixels=" + std::to_string(options_.max_pixels));
  return info_;
}

int ImageDecoder::max_scale_denom() const { return info_.format == ImageFormat::kJpeg ? 8 : 1; }

const DecodedRegion& ImageDecoder::decode(int scale_denom, int x0, int y0, int x1, int y1) {
  STOKER_CHECK(info_.format != ImageFormat::kUnknown, ErrorCode::kInvalidArgument,
               "decode() before a successful open()");
  STOKER_CHECK(scale_denom == 1 || scale_denom == 2 || scale_denom == 4 || scale_denom == 8,
               ErrorCode::kInvalidArgument, "scale_denom must be 1, 2, 4 or 8");
  if (info_.format == ImageFormat::kJpeg) {
    const int w = scaled_size(info_.width, scale_denom), h = scaled_size(info_.height, scale_denom);
    x0 = std::max(0, x0), y0 = std::max(0, y0), x1 = std::min(w, x1), y1 = std::min(h, y1);
    STOKER_CHECK(x0 < x1 && y0 < y1, ErrorCode::kInvalidArgument, "empty decode rectangle");
    jpeg_->decode(scale_denom, x0, y0, x1, y1, options_, pixels_, region_);
  } else if (info_.format == ImageFormat::kWebp) {
    STOKER_CHECK(scale_denom == 1, ErrorCode::kInvalidArgument, "WebP decodes at full size only");
    x0 = std::max(0, x0), y0 = std::max(0, y0);
    x1 = std::min(info_.width, x1), y1 = std::min(info_.height, y1);
    STOKER_CHECK(x0 < x1 && y0 < y1, ErrorCode::kInvalidArgument, "empty decode rectangle");
    webp_->decode(x0, y0, x1, y1, options_, pixels_, region_);
  } else {
    STOKER_CHECK(scale_denom == 1, ErrorCode::kInvalidArgument, "PNG decodes at full size only");
    png_->decode(pixels_, region_);
  }
  return region_;
}

const DecodedRegion& ImageDecoder::decode_full() {
  return decode(1, 0, 0, info_.width, info_.height);
}

int ImageDecoder::warnings() const {
  return info_.format == ImageFormat::kJpeg ? jpeg_->err.warnings : 0;
}

std::string ImageDecoder::first_warning() const {
  return info_.format == ImageFormat::kJpeg ? std::string(jpeg_->err.first_warning) : std::string();
}

}  // namespace stoker::decode
