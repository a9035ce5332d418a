#include "stoker/io/shard_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "io/detail/sigbus_guard.h"
#include "stoker/core/checked.h"
#include "stoker/core/error.h"
#include "stoker/core/fault.h"

namespace stoker::io {

namespace {
[[noreturn]] void throw_io(const std::string& path, const std::string& what, int err) {
  throw Error(ErrorCode::kIO, what + ": " + std::strerror(err), path);
}

int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}
}  // namespace

ShardFile::ShardFile(std::string path, bool mapped) : path_(std::move(path)) {
  if (fault::due("file_open"))
    throw Error(ErrorCode::kIO, fault::describe("file_open", path_), path_);
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw_io(path_, "cannot open", errno);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw_io(path_, "cannot stat", err);
  }
  size_ = static_cast<uint64_t>(st.st_size);
  mtime_ns_ = mtime_ns(st);
  if (mapped && size_ > 0) {  // best effort: where it cannot be mapped, reads are preads
    void* map =
        fault::due("mmap") ? MAP_FAILED : ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
    if (map != MAP_FAILED) mapping_ = static_cast<const uint8_t*>(map);
  }
}

std::shared_ptr<const ShardFile> ShardFile::in_memory(const ShardFile& file) {
  auto copy = std::shared_ptr<ShardFile>(new ShardFile());
  copy->path_ = file.path_;
  copy->size_ = file.size_;
  copy->mtime_ns_ = file.mtime_ns_;
  file.read(0, file.size_, copy->memory_);
  copy->in_memory_ = true;
  return copy;
}

const uint8_t* ShardFile::view(uint64_t offset, uint64_t size) const {
  if (!in_memory_) return nullptr;
  if (!range_within(offset, size, size_))
    throw Error(ErrorCode::kIO,
                "range [" + std::to_string(offset) + ", +" + std::to_string(size) +
                    ") is outside the file (" + std::to_string(size_) + " bytes)",
                path_);
  return memory_.data() + offset;
}

std::string ShardFile::describe_change(uint64_t new_size) const {
  if (new_size < size_)
    return "truncated after it was opened: " + std::to_string(new_size) + " bytes, was " +
           std::to_string(size_);
  if (new_size > size_)
    return "rewritten after it was opened: " + std::to_string(new_size) + " bytes, was " +
           std::to_string(size_);
  return "modified after it was opened (same size, new modification time)";
}

uint64_t ShardFile::resident_bytes() const {
  if (in_memory_) return size_;
  if (size_ == 0) return 0;
  const long page_size = ::sysconf(_SC_PAGESIZE);
  const uint64_t page = page_size > 0 ? static_cast<uint64_t>(page_size) : 4096;
  void* map = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
  if (map == MAP_FAILED) return 0;
  std::vector<unsigned char> pages((size_ + page - 1) / page);
  uint64_t resident = 0;
  if (::mincore(map, size_, pages.data()) == 0) {
    for (size_t i = 0; i < pages.size(); ++i)
      if (pages[i] & 1) resident += std::min(page, size_ - i * page);
  }
  ::munmap(map, size_);
  return resident;
}

void ShardFile::check_unchanged() const {
  if (in_memory_) return;  // a copy: the file may change, what is read does not
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw_io(path_, "cannot stat", errno);
  const auto now = static_cast<uint64_t>(st.st_size);
  if (now != size_ || mtime_ns(st) != mtime_ns_)
    throw Error(ErrorCode::kIO, describe_change(now) + "; its index no longer describes it", path_);
}

ShardFile::~ShardFile() {
  if (mapping_ != nullptr) ::munmap(const_cast<uint8_t*>(mapping_), size_);
  if (fd_ >= 0) ::close(fd_);
}

void ShardFile::read(uint64_t offset, uint64_t size, std::vector<uint8_t>& out) const {
  out.resize(size);
  read(offset, size, out.data());
}

void ShardFile::read(uint64_t offset, uint64_t size, uint8_t* out) const {
  if (!range_within(offset, size, size_))
    throw Error(ErrorCode::kIO,
                "range [" + std::to_string(offset) + ", +" + std::to_string(size) +
                    ") is outside the file (" + std::to_string(size_) + " bytes)",
                path_);
  if (in_memory_) {
    if (size > 0) std::memcpy(out, memory_.data() + offset, size);
    return;
  }
  if (mapping_ != nullptr) {
    if (size > 0 && !detail::guarded_copy(out, mapping_ + offset, size)) {
      struct stat st {};
      const uint64_t now = ::fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
      throw Error(ErrorCode::kIO, "cannot read the sample: the file was " + describe_change(now),
                  path_);
    }
    return;
  }
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd_, out + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io(path_, "read failed", errno);
    }
    if (n == 0) {
      struct stat st {};
      const uint64_t now = ::fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
      throw Error(ErrorCode::kIO, "cannot read the sample: the shard was " + describe_change(now),
                  path_);
    }
    done += static_cast<uint64_t>(n);
  }
}

std::vector<uint8_t> read_file(const std::string& path) {
  ShardFile f(path);
  std::vector<uint8_t> out;
  f.read(0, f.size(), out);
  return out;
}

}  // namespace stoker::io
