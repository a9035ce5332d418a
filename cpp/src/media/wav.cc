#include "media/wav.h"

#include <algorithm>
#include <cstring>

namespace stoker::media::detail {

namespace {

uint32_t le32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint16_t le16(const uint8_t* p) { return uint16_t(p[0] | p[1] << 8); }

constexpr uint16_t kPcm = 1, kFloat = 3, kExtensible = 0xFFFE;

}  // namespace

std::optional<PcmWav> parse_pcm_wav(std::span<const uint8_t> bytes) {
  const size_t n = bytes.size();
  const uint8_t* b = bytes.data();
  if (n < 12 || std::memcmp(b, "RIFF", 4) != 0 || std::memcmp(b + 8, "WAVE", 4) != 0) return {};
  PcmWav wav;
  bool have_format = false;
  for (size_t at = 12; at + 8 <= n;) {
    const uint8_t* chunk = b + at;
    const uint64_t size = le32(chunk + 4);
    const size_t body = at + 8;
    if (std::memcmp(chunk, "fmt ", 4) == 0) {
      if (size < 16 || body + 16 > n) return {};
      uint16_t tag = le16(b + body);
      wav.channels = le16(b + body + 2);
      const uint32_t rate = le32(b + body + 4);
      const uint16_t block = le16(b + body + 12);
      wav.bits = le16(b + body + 14);
      if (tag == kExtensible) {  // the subformat GUID's first two bytes are the real tag
        if (size < 40 || body + 40 > n) return {};
        tag = le16(b + body + 24);
      }
      if (rate == 0 || rate > (1u << 30) || wav.channels == 0) return {};
      wav.sample_rate = static_cast<int>(rate);
      wav.floating = tag == kFloat;
      const bool integer =
          tag == kPcm && (wav.bits == 8 || wav.bits == 16 || wav.bits == 24 || wav.bits == 32);
      const bool floating = tag == kFloat && (wav.bits == 32 || wav.bits == 64);
      if (!integer && !floating) return {};
      if (block != wav.channels * (wav.bits / 8)) return {};
      have_format = true;
    } else if (std::memcmp(chunk, "data", 4) == 0) {
      if (!have_format) return {};
      wav.data_offset = body;
      const uint64_t available = n - body;  // a size past the file's end is cut to it
      const uint64_t block = uint64_t(wav.channels) * uint64_t(wav.bits / 8);
      wav.frames = static_cast<int64_t>(std::min(size, available) / block);
      static const char* names[] = {"pcm_u8", "pcm_s16le", "pcm_s24le", "pcm_s32le"};
      wav.codec =
          wav.floating ? (wav.bits == 32 ? "pcm_f32le" : "pcm_f64le") : names[wav.bits / 8 - 1];
      return wav;
    }
    const uint64_t next = uint64_t(body) + size + (size & 1);
    if (next > n) return {};
    at = static_cast<size_t>(next);
  }
  return {};
}

void read_pcm_wav(const PcmWav& wav, std::span<const uint8_t> bytes, int64_t first, int64_t count,
                  std::vector<std::vector<float>>& planes) {
  const int64_t from = std::clamp<int64_t>(first, 0, wav.frames);
  const int64_t to = count < 0 ? wav.frames : std::clamp<int64_t>(first + count, from, wav.frames);
  const int channels = wav.channels, width = wav.bits / 8;
  planes.assign(static_cast<size_t>(channels), std::vector<float>(static_cast<size_t>(to - from)));
  const uint8_t* data = bytes.data() + wav.data_offset;
  const size_t block = static_cast<size_t>(channels) * static_cast<size_t>(width);
  for (int c = 0; c < channels; ++c) {
    float* out = planes[static_cast<size_t>(c)].data();
    const uint8_t* p = data + static_cast<size_t>(from) * block + static_cast<size_t>(c * width);
    for (int64_t i = 0; i < to - from; ++i, p += block) {
      float v;
      if (wav.floating) {
        if (width == 4) {
          std::memcpy(&v, p, 4);
        } else {
          double d;
          std::memcpy(&d, p, 8);
          v = static_cast<float>(d);
        }
      } else if (width == 1) {
        v = static_cast<float>(int(p[0]) - 128) * (1.0f / 128);
      } else if (width == 2) {
        v = static_cast<float>(int16_t(le16(p))) * (1.0f / 32768);
      } else if (width == 3) {
        const auto x = int32_t(uint32_t(p[0]) << 8 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 24);
        v = static_cast<float>(x) * (1.0f / 2147483648.0f);  // as FFmpeg: 24 bits in an s32
      } else {
        v = static_cast<float>(int32_t(le32(p))) * (1.0f / 2147483648.0f);
      }
      out[i] = v;
    }
  }
}

}  // namespace stoker::media::detail
