// Fuzz target: a pack's manifest.json, as Dataset::open reads it. The input is the manifest; the
// pack folder around it (made once per process, in memory: see memory_folder) holds two valid
// shards, shard-000000 and shard-000001, with their indexes, so a manifest can name real, missing
// or mismatched files.
//
// Beyond "no crash": a dataset that opens has every sample inside its shard file.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "fuzz_util.h"
#include "stoker/core/checked.h"
#include "stoker/core/error.h"
#include "stoker/format/dataset.h"
#include "stoker/format/shard_writer.h"

using namespace stoker;
namespace fs = std::filesystem;

namespace {

// The manifest is rewritten for every input: on a disk file system, truncating and rewriting a
// file makes ext4 write it out at once (auto_da_alloc), which made the target 15 times slower
// whenever the disk was busy. tmpfs keeps it in memory.
const char* memory_folder() {
  struct stat st {};
  if (::stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && ::access("/dev/shm", W_OK) == 0)
    return "/dev/shm";
  const char* tmp = std::getenv("TMPDIR");
  return tmp && *tmp ? tmp : "/tmp";
}

class PackFolder {
 public:
  PackFolder() {
    std::string pattern = std::string(memory_folder()) + "/stoker-fuzz-pack-XXXXXX";
    FUZZ_CHECK(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
    const uint8_t jpeg[] = {0xFF, 0xD8, 0xFF, 0xD9};  // the bytes do not matter here
    for (int shard = 0; shard < 2; ++shard) {
      const std::string name = "shard-00000" + std::to_string(shard);
      format::ShardWriter writer(path_ + "/" + name + ".tar", path_ + "/" + name + ".idx");
      for (int i = 0; i < 2 + shard; ++i)
        writer.add("s" + std::to_string(shard) + "_" + std::to_string(i), ImageFormat::kJpeg, jpeg,
                   sizeof jpeg, i);
      writer.finish();
    }
  }
  ~PackFolder() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  PackFolder(const PackFolder&) = delete;
  PackFolder& operator=(const PackFolder&) = delete;

  const std::string& path() const { return path_; }

  void write_manifest(const uint8_t* data, size_t size) const {
    std::FILE* f = std::fopen((path_ + "/manifest.json").c_str(), "wb");
    FUZZ_CHECK(f != nullptr);
    FUZZ_CHECK(std::fwrite(data, 1, size, f) == size);
    FUZZ_CHECK(std::fclose(f) == 0);
  }

 private:
  std::string path_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const PackFolder pack;
  pack.write_manifest(data, size);
  try {
    const auto dataset = format::Dataset::open(pack.path());
    for (int64_t i = 0; i < dataset->size(); ++i) {
      const format::SampleRecord& r = dataset->record(i);
      FUZZ_CHECK(range_within(r.offset, r.size, dataset->shard_file(i).size()));
      FUZZ_CHECK(!dataset->shard_name(i).empty());
    }
  } catch (const Error&) {
  }
  return 0;
}
