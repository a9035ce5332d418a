// The sidecar index of one shard: for each sample, its key, its label and a table of its members
// (WebDataset's files KEY.jpg, KEY.seg.png, KEY.cls, ...): where each lies in the tar, its
// CRC32C and, for an image, its width and height. Binary, little-endian, versioned; specified in
// docs/FORMAT.md. Version 1 indexes (one image per sample) are read as one-member samples;
// version 1 and 2 indexes record no image sizes (read_image_sizes reads them from the images).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/core/image_size.h"
#include "stoker/io/shard_file.h"

namespace stoker::format {

inline constexpr char kIndexMagic[8] = {'S', 'T', 'K', 'R', 'I', 'D', 'X', '\0'};
inline constexpr uint32_t kIndexVersion = 3;
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
  int64_t label = -1;         // from the sample's .cls member when it has one; -1: none
  uint32_t first_member = 0;  // the sample's members are members[first, first + count)
  uint16_t num_members = 0;
};

struct ShardIndex {
  uint32_t flags = 0;
  uint32_t version = kIndexVersion;  // as read (a built index: the version it is written as)
  uint32_t checksum = 0;  // the trailing CRC32C of the index as read (0 for one built here)
  std::vector<std::string> member_names;  // "jpg", "seg.png", "cls": everything after KEY.
  std::vector<SampleRecord> samples;
  std::vector<MemberRecord> members;
  // Per member (members[i]'s is image_sizes[i]): an image member's width and height, 0 x 0 for
  // the others. Empty when the index records none (versions 1 and 2).
  std::vector<ImageSize> image_sizes;

  std::span<const MemberRecord> members_of(const SampleRecord& s) const {
    return {members.data() + s.first_member, s.num_members};
  }
  bool has_image_sizes() const { return !image_sizes.empty(); }
  // The id of a member name, or -1 when no sample of the shard has it.
  int find_name(std::string_view name) const;
};

// Appends a sample to an index being built (by the writer or a tar scan): names are interned.
class ShardIndexBuilder {
 public:
  void begin_sample(std::string key, int64_t label = -1);
  void add_member(std::string_view name, uint64_t offset, uint64_t size, uint32_t crc32c,
                  ImageSize image_size = {});
  void set_label(int64_t label) { index_.samples.back().label = label; }
  ShardIndex& index() { return index_; }
  const ShardIndex& index() const { return index_; }

 private:
  ShardIndex index_;
};

// True for a member whose name ends in an image extension: "jpg", "seg.png", "webp".
bool is_image_member_name(std::string_view name);

std::string serialize_shard_index(const ShardIndex& index);
// Parses and validates an index of version 1, 2 or 3. `shard_size` bounds every offset; `name` is
// used in errors.
ShardIndex parse_shard_index(const uint8_t* data, size_t size, uint64_t shard_size,
                             const std::string& name);

// Builds an index for a WebDataset tar that stoker did not write: one sample per key, in the order
// keys first appear, with every member the tar has for it; the label from its .cls member if any.
// With `with_crc`, reads every member and records its CRC32C (kIndexFlagHasCrc): the index of a
// foreign shard fetched from object storage, against which later downloads are checked.
ShardIndex index_webdataset_tar(const io::ShardFile& file, bool with_crc = false);

// The image sizes of a shard whose index records none (versions 1 and 2, foreign shards), read
// once from the images' first bytes (read_image_size: 64 KiB, more only where the header goes
// on, at most kMaxSizeProbeBytes), for every member whose name is an image's
// (is_image_member_name); 0 x 0 where the header does not parse. Per member, as
// ShardIndex::image_sizes.
inline constexpr uint64_t kMaxSizeProbeBytes = uint64_t{16} << 20;
std::vector<ImageSize> probe_image_sizes(const io::ShardFile& file, const ShardIndex& index);

// Those sizes kept beside an index that records none (a pack written before version 3), so that
// they are read once: the "sizes file" of docs/FORMAT.md, tied to its index by the index's
// checksum and member count. parse_image_sizes validates every value and throws
// Error(kCorruptData) naming `name` (a stale file, for another index, is kCorruptData too).
std::string serialize_image_sizes(const ShardIndex& index, const std::vector<ImageSize>& sizes);
std::vector<ImageSize> parse_image_sizes(const uint8_t* data, size_t size, const ShardIndex& index,
                                         const std::string& name);

}  // namespace stoker::format
