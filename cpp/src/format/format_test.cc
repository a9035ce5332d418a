#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
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

std::vector<uint8_t> bytes_of(std::string_view s) { return {s.begin(), s.end()}; }

const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

ShardIndex parse(const std::string& bytes, uint64_t shard_size = 1 << 20) {
  return parse_shard_index(u8(bytes), bytes.size(), shard_size, "test.idx");
}

// The Error `f` throws; fails the test when it throws none.
Error error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error thrown";
  return Error(ErrorCode::kInternal, "no error thrown");
}
ErrorCode code_of(const std::function<void()>& f) { return error_of(f).code(); }

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

void put_crc(std::string& out) { put<uint32_t>(out, crc32c(out.data(), out.size())); }

// Every field of two indexes, member names included.
void expect_same_index(const ShardIndex& a, const ShardIndex& b) {
  EXPECT_EQ(a.flags, b.flags);
  EXPECT_EQ(a.member_names, b.member_names);
  ASSERT_EQ(a.samples.size(), b.samples.size());
  for (size_t i = 0; i < a.samples.size(); ++i) {
    EXPECT_EQ(a.samples[i].key, b.samples[i].key) << i;
    EXPECT_EQ(a.samples[i].label, b.samples[i].label) << i;
    EXPECT_EQ(a.samples[i].first_member, b.samples[i].first_member) << i;
    EXPECT_EQ(a.samples[i].num_members, b.samples[i].num_members) << i;
  }
  ASSERT_EQ(a.members.size(), b.members.size());
  for (size_t i = 0; i < a.members.size(); ++i) {
    EXPECT_EQ(a.members[i].offset, b.members[i].offset) << i;
    EXPECT_EQ(a.members[i].size, b.members[i].size) << i;
    EXPECT_EQ(a.members[i].crc32c, b.members[i].crc32c) << i;
    EXPECT_EQ(a.members[i].name, b.members[i].name) << i;
  }
}

// The names of a sample's members, in order.
std::vector<std::string> member_names(const ShardIndex& index, const SampleRecord& s) {
  std::vector<std::string> out;
  for (const MemberRecord& m : index.members_of(s)) out.push_back(index.member_names.at(m.name));
  return out;
}

// ---- Version 3 index bytes written field by field, as docs/FORMAT.md lays them out (version 2:
// the same without the image sizes table) ---------------------------------------------------------

struct RawSample {
  uint64_t key_offset;
  uint32_t first_member;
  uint16_t num_members;
  uint16_t key_length;
  int64_t label;
};
struct RawMember {
  uint64_t offset, size;
  uint32_t crc32c;
  uint16_t name;
  uint16_t reserved = 0;
};
struct RawIndexV2 {
  uint32_t version = 3, flags = kIndexFlagHasCrc;
  // Header counts; each defaults (-1) to the true count of what follows.
  int64_t n = -1, m = -1, k = -1, s = -1;
  std::vector<RawSample> samples;
  std::vector<RawMember> members;
  std::string keys;
  std::string names;                                 // (u16 length, bytes) entries
  std::vector<std::pair<uint32_t, uint32_t>> sizes;  // version 3: per member (0, 0 if not given)

  void add_name(std::string_view name) {
    put<uint16_t>(names, static_cast<uint16_t>(name.size()));
    names += name;
  }
  std::string bytes() const {
    std::string out(kIndexMagic, 8);
    put<uint32_t>(out, version);
    put<uint32_t>(out, flags);
    auto count = [](int64_t given, size_t actual) {
      return given >= 0 ? static_cast<uint64_t>(given) : uint64_t{actual};
    };
    put<uint64_t>(out, count(n, samples.size()));
    put<uint64_t>(out, count(m, members.size()));
    put<uint64_t>(out, count(k, keys.size()));
    put<uint64_t>(out, count(s, names.size()));
    EXPECT_EQ(out.size(), 48u);
    for (const RawSample& r : samples) {
      put(out, r.key_offset);
      put(out, r.first_member);
      put(out, r.num_members);
      put(out, r.key_length);
      put(out, r.label);
    }
    for (const RawMember& r : members) {
      put(out, r.offset);
      put(out, r.size);
      put(out, r.crc32c);
      put(out, r.name);
      put(out, r.reserved);
    }
    out += keys;
    out += names;
    for (size_t i = 0; version >= 3 && i < members.size(); ++i) {
      put<uint32_t>(out, i < sizes.size() ? sizes[i].first : 0);
      put<uint32_t>(out, i < sizes.size() ? sizes[i].second : 0);
    }
    put_crc(out);
    return out;
  }
};

// Three samples: "a" (jpg, seg.png, cls), "bb" (jpg), "ccc" (jpg, boxes.npy); names interned in
// order of first use.
RawIndexV2 good_raw_v2() {
  RawIndexV2 r;
  r.keys = "abbccc";
  for (const char* n : {"jpg", "seg.png", "cls", "boxes.npy"}) r.add_name(n);
  r.samples = {{0, 0, 3, 1, 7}, {1, 3, 1, 2, -1}, {3, 4, 2, 3, 0}};
  r.members = {{512, 100, 0x11, 0},  {1024, 200, 0x22, 1}, {1536, 1, 0x33, 2},
               {2048, 300, 0x44, 0}, {3072, 400, 0x55, 0}, {4096, 0, 0x66, 3}};
  return r;
}

ShardIndex good_index_v2() {
  ShardIndexBuilder b;
  b.index().flags = kIndexFlagHasCrc;
  b.begin_sample("a", 7);
  b.add_member("jpg", 512, 100, 0x11);
  b.add_member("seg.png", 1024, 200, 0x22);
  b.add_member("cls", 1536, 1, 0x33);
  b.begin_sample("bb");
  b.add_member("jpg", 2048, 300, 0x44);
  b.begin_sample("ccc", 0);
  b.add_member("jpg", 3072, 400, 0x55);
  b.add_member("boxes.npy", 4096, 0, 0x66);
  return b.index();
}

// ---- Version 1 index bytes, as docs/FORMAT.md's "Version 1 indexes" table lays them out ------

struct RawRecordV1 {
  uint64_t offset, size;
  int64_t label;
  std::string key;
  uint32_t crc32c;
  uint8_t format;  // 1 JPEG, 2 PNG
};

std::string index_v1_bytes(const std::vector<RawRecordV1>& records, uint32_t flags = 1) {
  std::string keys;
  std::string out(kIndexMagic, 8);
  put<uint32_t>(out, 1);
  put<uint32_t>(out, flags);
  put<uint64_t>(out, records.size());
  for (const auto& r : records) keys += r.key;
  put<uint64_t>(out, keys.size());
  EXPECT_EQ(out.size(), 32u);
  uint64_t key_offset = 0;
  for (const auto& r : records) {
    put(out, r.offset);
    put(out, r.size);
    put(out, r.label);
    put(out, key_offset);
    put(out, r.crc32c);
    put<uint16_t>(out, static_cast<uint16_t>(r.key.size()));
    put<uint8_t>(out, r.format);
    put<uint8_t>(out, 0);
    key_offset += r.key.size();
  }
  EXPECT_EQ(out.size(), 32 + 40 * records.size());
  out += keys;
  put_crc(out);
  return out;
}

