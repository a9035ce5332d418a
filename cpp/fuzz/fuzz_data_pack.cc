// Fuzz target: an array pack or a token pack, as Dataset::open reads it: its manifest and one of
// its data files, both untrusted. The input is
//   byte 0          the window length for token data: 1 + byte % 64
//   bytes 1-2       n, the manifest's length (little-endian)
//   bytes 3..3+n    manifest.json
//   the rest        the file "d" (a column's .npy, or a token file) that the manifest may name
// written into a folder in memory (as fuzz_manifest's). A second, valid column file "v.npy"
// (uint8 (3, 2, 2)) is there for manifests that name two files.
//
// Beyond "no crash": a dataset that opens has every member of every sample inside its file,
// of exactly the size its raw layout says, and that member is found again by its name.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "stoker/core/checked.h"
#include "stoker/core/error.h"
#include "stoker/format/dataset.h"

using namespace stoker;
namespace fs = std::filesystem;

namespace {

const char* memory_folder() {
  struct stat st {};
  if (::stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && ::access("/dev/shm", W_OK) == 0)
    return "/dev/shm";
  const char* tmp = std::getenv("TMPDIR");
  return tmp && *tmp ? tmp : "/tmp";
}

void write(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  FUZZ_CHECK(f != nullptr);
  FUZZ_CHECK(size == 0 || std::fwrite(data, 1, size, f) == size);
  FUZZ_CHECK(std::fclose(f) == 0);
}

class Folder {
 public:
  Folder() {
    std::string pattern = std::string(memory_folder()) + "/stoker-fuzz-data-XXXXXX";
    FUZZ_CHECK(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
    // v.npy: uint8 (3, 2, 2), as numpy writes it.
    std::string header = "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 2, 2), }";
    header.resize(64 - 10 - 1, ' ');
    header += '\n';
    std::string npy = std::string("\x93NUMPY\x01\x00", 8);
    npy += static_cast<char>(header.size());
    npy += '\0';
    npy += header;
    for (int i = 0; i < 12; ++i) npy += static_cast<char>(i);
    write(path_ + "/v.npy", reinterpret_cast<const uint8_t*>(npy.data()), npy.size());
  }
  ~Folder() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  Folder(const Folder&) = delete;
  Folder& operator=(const Folder&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Folder folder;
  if (size < 3) return 0;
  const int64_t seq_len = 1 + data[0] % 64;
  const size_t n = data[1] | (size_t{data[2]} << 8);
  if (n > size - 3) return 0;
  write(folder.path() + "/manifest.json", data + 3, n);
  write(folder.path() + "/d", data + 3 + n, size - 3 - n);
  try {
    format::DatasetOptions options;
    options.seq_len = seq_len;
    const auto dataset = format::Dataset::open(folder.path(), options);
    std::vector<format::MemberRef> members;
    std::vector<uint8_t> bytes;
    // At most 4096 samples: a short file can still hold many one-byte rows.
    for (int64_t i = 0; i < std::min<int64_t>(dataset->size(), 4096); ++i) {
      const uint32_t shard = dataset->shard_of(i);
      dataset->members(i, members);
      for (const format::MemberRef& m : members) {
        const auto file = dataset->file(i, m.file);
        FUZZ_CHECK(range_within(m.offset, m.size, file->size()));
        if (dataset->layout(shard) == format::ShardLayout::kTar) continue;  // fuzz_manifest's
        FUZZ_CHECK(m.raw != nullptr);
        uint64_t expected = dtype_size(m.raw->dtype);
        for (int64_t d : m.raw->shape) {
          FUZZ_CHECK(d >= 0);
          expected *= static_cast<uint64_t>(d);
        }
        FUZZ_CHECK(expected == m.size);
        FUZZ_CHECK(dataset->find_member(shard, m.name) >= 0);
        if (m.size <= 4096) file->read(m.offset, m.size, bytes);
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
