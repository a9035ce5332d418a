#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "stoker/core/checked.h"
#include "stoker/core/crc32c.h"
#include "stoker/core/error.h"
#include "stoker/core/fault.h"
#include "stoker/core/image_size.h"
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

namespace {

std::vector<uint8_t> jpeg_with_frame(uint16_t width, uint16_t height, size_t app_bytes = 14,
                                     uint8_t sof = 0xC0) {
  std::vector<uint8_t> b = {0xFF, 0xD8, 0xFF, 0xE1};
  const size_t length = app_bytes + 2;
  b.push_back(static_cast<uint8_t>(length >> 8));
  b.push_back(static_cast<uint8_t>(length & 0xFF));
  b.insert(b.end(), app_bytes, 0x41);
  b.insert(b.end(), {0xFF, 0xFF, sof, 0x00, 0x11, 0x08, static_cast<uint8_t>(height >> 8),
                     static_cast<uint8_t>(height), static_cast<uint8_t>(width >> 8),
                     static_cast<uint8_t>(width), 0x03});
  b.insert(b.end(), 9, 0x11);  // components
  b.insert(b.end(), {0xFF, 0xDA, 0x00, 0x08});
  return b;
}

ImageSizeResult size_of(const std::vector<uint8_t>& b) {
  return read_image_size(b.data(), b.size());
}

}  // namespace

TEST(ImageSize, ReadsEachFormatsHeader) {
  EXPECT_EQ(size_of(jpeg_with_frame(640, 480)).size, (ImageSize{640, 480}));
  EXPECT_EQ(size_of(jpeg_with_frame(17, 3000, 60000, 0xC2)).size, (ImageSize{17, 3000}));
  // PNG: the signature, IHDR's length and type, then width and height.
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n', 0, 0, 0,    13, 'I',
                              'H',  'D', 'R', 0,   0,    0x01, 0x2C, 0,    0, 0, 0x64, 8,  2};
  EXPECT_EQ(size_of(png).size, (ImageSize{300, 100}));
  auto webp = [](const char* tag, std::vector<uint8_t> body) {
    const std::string head = std::string("RIFF\x64\0\0\0WEBP", 12) + tag +
                             static_cast<char>(body.size()) + std::string(3, '\0');
    std::vector<uint8_t> b(head.begin(), head.end());
    for (uint8_t v : body) b.push_back(v);
    return b;
  };
  // Lossy: a key frame's tag, the start code, 14-bit sides (scale bits above them ignored).
  EXPECT_EQ(size_of(webp("VP8 ", {0x10, 0, 0, 0x9D, 0x01, 0x2A, 0x90, 0x41, 0x2C, 0x01})).size,
            (ImageSize{400, 300}));
  // Lossless: 0x2F, then width - 1 and height - 1 in 14 bits each.
  const uint32_t bits = (400 - 1) | ((300 - 1) << 14);
  EXPECT_EQ(
      size_of(webp("VP8L", {0x2F, static_cast<uint8_t>(bits), static_cast<uint8_t>(bits >> 8),
                            static_cast<uint8_t>(bits >> 16), static_cast<uint8_t>(bits >> 24)}))
          .size,
      (ImageSize{400, 300}));
  // Extended: the canvas, 24 bits each, minus one.
  EXPECT_EQ(size_of(webp("VP8X", {0x10, 0, 0, 0, 0x0F, 0x27, 0x00, 0x0F, 0x27, 0x00})).size,
            (ImageSize{10000, 10000}));
  const std::string ppm = "P6\n# a comment\n 640 480\n255\n";
  EXPECT_EQ(read_image_size(reinterpret_cast<const uint8_t*>(ppm.data()), ppm.size()).size,
            (ImageSize{640, 480}));
}

TEST(ImageSize, AsksForMoreOrRefusesButNeverReadsPastTheBytes) {
  const std::vector<uint8_t> jpeg = jpeg_with_frame(640, 480, 2000);
  // Every prefix short of the frame header asks for more; none reads past what it is given
  // (ASan checks: each prefix is a buffer of its own size).
  for (size_t n = 0; n < jpeg.size(); ++n) {
    const std::vector<uint8_t> prefix(jpeg.begin(), jpeg.begin() + static_cast<ptrdiff_t>(n));
    const ImageSizeResult r = size_of(prefix);
    if (n < 2 + 4 + 2000 + 3 + 7) {  // SOI, APP1, its data, fill + SOF0, the frame's first 7
      EXPECT_EQ(r.status, ImageSizeStatus::kNeedMore) << n;
    } else {
      EXPECT_EQ(r.size, (ImageSize{640, 480})) << n;
    }
  }
  // A frame whose height a DNL marker gives later, a scan before any frame, a side over the
  // bound, not an image at all.
  EXPECT_EQ(size_of(jpeg_with_frame(640, 0)).status, ImageSizeStatus::kInvalid);
  EXPECT_EQ(size_of({0xFF, 0xD8, 0xFF, 0xDA, 0x00, 0x08, 1, 2, 3, 4, 5, 6}).status,
            ImageSizeStatus::kInvalid);
  // Junk between segments is skipped, as libjpeg skips it (with a warning).
  EXPECT_EQ(size_of({0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x02, 0x12, 0xFF, 0x00, 0xFF, 0xC0, 0, 11, 8, 0,
                     7, 0, 9, 1})
                .size,
            (ImageSize{9, 7}));
  std::vector<uint8_t> vp8x = {'R', 'I', 'F', 'F', 100,  0,    0,    0, 'W', 'E',
                               'B', 'P', 'V', 'P', '8',  'X',  10,   0, 0,   0,
                               0,   0,   0,   0,   0xFF, 0xFF, 0xFF, 0, 0,   0};
  EXPECT_EQ(size_of(vp8x).size, (ImageSize{kMaxRecordedSide, 1}));  // the bound itself
  std::vector<uint8_t> wide = {0x89, 'P', 'N', 'G',  '\r', '\n', 0x1A, '\n', 0, 0, 0,    13, 'I',
                               'H',  'D', 'R', 0x01, 0,    0,    0x01, 0,    0, 0, 0x64, 8,  2};
  EXPECT_EQ(size_of(wide).status, ImageSizeStatus::kInvalid);  // 2^24 + 1 wide: over it
  EXPECT_EQ(size_of({'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0, 0, 0, 0}).status,
            ImageSizeStatus::kInvalid);
  EXPECT_EQ(size_of({'G', 'I', 'F'}).status, ImageSizeStatus::kNeedMore);
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
