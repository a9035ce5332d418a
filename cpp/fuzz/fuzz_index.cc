// Fuzz target: the binary sidecar index of a pack shard (docs/FORMAT.md), version 1, 2 or 3, as
// Dataset::open reads it. The input is the whole .idx file; it describes a shard of kShardSize
// bytes. It is parsed as it is, then with its trailing CRC32C made right: a mutation almost
// never keeps the checksum valid, and without the second parse nothing behind the checksum
// check would be reached.
//
// Beyond "no crash": an index that parses has every member inside the shard, member tables that
// partition the member records in order, valid and distinct member names, image sizes (version 3)
// one per member, each 0 x 0 or both sides in 1 to 2^24, and it survives serialize + parse
// unchanged (every field, member names and image sizes included). The shard size it needs is
// exactly the end of its furthest member: one byte less is refused.
#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "stoker/core/checked.h"
#include "stoker/core/crc32c.h"
#include "stoker/core/error.h"
#include "stoker/format/shard_index.h"

using namespace stoker;

namespace {

constexpr uint64_t kShardSize = uint64_t{1} << 30;

void check_valid(const format::ShardIndex& index, uint64_t shard_size) {
  FUZZ_CHECK(index.member_names.size() <= format::kMaxMemberNames);
  std::set<std::string_view> names;
  for (const std::string& n : index.member_names) {
    FUZZ_CHECK(!n.empty() && n.size() <= 0xFFFF);
    FUZZ_CHECK(names.insert(n).second);
  }
  for (const format::MemberRecord& m : index.members) {
    FUZZ_CHECK(range_within(m.offset, m.size, shard_size));
    FUZZ_CHECK(m.name < index.member_names.size());
  }
  uint64_t next = 0;
  for (const format::SampleRecord& s : index.samples) {
    FUZZ_CHECK(s.first_member == next);
    next += s.num_members;
    FUZZ_CHECK(next <= index.members.size());
    FUZZ_CHECK(s.key.size() <= 0xFFFF);
    FUZZ_CHECK(s.label >= -1);
    const auto members = index.members_of(s);
    FUZZ_CHECK(members.size() == s.num_members);
    if (!members.empty()) FUZZ_CHECK(&members.back() == &index.members[next - 1]);
  }
  FUZZ_CHECK(next == index.members.size());
  FUZZ_CHECK(index.image_sizes.empty() || index.image_sizes.size() == index.members.size());
  FUZZ_CHECK(index.has_image_sizes() == (index.version >= 3 && !index.members.empty()));
  for (const ImageSize& s : index.image_sizes) {
    FUZZ_CHECK((s.width == 0) == (s.height == 0));
    FUZZ_CHECK(s.width <= kMaxRecordedSide && s.height <= kMaxRecordedSide);
  }
}

void check_same(const format::ShardIndex& a, const format::ShardIndex& b) {
  FUZZ_CHECK(a.flags == b.flags);
  FUZZ_CHECK(a.member_names == b.member_names);
  FUZZ_CHECK(a.samples.size() == b.samples.size());
  for (size_t i = 0; i < a.samples.size(); ++i) {
    const format::SampleRecord &x = a.samples[i], &y = b.samples[i];
    FUZZ_CHECK(x.key == y.key && x.label == y.label);
    FUZZ_CHECK(x.first_member == y.first_member && x.num_members == y.num_members);
  }
  FUZZ_CHECK(a.members.size() == b.members.size());
  for (size_t i = 0; i < a.members.size(); ++i) {
    const format::MemberRecord &x = a.members[i], &y = b.members[i];
    FUZZ_CHECK(x.offset == y.offset && x.size == y.size);
    FUZZ_CHECK(x.crc32c == y.crc32c && x.name == y.name);
  }
  // Written back as version 3: an index that records no sizes reads back as all unknown.
  for (size_t i = 0; i < b.image_sizes.size(); ++i)
    FUZZ_CHECK(b.image_sizes[i] == (a.image_sizes.empty() ? ImageSize{} : a.image_sizes[i]));
}

format::ShardIndex parse(const std::string& bytes, uint64_t shard_size) {
  return format::parse_shard_index(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                   shard_size, "back");
}

void check_index(const uint8_t* data, size_t size) {
  format::ShardIndex index;
  try {
    index = format::parse_shard_index(data, size, kShardSize, "fuzz.idx");
  } catch (const Error&) {
    return;
  }
  check_valid(index, kShardSize);
  // A version 1 index reads as one-member samples named by the format byte.
  if (size >= 12 && data[8] == 1 && data[9] == 0 && data[10] == 0 && data[11] == 0) {
    FUZZ_CHECK((index.member_names == std::vector<std::string>{"bin", "jpg", "png"}));
    FUZZ_CHECK(index.members.size() == index.samples.size());
    for (const format::SampleRecord& s : index.samples) FUZZ_CHECK(s.num_members == 1);
  }

  // Whatever parses is written back as version 3 (not byte for byte the input: a key table may
  // share or skip bytes, reserved fields may be set) and reads back the same; from then on the
  // bytes are a fixed point.
  const std::string serialized = format::serialize_shard_index(index);
  const format::ShardIndex back = parse(serialized, kShardSize);
  check_same(index, back);
  FUZZ_CHECK(format::serialize_shard_index(back) == serialized);

  // The shard must be just long enough for the furthest member.
  uint64_t end = 0;
  for (const format::MemberRecord& m : index.members) end = std::max(end, m.offset + m.size);
  check_same(parse(serialized, end), index);
  if (end > 0) {
    bool refused = false;
    try {
      parse(serialized, end - 1);
    } catch (const Error& e) {
      refused = e.code() == ErrorCode::kCorruptData;
    }
    FUZZ_CHECK(refused);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  check_index(data, size);
  if (size < 4) return 0;
  std::vector<uint8_t> fixed(data, data + size);
  const uint32_t crc = crc32c(fixed.data(), size - 4);
  if (std::memcmp(&crc, fixed.data() + size - 4, 4) == 0) return 0;
  std::memcpy(fixed.data() + size - 4, &crc, 4);  // little-endian, as the index stores it
  check_index(fixed.data(), fixed.size());
  return 0;
}