// A tar of the given (name, data) files, as another tool would write it.
void write_tar(const std::string& path,
               const std::vector<std::pair<std::string, std::string>>& files) {
  std::ofstream f(path, std::ios::binary);
  for (const auto& [name, data] : files) {
    f << make_tar_header(name, data.size()) << data << std::string(tar_padding(data.size()), '\0');
  }
  f << std::string(2 * kTarBlock, '\0');
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
  EXPECT_EQ(index.member_names, (std::vector<std::string>{"jpg", "cls"}));
  for (int i = 0; i < 5; ++i) {
    const SampleRecord& r = index.samples[i];
    EXPECT_EQ(r.key, "k" + std::to_string(i));
    EXPECT_EQ(r.label, i * 10);
    EXPECT_EQ(member_names(index, r), (std::vector<std::string>{"jpg", "cls"}));
    std::vector<uint8_t> data;
    const MemberRecord& image = index.members_of(r)[0];
    tar.read(image.offset, image.size, data);
    EXPECT_EQ(data, fake_jpeg(100 * i + 1));
    EXPECT_EQ(image.crc32c, crc32c(data.data(), data.size()));
    const MemberRecord& cls = index.members_of(r)[1];
    tar.read(cls.offset, cls.size, data);
    EXPECT_EQ(data, bytes_of(std::to_string(i * 10)));
    EXPECT_EQ(cls.crc32c, crc32c(data.data(), data.size()));
  }
  // The foreign-shard indexer finds the same samples, members and labels (without CRCs).
  const ShardIndex foreign = index_webdataset_tar(tar);
  EXPECT_EQ(foreign.flags & kIndexFlagHasCrc, 0u);
  EXPECT_EQ(foreign.member_names, index.member_names);
  ASSERT_EQ(foreign.samples.size(), 5u);
  ASSERT_EQ(foreign.members.size(), index.members.size());
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(foreign.samples[i].key, index.samples[i].key);
    EXPECT_EQ(foreign.samples[i].label, i * 10);
    EXPECT_EQ(foreign.samples[i].first_member, index.samples[i].first_member);
    EXPECT_EQ(foreign.samples[i].num_members, index.samples[i].num_members);
  }
  for (size_t i = 0; i < foreign.members.size(); ++i) {
    EXPECT_EQ(foreign.members[i].offset, index.members[i].offset);
    EXPECT_EQ(foreign.members[i].size, index.members[i].size);
    EXPECT_EQ(foreign.members[i].name, index.members[i].name);
  }
  // Asked for CRCs (a foreign shard fetched from object storage), it reads every member and
  // gives the writer's CRCs and flag, and the index survives the binary format.
  const ShardIndex with_crc = index_webdataset_tar(tar, /*with_crc=*/true);
  EXPECT_EQ(with_crc.flags, index.flags);
  ASSERT_EQ(with_crc.members.size(), index.members.size());
  for (size_t i = 0; i < with_crc.members.size(); ++i)
    EXPECT_EQ(with_crc.members[i].crc32c, index.members[i].crc32c) << i;
  expect_same_index(parse(serialize_shard_index(with_crc), tar.size()), index);
}

TEST(ShardWriter, AddSampleWritesEveryMemberInOrder) {
  TempDir dir;
  const std::string jpg = "\xFF\xD8\xFF jpeg", seg = "\x89PNG seg", boxes = "\x93NUMPY boxes";
  {
    ShardWriter w(dir / "s.tar", dir / "s.idx");
    const ShardWriter::MemberData m0[] = {{"jpg", u8(jpg), jpg.size()},
                                          {"seg.png", u8(seg), seg.size()},
                                          {"boxes.npy", u8(boxes), boxes.size()}};
    w.add_sample("a", m0, 5);
    // A cls member gives the label; no second cls is written.
    const std::string cls = " 12\n";
    const ShardWriter::MemberData m1[] = {{"cls", u8(cls), cls.size()},
                                          {"jpg", u8(jpg), jpg.size()}};
    w.add_sample("b", m1);
    // An empty member is a member; no label, no cls.
    const ShardWriter::MemberData m2[] = {{"txt", nullptr, 0}};
    w.add_sample("c", m2);
    EXPECT_EQ(w.num_samples(), 3u);
    w.finish();
  }
  io::ShardFile tar(dir / "s.tar");
  std::vector<std::string> names;
  scan_tar(tar, [&](const TarMember& m) { names.push_back(m.name); });
  EXPECT_EQ(names, (std::vector<std::string>{"a.jpg", "a.seg.png", "a.boxes.npy", "a.cls", "b.cls",
                                             "b.jpg", "c.txt"}));
  const auto bytes = io::read_file(dir / "s.idx");
  const ShardIndex index = parse_shard_index(bytes.data(), bytes.size(), tar.size(), "s.idx");
  ASSERT_EQ(index.samples.size(), 3u);
  EXPECT_EQ(member_names(index, index.samples[0]),
            (std::vector<std::string>{"jpg", "seg.png", "boxes.npy", "cls"}));
  EXPECT_EQ(member_names(index, index.samples[1]), (std::vector<std::string>{"cls", "jpg"}));
  EXPECT_EQ(member_names(index, index.samples[2]), (std::vector<std::string>{"txt"}));
  EXPECT_EQ(index.samples[0].label, 5);
  EXPECT_EQ(index.samples[1].label, 12);
  EXPECT_EQ(index.samples[2].label, -1);
  const std::string expected[] = {jpg, seg, boxes, "5", " 12\n", jpg, ""};
  ASSERT_EQ(index.members.size(), std::size(expected));
  std::vector<uint8_t> data;
  for (size_t i = 0; i < index.members.size(); ++i) {
    tar.read(index.members[i].offset, index.members[i].size, data);
    EXPECT_EQ(data, bytes_of(expected[i])) << i;
    EXPECT_EQ(index.members[i].crc32c, crc32c(data.data(), data.size())) << i;
  }
  // The tar read as a foreign shard says the same.
  const ShardIndex foreign = index_webdataset_tar(tar);
  ShardIndex without_crc = index;
  without_crc.flags = 0;
  for (auto& m : without_crc.members) m.crc32c = 0;
  expect_same_index(foreign, without_crc);
}

