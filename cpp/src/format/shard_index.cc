#include "stoker/format/shard_index.h"

#include <bit>
#include <cstring>
#include <map>

#include "stoker/core/checked.h"
#include "stoker/core/crc32c.h"
#include "stoker/core/error.h"
#include "stoker/format/tar.h"

namespace stoker::format {

namespace {

constexpr size_t kHeaderSize = 32;

template <typename T>
void put(std::string& out, T v) {
  static_assert(std::endian::native == std::endian::little, "index I/O assumes little-endian");
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

std::string serialize_shard_index(const ShardIndex& index) {
  std::string keys;
  for (const auto& s : index.samples) keys += s.key;
  std::string out;
  out.reserve(kHeaderSize + index.samples.size() * kIndexRecordSize + keys.size() + 4);
  out.append(kIndexMagic, 8);
  put<uint32_t>(out, kIndexVersion);
  put<uint32_t>(out, index.flags);
  put<uint64_t>(out, index.samples.size());
  put<uint64_t>(out, keys.size());
  uint64_t key_offset = 0;
  for (const auto& s : index.samples) {
    STOKER_CHECK(s.key.size() <= 0xFFFF, ErrorCode::kInvalidArgument, "sample key too long");
    put<uint64_t>(out, s.offset);
    put<uint64_t>(out, s.size);
    put<int64_t>(out, s.label);
    put<uint64_t>(out, key_offset);
    put<uint32_t>(out, s.crc32c);
    put<uint16_t>(out, static_cast<uint16_t>(s.key.size()));
    put<uint8_t>(out, static_cast<uint8_t>(s.format));
    put<uint8_t>(out, 0);
    key_offset += s.key.size();
  }
  out += keys;
  put<uint32_t>(out, crc32c(out.data(), out.size()));
  return out;
}

ShardIndex parse_shard_index(const uint8_t* data, size_t size, uint64_t shard_size,
                             const std::string& name) {
  auto fail = [&](const std::string& why) -> void {
    throw Error(ErrorCode::kCorruptData, "invalid shard index: " + why, name);
  };
  if (size < kHeaderSize + 4) fail("file too short (" + std::to_string(size) + " bytes)");
  if (std::memcmp(data, kIndexMagic, 8) != 0) fail("bad magic");
  const auto version = get<uint32_t>(data + 8);
  if (version != kIndexVersion)
    throw Error(ErrorCode::kUnsupported,
                "shard index version " + std::to_string(version) + " (this stoker reads " +
                    std::to_string(kIndexVersion) + ")",
                name);
  ShardIndex index;
  index.flags = get<uint32_t>(data + 12);
  const auto count = get<uint64_t>(data + 16);
  const auto key_bytes = get<uint64_t>(data + 24);
  // Exact coverage: header + records + keys + crc must be the whole file.
  const uint64_t expected = checked_add(
      checked_add(kHeaderSize, checked_mul(count, kIndexRecordSize, "index records"), "index"),
      checked_add(key_bytes, 4, "index"), "index");
  if (expected != size)
    fail("size " + std::to_string(size) + " does not match its header (" +
         std::to_string(expected) + ")");
  if (get<uint32_t>(data + size - 4) != crc32c(data, size - 4)) fail("checksum mismatch");
  const uint8_t* keys = data + kHeaderSize + count * kIndexRecordSize;
  index.samples.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t* r = data + kHeaderSize + i * kIndexRecordSize;
    SampleRecord& s = index.samples[i];
    s.offset = get<uint64_t>(r);
    s.size = get<uint64_t>(r + 8);
    s.label = get<int64_t>(r + 16);
    const auto key_offset = get<uint64_t>(r + 24);
    s.crc32c = get<uint32_t>(r + 32);
    const auto key_size = get<uint16_t>(r + 36);
    const auto format = get<uint8_t>(r + 38);
    if (!range_within(s.offset, s.size, shard_size))
      fail("sample " + std::to_string(i) + " lies outside the shard");
    if (!range_within(key_offset, key_size, key_bytes))
      fail("sample " + std::to_string(i) + " has a key outside the key table");
    if (format > static_cast<uint8_t>(ImageFormat::kPng))
      fail("sample " + std::to_string(i) + " has unknown image format " + std::to_string(format));
    s.format = static_cast<ImageFormat>(format);
    s.key.assign(reinterpret_cast<const char*>(keys + key_offset), key_size);
  }
  return index;
}

ShardIndex index_webdataset_tar(const io::ShardFile& file) {
  struct Partial {
    SampleRecord record;
    bool has_image = false;
    uint64_t cls_offset = 0, cls_size = 0;
    bool has_cls = false;
  };
  std::vector<Partial> samples;
  std::map<std::string, size_t> by_key;
  std::string key, ext;
  scan_tar(file, [&](const TarMember& m) {
    split_webdataset_name(m.name, key, ext);
    const bool image = ext == "jpg" || ext == "jpeg" || ext == "png";
    const bool cls = ext == "cls" || ext == "label";
    if (!image && !cls) return;
    auto [it, inserted] = by_key.try_emplace(key, samples.size());
    if (inserted) {
      samples.emplace_back();
      samples.back().record.key = key;
    }
    Partial& p = samples[it->second];
    if (image && !p.has_image) {
      p.has_image = true;
      p.record.offset = m.offset;
      p.record.size = m.size;
      p.record.format = ext == "png" ? ImageFormat::kPng : ImageFormat::kJpeg;
    } else if (cls) {
      p.has_cls = true;
      p.cls_offset = m.offset;
      p.cls_size = m.size;
    }
  });
  ShardIndex index;  // no CRCs: computing them would read every byte
  std::vector<uint8_t> text;
  for (auto& p : samples) {
    if (!p.has_image) continue;
    if (p.has_cls) {
      STOKER_CHECK(p.cls_size <= 64, ErrorCode::kCorruptData,
                   file.path() + ": label of '" + p.record.key + "' is over 64 bytes");
      file.read(p.cls_offset, p.cls_size, text);
      int64_t label = 0;
      bool any = false;
      for (uint8_t c : text) {
        if (c >= '0' && c <= '9' && label < (INT64_MAX - 9) / 10) {
          label = label * 10 + (c - '0');
          any = true;
        } else if (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
          if (any) break;
        } else {
          throw Error(ErrorCode::kCorruptData, "label is not a non-negative integer", file.path(),
                      p.record.key);
        }
      }
      if (any) p.record.label = label;
    }
    index.samples.push_back(std::move(p.record));
  }
  return index;
}

}  // namespace stoker::format
