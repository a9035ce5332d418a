// verify_range through the C++ API: a clean pack, a byte flipped after packing (CRC), damage only a
// full decode finds, foreign WebDataset shards (no CRCs), and the options that turn checks off.
#include "stoker/pipeline/verify.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "stoker/core/error.h"
#include "stoker/decode/image_decoder.h"
#include "stoker/format/shard_writer.h"
#include "stoker/format/tar.h"

namespace stoker::pipeline {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("stoker_verify_test_" + std::to_string(::getpid()) + "_" + std::to_string(count_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
  static inline int count_ = 0;
};

std::vector<uint8_t> test_jpeg(int i) {
  const int w = 72 + 29 * (i % 5), h = 56 + 17 * (i % 3);
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        px[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>((x * (c + 2) + y * 5 + i * 31) & 255);
  return decode::encode_jpeg(px.data(), w, h, w * 3, 90);
}

std::string key_of(int i) {
  char key[16];
  std::snprintf(key, sizeof key, "%08d", i);
  return key;
}

// A stoker pack of `n` good JPEGs in two shards (shard-0.tar, shard-1.tar), with CRCs.
void write_pack(const TempDir& dir, int n) {
  std::string shards;
  const int per_shard = (n + 1) / 2;
  for (int s = 0, i = 0; i < n; ++s) {
    const std::string tar = "shard-" + std::to_string(s) + ".tar";
    const std::string idx = "shard-" + std::to_string(s) + ".idx";
    format::ShardWriter w(dir / tar, dir / idx);
    int in_shard = 0;
    for (; i < n && in_shard < per_shard; ++i, ++in_shard) {
      const auto bytes = test_jpeg(i);
      w.add(key_of(i), ImageFormat::kJpeg, bytes.data(), bytes.size(), i % 2);
    }
    w.finish();
    if (!shards.empty()) shards += ",";
    shards += R"({"tar": ")" + tar + R"(", "index": ")" + idx + R"(", "num_samples": )" +
              std::to_string(in_shard) + "}";
  }
  std::ofstream(dir / "manifest.json")
      << R"({"format": "stoker-pack", "version": 1, "classes": ["a", "b"], "num_samples": )" << n
      << R"(, "shards": [)" << shards << "]}";
}

// Overwrites bytes of a shard file in place (after packing, before the dataset is opened).
void overwrite(const std::string& path, uint64_t offset, const std::vector<uint8_t>& bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A WebDataset tar that stoker did not write: `members` of (name, bytes), no index, no CRCs.
void write_tar(const std::string& path,
               const std::vector<std::pair<std::string, std::vector<uint8_t>>>& members) {
  std::ofstream f(path, std::ios::binary);
  for (const auto& [name, bytes] : members) {
    f << format::make_tar_header(name, bytes.size());
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
    f << std::string(format::tar_padding(bytes.size()), '\0');
  }
  f << std::string(2 * format::kTarBlock, '\0');
}

TEST(Verify, CleanPackHasNoFailuresAndCountsEveryByte) {
  TempDir dir;
  write_pack(dir, 9);
  const auto ds = format::Dataset::open(dir.path().string());
  ASSERT_TRUE(ds->has_crc());
  const VerifyResult r = verify_range(ds, 0, ds->size());
  EXPECT_TRUE(r.failures.empty());
  EXPECT_EQ(r.checked, 9);
  EXPECT_TRUE(r.crc_checked);
  uint64_t bytes = 0;
  std::vector<format::MemberRef> members;
  for (int64_t i = 0; i < ds->size(); ++i) {
    ds->members(i, members);
    for (const auto& m : members) bytes += m.size;  // every member is read
  }
  EXPECT_EQ(r.bytes, bytes);

  const VerifyResult part = verify_range(ds, 3, 7);
  EXPECT_EQ(part.checked, 4);
  EXPECT_EQ(verify_range(ds, 5, 5).checked, 0);
  EXPECT_THROW(verify_range(ds, 0, 10), Error);
  EXPECT_THROW(verify_range(ds, 4, 3), Error);
  EXPECT_THROW(verify_range(ds, -1, 3), Error);
}

TEST(Verify, FlippedByteIsACrcMismatchNamingShardAndKey) {
  TempDir dir;
  write_pack(dir, 8);
  uint64_t offset = 0, size = 0;
  {
    const auto ds = format::Dataset::open(dir.path().string());
    ASSERT_EQ(ds->shard_name(6), "shard-1.tar");
    std::vector<format::MemberRef> members;
    ds->members(6, members);
    offset = members.front().offset, size = members.front().size;  // the image
  }
  // In the middle of the entropy-coded data: the image may still decode, the CRC cannot match.
  std::vector<uint8_t> byte(1);
  {
    std::ifstream f(dir / "shard-1.tar", std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset + size / 2));
    f.read(reinterpret_cast<char*>(byte.data()), 1);
  }
  byte[0] ^= 0x10;
  overwrite(dir / "shard-1.tar", offset + size / 2, byte);

  const auto ds = format::Dataset::open(dir.path().string());
  const VerifyResult r = verify_range(ds, 0, ds->size());
  EXPECT_EQ(r.checked, 8);
  ASSERT_EQ(r.failures.size(), 1u);
  const VerifyFailure& f = r.failures[0];
  EXPECT_EQ(f.index, 6);
  EXPECT_EQ(f.error.code(), ErrorCode::kCorruptData);
  EXPECT_EQ(f.error.shard(), "shard-1.tar");
  EXPECT_EQ(f.error.key(), "00000006");
  EXPECT_NE(f.error.reason().find("CRC32C mismatch"), std::string::npos) << f.error.reason();
  // A range that does not contain the sample is clean.
  EXPECT_TRUE(verify_range(ds, 0, 6).failures.empty());
  // Without the CRC check and without decoding nothing looks at the bytes.
  EXPECT_TRUE(verify_range(ds, 0, 8, {.check_crc = false, .decode = false}).failures.empty());
}

TEST(Verify, WithoutCrcTheFullDecodeFindsATruncatedImage) {
  TempDir dir;
  write_pack(dir, 6);
  uint64_t offset = 0, size = 0;
  {
    const auto ds = format::Dataset::open(dir.path().string());
    std::vector<format::MemberRef> members;
    ds->members(2, members);
    offset = members.front().offset, size = members.front().size;  // the image
  }
  // The second half of the image (entropy data and EOI) zeroed: libjpeg decodes it with a warning
  // and grey rows, which a loader's crop of the top half would never notice.
  overwrite(dir / "shard-0.tar", offset + size / 2, std::vector<uint8_t>(size - size / 2, 0));
  const auto ds = format::Dataset::open(dir.path().string());
  const VerifyResult r = verify_range(ds, 0, ds->size(), {.check_crc = false});
  EXPECT_FALSE(r.crc_checked);
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_EQ(r.failures[0].index, 2);
  EXPECT_EQ(r.failures[0].error.code(), ErrorCode::kCorruptData);
  EXPECT_EQ(r.failures[0].error.key(), "00000002");
  EXPECT_NE(r.failures[0].error.reason().find("damaged JPEG data"), std::string::npos)
      << r.failures[0].error.reason();
  // Warnings tolerated: the file decodes, so it passes.
  EXPECT_TRUE(verify_range(ds, 0, ds->size(), {.check_crc = false, .fail_on_warnings = false})
                  .failures.empty());
}

TEST(Verify, ForeignTarDecodeFailuresAreListedByKey) {
  TempDir dir;
  const auto good = test_jpeg(1);
  auto truncated = test_jpeg(2);
  truncated.resize(truncated.size() / 2);
  const std::string html = "<html><body>404 not found</body></html>";
  write_tar(dir / "foreign.tar", {{"a/good1.jpg", test_jpeg(0)},
                                  {"a/good1.cls", {'3'}},
                                  {"a/html.jpg", std::vector<uint8_t>(html.begin(), html.end())},
                                  {"a/garbage.jpg", {0xFF, 0xD8, 0xFF, 0xDB, 0x00, 0x01, 0x02}},
                                  {"a/good2.jpg", good},
                                  {"a/cut.jpg", truncated}});
  const auto ds = format::Dataset::open_tars({dir / "foreign.tar"});
  ASSERT_FALSE(ds->has_crc());
  ASSERT_EQ(ds->size(), 5);
  const VerifyResult r = verify_range(ds, 0, ds->size());
  EXPECT_FALSE(r.crc_checked);  // asked for, but there are none to compare
  EXPECT_EQ(r.checked, 5);
  ASSERT_EQ(r.failures.size(), 3u);
  EXPECT_EQ(r.failures[0].index, 1);
  EXPECT_EQ(r.failures[0].error.key(), "a/html");
  EXPECT_EQ(r.failures[0].error.code(), ErrorCode::kUnsupported);
  EXPECT_EQ(r.failures[1].error.key(), "a/garbage");
  EXPECT_EQ(r.failures[1].error.code(), ErrorCode::kCorruptData);
  EXPECT_EQ(r.failures[2].error.key(), "a/cut");
  EXPECT_EQ(r.failures[2].error.code(), ErrorCode::kCorruptData);
  for (const auto& f : r.failures) EXPECT_EQ(f.error.shard(), "foreign.tar");
  // Read only: nothing to compare, nothing decoded, nothing fails.
  const VerifyResult read_only = verify_range(ds, 0, ds->size(), {.decode = false});
  EXPECT_TRUE(read_only.failures.empty());
  EXPECT_EQ(read_only.bytes, r.bytes);
}

TEST(Verify, LimitsAreResourceLimitFailures) {
  TempDir dir;
  write_pack(dir, 3);
  const auto ds = format::Dataset::open(dir.path().string());
  const VerifyResult r = verify_range(ds, 0, 3, {.max_pixels = 100});
  ASSERT_EQ(r.failures.size(), 3u);
  for (const auto& f : r.failures) EXPECT_EQ(f.error.code(), ErrorCode::kResourceLimit);
  EXPECT_THROW(verify_range(ds, 0, 3, {.max_scans = 0}), Error);
}

}  // namespace
}  // namespace stoker::pipeline
