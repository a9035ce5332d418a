// Reads byte ranges of one shard file: one open per shard, one pread per sample.
// pread (not mmap) so that a shard truncated under a running job gives an error, never SIGBUS.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace stoker::io {

class ShardFile {
 public:
  // Opens `path` read-only. Throws Error(kIO) naming the path.
  explicit ShardFile(std::string path);
  ~ShardFile();
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }

  // Reads exactly `size` bytes at `offset` into `out` (resized). Thread-safe: pread has no shared
  // file position. Throws Error(kIO) if the range is outside the file or the file got shorter.
  void read(uint64_t offset, uint64_t size, std::vector<uint8_t>& out) const;
  void read(uint64_t offset, uint64_t size, uint8_t* out) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Reads a whole (small) file. Throws Error(kIO).
std::vector<uint8_t> read_file(const std::string& path);

}  // namespace stoker::io
