// Fuzz target: a pack's manifest.json, as Dataset::open reads it, and its attached.json. The
// input is the manifest, then (after a NUL byte, where it has one) attached.json, whose "@CRC@"
// becomes the manifest's CRC32C (so that a sidecar can be the pack's); the pack folder around
// them (made once per process, in memory: see memory_folder) holds three valid shards with their
// indexes, so a manifest can name real, missing or mismatched files:
//   shard-000000  2 samples of several members (jpg, seg.png, cls), version 2 index
//   shard-000001  3 samples of one image each and a label, version 2 index
//   shard-000002  2 samples of one image each, version 1 index (as stoker 1 wrote it)
// and a sidecar `lat` for them: attached/lat/shard-00000N.tar + .idx, the same keys, one member
// "lat" each (and attached/lat/short.idx: one of shard 1's 3 samples). A manifest is cut at its
// first NUL: NULs inside one are not fuzzed here (the JSON parser refuses them anyway).
//
// Beyond "no crash": a dataset that opens has every member of every sample inside its shard file,
// each sample's members are its own shard's, and their names are that shard's.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "stoker/core/checked.h"
#include "stoker/core/crc32c.h"
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

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// The version 1 index of a shard whose samples are one image each (docs/FORMAT.md, "Version 1
// indexes"), made from the version 2 index the writer wrote for it.
std::string version1_index(const format::ShardIndex& index) {
  std::string out(format::kIndexMagic, 8), keys;
  put<uint32_t>(out, 1);
  put<uint32_t>(out, index.flags);
  put<uint64_t>(out, index.samples.size());
  for (const auto& s : index.samples) keys += s.key;
  put<uint64_t>(out, keys.size());
  uint64_t key_offset = 0;
  for (const auto& s : index.samples) {
    const format::MemberRecord& image = index.members_of(s)[0];
    put<uint64_t>(out, image.offset);
    put<uint64_t>(out, image.size);
    put<int64_t>(out, s.label);
    put<uint64_t>(out, key_offset);
    put<uint32_t>(out, image.crc32c);
    put<uint16_t>(out, static_cast<uint16_t>(s.key.size()));
    put<uint8_t>(out, 1);  // JPEG
    put<uint8_t>(out, 0);
    key_offset += s.key.size();
  }
  out += keys;
  put<uint32_t>(out, crc32c(out.data(), out.size()));
  return out;
}

class PackFolder {
 public:
  PackFolder() {
    std::string pattern = std::string(memory_folder()) + "/stoker-fuzz-pack-XXXXXX";
    FUZZ_CHECK(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
    const uint8_t jpeg[] = {0xFF, 0xD8, 0xFF, 0xD9};  // the bytes do not matter here
    const uint8_t png[] = {0x89, 'P', 'N', 'G'};
    const uint8_t cls[] = {'1'};
    {
      format::ShardWriter writer(path_ + "/shard-000000.tar", path_ + "/shard-000000.idx");
      const format::ShardWriter::MemberData members[] = {
          {"jpg", jpeg, sizeof jpeg}, {"seg.png", png, sizeof png}, {"cls", cls, sizeof cls}};
      writer.add_sample("s0_0", members);
      writer.add_sample("s0_1", {members, 2}, 0);
      writer.finish();
    }
    for (int shard = 1; shard < 3; ++shard) {
      const std::string name = path_ + "/shard-00000" + std::to_string(shard);
      format::ShardWriter writer(name + ".tar", name + ".idx");
      for (int i = 0; i < 4 - shard; ++i)
        writer.add("s" + std::to_string(shard) + "_" + std::to_string(i), ImageFormat::kJpeg, jpeg,
                   sizeof jpeg, i);
      writer.finish();
    }
    const std::string v2 = read(path_ + "/shard-000002.idx");
    const auto index = format::parse_shard_index(reinterpret_cast<const uint8_t*>(v2.data()),
                                                 v2.size(), UINT64_MAX, "shard-000002.idx");
    write(path_ + "/shard-000002.idx", version1_index(index));
    // The sidecar: each shard's keys, one member "lat" each.
    fs::create_directories(path_ + "/attached/lat");
    const uint8_t npy[] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    const std::vector<std::vector<std::string>> keys = {
        {"s0_0", "s0_1"}, {"s1_0", "s1_1", "s1_2"}, {"s2_0", "s2_1"}};
    for (size_t shard = 0; shard < keys.size(); ++shard) {
      const std::string name = path_ + "/attached/lat/shard-00000" + std::to_string(shard);
      format::ShardWriter writer(name + ".tar", name + ".idx");
      const format::ShardWriter::MemberData lat[] = {{"lat", npy, sizeof npy}};
      for (const std::string& key : keys[shard]) writer.add_sample(key, lat);
      writer.finish();
    }
    format::ShardWriter writer(path_ + "/attached/lat/short.tar",
                               path_ + "/attached/lat/short.idx");
    const format::ShardWriter::MemberData lat[] = {{"lat", npy, sizeof npy}};
    writer.add_sample("s1_0", lat);
    writer.finish();
  }
  ~PackFolder() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  PackFolder(const PackFolder&) = delete;
  PackFolder& operator=(const PackFolder&) = delete;

  const std::string& path() const { return path_; }

  // The manifest, and attached.json after a NUL (none: no attached.json), "@CRC@" in it
  // replaced by the manifest's CRC32C.
  void write_input(const uint8_t* data, size_t size) const {
    const std::string input(reinterpret_cast<const char*>(data), size);
    const size_t nul = input.find('\0');
    const std::string manifest = input.substr(0, nul);
    write(path_ + "/manifest.json", manifest);
    std::error_code ec;
    fs::remove(path_ + "/attached.json", ec);
    if (nul == std::string::npos) return;
    std::string attached = input.substr(nul + 1);
    const std::string crc = std::to_string(crc32c(manifest.data(), manifest.size()));
    for (size_t at = attached.find("@CRC@"); at != std::string::npos;
         at = attached.find("@CRC@", at + crc.size()))
      attached.replace(at, 5, crc);
    write(path_ + "/attached.json", attached);
  }

 private:
  static std::string read(const std::string& path) {
    const std::vector<uint8_t> bytes = io::read_file(path);
    return {bytes.begin(), bytes.end()};
  }
  static void write(const std::string& path, const std::string& bytes) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    FUZZ_CHECK(f != nullptr);
    FUZZ_CHECK(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
    FUZZ_CHECK(std::fclose(f) == 0);
  }

  std::string path_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const PackFolder pack;
  pack.write_input(data, size);
  try {
    const auto dataset = format::Dataset::open(pack.path());
    for (int64_t i = 0; i < dataset->size(); ++i) {
      const uint32_t shard = dataset->shard_of(i);
      FUZZ_CHECK(shard < dataset->num_shards());
      std::vector<format::MemberRef> members;
      dataset->members(i, members);
      FUZZ_CHECK(!members.empty() || dataset->layout(shard) != format::ShardLayout::kTar);
      for (const format::MemberRef& m : members) {
        FUZZ_CHECK(range_within(m.offset, m.size, dataset->file(i, m.file)->size()));
        FUZZ_CHECK(!m.name.empty());
        FUZZ_CHECK(dataset->find_member(shard, m.name) >= 0);
      }
      FUZZ_CHECK(dataset->label(i) >= -1);
      FUZZ_CHECK(!dataset->shard_name(i).empty());
    }
  } catch (const Error&) {
  }
  return 0;
}
