#include "stoker/format/shard_index.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "stoker/core/checked.h"
#include "stoker/core/crc32c.h"
#include "stoker/core/error.h"
#include "stoker/core/image_format.h"
#include "stoker/core/label.h"
#include "stoker/format/tar.h"

namespace stoker::format {

namespace {

constexpr size_t kHeaderSizeV1 = 32, kRecordSizeV1 = 40;
constexpr size_t kHeaderSize = 48, kRecordSize = 24, kMemberSize = 24, kImageSizeSize = 8;
// The sizes file kept beside an index of version 1 or 2 (docs/FORMAT.md, "Image sizes of older
// packs").
constexpr char kSizesMagic[8] = {'S', 'T', 'K', 'R', 'S', 'I', 'Z', '\0'};
constexpr uint32_t kSizesVersion = 1;
constexpr size_t kSizesHeaderSize = 32;
constexpr uint64_t kProbeBytes = uint64_t{64} << 10;

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

[[noreturn]] void invalid(const std::string& name, const std::string& why) {
  throw Error(ErrorCode::kCorruptData, "invalid shard index: " + why, name);
}

// Version 1: one image per sample, 40-byte records (docs/FORMAT.md, "Version 1 indexes").
ShardIndex parse_v1(const uint8_t* data, size_t size, uint64_t shard_size,
                    const std::string& name) {
  if (size < kHeaderSizeV1 + 4)
    invalid(name, "file too short (" + std::to_string(size) + " bytes)");
  ShardIndex index;
  index.flags = get<uint32_t>(data + 12);
  const auto count = get<uint64_t>(data + 16);
  const auto key_bytes = get<uint64_t>(data + 24);
  const uint64_t expected = checked_add(
      checked_add(kHeaderSizeV1, checked_mul(count, kRecordSizeV1, "index records"), "index"),
      checked_add(key_bytes, 4, "index"), "index");
  if (expected != size)
    invalid(name, "size " + std::to_string(size) + " does not match its header (" +
                      std::to_string(expected) + ")");
  if (get<uint32_t>(data + size - 4) != crc32c(data, size - 4)) invalid(name, "checksum mismatch");
  index.version = 1;
  index.checksum = get<uint32_t>(data + size - 4);
  const uint8_t* keys = data + kHeaderSizeV1 + count * kRecordSizeV1;
  index.member_names = {"bin", "jpg", "png"};  // by the v1 format byte
  index.samples.resize(count);
  index.members.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t* r = data + kHeaderSizeV1 + i * kRecordSizeV1;
    SampleRecord& s = index.samples[i];
    MemberRecord& m = index.members[i];
    m.offset = get<uint64_t>(r);
    m.size = get<uint64_t>(r + 8);
    s.label = get<int64_t>(r + 16);
    const auto key_offset = get<uint64_t>(r + 24);
    m.crc32c = get<uint32_t>(r + 32);
    const auto key_size = get<uint16_t>(r + 36);
    const auto format = get<uint8_t>(r + 38);
    if (!range_within(m.offset, m.size, shard_size))
      invalid(name, "sample " + std::to_string(i) + " lies outside the shard");
    if (!range_within(key_offset, key_size, key_bytes))
      invalid(name, "sample " + std::to_string(i) + " has a key outside the key table");
    if (format > 2)
      invalid(name, "sample " + std::to_string(i) + " has unknown image format " +
                        std::to_string(format));
    if (s.label < -1) invalid(name, "sample " + std::to_string(i) + " has a negative label");
    m.name = format;
    s.first_member = static_cast<uint32_t>(i);
    s.num_members = 1;
    s.key.assign(reinterpret_cast<const char*>(keys + key_offset), key_size);
  }
  return index;
}

}  // namespace

bool is_image_member_name(std::string_view name) {
  const size_t dot = name.rfind('.');
  const std::string_view ext = dot == std::string_view::npos ? name : name.substr(dot + 1);
  return ext == "jpg" || ext == "jpeg" || ext == "png" || ext == "webp" || ext == "ppm" ||
         ext == "pgm";
}