TEST(ShardWriter, RefusesBadSamplesAndStaysUsable) {
  TempDir dir;
  ShardWriter w(dir / "s.tar", dir / "s.idx");
  const std::string img = "image";
  auto add = [&](const std::string& key, std::vector<std::pair<std::string, std::string>> files,
                 int64_t label = -1) {
    std::vector<ShardWriter::MemberData> members;
    for (const auto& [name, data] : files) members.push_back({name, u8(data), data.size()});
    w.add_sample(key, members, label);
  };
  auto refused = [&](const std::string& key, std::vector<std::pair<std::string, std::string>> files,
                     int64_t label = -1) {
    return code_of([&] { add(key, std::move(files), label); }) == ErrorCode::kInvalidArgument;
  };
  EXPECT_TRUE(refused("k", {{"", img}}));
  EXPECT_TRUE(refused("k", {{"a/b", img}}));
  EXPECT_TRUE(refused("k", {{"/", img}}));
  EXPECT_TRUE(refused("k", {{".jpg", img}}));
  EXPECT_TRUE(refused("k", {{"jpg", img}, {"seg.png", img}, {"jpg", img}}));
  EXPECT_TRUE(refused("k.x", {{"jpg", img}}));
  EXPECT_TRUE(refused("", {{"jpg", img}}));
  EXPECT_TRUE(refused("d/k", {{"jpg", img}}));
  EXPECT_TRUE(refused("k", {{"jpg", img}, {"cls", "seven"}}));
  EXPECT_TRUE(refused("k", {{"cls", "-3"}}));
  EXPECT_TRUE(refused("k", {{"cls", "3"}}, 4));  // the cls member and the label disagree
  EXPECT_TRUE(refused("k", {{"cls", ""}}, 4));
  EXPECT_TRUE(refused("k", {{"jpg", img}}, -2));
  EXPECT_TRUE(refused("k", {}));  // no member and no label: nothing in the tar
  // Its tar name (KEY.<member>) would not fit in a ustar header: refused before anything is
  // written.
  EXPECT_TRUE(refused("k", {{"jpg", img}, {std::string(99, 'n'), img}}));
  EXPECT_EQ(w.num_samples(), 0u);
  EXPECT_EQ(w.bytes_written(), 0u);

  add("k1", {{"cls", "3"}}, 3);  // agreeing label: fine
  add("k2", {{"jpg", img}, {"cls", "\t9 "}});
  add("k3", {}, 2);  // a label alone: KEY.cls
  w.finish();
  io::ShardFile tar(dir / "s.tar");
  const auto bytes = io::read_file(dir / "s.idx");
  const ShardIndex index = parse_shard_index(bytes.data(), bytes.size(), tar.size(), "s.idx");
  ASSERT_EQ(index.samples.size(), 3u);
  EXPECT_EQ(index.samples[0].label, 3);
  EXPECT_EQ(index.samples[1].label, 9);
  EXPECT_EQ(index.samples[2].label, 2);
  EXPECT_EQ(member_names(index, index.samples[0]), (std::vector<std::string>{"cls"}));
  EXPECT_EQ(member_names(index, index.samples[2]), (std::vector<std::string>{"cls"}));
  std::vector<std::string> names;
  scan_tar(tar, [&](const TarMember& m) { names.push_back(m.name); });
  EXPECT_EQ(names, (std::vector<std::string>{"k1.cls", "k2.jpg", "k2.cls", "k3.cls"}));
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

TEST(ShardIndex, Version3RoundTripsWithSeveralMembers) {
  const ShardIndex index = good_index_v2();
  EXPECT_EQ(index.member_names, (std::vector<std::string>{"jpg", "seg.png", "cls", "boxes.npy"}));
  EXPECT_EQ(index.find_name("boxes.npy"), 3);
  EXPECT_EQ(index.find_name("png"), -1);
  const std::string bytes = serialize_shard_index(index);
  // Byte for byte the layout of docs/FORMAT.md.
  EXPECT_EQ(bytes, good_raw_v2().bytes());
  const ShardIndex back = parse(bytes);
  expect_same_index(back, index);
  EXPECT_EQ(member_names(back, back.samples[0]),
            (std::vector<std::string>{"jpg", "seg.png", "cls"}));
  EXPECT_EQ(member_names(back, back.samples[2]), (std::vector<std::string>{"jpg", "boxes.npy"}));
  EXPECT_EQ(serialize_shard_index(back), bytes);
  // The shard's exact size is enough; one byte less is not.
  EXPECT_NO_THROW(parse(bytes, 4096));
  EXPECT_EQ(code_of([&] { parse(bytes, 4095); }), ErrorCode::kCorruptData);
  // An empty index is valid too.
  // Version 2, the same less the sizes table, reads as the same index.
  RawIndexV2 v2 = good_raw_v2();
  v2.version = 2;
  expect_same_index(parse(v2.bytes()), index);
  const std::string empty = serialize_shard_index(ShardIndex{});
  EXPECT_EQ(empty.size(), 48u + 4u);
  EXPECT_TRUE(parse(empty, 0).samples.empty());
}

TEST(ShardIndex, ParsesHandBuiltVersion1) {
  const std::vector<RawRecordV1> records = {{512, 1000, 3, "00000000", 0xDEADBEEF, 1},
                                            {2048, 77, -1, "00000001", 0x12345678, 2},
                                            {3072, 0, 0, "k", 0, 1}};
  const std::string bytes = index_v1_bytes(records);
  ASSERT_EQ(bytes.size(), 32 + 40 * 3 + 17 + 4u);
  const ShardIndex index = parse(bytes, 3072);
  EXPECT_EQ(index.flags, kIndexFlagHasCrc);
  ASSERT_EQ(index.samples.size(), 3u);
  ASSERT_EQ(index.members.size(), 3u);
  for (size_t i = 0; i < records.size(); ++i) {
    const SampleRecord& s = index.samples[i];
    EXPECT_EQ(s.key, records[i].key);
    EXPECT_EQ(s.label, records[i].label);
    ASSERT_EQ(s.num_members, 1);
    const MemberRecord& m = index.members_of(s)[0];
    EXPECT_EQ(m.offset, records[i].offset);
    EXPECT_EQ(m.size, records[i].size);
    EXPECT_EQ(m.crc32c, records[i].crc32c);
  }
  EXPECT_EQ(member_names(index, index.samples[0]), (std::vector<std::string>{"jpg"}));
  EXPECT_EQ(member_names(index, index.samples[1]), (std::vector<std::string>{"png"}));
  EXPECT_EQ(member_names(index, index.samples[2]), (std::vector<std::string>{"jpg"}));
  // What it reads survives the version 2 format.
  expect_same_index(parse(serialize_shard_index(index), 3072), index);

  // Version 1's own checks.
  EXPECT_EQ(code_of([&] { parse(bytes, 3071); }), ErrorCode::kCorruptData);  // past the shard
  auto bad_format = records;
  bad_format[1].format = 3;
  EXPECT_EQ(code_of([&] { parse(index_v1_bytes(bad_format)); }), ErrorCode::kCorruptData);
  // A label below -1, which version 2 refuses too (it read as version 1, then failed to read
  // back once written as version 2: found by fuzz_index).
  auto bad_label = records;
  bad_label[2].label = -2;
  EXPECT_EQ(code_of([&] { parse(index_v1_bytes(bad_label)); }), ErrorCode::kCorruptData);
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x40;
    EXPECT_THROW(parse(bad), Error) << "flip at " << i;
  }
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_EQ(code_of([&] { parse(bytes.substr(0, n)); }), ErrorCode::kCorruptData) << n;
  std::string key_outside = bytes;
  key_outside[32 + 40 + 24] = 20;  // record 1's key offset: 20 + 8 > 17 key bytes
  key_outside.resize(key_outside.size() - 4);
  put_crc(key_outside);
  EXPECT_EQ(code_of([&] { parse(key_outside); }), ErrorCode::kCorruptData);
}

