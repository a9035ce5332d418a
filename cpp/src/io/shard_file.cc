#include "stoker/io/shard_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "stoker/core/checked.h"
#include "stoker/core/error.h"

namespace stoker::io {

namespace {
[[noreturn]] void throw_io(const std::string& path, const std::string& what, int err) {
  throw Error(ErrorCode::kIO, what + ": " + std::strerror(err), path);
}
}  // namespace

ShardFile::ShardFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw_io(path_, "cannot open", errno);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw_io(path_, "cannot stat", err);
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

ShardFile::~ShardFile() {
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
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd_, out + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io(path_, "read failed", errno);
    }
    if (n == 0)
      throw Error(ErrorCode::kIO, "file is shorter than its index says (truncated after packing?)",
                  path_);
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
