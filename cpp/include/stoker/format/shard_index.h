// The sidecar index of one shard: for each sample, its key, its label and a table of its members
// (WebDataset's files KEY.jpg, KEY.seg.png, KEY.cls, ...): where each lies in the tar and its
// CRC32C. Binary, little-endian, versioned; specified in docs/FORMAT.md. Version 1 indexes (one
// image per sample) are read as one-member samples.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/io/shard_file.h"

namespace stoker::format {

inline constexpr char kIndexMagic[8] = {'S', 'T', 'K', 'R', 'I', 'D', 'X', '\0'};
inline constexpr uint32_t kIndexVersion = 2;
inline constexpr uint32_t kIndexFlagHasCrc = 1;
// Member names one shard may use (the index stores a member's name as a 16-bit id).
inline constexpr size_t kMaxMemberNames = 0xFFFF;
inline constexpr size_t kMaxMembersPerSample = 0xFFFF;

// One file of a sample: KEY.<name> in the tar.
struct MemberRecord {
  uint64_t offset = 0;  // of the data in the tar (not the header)
  uint64_t size = 0;
  uint32_t crc32c = 0;  // of the data (valid when the index has kIndexFlagHasCrc)
  uint16_t name = 0;    // into ShardIndex::member_names
};

struct SampleRecord {
  std::string key;
  int64_t label = -1;  // from the sample's .cls member when it has one; -1: none
  uint32_t first_member = 0;  // the sample's members are members[first, first + count)
  uint16_t num_members = 0;
};

struct ShardIndex {
  uint32_t flags = 0;
  std::vector<std::string> member_names;  // "jpg", "seg.png", "cls": everything after KEY.
  std::vector<SampleRecord> samples;
  std::vector<MemberRecord> members;

  std::span<const MemberRecord> members_of(const SampleRecord& s) const {
    return {members.data() + s.first_member, s.num_members};
  }
  // The id of a member name, or -1 when no sample of the shard has it.
  int find_name(std::string_view name) const;
};

// Appends a sample to an index being built (by the writer or a tar scan): names are interned.
class ShardIndexBuilder {
 public:
  void begin_sample(std::string key, int64_t label = -1);
  void add_member(std::string_view name, uint64_t offset, uint64_t size, uint32_t crc32c);
  void set_label(int64_t label) { index_.samples.back().label = label; }
  ShardIndex& index() { return index_; }
  const ShardIndex& index() const { return index_; }

 private:
  ShardIndex index_;
};

// True for a member whose name ends in an image extension: "jpg", "seg.png", "webp".
bool is_image_member_name(std::string_view name);

std::string serialize_shard_index(const ShardIndex& index);
// Parses and validates an index of version 1 or 2. `shard_size` bounds every offset; `name` is
// used in errors.
ShardIndex parse_shard_index(const uint8_t* data, size_t size, uint64_t shard_size,
                             const std::string& name);

// Builds an index for a WebDataset tar that stoker did not write: one sample per key, in the order
// keys first appear, with every member the tar has for it; the label from its .cls member if any.
// With `with_crc`, reads every member and records its CRC32C (kIndexFlagHasCrc): the index of a
// foreign shard fetched from object storage, against which later downloads are checked.
ShardIndex index_webdataset_tar(const io::ShardFile& file, bool with_crc = false);

}  // namespace stoker::format