TEST(ShardIndex, RefusesEveryCorruption) {
  const std::string good = serialize_shard_index(good_index_v2());
  EXPECT_EQ(parse(good).samples.size(), 3u);
  // Offsets beyond the shard.
  EXPECT_EQ(code_of([&] { parse(good, 1000); }), ErrorCode::kCorruptData);
  // Every single-byte flip and every truncation is caught (checksum, sizes, magic).
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x40;
    EXPECT_THROW(parse(bad), Error) << "flip at " << i;
  }
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_EQ(code_of([&] { parse(good.substr(0, n)); }), ErrorCode::kCorruptData)
        << "truncated to " << n;
}

// Each rule of docs/FORMAT.md's validation, broken alone with a valid checksum.
TEST(ShardIndex, RefusesEachBrokenRuleOfVersion2) {
  ASSERT_NO_THROW(parse(good_raw_v2().bytes(), 4096));
  // Each case names the rule it breaks by a fragment of the message it must give.
  struct Case {
    const char* what;
    const char* message;
    std::function<void(RawIndexV2&)> edit;
    ErrorCode code = ErrorCode::kCorruptData;
  };
  const char* kSize = "does not match its header";
  const char* kOrder = "members out of order";
  const std::vector<Case> cases = {
      {"N + 1", kSize, [](RawIndexV2& r) { r.n = 4; }},
      {"N - 1", kSize, [](RawIndexV2& r) { r.n = 2; }},
      {"M + 1", kSize, [](RawIndexV2& r) { r.m = 7; }},
      {"M - 1", kSize, [](RawIndexV2& r) { r.m = 5; }},
      {"K + 1", kSize, [](RawIndexV2& r) { r.k = 7; }},
      {"K - 1", kSize, [](RawIndexV2& r) { r.k = 5; }},
      {"S + 1", kSize, [](RawIndexV2& r) { r.s = static_cast<int64_t>(r.names.size()) + 1; }},
      {"S - 1", kSize, [](RawIndexV2& r) { r.s = static_cast<int64_t>(r.names.size()) - 1; }},
      {"N huge", "overflows", [](RawIndexV2& r) { r.n = INT64_MAX; }},
      {"M huge", "overflows", [](RawIndexV2& r) { r.m = INT64_MAX / 2; }},
      {"byte after the checksum", kSize, [](RawIndexV2&) {}},  // appended below
      {"key byte moved into the name table", "overruns",
       [](RawIndexV2& r) {
         r.keys.pop_back();
         r.names.insert(r.names.begin(), 'c');
       }},
      {"name table ends inside a length", "inside a length",
       [](RawIndexV2& r) { r.names += '\x01'; }},
      {"name overruns the table", "overruns",
       [](RawIndexV2& r) {
         r.names += std::string(
             "\x05\x00"
             "ab",
             4);
       }},
      {"last name longer than the table", "overruns",
       [](RawIndexV2& r) {
         r.names.clear();
         r.add_name("jpg");
         r.add_name("seg.png");
         r.add_name("cls");
         r.names += std::string("\x0A\x00", 2) + "boxes.npy";  // 10 bytes claimed, 9 there
       }},
      {"zero-length name", "member name", [](RawIndexV2& r) { r.add_name(""); }},
      {"duplicate names", "twice", [](RawIndexV2& r) { r.add_name("seg.png"); }},
      {"name id out of range", "unknown name id", [](RawIndexV2& r) { r.members[5].name = 4; }},
      {"name id 0xFFFF", "unknown name id", [](RawIndexV2& r) { r.members[0].name = 0xFFFF; }},
      {"member past the shard's end", "outside the shard",
       [](RawIndexV2& r) { r.members[4].size = 4096 - 3072 + 1; }},
      {"member offset past the shard", "outside the shard",
       [](RawIndexV2& r) { r.members[5].offset = 4097; }},
      {"member range overflows", "outside the shard",
       [](RawIndexV2& r) { r.members[1].offset = 1, r.members[1].size = UINT64_MAX; }},
      {"first member skips one", kOrder, [](RawIndexV2& r) { r.samples[1].first_member = 4; }},
      {"tables overlap", kOrder,
       [](RawIndexV2& r) {
         r.samples[1].first_member = 2;
         r.samples[1].num_members = 2;
       }},
      {"tables out of order", kOrder,
       [](RawIndexV2& r) {
         r.samples[0].first_member = 1;
         r.samples[1].first_member = 0;
       }},
      {"first table does not start at 0", kOrder,
       [](RawIndexV2& r) {
         r.samples[0].first_member = 1;
         r.samples[0].num_members = 2;
       }},
      {"last table runs past the members", kOrder,
       [](RawIndexV2& r) { r.samples[2].num_members = 3; }},
      {"member count 0xFFFF", kOrder, [](RawIndexV2& r) { r.samples[2].num_members = 0xFFFF; }},
      {"a member of no sample", "no sample", [](RawIndexV2& r) { r.samples[2].num_members = 1; }},
      {"key past the key table", "key outside", [](RawIndexV2& r) { r.samples[2].key_length = 4; }},
      {"key offset past the key table", "key outside",
       [](RawIndexV2& r) { r.samples[0].key_offset = 7; }},
      {"key offset huge", "key outside",
       [](RawIndexV2& r) { r.samples[0].key_offset = UINT64_MAX; }},
      {"label -2", "negative label", [](RawIndexV2& r) { r.samples[1].label = -2; }},
      {"label INT64_MIN", "negative label", [](RawIndexV2& r) { r.samples[0].label = INT64_MIN; }},
      {"version 4", "version 4", [](RawIndexV2& r) { r.version = 4; }, ErrorCode::kUnsupported},
      {"version 0", "version 0", [](RawIndexV2& r) { r.version = 0; }, ErrorCode::kUnsupported},
  };
  for (const Case& c : cases) {
    RawIndexV2 raw = good_raw_v2();
    c.edit(raw);
    std::string bytes = raw.bytes();
    if (std::string_view(c.what) == "byte after the checksum") bytes += '\0';
    const Error e = error_of([&] { parse(bytes, 4096); });
    EXPECT_EQ(e.code(), c.code) << c.what;
    EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos)
        << c.what << ": " << e.what();
  }
  // A wrong checksum, a trailing byte inside the checksum, a bad magic.
  std::string bad_crc = good_raw_v2().bytes();
  bad_crc.back() ^= 1;
  const Error crc_error = error_of([&] { parse(bad_crc, 4096); });
  EXPECT_EQ(crc_error.code(), ErrorCode::kCorruptData);
  EXPECT_NE(std::string(crc_error.what()).find("checksum"), std::string::npos);
  EXPECT_EQ(crc_error.shard(), "test.idx");
  std::string trailing = good_raw_v2().bytes();
  trailing.resize(trailing.size() - 4);
  trailing += 'x';
  put_crc(trailing);
  EXPECT_EQ(code_of([&] { parse(trailing, 4096); }), ErrorCode::kCorruptData);
  std::string magic = good_raw_v2().bytes();
  magic[0] = 's';
  EXPECT_EQ(code_of([&] { parse(magic, 4096); }), ErrorCode::kCorruptData);
  // Unknown flags and reserved bits are not errors (they are for later versions to use).
  RawIndexV2 reserved = good_raw_v2();
  reserved.flags = 0xF0;
  reserved.members[0].reserved = 7;
  EXPECT_NO_THROW(parse(reserved.bytes(), 4096));
}

