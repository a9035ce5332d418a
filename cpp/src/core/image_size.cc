#include "stoker/core/image_size.h"

#include <algorithm>

#include "stoker/core/image_format.h"

namespace stoker {

namespace {

constexpr ImageSizeResult kNeedMore{ImageSizeStatus::kNeedMore, {}};
constexpr ImageSizeResult kInvalid{ImageSizeStatus::kInvalid, {}};

uint32_t be16(const uint8_t* p) { return uint32_t{p[0]} << 8 | p[1]; }
uint32_t be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3];
}
uint32_t le16(const uint8_t* p) { return uint32_t{p[0]} | uint32_t{p[1]} << 8; }
uint32_t le24(const uint8_t* p) { return le16(p) | uint32_t{p[2]} << 16; }
uint32_t le32(const uint8_t* p) { return le24(p) | uint32_t{p[3]} << 24; }

ImageSizeResult found(uint64_t width, uint64_t height) {
  if (width == 0 || height == 0 || width > kMaxRecordedSide || height > kMaxRecordedSide)
    return kInvalid;
  return {ImageSizeStatus::kFound, {static_cast<uint32_t>(width), static_cast<uint32_t>(height)}};
}

// Markers up to the first frame header, as libjpeg's jdmarker reads them (next_marker): bytes
// other than 0xFF between segments are skipped (libjpeg warns of "extraneous bytes"), fill bytes
// before a marker too, and 0xFF 0x00 is not a marker.
ImageSizeResult jpeg_size(const uint8_t* data, size_t size) {
  size_t at = 2;  // after SOI
  while (true) {
    uint8_t marker = 0;
    while (marker == 0) {
      while (at < size && data[at] != 0xFF) ++at;
      while (at < size && data[at] == 0xFF) ++at;
      if (at >= size) return kNeedMore;
      marker = data[at++];
    }
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;       // no length
    if (marker == 0xD8 || marker == 0xD9 || marker == 0xDA) return kInvalid;  // no frame first
    if (size - at < 2) return kNeedMore;
    // libjpeg skips length - 2 bytes after the length itself: nothing where it is below 2.
    const uint32_t length = std::max<uint32_t>(be16(data + at), 2);
    const bool frame =
        marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (frame) {
      if (length < 8) return kInvalid;
      if (size - at < 7) return kNeedMore;
      return found(be16(data + at + 5), be16(data + at + 3));  // precision, height, width
    }
    if (size - at < length) return kNeedMore;
    at += length;
  }
}

ImageSizeResult png_size(const uint8_t* data, size_t size) {
  if (size < 24) return kNeedMore;
  if (be32(data + 8) != 13 || data[12] != 'I' || data[13] != 'H' || data[14] != 'D' ||
      data[15] != 'R')
    return kInvalid;
  const uint32_t width = be32(data + 16), height = be32(data + 20);
  if (width > 0x7FFFFFFF || height > 0x7FFFFFFF) return kInvalid;  // the PNG spec's bound
  return found(width, height);
}

// The first chunk after RIFF....WEBP: a simple lossy file (VP8), a lossless one (VP8L), or an
// extended one (VP8X: the canvas size, what libwebp's WebPGetFeatures reports).
ImageSizeResult webp_size(const uint8_t* data, size_t size) {
  if (size < 20) return kNeedMore;
  const uint8_t* chunk = data + 12;
  const uint32_t chunk_size = le32(chunk + 4);
  const uint8_t* body = chunk + 8;
  const size_t available = size - 20;
  auto is = [&](const char* tag) {
    return chunk[0] == tag[0] && chunk[1] == tag[1] && chunk[2] == tag[2] && chunk[3] == tag[3];
  };
  if (is("VP8 ")) {
    if (chunk_size < 10) return kInvalid;
    if (available < 10) return kNeedMore;
    if ((body[0] & 1) != 0) return kInvalid;  // not a key frame
    if (body[3] != 0x9D || body[4] != 0x01 || body[5] != 0x2A) return kInvalid;
    return found(le16(body + 6) & 0x3FFF, le16(body + 8) & 0x3FFF);
  }
  if (is("VP8L")) {
    if (chunk_size < 5) return kInvalid;
    if (available < 5) return kNeedMore;
    if (body[0] != 0x2F) return kInvalid;
    const uint32_t bits = le32(body + 1);
    if ((bits >> 29) != 0) return kInvalid;  // version
    return found((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1);
  }
  if (is("VP8X")) {
    if (chunk_size < 10) return kInvalid;
    if (available < 10) return kNeedMore;
    return found(uint64_t{le24(body + 4)} + 1, uint64_t{le24(body + 7)} + 1);
  }
  return kInvalid;
}

bool pnm_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// P5/P6 as decode's PNM reader takes them: whitespace and comments, then width and height (each
// at most 1,000,000).
ImageSizeResult pnm_size(const uint8_t* data, size_t size) {
  size_t at = 2;
  uint64_t values[2] = {0, 0};
  for (uint64_t& value : values) {
    bool separated = false;
    while (at < size) {
      if (pnm_space(data[at])) {
        separated = true;
        ++at;
      } else if (data[at] == '#') {
        while (at < size && data[at] != '\n' && data[at] != '\r') ++at;
        separated = true;
      } else {
        break;
      }
    }
    if (at >= size) return kNeedMore;
    if (!separated || data[at] < '0' || data[at] > '9') return kInvalid;
    while (at < size && data[at] >= '0' && data[at] <= '9') {
      value = value * 10 + static_cast<uint64_t>(data[at++] - '0');
      if (value > 1'000'000) return kInvalid;
    }
    if (at >= size) return kNeedMore;  // the number may go on
  }
  return found(values[0], values[1]);
}

}  // namespace

ImageSizeResult read_image_size(const uint8_t* data, size_t size) {
  if (data == nullptr || size == 0) return size == 0 ? kNeedMore : kInvalid;
  switch (sniff_image_format(data, size)) {
    case ImageFormat::kJpeg: return jpeg_size(data, size);
    case ImageFormat::kPng: return png_size(data, size);
    case ImageFormat::kWebp: return webp_size(data, size);
    case ImageFormat::kPnm: return pnm_size(data, size);
    default:
      // Too few bytes to tell yet: as many as the longest signature (a WebP's 12) decide it.
      return size < 12 ? kNeedMore : kInvalid;
  }
}

}  // namespace stoker
