#include "stoker/decode/image_decoder.h"

#include "decode/detail/decoders.h"
#include "stoker/core/error.h"

namespace stoker::decode {

namespace {
constexpr size_t kKeepBufferBytes = size_t{64} << 20;

bool pnm_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// A binary PPM/PGM header: "P6" or "P5", then width, height and maxval as decimal numbers, each
// after whitespace (a '#' comment runs to the end of its line), then exactly one whitespace
// byte before the pixels. Only maxval 255 (8 bits). Every number is bounded before it is used.
struct PnmHeader {
  int width = 0, height = 0, channels = 0;
  size_t data_offset = 0;
};

PnmHeader parse_pnm_header(const uint8_t* data, size_t size) {
  PnmHeader h;
  h.channels = data[1] == '6' ? 3 : 1;
  size_t pos = 2;
  int64_t values[3] = {0, 0, 0};
  for (int64_t& value : values) {
    // Whitespace and comments, at least one separator.
    bool separated = false;
    while (pos < size) {
      if (pnm_space(data[pos])) {
        separated = true;
        ++pos;
      } else if (data[pos] == '#') {
        while (pos < size && data[pos] != '\n' && data[pos] != '\r') ++pos;
        separated = true;
      } else {
        break;
      }
    }
    if (!separated || pos >= size || data[pos] < '0' || data[pos] > '9')
      throw_error(ErrorCode::kCorruptData, "PNM: malformed header");
    while (pos < size && data[pos] >= '0' && data[pos] <= '9') {
      value = value * 10 + (data[pos++] - '0');
      if (value > 1'000'000)
        throw_error(ErrorCode::kCorruptData, "PNM: a header number is too large");
    }
  }
  if (pos >= size || !pnm_space(data[pos]))
    throw_error(ErrorCode::kCorruptData, "PNM: no whitespace between the header and the pixels");
  if (values[2] != 255)
    throw_error(ErrorCode::kUnsupported, "PNM: maxval " + std::to_string(values[2]) +
                                             " (8-bit files, maxval 255, are read)");
  h.width = static_cast<int>(values[0]);
  h.height = static_cast<int>(values[1]);
  h.data_offset = pos + 1;
  return h;
}

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

ImageDecoder::ImageDecoder(DecodeOptions options, std::shared_ptr<ScanIndexCache> scan_indexes)
    : options_(options),
      jpeg_(std::make_unique<detail::JpegDecoder>()),
      png_(std::make_unique<detail::PngDecoder>()),
      webp_(std::make_unique<detail::WebpDecoder>()) {
  if (options_.scan_index) jpeg_->scan_indexes = std::move(scan_indexes);
}

ImageDecoder::~ImageDecoder() = default;

const ImageInfo& ImageDecoder::open(const uint8_t* data, size_t size, int64_t key) {
  info_ = ImageInfo{};
  // One huge image must not pin its buffer for the rest of the run: give memory back past 64 MiB.
  if (pixels_.capacity() > kKeepBufferBytes) std::vector<uint8_t>().swap(pixels_);
  data_ = data;
  size_ = size;
  const ImageFormat format = sniff_image_format(data, size);
  if (format == ImageFormat::kJpeg) {
    info_ = jpeg_->read_header(data, size, options_);
    jpeg_->scan_key = key;
  } else if (format == ImageFormat::kPng) {
    info_ = png_->read_header(data, size, options_);
  } else if (format == ImageFormat::kWebp) {
    info_ = webp_->read_header(data, size, options_);
  } else if (format == ImageFormat::kPnm) {
    const PnmHeader h = parse_pnm_header(data, size);
    open_raw(data + h.data_offset, size - h.data_offset, h.width, h.height, h.channels);
    info_.format = ImageFormat::kPnm;
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

const ImageInfo& ImageDecoder::open_raw(const uint8_t* pixels, size_t size, int width, int height,
                                        int channels) {
  info_ = ImageInfo{};
  if (width <= 0 || height <= 0)
    throw_error(ErrorCode::kCorruptData, "image has no pixels (" + std::to_string(width) + "x" +
                                             std::to_string(height) + ")");
  if (channels != 1 && channels != 3)
    throw_error(ErrorCode::kUnsupported,
                std::to_string(channels) + " channels (grey and RGB pixels are read)");
  if (static_cast<int64_t>(width) * height > options_.max_pixels)
    throw_error(ErrorCode::kResourceLimit,
                "image of " + std::to_string(width) + "x" + std::to_string(height) +
                    " exceeds max_pixels=" + std::to_string(options_.max_pixels));
  const uint64_t needed = static_cast<uint64_t>(width) * static_cast<uint64_t>(height) *
                          static_cast<uint64_t>(channels);  // < 2^28 * 3: no overflow
  if (size != needed)
    throw_error(ErrorCode::kCorruptData,
                "a " + std::to_string(width) + "x" + std::to_string(height) + "x" +
                    std::to_string(channels) + " image needs " + std::to_string(needed) +
                    " bytes of pixels, there are " + std::to_string(size) +
                    (size < needed ? " (truncated)" : " (trailing bytes)"));
  raw_ = pixels;
  raw_channels_ = channels;
  info_.format = ImageFormat::kRaw;
  info_.width = width;
  info_.height = height;
  info_.components = channels;
  return info_;
}

int ImageDecoder::max_scale_denom() const { return info_.format == ImageFormat::kJpeg ? 8 : 1; }

bool ImageDecoder::starts() {
  return info_.format != ImageFormat::kJpeg || jpeg_->starts(data_, size_, options_);
}

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
  } else if (info_.format == ImageFormat::kPnm || info_.format == ImageFormat::kRaw) {
    STOKER_CHECK(scale_denom == 1, ErrorCode::kInvalidArgument, "pixels are read at full size");
    x0 = std::max(0, x0), y0 = std::max(0, y0);
    x1 = std::min(info_.width, x1), y1 = std::min(info_.height, y1);
    STOKER_CHECK(x0 < x1 && y0 < y1, ErrorCode::kInvalidArgument, "empty decode rectangle");
    const size_t row = static_cast<size_t>(info_.width) * static_cast<size_t>(raw_channels_);
    region_ = DecodedRegion{};
    region_.width = x1 - x0;
    region_.height = y1 - y0;
    region_.origin_x = x0;
    region_.origin_y = y0;
    region_.scaled_width = info_.width;
    region_.scaled_height = info_.height;
    if (raw_channels_ == 3) {  // the pixels themselves: no copy
      region_.pixels = raw_ + row * static_cast<size_t>(y0) + static_cast<size_t>(x0) * 3;
      region_.stride = static_cast<ptrdiff_t>(row);
    } else {  // grey: RGB of the rectangle
      const size_t out_row = static_cast<size_t>(region_.width) * 3;
      pixels_.resize(out_row * static_cast<size_t>(region_.height));
      for (int y = 0; y < region_.height; ++y) {
        const uint8_t* in = raw_ + row * static_cast<size_t>(y0 + y) + static_cast<size_t>(x0);
        uint8_t* out = pixels_.data() + out_row * static_cast<size_t>(y);
        for (int x = 0; x < region_.width; ++x, out += 3) out[0] = out[1] = out[2] = in[x];
      }
      region_.pixels = pixels_.data();
      region_.stride = static_cast<ptrdiff_t>(out_row);
    }
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
