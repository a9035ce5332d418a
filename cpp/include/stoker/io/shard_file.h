// Reads byte ranges of one shard file: one open per shard, one pread per sample.
// pread (not a plain mmap) so that a shard truncated under a running job gives an error, never a
// SIGBUS. Files of small rows read at random (an array pack's columns, token files) are mapped
// instead, where a pread's system call would cost more than the copy: their reads are copies
// from the mapping that a SIGBUS interrupts into the same error (io/detail/sigbus_guard.h).
// Or of a copy in memory (a resident dataset's): a memcpy, and nothing can change under it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace stoker::io {

class ShardFile {
 public:
  // Opens `path` read-only (and with `mapped`, maps it: reads copy from the mapping). Throws
  // Error(kIO) naming the path.
  explicit ShardFile(std::string path, bool mapped = false);
  // The whole of `file`, read now into memory (Error(kIO) as read()); reads then copy from it.
  static std::shared_ptr<const ShardFile> in_memory(const ShardFile& file);
  // The bytes [offset, offset + size) where they can be used in place (a file held in memory),
  // else null. Throws Error(kIO) for a range outside the file, as read() does.
  const uint8_t* view(uint64_t offset, uint64_t size) const;
  ~ShardFile();
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }

  // Reads exactly `size` bytes at `offset` into `out` (resized). Thread-safe: pread has no shared
  // file position. Throws Error(kIO) if the range is outside the file or the file got shorter.
  void read(uint64_t offset, uint64_t size, std::vector<uint8_t>& out) const;
  void read(uint64_t offset, uint64_t size, uint8_t* out) const;

  // Throws Error(kIO) if the open file's size or modification time is no longer what it was when
  // it was opened: the shard was truncated or rewritten in place, so its index no longer
  // describes it. (A shard replaced by rename is not seen: the open descriptor keeps the old,
  // consistent file.)
  void check_unchanged() const;

  // Bytes of the file in the page cache now (mincore on a mapping that is never touched, so no
  // page is read and a truncated file cannot fault). 0 where the kernel will not say.
  uint64_t resident_bytes() const;

 private:
  std::string describe_change(uint64_t new_size) const;

  ShardFile() = default;

  std::string path_;
  std::vector<uint8_t> memory_;  // the bytes, when held in memory (fd_ < 0)
  bool in_memory_ = false;
  const uint8_t* mapping_ = nullptr;  // the whole file, mapped read-only (`mapped`)
  int fd_ = -1;
  uint64_t size_ = 0;
  int64_t mtime_ns_ = 0;
};

// Reads a whole (small) file. Throws Error(kIO).
std::vector<uint8_t> read_file(const std::string& path);

}  // namespace stoker::io