int ShardIndex::find_name(std::string_view name) const {
  for (size_t i = 0; i < member_names.size(); ++i)
    if (member_names[i] == name) return static_cast<int>(i);
  return -1;
}

void ShardIndexBuilder::begin_sample(std::string key, int64_t label) {
  STOKER_CHECK(index_.members.size() < UINT32_MAX, ErrorCode::kResourceLimit,
               "too many members in one shard");
  SampleRecord s;
  s.key = std::move(key);
  s.label = label;
  s.first_member = static_cast<uint32_t>(index_.members.size());
  index_.samples.push_back(std::move(s));
}

void ShardIndexBuilder::add_member(std::string_view name, uint64_t offset, uint64_t size,
                                   uint32_t crc, ImageSize image_size) {
  SampleRecord& s = index_.samples.back();
  STOKER_CHECK(s.num_members < kMaxMembersPerSample, ErrorCode::kResourceLimit,
               "sample '" + s.key + "' has too many members");
  int id = index_.find_name(name);
  if (id < 0) {
    STOKER_CHECK(index_.member_names.size() < kMaxMemberNames, ErrorCode::kResourceLimit,
                 "more than 65535 member names in one shard");
    id = static_cast<int>(index_.member_names.size());
    index_.member_names.emplace_back(name);
  }
  index_.members.push_back({offset, size, crc, static_cast<uint16_t>(id)});
  // Recorded only where it is one an index may hold (read_image_size's bounds): else unknown.
  const bool valid = image_size.known() && image_size.width <= kMaxRecordedSide &&
                     image_size.height <= kMaxRecordedSide;
  index_.image_sizes.push_back(valid ? image_size : ImageSize{});
  ++s.num_members;
}

std::string serialize_shard_index(const ShardIndex& index) {
  std::string keys, names;
  for (const auto& s : index.samples) keys += s.key;
  for (const auto& n : index.member_names) {
    STOKER_CHECK(!n.empty() && n.size() <= 0xFFFF, ErrorCode::kInvalidArgument,
                 "member name must be 1-65535 bytes");
    put<uint16_t>(names, static_cast<uint16_t>(n.size()));
    names += n;
  }
  std::string out;
  STOKER_CHECK(index.image_sizes.empty() || index.image_sizes.size() == index.members.size(),
               ErrorCode::kInvalidArgument, "an index's image sizes must be one per member");
  out.reserve(kHeaderSize + index.samples.size() * kRecordSize +
              index.members.size() * (kMemberSize + kImageSizeSize) + keys.size() + names.size() +
              4);
  out.append(kIndexMagic, 8);
  put<uint32_t>(out, kIndexVersion);
  put<uint32_t>(out, index.flags);
  put<uint64_t>(out, index.samples.size());
  put<uint64_t>(out, index.members.size());
  put<uint64_t>(out, keys.size());
  put<uint64_t>(out, names.size());
  uint64_t key_offset = 0;
  for (const auto& s : index.samples) {
    STOKER_CHECK(s.key.size() <= 0xFFFF, ErrorCode::kInvalidArgument, "sample key too long");
    put<uint64_t>(out, key_offset);
    put<uint32_t>(out, s.first_member);
    put<uint16_t>(out, s.num_members);
    put<uint16_t>(out, static_cast<uint16_t>(s.key.size()));
    put<int64_t>(out, s.label);
    key_offset += s.key.size();
  }
  for (const auto& m : index.members) {
    put<uint64_t>(out, m.offset);
    put<uint64_t>(out, m.size);
    put<uint32_t>(out, m.crc32c);
    put<uint16_t>(out, m.name);
    put<uint16_t>(out, 0);
  }
  out += keys;
  out += names;
  for (size_t i = 0; i < index.members.size(); ++i) {  // none recorded: every one unknown
    const ImageSize size = index.image_sizes.empty() ? ImageSize{} : index.image_sizes[i];
    put<uint32_t>(out, size.width);
    put<uint32_t>(out, size.height);
  }
  put<uint32_t>(out, crc32c(out.data(), out.size()));
  return out;
}