TEST(WebDataset, ForeignTarWithScrambledMembers) {
  TempDir dir;
  // Members of one key are not adjacent; files without an extension belong to no sample.
  write_tar(dir / "f.tar", {{"README", "read me"},
                            {"s/b.seg.png", "b-seg"},
                            {"s/a.jpg", "a-jpg"},
                            {"s/b.jpg", "b-jpg"},
                            {"s/a.json", "{}"},
                            {"s/c.txt", "c text"},
                            {"s/a.cls", "4\n"},
                            {"s/LICENSE", "none"},
                            {"s/b.cls", "0"},
                            {"s/a.seg.png", "a-seg"},
                            {"s/c.jpg", "c-jpg"},
                            {"s/a.txt", "a text"}});
  io::ShardFile tar(dir / "f.tar");
  const ShardIndex index = index_webdataset_tar(tar);
  EXPECT_EQ(index.flags, 0u);
  ASSERT_EQ(index.samples.size(), 3u);
  EXPECT_EQ(index.samples[0].key, "s/b");
  EXPECT_EQ(index.samples[1].key, "s/a");
  EXPECT_EQ(index.samples[2].key, "s/c");
  EXPECT_EQ(index.samples[0].label, 0);
  EXPECT_EQ(index.samples[1].label, 4);
  EXPECT_EQ(index.samples[2].label, -1);
  EXPECT_EQ(member_names(index, index.samples[0]),
            (std::vector<std::string>{"seg.png", "jpg", "cls"}));
  EXPECT_EQ(member_names(index, index.samples[1]),
            (std::vector<std::string>{"jpg", "json", "cls", "seg.png", "txt"}));
  EXPECT_EQ(member_names(index, index.samples[2]), (std::vector<std::string>{"txt", "jpg"}));
  EXPECT_EQ(index.member_names, (std::vector<std::string>{"seg.png", "jpg", "cls", "json", "txt"}));
  std::vector<uint8_t> data;
  for (const SampleRecord& s : index.samples) {
    for (const MemberRecord& m : index.members_of(s)) {
      EXPECT_EQ(m.crc32c, 0u);
      tar.read(m.offset, m.size, data);
      const std::string name = index.member_names[m.name];
      const std::string text(data.begin(), data.end());
      if (name == "cls") continue;
      // Each member's bytes are the file of that key and name.
      const std::string key = s.key.substr(2);
      const std::string expected = name == "json"      ? "{}"
                                   : name == "txt"     ? key + " text"
                                   : name == "seg.png" ? key + "-seg"
                                                       : key + "-" + name;
      EXPECT_EQ(text, expected) << s.key << "." << name;
    }
  }
  // The member tables partition the members, so the index survives the binary format.
  expect_same_index(parse(serialize_shard_index(index), tar.size()), index);
}

TEST(WebDataset, ForeignTarCrcsCoverMembersLargerThanOneRead) {
  TempDir dir;
  std::string big(9 << 20, '\0');  // over two of the indexer's 4 MiB reads
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 131) >> 7);
  write_tar(dir / "f.tar", {{"a.bin", big}, {"a.cls", "3"}, {"b.bin", ""}});
  io::ShardFile tar(dir / "f.tar");
  const ShardIndex index = index_webdataset_tar(tar, /*with_crc=*/true);
  ASSERT_EQ(index.samples.size(), 2u);
  EXPECT_EQ(index.samples[0].label, 3);
  EXPECT_EQ(index.members_of(index.samples[0])[0].crc32c, crc32c(big.data(), big.size()));
  EXPECT_EQ(index.members_of(index.samples[1])[0].crc32c, crc32c("", 0));
}

TEST(WebDataset, ForeignTarWithBadLabelNamesTheSample) {
  TempDir dir;
  write_tar(dir / "f.tar", {{"k.jpg", "x"}, {"k.cls", "cat"}});
  io::ShardFile tar(dir / "f.tar");
  try {
    index_webdataset_tar(tar);
    FAIL() << "a label that is not a number must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptData);
    EXPECT_EQ(e.key(), "k");
  }
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
      << R"({"format": "stoker-pack", "version": 2, "classes": ["a", "b"], "num_samples": 2,
             "shards": [{"tar": "shard-000000.tar", "index": "shard-000000.idx", "num_samples": 2}]})";
  auto ds = Dataset::open(dir.path().string());
  EXPECT_EQ(ds->size(), 2);
  EXPECT_EQ(ds->classes().size(), 2u);
  EXPECT_EQ(ds->label(1), 1);
  EXPECT_EQ(ds->shard_name(1), "shard-000000.tar");
  EXPECT_TRUE(ds->has_crc());
  // A single tar opens as a foreign WebDataset shard.
  auto foreign = Dataset::open(dir / "shard-000000.tar");
  EXPECT_EQ(foreign->size(), 2);
  EXPECT_FALSE(foreign->has_crc());
  // A truncated shard is refused at open: its index points past the end.
  fs::resize_file(dir / "shard-000000.tar", 600);
  EXPECT_THROW(Dataset::open(dir.path().string()), Error);
}

std::string manifest(int version, const std::vector<std::pair<std::string, int>>& shards) {
  std::string list;
  int total = 0;
  for (const auto& [name, n] : shards) {
    if (!list.empty()) list += ", ";
    list += R"({"tar": ")" + name + R"(.tar", "index": ")" + name + R"(.idx", "num_samples": )" +
            std::to_string(n) + "}";
    total += n;
  }
  return R"({"format": "stoker-pack", "version": )" + std::to_string(version) +
         R"(, "classes": ["a", "b", "c"], "num_samples": )" + std::to_string(total) +
         R"(, "shards": [)" + list + "]}";
}

