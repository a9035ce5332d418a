// A dataset: an ordered list of samples spread over shard files. Opened from a stoker pack (a
// folder with manifest.json), a single WebDataset .tar, or a folder of .tar files (indexed on
// open).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stoker/format/shard_index.h"
#include "stoker/io/shard_file.h"

namespace stoker::format {

inline constexpr int kPackFormatVersion = 2;  // 1 still loads: its samples are one image
inline constexpr const char* kManifestName = "manifest.json";

struct SampleLocation {
  uint32_t shard = 0;
  uint32_t record = 0;  // index into that shard's records
};

// Immutable after open(); safe to share between threads.
class Dataset {
 public:
  static std::shared_ptr<const Dataset> open(const std::string& path);
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;
  // Foreign WebDataset shards, in the given order.
  static std::shared_ptr<const Dataset> open_tars(const std::vector<std::string>& tar_paths);

  int64_t size() const { return static_cast<int64_t>(locations_.size()); }
  const SampleRecord& record(int64_t i) const;
  // The sample's members (files KEY.<name>), in tar order; names via shard_index(i).
  std::span<const MemberRecord> members(int64_t i) const;
  uint32_t shard_of(int64_t i) const { return locations_.at(static_cast<size_t>(i)).shard; }
  const ShardIndex& shard_index(uint32_t shard) const { return shards_.at(shard).index; }
  const io::ShardFile& shard_file(int64_t i) const;
  const std::string& shard_name(int64_t i) const;  // file name, for messages
  size_t num_shards() const { return shards_.size(); }
  const std::vector<std::string>& classes() const { return classes_; }
  bool has_crc() const { return has_crc_; }
  const std::string& path() const { return path_; }
  // Throws Error(kIO) naming the first shard truncated or rewritten since open().
  void check_unchanged() const;
  // Shard files in order, with their sizes and the bytes of each in the page cache now.
  struct ShardCache {
    std::string path;
    uint64_t bytes = 0, resident = 0;
  };
  std::vector<ShardCache> page_cache() const;

 private:
  Dataset() = default;
  struct Shard {
    std::unique_ptr<io::ShardFile> file;
    std::string name;
    ShardIndex index;
  };
  void add_shard(std::unique_ptr<io::ShardFile> file, ShardIndex index);

  std::string path_;
  std::vector<Shard> shards_;
  std::vector<SampleLocation> locations_;
  std::vector<std::string> classes_;
  bool has_crc_ = true;
};

}  // namespace stoker::format
