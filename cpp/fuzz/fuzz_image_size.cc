// Fuzz target: an image's size read from its first bytes (core/image_size.h: what the shard
// writer records in the index, and what a reader reads once for packs whose index records none)
// and the sizes file kept beside such an index (docs/FORMAT.md, "Image sizes of older packs").
//
// The input is an image file's first bytes, and also a sizes file. Beyond "no crash":
//   - read_image_size never reads past the bytes it is given (each prefix is a buffer of its
//     own size, which ASan bounds), a size found is within the bounds an index accepts, and
//     more bytes never change an answer once found or refused: a prefix that finds a size finds
//     the same one with every longer prefix, a prefix that refuses refuses with every longer one;
//   - the sizes file is checked against an index of as many members as it says (up to 4096), with
//     the index checksum it names, so that its body is reached; with its trailing CRC32C made
//     right too. What parses has one size per member, each 0 x 0 or within the bounds, and
//     reads back the same once written back.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "stoker/core/crc32c.h"
#include "stoker/core/error.h"
#include "stoker/core/image_size.h"
#include "stoker/format/shard_index.h"

using namespace stoker;

namespace {

void check_header(const uint8_t* data, size_t size) {
  ImageSizeResult settled;  // the first answer that is not "need more"
  bool has_settled = false;
  // Every prefix up to 8 KiB (a header further on is found the same way, a quadratic loop
  // beyond that would only slow the run).
  for (size_t n = 0; n <= std::min<size_t>(size, 8192); ++n) {
    const std::vector<uint8_t> prefix(data, data + n);
    const ImageSizeResult r = read_image_size(prefix.data(), prefix.size());
    if (r.status == ImageSizeStatus::kFound) {
      FUZZ_CHECK(r.size.known());
      FUZZ_CHECK(r.size.width <= kMaxRecordedSide && r.size.height <= kMaxRecordedSide);
    } else {
      FUZZ_CHECK(r.size == ImageSize{});
    }
    if (has_settled) {
      FUZZ_CHECK(r.status == settled.status && r.size == settled.size);
    } else if (r.status != ImageSizeStatus::kNeedMore) {
      settled = r;
      has_settled = true;
    }
  }
}

void check_sizes_file(const uint8_t* data, size_t size) {
  if (size < 32) return;
  uint64_t members;
  uint32_t checksum;
  std::memcpy(&members, data + 24, 8);
  std::memcpy(&checksum, data + 16, 4);
  if (members > 4096) members = 0;
  format::ShardIndex index;
  index.members.resize(members);
  index.checksum = checksum;
  std::vector<ImageSize> sizes;
  try {
    sizes = format::parse_image_sizes(data, size, index, "fuzz.sizes");
  } catch (const Error& e) {
    FUZZ_CHECK(e.code() == ErrorCode::kCorruptData);
    return;
  }
  FUZZ_CHECK(sizes.size() == members);
  for (const ImageSize& s : sizes) {
    FUZZ_CHECK((s.width == 0) == (s.height == 0));
    FUZZ_CHECK(s.width <= kMaxRecordedSide && s.height <= kMaxRecordedSide);
  }
  // Written back (flags and the reserved word as 0, which readers ignore), it reads back the
  // same, and from then on the bytes are a fixed point.
  const std::string back = format::serialize_image_sizes(index, sizes);
  FUZZ_CHECK(back.size() == size);
  const auto* bytes = reinterpret_cast<const uint8_t*>(back.data());
  FUZZ_CHECK(format::parse_image_sizes(bytes, back.size(), index, "back") == sizes);
  FUZZ_CHECK(format::serialize_image_sizes(index, sizes) == back);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  check_header(data, size);
  check_sizes_file(data, size);
  if (size < 36) return 0;
  std::vector<uint8_t> fixed(data, data + size);
  const uint32_t crc = crc32c(fixed.data(), size - 4);
  std::memcpy(fixed.data() + size - 4, &crc, 4);
  check_sizes_file(fixed.data(), fixed.size());
  return 0;
}