// A pack written by stoker 1: manifest version 1, version 1 indexes (written here byte by byte).
TEST(Dataset, OpensVersion1Pack) {
  TempDir dir;
  std::vector<std::vector<RawRecordV1>> shards(2);
  for (int shard = 0; shard < 2; ++shard) {
    const std::string name = "shard-00000" + std::to_string(shard);
    ShardWriter w(dir / (name + ".tar"), dir / (name + ".idx"));
    for (int i = 0; i < 2 + shard; ++i) {
      const auto img = fake_jpeg(30 + i);
      const std::string key = "0000000" + std::to_string(shard * 2 + i);
      const bool png = i == 1;
      w.add(key, png ? ImageFormat::kPng : ImageFormat::kJpeg, img.data(), img.size(), i);
    }
    w.finish();
    // The same samples, described by a version 1 index.
    const auto v2 = io::read_file(dir / (name + ".idx"));
    const ShardIndex index = parse_shard_index(v2.data(), v2.size(), 1 << 20, name);
    for (const SampleRecord& s : index.samples) {
      const MemberRecord& image = index.members_of(s)[0];
      const bool png = index.member_names[image.name] == "png";
      shards[shard].push_back(
          {image.offset, image.size, s.label, s.key, image.crc32c, uint8_t(png ? 2 : 1)});
    }
    std::ofstream(dir / (name + ".idx"), std::ios::binary) << index_v1_bytes(shards[shard]);
  }
  std::ofstream(dir / "manifest.json") << manifest(1, {{"shard-000000", 2}, {"shard-000001", 3}});
  auto ds = Dataset::open(dir.path().string());
  ASSERT_EQ(ds->size(), 5);
  EXPECT_TRUE(ds->has_crc());
  std::vector<uint8_t> data;
  for (int64_t i = 0; i < ds->size(); ++i) {
    const uint32_t shard = ds->shard_of(i);
    const RawRecordV1& want = shards[shard][i < 2 ? i : i - 2];
    EXPECT_EQ(shard, i < 2 ? 0u : 1u);
    EXPECT_EQ(ds->key(i), want.key);
    EXPECT_EQ(ds->label(i), want.label);
    std::vector<MemberRef> members;
    ds->members(i, members);
    ASSERT_EQ(members.size(), 1u);
    const MemberRef& m = members[0];
    EXPECT_EQ(m.name, want.format == 2 ? "png" : "jpg");
    EXPECT_EQ(m.offset, want.offset);
    EXPECT_TRUE(m.has_crc && m.raw == nullptr && m.file == 0);
    ds->file(i, m.file)->read(m.offset, m.size, data);
    EXPECT_EQ(crc32c(data.data(), data.size()), m.crc32c);
  }
  // A manifest version this stoker does not know.
  std::ofstream(dir / "manifest.json") << manifest(3, {{"shard-000000", 2}, {"shard-000001", 3}});
  EXPECT_EQ(code_of([&] { Dataset::open(dir.path().string()); }), ErrorCode::kUnsupported);
}

TEST(Dataset, OpensVersion2PackWithSeveralMembers) {
  TempDir dir;
  const std::string jpg = "jpeg bytes", seg = "png bytes", boxes = "npy bytes";
  for (int shard = 0; shard < 2; ++shard) {
    const std::string name = "shard-00000" + std::to_string(shard);
    ShardWriter w(dir / (name + ".tar"), dir / (name + ".idx"));
    for (int i = 0; i < 2; ++i) {
      std::vector<ShardWriter::MemberData> members = {{"jpg", u8(jpg), jpg.size()}};
      if (shard == 1) members.push_back({"seg.png", u8(seg), seg.size()});
      if (i == 1) members.push_back({"boxes.npy", u8(boxes), boxes.size()});
      w.add_sample("k" + std::to_string(shard) + std::to_string(i), members, shard + i);
    }
    w.finish();
  }
  std::ofstream(dir / "manifest.json") << manifest(2, {{"shard-000000", 2}, {"shard-000001", 2}});
  auto ds = Dataset::open(dir.path().string());
  ASSERT_EQ(ds->size(), 4);
  const std::vector<std::vector<std::string>> expected = {{"jpg", "cls"},
                                                          {"jpg", "boxes.npy", "cls"},
                                                          {"jpg", "seg.png", "cls"},
                                                          {"jpg", "seg.png", "boxes.npy", "cls"}};
  std::vector<uint8_t> data;
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ds->shard_of(i), static_cast<uint32_t>(i / 2));
    EXPECT_EQ(ds->label(i), i / 2 + i % 2);
    std::vector<std::string> names;
    std::vector<MemberRef> members;
    ds->members(i, members);
    for (const MemberRef& m : members) {
      names.push_back(std::string(m.name));
      ds->file(i, m.file)->read(m.offset, m.size, data);
      const std::string text(data.begin(), data.end());
      const std::map<std::string, std::string> content = {{"jpg", jpg},
                                                          {"seg.png", seg},
                                                          {"boxes.npy", boxes},
                                                          {"cls", std::to_string(i / 2 + i % 2)}};
      EXPECT_EQ(text, content.at(names.back()));
    }
    EXPECT_EQ(names, expected[i]) << i;
  }
  EXPECT_EQ(ds->find_member(1, "seg.png"), 1);
  EXPECT_EQ(ds->find_member(0, "seg.png"), -1);
  MemberRef ref;
  EXPECT_FALSE(ds->member(0, ds->find_member(0, "boxes.npy"), ref));  // k00 has none
  EXPECT_TRUE(ds->member(1, ds->find_member(0, "boxes.npy"), ref));
  EXPECT_EQ(ref.name, "boxes.npy");
  EXPECT_THROW(ds->find_member(2, "jpg"), std::out_of_range);
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

