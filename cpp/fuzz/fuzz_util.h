// Helpers shared by the fuzz targets. Only stoker::Error is an acceptable outcome for bad input:
// any other exception escapes LLVMFuzzerTestOneInput and libFuzzer reports it as a crash, and
// FUZZ_CHECK turns a broken invariant into one too.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#define FUZZ_CHECK(cond)                                                                \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

namespace stoker::fuzz {

// An in-memory file with a path (/proc/self/fd/N): stoker's readers open shards by path, and
// a memfd gives them one without disk writes or temp-file clean-up. One per process.
class MemoryFile {
 public:
  MemoryFile() : fd_(memfd_create("stoker-fuzz", 0)) {
    FUZZ_CHECK(fd_ >= 0);
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemoryFile() { close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  void replace(const uint8_t* data, size_t size) {
    FUZZ_CHECK(ftruncate(fd_, 0) == 0);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      FUZZ_CHECK(n > 0);
      done += static_cast<size_t>(n);
    }
  }
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

// Reads every byte of a buffer the code under test produced, so that a buffer shorter than it
// claims is caught by AddressSanitizer here rather than going unnoticed.
inline volatile uint32_t touch_sink;  // volatile: the reads below cannot be optimised away
inline void touch(const uint8_t* p, size_t n) {
  uint32_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum += p[i];
  touch_sink = sum;
}

}  // namespace stoker::fuzz
