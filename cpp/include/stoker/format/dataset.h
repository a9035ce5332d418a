// A dataset: an ordered list of samples spread over shard files. Opened from a stoker pack (a
// folder with manifest.json), a single WebDataset .tar, or a folder of .tar files (indexed on
// open); or from a pack folder in a local cache whose shards arrive while it is read
// (open_fetched: a pack in object storage).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "stoker/format/shard_index.h"
#include "stoker/io/shard_file.h"
#include "stoker/io/shard_gate.h"

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
  // A pack folder holding manifest.json and every shard's index, whose .tar files a fetcher
  // brings into the same folder while the dataset is read: each index is checked against the
  // shard size the manifest gives, and reads wait at gate() for their shard.
  static std::shared_ptr<const Dataset> open_fetched(const std::string& path);

  int64_t size() const { return static_cast<int64_t>(locations_.size()); }
  const SampleRecord& record(int64_t i) const;
  // The sample's members (files KEY.<name>), in tar order; names via shard_index(i).
  std::span<const MemberRecord> members(int64_t i) const;
  uint32_t shard_of(int64_t i) const { return locations_.at(static_cast<size_t>(i)).shard; }
  const ShardIndex& shard_index(uint32_t shard) const { return shards_.at(shard).index; }
  // The open shard file of sample i. For a fetched dataset: waits at the gate while
  // `keep_waiting()` says to (see io::ShardGate::acquire); otherwise returns at once.
  std::shared_ptr<const io::ShardFile> acquire_shard(
      int64_t i, const std::function<bool()>& keep_waiting) const;
  // The same without waiting: throws Error(kIO) if a fetched shard is not local now.
  std::shared_ptr<const io::ShardFile> shard_file(int64_t i) const;
  const std::string& shard_name(int64_t i) const;  // file name, for messages
  size_t num_shards() const { return shards_.size(); }
  const std::vector<std::string>& classes() const { return classes_; }
  bool has_crc() const { return has_crc_; }
  const std::string& path() const { return path_; }
  // Reads every member of `shard` from `file` and checks it against the index's CRC32C (where
  // the index has them). Throws Error(kCorruptData) naming the shard, the key and the member.
  void verify_shard_file(uint32_t shard, const io::ShardFile& file) const;
  // Where a fetcher hands shards over; null unless opened with open_fetched().
  const std::shared_ptr<io::ShardGate>& gate() const { return gate_; }
  const std::string& shard_file_name(uint32_t shard) const { return shards_.at(shard).name; }
  // The shard's size in bytes: its file's at open, or (fetched) the manifest's.
  uint64_t shard_bytes(uint32_t shard) const { return shards_.at(shard).bytes; }
  // Throws Error(kIO) naming the first shard truncated or rewritten since open() (fetched
  // datasets: since it arrived).
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
    std::shared_ptr<const io::ShardFile> file;  // null in a fetched dataset: see gate_
    std::string name;
    uint64_t bytes = 0;
    ShardIndex index;
  };
  void add_shard(std::shared_ptr<const io::ShardFile> file, std::string name, uint64_t bytes,
                 ShardIndex index);
  static std::shared_ptr<Dataset> open_manifest(const std::string& path, bool fetched);
  // The shards' open files now (a fetched dataset: those that have arrived).
  std::vector<std::shared_ptr<const io::ShardFile>> open_files() const;

  std::string path_;
  std::vector<Shard> shards_;
  std::vector<SampleLocation> locations_;
  std::vector<std::string> classes_;
  bool has_crc_ = true;
  std::shared_ptr<io::ShardGate> gate_;
};

}  // namespace stoker::format
