// Fuzz target: a foreign WebDataset shard, as Dataset::open_tars reads it. The input is the whole
// tar file: scan_tar walks its headers (ustar, GNU long names, pax records, base-256 sizes) and
// index_webdataset_tar groups members into samples and parses .cls labels.
//
// Beyond "no crash": every member lies inside the file, members come in file order without
// overlapping; the index built from the tar has one sample per key in order of first appearance,
// holds every member that has an extension (as KEY.<name>, in tar order) and nothing else, takes
// its label from the last non-empty .cls/.label member, and survives the binary index format
// that packs use.
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_util.h"
#include "stoker/core/checked.h"
#include "stoker/core/error.h"
#include "stoker/core/label.h"
#include "stoker/format/shard_index.h"
#include "stoker/format/tar.h"
#include "stoker/io/shard_file.h"

using namespace stoker;

namespace {

struct Scanned {
  std::string key, name;
  uint64_t size;
};

// Every member of the tar with an extension, by data offset (what the index must hold), and the
// keys in order of first appearance.
struct Scan {
  std::map<uint64_t, Scanned> members;
  std::vector<std::string> keys;
};

Scan check_members(const io::ShardFile& shard) {
  const uint64_t file_size = shard.size();
  uint64_t end_of_previous = 0;
  Scan scan;
  std::set<std::string> seen;
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
    if (extension.empty()) return;
    FUZZ_CHECK(scan.members.emplace(m.offset, Scanned{key, extension, m.size}).second);
    if (seen.insert(key).second) scan.keys.push_back(key);
  });
  return scan;
}

void check_index(const io::ShardFile& shard, const Scan& scan) {
  const format::ShardIndex index = format::index_webdataset_tar(shard);
  FUZZ_CHECK(index.flags == 0);  // no CRCs
  FUZZ_CHECK(index.samples.size() == scan.keys.size());
  FUZZ_CHECK(index.members.size() == scan.members.size());
  std::set<std::string> names(index.member_names.begin(), index.member_names.end());
  FUZZ_CHECK(names.size() == index.member_names.size());
  FUZZ_CHECK(!names.count(""));
  std::vector<uint8_t> bytes;
  uint64_t next = 0;
  bool fits_index_format = index.member_names.size() <= format::kMaxMemberNames;
  for (const std::string& n : index.member_names) fits_index_format &= n.size() <= 0xFFFF;
  for (size_t i = 0; i < index.samples.size(); ++i) {
    const format::SampleRecord& s = index.samples[i];
    FUZZ_CHECK(s.key == scan.keys[i]);
    FUZZ_CHECK(s.first_member == next);
    next += s.num_members;
    FUZZ_CHECK(s.num_members >= 1 && next <= index.members.size());
    fits_index_format &= s.key.size() <= 0xFFFF;
    int64_t label = -1;
    uint64_t previous_offset = 0;
    for (const format::MemberRecord& m : index.members_of(s)) {
      FUZZ_CHECK(m.name < index.member_names.size());
      FUZZ_CHECK(m.crc32c == 0);
      FUZZ_CHECK(m.offset >= previous_offset);  // tar order
      previous_offset = m.offset + 1;
      const auto it = scan.members.find(m.offset);
      FUZZ_CHECK(it != scan.members.end());
      FUZZ_CHECK(it->second.key == s.key && it->second.size == m.size);
      const std::string& name = index.member_names[m.name];
      FUZZ_CHECK(it->second.name == name);
      shard.read(m.offset, m.size, bytes);  // what a field does with the member
      fuzz::touch(bytes.data(), bytes.size());
      if (name == "cls" || name == "label") {
        std::optional<int64_t> parsed;
        try {
          parsed = parse_label(bytes.data(), bytes.size());
        } catch (const Error&) {
          FUZZ_CHECK(!"a label the index accepted does not parse");
        }
        if (parsed) label = *parsed;
      }
    }
    FUZZ_CHECK(s.label == label);
  }
  FUZZ_CHECK(next == index.members.size());
  // Keys and names longer than the index format allows are refused by serialize_shard_index;
  // nothing to compare then.
  if (!fits_index_format) return;
  const std::string serialized = format::serialize_shard_index(index);
  const format::ShardIndex back =
      format::parse_shard_index(reinterpret_cast<const uint8_t*>(serialized.data()),
                                serialized.size(), shard.size(), "round trip");
  FUZZ_CHECK(back.flags == index.flags && back.member_names == index.member_names);
  FUZZ_CHECK(back.samples.size() == index.samples.size());
  for (size_t i = 0; i < back.samples.size(); ++i) {
    FUZZ_CHECK(back.samples[i].key == index.samples[i].key);
    FUZZ_CHECK(back.samples[i].label == index.samples[i].label);
    FUZZ_CHECK(back.samples[i].first_member == index.samples[i].first_member);
    FUZZ_CHECK(back.samples[i].num_members == index.samples[i].num_members);
  }
  FUZZ_CHECK(back.members.size() == index.members.size());
  for (size_t i = 0; i < back.members.size(); ++i) {
    FUZZ_CHECK(back.members[i].offset == index.members[i].offset);
    FUZZ_CHECK(back.members[i].size == index.members[i].size);
    FUZZ_CHECK(back.members[i].name == index.members[i].name);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemoryFile file;
  file.replace(data, size);
  Scan scan;
  try {
    const io::ShardFile shard(file.path());
    FUZZ_CHECK(shard.size() == size);
    scan = check_members(shard);
  } catch (const Error&) {
    // A tar that does not scan cannot be indexed either.
    bool refused = false;
    try {
      const io::ShardFile shard(file.path());
      format::index_webdataset_tar(shard);
    } catch (const Error&) {
      refused = true;
    }
    FUZZ_CHECK(refused);
    return 0;
  }
  try {
    const io::ShardFile shard(file.path());
    check_index(shard, scan);
  } catch (const Error&) {
  }
  return 0;
}
