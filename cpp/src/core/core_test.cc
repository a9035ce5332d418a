#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "stoker/core/checked.h"
#include "stoker/core/crc32c.h"
#include "stoker/core/error.h"
#include "stoker/core/fault.h"
#include "stoker/core/random.h"

namespace stoker {

TEST(Crc32c, KnownVectors) {
  // RFC 3720 B.4 test vectors.
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  uint8_t zeros[32] = {};
  EXPECT_EQ(crc32c(zeros, 32), 0x8a9136aau);
  uint8_t ones[32];
  for (auto& b : ones) b = 0xff;
  EXPECT_EQ(crc32c(ones, 32), 0x62a8ab43u);
}

TEST(Crc32c, Incremental) {
  const std::string s = "the quick brown fox jumps over the lazy dog";
  const uint32_t whole = crc32c(s.data(), s.size());
  const uint32_t part = crc32c(s.data() + 10, s.size() - 10, crc32c(s.data(), 10));
  EXPECT_EQ(whole, part);
}

TEST(Checked, Overflow) {
  EXPECT_EQ(checked_add(1, 2, "x"), 3u);
  EXPECT_THROW(checked_add(UINT64_MAX, 1, "x"), Error);
  EXPECT_THROW(checked_mul(UINT64_MAX / 2, 3, "x"), Error);
  EXPECT_TRUE(range_within(10, 5, 15));
  EXPECT_FALSE(range_within(10, 6, 15));
  EXPECT_FALSE(range_within(UINT64_MAX, 2, 15));
}

TEST(Error, MessageNamesShardAndKey) {
  Error e(ErrorCode::kCorruptData, "bad marker", "shard-000001.tar", "00000042");
  EXPECT_EQ(std::string(e.what()), "shard-000001.tar: sample '00000042': corrupt data: bad marker");
  Error moved = Error(ErrorCode::kIO, "short read").with_location("a.tar", "k");
  EXPECT_EQ(moved.shard(), "a.tar");
  EXPECT_EQ(moved.key(), "k");
  EXPECT_EQ(moved.code(), ErrorCode::kIO);
}

TEST(KeyedRandom, DeterministicAndKeyed) {
  KeyedRandom a(1, 2, 3), b(1, 2, 3), c(1, 2, 4);
  const uint64_t a0 = a.next_u64();
  EXPECT_EQ(a0, b.next_u64());
  EXPECT_NE(a0, c.next_u64());
}

TEST(KeyedRandom, UniformAndBelowRanges) {
  KeyedRandom r(7, 0, 0);
  double sum = 0;
  std::set<uint64_t> seen;
  for (int i = 0; i < 20000; ++i) {
    const double u = r.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    const uint64_t k = r.below(10);
    ASSERT_LT(k, 10u);
    seen.insert(k);
  }
  EXPECT_NEAR(sum / 20000, 0.5, 0.01);
  EXPECT_EQ(seen.size(), 10u);
}

TEST(Fault, OffCountsNothingArmedFailsTheNthOfItsKindOnly) {
  EXPECT_FALSE(fault::due("file_open"));  // off: nothing counted
  fault::arm("file_open", 2);
  EXPECT_FALSE(fault::due("file_open"));
  EXPECT_FALSE(fault::due("thread"));  // another kind counts on its own
  EXPECT_TRUE(fault::due("file_open"));
  EXPECT_EQ(fault::describe("file_open", "a.tar"), "injected fault: file_open #2 (a.tar)");
  EXPECT_FALSE(fault::due("file_open"));  // the Nth only
  fault::disarm();
  EXPECT_TRUE(fault::fired());
  EXPECT_FALSE(fault::due("file_open"));
  EXPECT_EQ(fault::count("file_open"), 3);
  EXPECT_EQ(fault::count("thread"), 1);
  fault::arm("", 0);  // counting only
  EXPECT_FALSE(fault::due("file_open"));
  fault::disarm();
  EXPECT_FALSE(fault::fired());
  EXPECT_EQ(fault::counts(), (std::vector<std::pair<std::string, int64_t>>{{"file_open", 1}}));
}

}  // namespace stoker