ShardIndex parse_shard_index(const uint8_t* data, size_t size, uint64_t shard_size,
                             const std::string& name) {
  if (size < 16) invalid(name, "file too short (" + std::to_string(size) + " bytes)");
  if (std::memcmp(data, kIndexMagic, 8) != 0) invalid(name, "bad magic");
  const auto version = get<uint32_t>(data + 8);
  if (version == 1) return parse_v1(data, size, shard_size, name);
  if (version != 2 && version != kIndexVersion)
    throw Error(ErrorCode::kUnsupported,
                "shard index version " + std::to_string(version) + " (this stoker reads 1 to " +
                    std::to_string(kIndexVersion) + ")",
                name);
  const bool has_sizes = version >= 3;
  if (size < kHeaderSize + 4) invalid(name, "file too short (" + std::to_string(size) + " bytes)");
  ShardIndex index;
  index.flags = get<uint32_t>(data + 12);
  const auto count = get<uint64_t>(data + 16);
  const auto member_count = get<uint64_t>(data + 24);
  const auto key_bytes = get<uint64_t>(data + 32);
  const auto name_bytes = get<uint64_t>(data + 40);
  // Exact coverage: header + records + members + keys + names + crc must be the whole file.
  uint64_t expected = checked_add(kHeaderSize, checked_mul(count, kRecordSize, "index"), "index");
  expected = checked_add(expected, checked_mul(member_count, kMemberSize, "index"), "index");
  expected = checked_add(expected, checked_add(key_bytes, name_bytes, "index"), "index");
  if (has_sizes)
    expected = checked_add(expected, checked_mul(member_count, kImageSizeSize, "index"), "index");
  expected = checked_add(expected, 4, "index");
  if (expected != size)
    invalid(name, "size " + std::to_string(size) + " does not match its header (" +
                      std::to_string(expected) + ")");
  if (get<uint32_t>(data + size - 4) != crc32c(data, size - 4)) invalid(name, "checksum mismatch");
  if (member_count > UINT32_MAX) invalid(name, "too many members");
  index.version = version;
  index.checksum = get<uint32_t>(data + size - 4);

  const uint8_t* records = data + kHeaderSize;
  const uint8_t* members = records + count * kRecordSize;
  const uint8_t* keys = members + member_count * kMemberSize;
  const uint8_t* names = keys + key_bytes;
  for (uint64_t at = 0; at < name_bytes;) {
    if (name_bytes - at < 2) invalid(name, "name table ends inside a length");
    const auto length = get<uint16_t>(names + at);
    at += 2;
    if (length == 0 || length > name_bytes - at) invalid(name, "a member name overruns the table");
    if (index.member_names.size() >= kMaxMemberNames) invalid(name, "too many member names");
    index.member_names.emplace_back(reinterpret_cast<const char*>(names + at), length);
    at += length;
  }
  std::unordered_set<std::string_view> unique(index.member_names.begin(), index.member_names.end());
  if (unique.size() != index.member_names.size()) invalid(name, "a member name appears twice");

  index.members.resize(member_count);
  for (uint64_t i = 0; i < member_count; ++i) {
    const uint8_t* r = members + i * kMemberSize;
    MemberRecord& m = index.members[i];
    m.offset = get<uint64_t>(r);
    m.size = get<uint64_t>(r + 8);
    m.crc32c = get<uint32_t>(r + 16);
    m.name = get<uint16_t>(r + 20);
    if (!range_within(m.offset, m.size, shard_size))
      invalid(name, "member " + std::to_string(i) + " lies outside the shard");
    if (m.name >= index.member_names.size())
      invalid(name, "member " + std::to_string(i) + " has an unknown name id");
  }
  index.samples.resize(count);
  uint64_t next_member = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t* r = records + i * kRecordSize;
    SampleRecord& s = index.samples[i];
    const auto key_offset = get<uint64_t>(r);
    s.first_member = get<uint32_t>(r + 8);
    s.num_members = get<uint16_t>(r + 12);
    const auto key_size = get<uint16_t>(r + 14);
    s.label = get<int64_t>(r + 16);
    // The member tables of consecutive samples partition the member records, in order.
    if (s.first_member != next_member || s.num_members > member_count - next_member)
      invalid(name, "sample " + std::to_string(i) + " has members out of order");
    next_member += s.num_members;
    if (!range_within(key_offset, key_size, key_bytes))
      invalid(name, "sample " + std::to_string(i) + " has a key outside the key table");
    if (s.label < -1) invalid(name, "sample " + std::to_string(i) + " has a negative label");
    s.key.assign(reinterpret_cast<const char*>(keys + key_offset), key_size);
  }
  if (next_member != member_count) invalid(name, "members that belong to no sample");
  if (has_sizes) {
    const uint8_t* sizes = names + name_bytes;
    index.image_sizes.resize(member_count);
    for (uint64_t i = 0; i < member_count; ++i) {
      const ImageSize s{get<uint32_t>(sizes + i * kImageSizeSize),
                        get<uint32_t>(sizes + i * kImageSizeSize + 4)};
      if ((s.width == 0) != (s.height == 0) || s.width > kMaxRecordedSide ||
          s.height > kMaxRecordedSide)
        invalid(name, "member " + std::to_string(i) + " has an image size out of range (" +
                          std::to_string(s.width) + " x " + std::to_string(s.height) + ")");
      index.image_sizes[i] = s;
    }
  }
  return index;
}