// A .npy file (format 1.0) of `descr` and `shape` holding `data`, as numpy writes it.
std::string npy_file(const std::string& descr, const std::string& shape, const std::string& data) {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  header.resize(((10 + header.size() + 1 + 63) / 64) * 64 - 10 - 1, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xFF);
  out += static_cast<char>(header.size() >> 8);
  return out + header + data;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(Dataset, AnArrayPacksSamplesAreRowsOfItsColumnFiles) {
  TempDir dir;
  // Two shards of 3 and 2 rows: a uint8 (2, 2) column and an int64 label column.
  std::string pixels, labels;
  for (int i = 0; i < 20; ++i) pixels += static_cast<char>(i);
  for (int64_t i = 0; i < 5; ++i) labels.append(reinterpret_cast<const char*>(&i), 8);
  const std::string img0 = npy_file("|u1", "(3, 2, 2)", pixels.substr(0, 12));
  const std::string img1 = npy_file("|u1", "(2, 2, 2)", pixels.substr(12));
  write_file(dir / "s0.image.npy", img0);
  write_file(dir / "s1.image.npy", img1);
  write_file(dir / "s0.label.npy", npy_file("<i8", "(3,)", labels.substr(0, 24)));
  write_file(dir / "s1.label.npy", npy_file("<i8", "(2,)", labels.substr(24)));
  auto manifest = [&](const std::string& image_shape) {
    std::ofstream(dir / "manifest.json")
        << R"({"format": "stoker-arrays", "version": 1, "num_samples": 5, "fields": [
               {"name": "image", "dtype": "uint8", "shape": )"
        << image_shape << R"(},
               {"name": "label", "dtype": "int64", "shape": []}],
             "shards": [
               {"num_samples": 3, "files": [{"field": "image", "file": "s0.image.npy"},
                                            {"field": "label", "file": "s0.label.npy"}]},
               {"num_samples": 2, "files": [{"field": "image", "file": "s1.image.npy"},
                                            {"field": "label", "file": "s1.label.npy"}]}]})";
  };
  manifest("[2, 2]");
  const auto ds = Dataset::open(dir.path().string());
  ASSERT_EQ(ds->size(), 5);
  EXPECT_EQ(ds->layout(1), ShardLayout::kColumns);
  EXPECT_EQ(ds->find_member(0, "label"), 1);
  EXPECT_EQ(ds->find_member(0, "jpg"), -1);
  const auto held = ds->resident([] { return true; });
  std::vector<uint8_t> bytes, again;
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(ds->key(i), "0000000" + std::to_string(i));
    EXPECT_EQ(ds->label(i), -1);  // labels are a column here, read by a Label field
    MemberRef image, label;
    ASSERT_TRUE(ds->member(i, 0, image) && ds->member(i, 1, label));
    ASSERT_TRUE(image.raw && label.raw);
    EXPECT_EQ(image.raw->shape, (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(label.raw->dtype, DType::kInt64);
    ds->file(i, image.file)->read(image.offset, image.size, bytes);
    EXPECT_EQ(std::string(bytes.begin(), bytes.end()), pixels.substr(4 * i, 4));
    ds->file(i, label.file)->read(label.offset, label.size, bytes);
    EXPECT_EQ(std::memcmp(bytes.data(), &i, 8), 0);
    held->file(i, label.file)->read(label.offset, label.size, again);
    EXPECT_EQ(again, bytes);  // the copy in memory reads the same
  }
  uint64_t files = 0;
  for (const char* name : {"s0.image.npy", "s1.image.npy", "s0.label.npy", "s1.label.npy"})
    files += fs::file_size(dir.path() / name);
  EXPECT_EQ(held->resident_bytes(), files);
  // Arriving files (a pack at a URL) are checked against the manifest: header, size.
  EXPECT_NO_THROW(ds->verify_file(0, io::ShardFile(dir / "s0.image.npy")));
  EXPECT_EQ(code_of([&] { ds->verify_file(0, io::ShardFile(dir / "s1.image.npy")); }),
            ErrorCode::kCorruptData);
  // A manifest whose shape disagrees with the file's, and a truncated file.
  manifest("[4]");
  EXPECT_EQ(code_of([&] { Dataset::open(dir.path().string()); }), ErrorCode::kCorruptData);
  manifest("[2, 2]");
  write_file(dir / "s1.image.npy", img1.substr(0, img1.size() - 1));
  EXPECT_EQ(code_of([&] { Dataset::open(dir.path().string()); }), ErrorCode::kCorruptData);
}

