#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "stoker/core/crc32c.h"
#include "stoker/core/error.h"
#include "stoker/format/dataset.h"
#include "stoker/format/shard_index.h"
#include "stoker/format/shard_writer.h"
#include "stoker/format/tar.h"

namespace stoker::format {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("stoker_format_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
  static inline int counter_ = 0;
};

std::vector<uint8_t> fake_jpeg(int n) {
  std::vector<uint8_t> b = {0xFF, 0xD8, 0xFF, 0xE0};
  for (int i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(i * 7));
  return b;
}

TEST(Tar, HeaderIsValidUstar) {
  const std::string h = make_tar_header("00000001.jpg", 1234);
  ASSERT_EQ(h.size(), kTarBlock);
  EXPECT_EQ(h.substr(257, 5), "ustar");
  EXPECT_EQ(h.substr(124, 11), "00000002322");  // 1234 in octal
  EXPECT_THROW(make_tar_header(std::string(101, 'a'), 1), Error);
}

TEST(Tar, SplitWebDatasetName) {
  std::string key, ext;
  split_webdataset_name("dir/a.b/sample001.seg.PNG", key, ext);
  EXPECT_EQ(key, "dir/a.b/sample001");
  EXPECT_EQ(ext, "seg.png");
}

TEST(ShardWriter, RoundTripThroughIndexAndTarScan) {
  TempDir dir;
  {
    ShardWriter w(dir / "s.tar", dir / "s.idx");
    for (int i = 0; i < 5; ++i) {
      const auto img = fake_jpeg(100 * i + 1);
      w.add("k" + std::to_string(i), ImageFormat::kJpeg, img.data(), img.size(), i * 10);
    }
    EXPECT_FALSE(fs::exists(dir / "s.tar"));  // not visible before finish()
    w.finish();
  }
  io::ShardFile tar(dir / "s.tar");
  EXPECT_EQ(tar.size() % kTarBlock, 0u);
  std::vector<TarMember> members;
  scan_tar(tar, [&](const TarMember& m) { members.push_back(m); });
  ASSERT_EQ(members.size(), 10u);
  EXPECT_EQ(members[0].name, "k0.jpg");
  EXPECT_EQ(members[1].name, "k0.cls");

  const auto bytes = io::read_file(dir / "s.idx");
  const ShardIndex index = parse_shard_index(bytes.data(), bytes.size(), tar.size(), "s.idx");
  ASSERT_EQ(index.samples.size(), 5u);
  EXPECT_TRUE(index.flags & kIndexFlagHasCrc);
  for (int i = 0; i < 5; ++i) {
    const SampleRecord& r = index.samples[i];
    EXPECT_EQ(r.key, "k" + std::to_string(i));
    EXPECT_EQ(r.label, i * 10);
    EXPECT_EQ(r.format, ImageFormat::kJpeg);
    std::vector<uint8_t> data;
    tar.read(r.offset, r.size, data);
    EXPECT_EQ(data, fake_jpeg(100 * i + 1));
    EXPECT_EQ(r.crc32c, crc32c(data.data(), data.size()));
  }
  // The foreign-shard indexer finds the same samples and labels.
  const ShardIndex foreign = index_webdataset_tar(tar);
  ASSERT_EQ(foreign.samples.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(foreign.samples[i].offset, index.samples[i].offset);
    EXPECT_EQ(foreign.samples[i].label, i * 10);
  }
}

TEST(ShardWriter, UnfinishedShardLeavesNothing) {
  TempDir dir;
  {
    ShardWriter w(dir / "s.tar", dir / "s.idx");
    const auto img = fake_jpeg(10);
    w.add("k", ImageFormat::kJpeg, img.data(), img.size(), 1);
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(ShardIndex, RejectsEveryCorruption) {
  ShardIndex index;
  index.flags = kIndexFlagHasCrc;
  for (int i = 0; i < 3; ++i) {
    SampleRecord r;
    r.offset = 512 * (2 * i + 1);
    r.size = 100;
    r.label = i;
    r.format = ImageFormat::kPng;
    r.key = "key" + std::to_string(i);
    index.samples.push_back(r);
  }
  const std::string good = serialize_shard_index(index);
  const auto* p = reinterpret_cast<const uint8_t*>(good.data());
  EXPECT_EQ(parse_shard_index(p, good.size(), 1 << 20, "x").samples.size(), 3u);
  // Offsets beyond the shard.
  EXPECT_THROW(parse_shard_index(p, good.size(), 1000, "x"), Error);
  // Every single-byte flip and every truncation is caught (checksum, sizes, magic).
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x40;
    EXPECT_THROW(
        parse_shard_index(reinterpret_cast<const uint8_t*>(bad.data()), bad.size(), 1 << 20, "x"),
        Error)
        << "flip at " << i;
  }
  for (size_t n = 0; n < good.size(); n += 7)
    EXPECT_THROW(parse_shard_index(p, n, 1 << 20, "x"), Error) << "truncated to " << n;
}

TEST(Dataset, OpensPackAndRefusesIncompleteOne) {
  TempDir dir;
  {
    ShardWriter w(dir / "shard-000000.tar", dir / "shard-000000.idx");
    const auto img = fake_jpeg(50);
    w.add("00000000", ImageFormat::kJpeg, img.data(), img.size(), 0);
    w.add("00000001", ImageFormat::kJpeg, img.data(), img.size(), 1);
    w.finish();
  }
  try {
    Dataset::open(dir.path().string());
    FAIL() << "a pack without its manifest must not load";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("incomplete"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "manifest.json")
      << R"({"format": "stoker-pack", "version": 1, "classes": ["a", "b"], "num_samples": 2,
             "shards": [{"tar": "shard-000000.tar", "index": "shard-000000.idx", "num_samples": 2}]})";
  auto ds = Dataset::open(dir.path().string());
  EXPECT_EQ(ds->size(), 2);
  EXPECT_EQ(ds->classes().size(), 2u);
  EXPECT_EQ(ds->record(1).label, 1);
  EXPECT_EQ(ds->shard_name(1), "shard-000000.tar");
  // A single tar opens as a foreign WebDataset shard.
  auto foreign = Dataset::open(dir / "shard-000000.tar");
  EXPECT_EQ(foreign->size(), 2);
  EXPECT_FALSE(foreign->has_crc());
  // A truncated shard is refused at open: its index points past the end.
  fs::resize_file(dir / "shard-000000.tar", 600);
  EXPECT_THROW(Dataset::open(dir.path().string()), Error);
}

TEST(Tar, TruncatedOrGarbageTarGivesError) {
  TempDir dir;
  {
    std::ofstream f(dir / "bad.tar", std::ios::binary);
    std::string h = make_tar_header("a.jpg", 100000);  // claims more than the file has
    f << h << std::string(512, 'x');
  }
  io::ShardFile tar(dir / "bad.tar");
  EXPECT_THROW(scan_tar(tar, [](const TarMember&) {}), Error);
  {
    std::ofstream f(dir / "garbage.tar", std::ios::binary);
    f << std::string(2048, '\x7f');
  }
  io::ShardFile garbage(dir / "garbage.tar");
  EXPECT_THROW(scan_tar(garbage, [](const TarMember&) {}), Error);
}

}  // namespace
}  // namespace stoker::format
