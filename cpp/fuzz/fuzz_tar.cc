// Fuzz target: a foreign WebDataset shard, as Dataset::open_tars reads it. The input is the whole
// tar file: scan_tar walks its headers (ustar, GNU long names, pax records, base-256 sizes) and
// index_webdataset_tar groups members into samples and parses .cls labels.
//
// Beyond "no crash": every member and every sample must lie inside the file, members come in
// file order without overlapping, and the index built from the tar survives the binary index
// format that packs use.
#include <set>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "stoker/core/checked.h"
#include "stoker/core/error.h"
#include "stoker/format/shard_index.h"
#include "stoker/format/tar.h"
#include "stoker/io/shard_file.h"

using namespace stoker;

namespace {

void check_members(const io::ShardFile& shard) {
  const uint64_t file_size = shard.size();
  uint64_t end_of_previous = 0;
  std::string key, extension;
  format::scan_tar(shard, [&](const format::TarMember& m) {
    FUZZ_CHECK(m.offset % format::kTarBlock == 0);  // data follows a 512-byte header
    FUZZ_CHECK(m.offset >= end_of_previous + format::kTarBlock);
    FUZZ_CHECK(range_within(m.offset, m.size, file_size));
    end_of_previous = m.offset + m.size;
    format::split_webdataset_name(m.name, key, extension);
    // KEY or KEY.EXTENSION: nothing of the name is lost or invented.
    FUZZ_CHECK(m.name.compare(0, key.size(), key) == 0);
    FUZZ_CHECK(key.size() == m.name.size() || key.size() + 1 + extension.size() == m.name.size());
  });
}

void check_index(const io::ShardFile& shard) {
  const format::ShardIndex index = format::index_webdataset_tar(shard);
  std::set<std::string> keys;
  std::vector<uint8_t> bytes;
  for (const format::SampleRecord& s : index.samples) {
    FUZZ_CHECK(range_within(s.offset, s.size, shard.size()));
    FUZZ_CHECK(s.format == ImageFormat::kJpeg || s.format == ImageFormat::kPng);
    FUZZ_CHECK(s.label >= -1);
    FUZZ_CHECK(keys.insert(s.key).second);  // one sample per key
    shard.read(s.offset, s.size, bytes);    // what the loader does with the record
    fuzz::touch(bytes.data(), bytes.size());
  }
  // Keys longer than the index format allows are refused by the writer; nothing to compare then.
  for (const auto& s : index.samples)
    if (s.key.size() > 0xFFFF) return;
  const std::string serialized = format::serialize_shard_index(index);
  const format::ShardIndex back =
      format::parse_shard_index(reinterpret_cast<const uint8_t*>(serialized.data()),
                                serialized.size(), shard.size(), "round trip");
  FUZZ_CHECK(back.samples.size() == index.samples.size());
  for (size_t i = 0; i < back.samples.size(); ++i) {
    FUZZ_CHECK(back.samples[i].key == index.samples[i].key);
    FUZZ_CHECK(back.samples[i].offset == index.samples[i].offset);
    FUZZ_CHECK(back.samples[i].size == index.samples[i].size);
    FUZZ_CHECK(back.samples[i].label == index.samples[i].label);
    FUZZ_CHECK(back.samples[i].format == index.samples[i].format);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemoryFile file;
  file.replace(data, size);
  try {
    const io::ShardFile shard(file.path());
    FUZZ_CHECK(shard.size() == size);
    check_members(shard);
  } catch (const Error&) {
  }
  try {
    const io::ShardFile shard(file.path());
    check_index(shard);
  } catch (const Error&) {
  }
  return 0;
}