ShardIndex index_webdataset_tar(const io::ShardFile& file, bool with_crc) {
  // Members of one key are usually adjacent; WebDataset allows them anywhere, so collect first.
  struct Partial {
    std::string key;
    std::vector<std::pair<std::string, TarMember>> members;
  };
  std::vector<Partial> samples;
  std::unordered_map<std::string, size_t> by_key;
  std::string key, ext;
  scan_tar(file, [&](const TarMember& m) {
    split_webdataset_name(m.name, key, ext);
    if (ext.empty()) return;  // not a member of any sample (a README, a folder's file)
    auto [it, inserted] = by_key.try_emplace(key, samples.size());
    if (inserted) samples.push_back({key, {}});
    samples[it->second].members.emplace_back(ext, m);
  });
  ShardIndexBuilder builder;  // CRCs only when asked: computing them reads every byte
  if (with_crc) builder.index().flags |= kIndexFlagHasCrc;
  std::vector<uint8_t> text, data;
  for (auto& p : samples) {
    builder.begin_sample(p.key);
    for (const auto& [name, m] : p.members) {
      uint32_t crc = 0;
      ImageSizeResult size;  // read from the first chunk, which is read anyway for the CRC
      constexpr uint64_t kChunk = uint64_t{4} << 20;  // a member of any size in bounded memory
      for (uint64_t done = 0; with_crc && done < m.size; done += kChunk) {
        file.read(m.offset + done, std::min(kChunk, m.size - done), data);
        crc = crc32c(data.data(), data.size(), crc);
        if (done == 0 && is_image_member_name(name))
          size = read_image_size(data.data(), data.size());
      }
      builder.add_member(name, m.offset, m.size, crc,
                         size.status == ImageSizeStatus::kFound ? size.size : ImageSize{});
      if (name == "cls" || name == "label") {
        STOKER_CHECK(m.size <= kMaxLabelBytes, ErrorCode::kCorruptData,
                     file.path() + ": label of '" + p.key + "' is over 64 bytes");
        file.read(m.offset, m.size, text);
        try {
          if (const auto label = parse_label(text.data(), text.size())) builder.set_label(*label);
        } catch (const Error& e) {
          throw Error(e.code(), e.reason(), file.path(), p.key);
        }
      }
    }
  }
  // Without reading the members, nothing is known of their images: the index records no sizes
  // (probe_image_sizes reads them when a loader asks).
  if (!with_crc) builder.index().image_sizes.clear();
  builder.index().version = with_crc ? kIndexVersion : 2;
  return std::move(builder.index());
}

