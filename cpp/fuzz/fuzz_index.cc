// Fuzz target: the binary sidecar index of a pack shard (docs/FORMAT.md), as Dataset::open reads
// it. The input is the whole .idx file; it describes a shard of kShardSize bytes.
//
// Beyond "no crash": an index that parses has every record inside the shard and every key inside
// the key table, and it survives serialize + parse unchanged.
#include <string>

#include "fuzz_util.h"
#include "stoker/core/checked.h"
#include "stoker/core/error.h"
#include "stoker/format/shard_index.h"

using namespace stoker;

namespace {
constexpr uint64_t kShardSize = uint64_t{1} << 30;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  format::ShardIndex index;
  try {
    index = format::parse_shard_index(data, size, kShardSize, "fuzz.idx");
  } catch (const Error&) {
    return 0;
  }
  for (const format::SampleRecord& s : index.samples) {
    FUZZ_CHECK(range_within(s.offset, s.size, kShardSize));
    FUZZ_CHECK(s.key.size() <= 0xFFFF);
    FUZZ_CHECK(s.format == ImageFormat::kUnknown || s.format == ImageFormat::kJpeg ||
               s.format == ImageFormat::kPng);
  }
  const std::string serialized = format::serialize_shard_index(index);
  const format::ShardIndex back = format::parse_shard_index(
      reinterpret_cast<const uint8_t*>(serialized.data()), serialized.size(), kShardSize, "back");
  FUZZ_CHECK(back.flags == index.flags);
  FUZZ_CHECK(back.samples.size() == index.samples.size());
  for (size_t i = 0; i < back.samples.size(); ++i) {
    const format::SampleRecord &a = index.samples[i], &b = back.samples[i];
    FUZZ_CHECK(a.offset == b.offset && a.size == b.size && a.label == b.label);
    FUZZ_CHECK(a.crc32c == b.crc32c && a.format == b.format && a.key == b.key);
  }
  return 0;
}