TEST(Dataset, TokenWindowsStartEverySeqLenTokensAndNeverCrossAFile) {
  TempDir dir;
  std::string tokens;
  for (uint16_t t = 0; t < 10; ++t) tokens.append(reinterpret_cast<const char*>(&t), 2);
  write_file(dir / "a.bin", tokens);
  write_file(dir / "b.npy", npy_file("<u2", "(10,)", tokens));
  DatasetOptions options;
  options.seq_len = 3;
  options.token_dtype = DType::kUInt16;
  const auto ds = Dataset::open_token_files({dir / "a.bin", dir / "b.npy"}, options);
  ASSERT_EQ(ds->size(), 6);  // (10 - 1) / 3 = 3 windows a file
  EXPECT_EQ(ds->shard_tokens(1), 10);
  std::vector<uint8_t> bytes;
  for (int64_t i = 0; i < 6; ++i) {
    MemberRef w;
    ASSERT_TRUE(ds->member(i, ds->find_member(ds->shard_of(i), "tokens"), w));
    EXPECT_EQ(w.raw->shape, std::vector<int64_t>{4});
    ds->file(i, w.file)->read(w.offset, w.size, bytes);
    for (int k = 0; k < 4; ++k) {
      uint16_t t;
      std::memcpy(&t, bytes.data() + 2 * k, 2);
      EXPECT_EQ(t, (i % 3) * 3 + k) << i;  // windows of each file restart at its token 0
    }
  }
  options.token_dtype = DType::kUInt32;  // the .npy says uint16
  EXPECT_EQ(code_of([&] { Dataset::open_token_files({dir / "b.npy"}, options); }),
            ErrorCode::kInvalidArgument);
  write_file(dir / "odd.bin", tokens.substr(0, 5));
  options.token_dtype = DType::kUInt16;
  EXPECT_EQ(code_of([&] { Dataset::open_token_files({dir / "odd.bin"}, options); }),
            ErrorCode::kCorruptData);
  options.seq_len = 0;
  EXPECT_EQ(code_of([&] { Dataset::open_token_files({dir / "a.bin"}, options); }),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace stoker::format

namespace stoker::format {
namespace {

// The first bytes of a JPEG whose frame header says width x height (all read_image_size reads).
std::string jpeg_header(uint16_t width, uint16_t height) {
  std::string b = "\xFF\xD8\xFF\xC0";
  for (int v : {0, 11, 8, height >> 8, height & 255, width >> 8, width & 255, 1, 1, 0x11, 0})
    b += static_cast<char>(v);
  return b + "\xFF\xDA rest of the file";
}

std::string png_header(uint32_t width, uint32_t height) {
  std::string b("\x89PNG\r\n\x1A\n\0\0\0\x0DIHDR", 16);
  for (uint32_t v : {width, height})
    for (int shift = 24; shift >= 0; shift -= 8) b += static_cast<char>((v >> shift) & 255);
  return b + "\x08\x00 rest";
}

// A version 3 index's bytes as a version 2 one (the same, less the sizes table): what a pack
// written before image sizes were recorded holds.
std::string as_version_2(const std::string& v3, size_t members) {
  std::string v2 = v3.substr(0, v3.size() - 4 - 8 * members);
  const uint32_t version = 2;
  std::memcpy(v2.data() + 8, &version, 4);
  put_crc(v2);
  return v2;
}

// Two shards: samples with a JPEG, some with a PNG mask, one with a member that is no image.
void write_sized_pack(const TempDir& dir) {
  const std::string mask = png_header(30, 20), text = "not an image";
  for (int shard = 0; shard < 2; ++shard) {
    const std::string name = "shard-00000" + std::to_string(shard);
    ShardWriter w(dir / (name + ".tar"), dir / (name + ".idx"));
    for (int i = 0; i < 3; ++i) {
      const std::string jpg =
          jpeg_header(static_cast<uint16_t>(100 + 10 * i + shard), static_cast<uint16_t>(50 + i));
      std::vector<ShardWriter::MemberData> members = {{"txt", u8(text), text.size()},
                                                      {"jpg", u8(jpg), jpg.size()}};
      if (i == 1) members.push_back({"seg.png", u8(mask), mask.size()});
      w.add_sample("k" + std::to_string(shard) + std::to_string(i), members, i);
    }
    w.finish();
  }
  std::ofstream(dir / "manifest.json") << manifest(2, {{"shard-000000", 3}, {"shard-000001", 3}});
}

TEST(ShardIndex, Version3RecordsImageSizesAndOlderVersionsRecordNone) {
  ShardIndex built = good_index_v2();
  ASSERT_EQ(built.image_sizes.size(), built.members.size());
  built.image_sizes[0] = {640, 480};
  built.image_sizes[1] = {32, 24};
  const ShardIndex read = parse(serialize_shard_index(built), 1 << 20);
  EXPECT_EQ(read.version, 3u);
  expect_same_index(read, built);
  EXPECT_EQ(read.image_sizes, built.image_sizes);
  // Version 2 (written field by field) and version 1 still read, with no sizes.
  RawIndexV2 raw = good_raw_v2();
  raw.version = 2;
  const ShardIndex v2 = parse(raw.bytes(), 4096);
  EXPECT_EQ(v2.version, 2u);
  EXPECT_FALSE(v2.has_image_sizes());
  EXPECT_FALSE(parse(index_v1_bytes({{0, 10, 1, "k", 0, 1}}), 4096).has_image_sizes());
  // An unknown version is unsupported, not corrupt.
  std::string v4 = serialize_shard_index(built);
  v4[8] = 4;
  EXPECT_EQ(code_of([&] { parse(v4); }), ErrorCode::kUnsupported);
}

TEST(ShardIndex, RefusesImageSizesOutOfRangeAndAShortSizesTable) {
  const ShardIndex built = good_index_v2();
  const std::string good = serialize_shard_index(built);
  const size_t table = good.size() - 4 - 8 * built.members.size();
  auto with_size = [&](size_t member, uint32_t w, uint32_t h) {
    std::string bad = good.substr(0, good.size() - 4);
    std::memcpy(bad.data() + table + 8 * member, &w, 4);
    std::memcpy(bad.data() + table + 8 * member + 4, &h, 4);
    put_crc(bad);
    return bad;
  };
  EXPECT_NO_THROW(parse(with_size(2, kMaxRecordedSide, kMaxRecordedSide)));
  for (const auto& [w, h] : std::vector<std::pair<uint32_t, uint32_t>>{
           {0, 5}, {5, 0}, {kMaxRecordedSide + 1, 5}, {5, 0xFFFFFFFF}}) {
    const Error e = error_of([&] { parse(with_size(1, w, h)); });
    EXPECT_EQ(e.code(), ErrorCode::kCorruptData);
    EXPECT_NE(e.reason().find("image size out of range"), std::string::npos) << e.reason();
  }
  std::string short_table = good.substr(0, good.size() - 8);
  put_crc(short_table);
  EXPECT_NE(error_of([&] { parse(short_table); }).reason().find("does not match its header"),
            std::string::npos);
}

TEST(ShardWriter, RecordsEachImagesSizeFromItsHeader) {
  TempDir dir;
  write_sized_pack(dir);
  auto ds = Dataset::open(dir.path().string());
  SizeSource from = SizeSource::kNone;
  const std::vector<ImageSize> jpg = ds->image_sizes(1, {"jpg"}, &from);
  EXPECT_EQ(from, SizeSource::kIndex);
  EXPECT_EQ(jpg, (std::vector<ImageSize>{{101, 50}, {111, 51}, {121, 52}}));
  // The first of the alternatives a sample has; none: unknown; a member that is no image has
  // no size recorded.
  EXPECT_EQ(ds->image_sizes(0, {"seg.png", "jpg"}),
            (std::vector<ImageSize>{{100, 50}, {30, 20}, {120, 52}}));
  EXPECT_EQ(ds->image_sizes(0, {"seg.png"}), (std::vector<ImageSize>{{}, {30, 20}, {}}));
  EXPECT_EQ(ds->image_sizes(0, {"txt"}), (std::vector<ImageSize>(3)));
  MemberRef ref;
  ASSERT_TRUE(ds->member(4, ds->find_member(1, "jpg"), ref));
  EXPECT_EQ(ref.image_size, (ImageSize{111, 51}));
}

TEST(Dataset, OlderPacksGetTheirSizesFromTheImagesOnceThenFromTheSizesFile) {
  TempDir dir;
  write_sized_pack(dir);
  const std::vector<ImageSize> expected =
      Dataset::open(dir.path().string())->image_sizes(1, {"jpg"});
  for (const char* idx : {"shard-000000.idx", "shard-000001.idx"}) {  // as written before v3
    const auto v3 = io::read_file(dir / idx);
    const ShardIndex parsed = parse_shard_index(v3.data(), v3.size(), 1 << 20, idx);
    std::ofstream(dir / idx, std::ios::binary)
        << as_version_2(std::string(v3.begin(), v3.end()), parsed.members.size());
  }
  SizeSource from = SizeSource::kIndex;
  EXPECT_EQ(Dataset::open(dir.path().string())->image_sizes(1, {"jpg"}, &from), expected);
  EXPECT_EQ(from, SizeSource::kHeaders);
  ASSERT_TRUE(fs::exists(dir / "shard-000001.sizes"));
  EXPECT_FALSE(fs::exists(dir / "shard-000000.sizes"));  // read only where asked
  EXPECT_EQ(Dataset::open(dir.path().string())->image_sizes(1, {"jpg"}, &from), expected);
  EXPECT_EQ(from, SizeSource::kSizesFile);
  // A sizes file that does not parse, or is another index's, is read again from the images.
  std::ofstream(dir / "shard-000001.sizes", std::ios::binary) << "garbage";
  EXPECT_EQ(Dataset::open(dir.path().string())->image_sizes(1, {"jpg"}, &from), expected);
  EXPECT_EQ(from, SizeSource::kHeaders);
  EXPECT_EQ(Dataset::open(dir.path().string())->image_sizes(1, {"jpg"}, &from), expected);
  EXPECT_EQ(from, SizeSource::kSizesFile);  // and written anew
}

TEST(SizesFile, RoundTripsAndRefusesEveryCorruptionAndAnotherIndex) {
  ShardIndex index = good_index_v2();
  index.checksum = 0x12345678;
  const std::vector<ImageSize> sizes = {{640, 480}, {32, 24}, {}, {1, 1}, {7, 9}, {}};
  const std::string good = serialize_image_sizes(index, sizes);
  EXPECT_EQ(parse_image_sizes(u8(good), good.size(), index, "s.sizes"), sizes);
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x20;
    EXPECT_EQ(code_of([&] { parse_image_sizes(u8(bad), bad.size(), index, "s.sizes"); }),
              ErrorCode::kCorruptData)
        << "flip at " << i;
  }
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_EQ(code_of([&] { parse_image_sizes(u8(good), n, index, "s.sizes"); }),
              ErrorCode::kCorruptData)
        << "truncated to " << n;
  ShardIndex other = index;
  other.checksum ^= 1;
  const Error e = error_of([&] { parse_image_sizes(u8(good), good.size(), other, "s.sizes"); });
  EXPECT_NE(e.reason().find("another index"), std::string::npos) << e.reason();
  EXPECT_EQ(e.shard(), "s.sizes");
}

}  // namespace
}  // namespace stoker::format