std::vector<ImageSize> probe_image_sizes(const io::ShardFile& file, const ShardIndex& index) {
  std::vector<ImageSize> sizes(index.members.size());
  std::vector<uint8_t> head;
  for (size_t i = 0; i < index.members.size(); ++i) {
    const MemberRecord& m = index.members[i];
    if (!is_image_member_name(index.member_names[m.name])) continue;
    uint64_t want = std::min(m.size, kProbeBytes);
    while (true) {
      file.read(m.offset, want, head);
      const ImageSizeResult r = read_image_size(head.data(), head.size());
      if (r.status == ImageSizeStatus::kFound) sizes[i] = r.size;
      // A header past the first bytes (a large EXIF or ICC block): the member, up to the bound.
      if (r.status != ImageSizeStatus::kNeedMore || want == m.size || want >= kMaxSizeProbeBytes)
        break;
      want = std::min(m.size, kMaxSizeProbeBytes);
    }
  }
  return sizes;
}

std::string serialize_image_sizes(const ShardIndex& index, const std::vector<ImageSize>& sizes) {
  STOKER_CHECK(sizes.size() == index.members.size(), ErrorCode::kInvalidArgument,
               "image sizes must be one per member of the index");
  std::string out;
  out.reserve(kSizesHeaderSize + sizes.size() * kImageSizeSize + 4);
  out.append(kSizesMagic, 8);
  put<uint32_t>(out, kSizesVersion);
  put<uint32_t>(out, 0);  // flags
  put<uint32_t>(out, index.checksum);
  put<uint32_t>(out, 0);  // reserved
  put<uint64_t>(out, sizes.size());
  for (const ImageSize& s : sizes) {
    put<uint32_t>(out, s.width);
    put<uint32_t>(out, s.height);
  }
  put<uint32_t>(out, crc32c(out.data(), out.size()));
  return out;
}

std::vector<ImageSize> parse_image_sizes(const uint8_t* data, size_t size, const ShardIndex& index,
                                         const std::string& name) {
  auto bad = [&](const std::string& why) {
    throw Error(ErrorCode::kCorruptData, "invalid image sizes file: " + why, name);
  };
  if (size < kSizesHeaderSize + 4) bad("file too short (" + std::to_string(size) + " bytes)");
  if (std::memcmp(data, kSizesMagic, 8) != 0) bad("bad magic");
  if (get<uint32_t>(data + 8) != kSizesVersion)
    bad("version " + std::to_string(get<uint32_t>(data + 8)));
  const auto count = get<uint64_t>(data + 24);
  const uint64_t expected = checked_add(
      checked_add(kSizesHeaderSize, checked_mul(count, kImageSizeSize, "sizes"), "sizes"), 4,
      "sizes");
  if (expected != size)
    bad("size " + std::to_string(size) + " does not match its header (" + std::to_string(expected) +
        ")");
  if (get<uint32_t>(data + size - 4) != crc32c(data, size - 4)) bad("checksum mismatch");
  if (get<uint32_t>(data + 16) != index.checksum || count != index.members.size())
    bad("written for another index (the pack changed since): delete it to read the sizes again");
  std::vector<ImageSize> sizes(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t* p = data + kSizesHeaderSize + i * kImageSizeSize;
    const ImageSize s{get<uint32_t>(p), get<uint32_t>(p + 4)};
    if ((s.width == 0) != (s.height == 0) || s.width > kMaxRecordedSide ||
        s.height > kMaxRecordedSide)
      bad("member " + std::to_string(i) + " has an image size out of range");
    sizes[i] = s;
  }
  return sizes;
}

}  // namespace stoker::format
