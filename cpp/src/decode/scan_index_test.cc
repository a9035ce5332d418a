// The ScanIndex path (stoker/decode/scan_index.h): a JPEG without restart markers decoded once
// with stoker's Huffman decoder recording its index, then entered mid-scan for each crop.
#include "stoker/decode/scan_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "decode/detail/decoders.h"
#include "decode/jpeg_outcome_test.h"
#include "stoker/core/error.h"
#include "stoker/decode/image_decoder.h"

namespace stoker::decode {
namespace {

namespace fs = std::filesystem;
using Mode = detail::RestartHuffmanDecoder::Mode;
using test_support::read_bytes;

// Real files without restart markers: the first 60 of imagenet-sample and every JPEG of
// jpeg-variety (4:2:0, 4:2:2, 4:4:4, grey, CMYK, progressive, odd sizes).
std::vector<std::string> real_jpegs() {
  const std::string root = std::string(STOKER_SHARED_DATA);
  std::vector<std::string> paths;
  if (!fs::exists(root + "/imagenet-sample")) return paths;
  for (const auto& e : fs::directory_iterator(root + "/imagenet-sample"))
    paths.push_back(e.path().string());
  std::sort(paths.begin(), paths.end());
  paths.resize(std::min<size_t>(paths.size(), 60));
  for (const auto& e : fs::recursive_directory_iterator(root + "/jpeg-variety")) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".jpg" || ext == ".jpeg" || ext == ".JPEG"))
      paths.push_back(e.path().string());
  }
  std::sort(paths.begin() + static_cast<ptrdiff_t>(std::min<size_t>(paths.size(), 60)),
            paths.end());
  return paths;
}

using Outcome = test_support::JpegOutcome;

Outcome decode(detail::JpegDecoder& d, const std::vector<uint8_t>& file, int64_t key, int denom,
               int x0, int y0, int x1, int y1) {
  return test_support::decode_jpeg(d, file, denom, x0, y0, x1, y1, true, key);
}

struct Rng {
  uint64_t state;
  int operator()(int n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>((state >> 33) % static_cast<uint64_t>(std::max(n, 1)));
  }
};

TEST(ScanIndex, RecordsOnTheFirstDecodeAndCropsExactlyAfter) {
  // Each file's first decode (its top half) records its index down to the crop's rows and gives
  // libjpeg's pixels; every later crop, entered through the index (recorded further first when
  // it reaches below), gives libjpeg's pixels for the same rectangle (the whole image's, but for
  // libjpeg's skipping rows of a 4:1:0 file) away from the cut's own edges, which fancy
  // upsampling sees as image edges (the loader's margin).
  const std::vector<std::string> paths = real_jpegs();
  if (paths.empty()) GTEST_SKIP() << "shared data not found";
  detail::JpegDecoder ours, theirs;
  ours.scan_indexes = std::make_shared<ScanIndexCache>(int64_t{1} << 30);
  Rng next{4242};
  int indexed = 0, seeks = 0, extensions = 0;
  for (size_t f = 0; f < paths.size(); ++f) {
    const auto file = read_bytes(paths[f]);
    ImageDecoder probe;
    ImageInfo info;
    try {
      info = probe.open(file.data(), file.size());
    } catch (const Error&) {
      continue;
    }
    if (int64_t{info.width} * info.height > (int64_t{1} << 22)) continue;  // keep the test quick
    const auto key = static_cast<int64_t>(f);
    const int w = info.width, h = info.height;
    const int fx0 = Rng{f}(w / 2), fy0 = Rng{f + 1}(h / 4);
    const Outcome first = decode(ours, file, key, 1, fx0, fy0, w, h / 2);
    const Outcome plain = decode(theirs, file, -1, 1, fx0, fy0, w, h / 2);
    ASSERT_TRUE(first.same_result(plain))
        << paths[f] << ": " << first.error << " / " << plain.error;
    const auto index = ours.scan_indexes->find(static_cast<uint64_t>(key));
    // Progressive files and those with restart markers are not recorded; others that cannot be
    // are kept as empty.
    if (!index || index->empty()) continue;
    EXPECT_EQ(first.mode, Mode::kRecord);
    EXPECT_TRUE(first.ours) << paths[f];
    // Down to the crop's rows (and those libjpeg decodes for context), not all.
    int mcu_h = 8;  // pixels an MCU row: 8, 16 or 32 (libjpeg's sampling factors, 1-4)
    while ((h + mcu_h - 1) / mcu_h > index->mcu_rows) mcu_h *= 2;
    EXPECT_GE(index->rows * mcu_h + mcu_h, h / 2) << paths[f];
    if (index->mcu_rows > 4) {
      EXPECT_LT(index->rows, index->mcu_rows) << paths[f];
    }
    ++indexed;
    for (int denom : {1, 2, 4, 8}) {
      const int sw = scaled_size(w, denom), sh = scaled_size(h, denom);
      for (int t = 0; t < 2; ++t) {
        const int x0 = next(sw / 2), y0 = next(sh / 2);
        const int x1 = x0 + 1 + next(sw - x0), y1 = y0 + 1 + next(sh - y0);
        const Outcome whole = decode(theirs, file, -1, denom, x0, y0, x1, y1);
        ASSERT_TRUE(whole.error.empty()) << paths[f];
        const int rows_before = ours.scan_indexes->find(static_cast<uint64_t>(key))->rows;
        const Outcome r = decode(ours, file, key, denom, x0, y0, x1, y1);
        ASSERT_TRUE(r.error.empty()) << paths[f] << ": " << r.error;
        EXPECT_EQ(r.warnings, whole.warnings) << paths[f];
        ASSERT_LE(r.origin_x, x0);
        ASSERT_LE(r.origin_y, y0);
        ASSERT_GE(r.origin_x + r.width, x1);
        ASSERT_GE(r.origin_y + r.height, y1);
        if (r.ours) {
          ASSERT_EQ(r.mode, Mode::kSeek);
          ++seeks;
          // The cache's index covers the crop's rows now, recorded further when they were not.
          const int rows = ours.scan_indexes->find(static_cast<uint64_t>(key))->rows;
          EXPECT_GE(rows * mcu_h, std::min(h, y1 * denom)) << paths[f];
          extensions += rows > rows_before;
        }
        const int left = r.origin_x > 0 ? r.origin_x + 2 : 0;
        const int top = r.origin_y > 0 ? r.origin_y + 2 : 0;
        const int right = r.origin_x + r.width < sw ? r.origin_x + r.width - 2 : sw;
        const int bottom = r.origin_y + r.height < sh ? r.origin_y + r.height - 2 : sh;
        for (int y = std::max(y0, top); y < std::min(y1, bottom); ++y)
          for (int x = std::max(x0, left); x < std::min(x1, right); ++x)
            for (int c = 0; c < 3; ++c)
              ASSERT_EQ(r.at(x, y, c), whole.at(x, y, c))
                  << paths[f] << " 1/" << denom << " (" << x0 << "," << y0 << ")-(" << x1 << ","
                  << y1 << ") at " << x << "," << y;
      }
    }
  }
  EXPECT_GT(indexed, 150) << seeks;
  EXPECT_GT(seeks, 800) << indexed;
  EXPECT_GT(extensions, 100) << indexed;
  std::printf("%d files indexed, %d crops through an index, %d of them recording it further\n",
              indexed, seeks, extensions);
}

TEST(ScanIndex, DamagedDataGivesLibjpegsResultAndNoIndex) {
  // Bytes of the entropy-coded data overwritten or cut: the recording decode hands the scan
  // back wherever libjpeg would warn, the result is libjpeg's, and the file gets no index.
  const std::vector<std::string> paths = real_jpegs();
  if (paths.empty()) GTEST_SKIP() << "shared data not found";
  detail::JpegDecoder ours, theirs;
  ours.scan_indexes = std::make_shared<ScanIndexCache>(int64_t{1} << 30);
  Rng next{7};
  int cases = 0, unindexed = 0, extended_through_damage = 0;
  for (size_t f = 0; f < 6; ++f) {
    const auto original = read_bytes(paths[f * 7]);
    const size_t begin = original.size() / 8;  // past the headers of these files
    for (int v = 0; v < 30; ++v) {
      std::vector<uint8_t> damaged = original;
      const size_t at =
          begin + static_cast<size_t>(next(static_cast<int>(damaged.size() - begin - 2)));
      switch (next(3)) {
        case 0: damaged[at] ^= static_cast<uint8_t>(1 + next(255)); break;
        case 1:
          damaged[at] = 0xFF;
          damaged[at + 1] = static_cast<uint8_t>(next(256));
          break;
        default: damaged.resize(at); break;
      }
      const int64_t key = static_cast<int64_t>(f * 100 + static_cast<size_t>(v));
      ImageDecoder probe;
      const ImageInfo info = probe.open(damaged.data(), damaged.size());
      const int w = info.width, h = info.height;
      const Outcome a = decode(ours, damaged, key, 1, w / 4, h / 4, w / 2, h / 2);
      const Outcome b = decode(theirs, damaged, -1, 1, w / 4, h / 4, w / 2, h / 2);
      ASSERT_TRUE(a.same_result(b)) << paths[f * 7] << " variant " << v << ": '" << a.error << "' "
                                    << a.warnings << " vs '" << b.error << "' " << b.warnings;
      const auto index = ours.scan_indexes->find(static_cast<uint64_t>(key));
      // A file libjpeg warns about or refuses is never indexed (its damage may lie in rows a
      // crop skips); one it decodes cleanly may be (the damage was in bits it never reads).
      if (b.warnings > 0 || !b.error.empty()) {
        EXPECT_TRUE(!index || index->empty()) << v;
      }
      unindexed += !index || index->empty();
      // A second crop, below (the index, if any, recorded further through the damage), gives
      // libjpeg's result too: the same error, or the same warnings and pixels.
      const Outcome c = decode(ours, damaged, key, 1, w / 2, h / 2, w, h);
      const Outcome d = decode(theirs, damaged, -1, 1, w / 2, h / 2, w, h);
      ASSERT_TRUE(c.same_result(d)) << paths[f * 7] << " variant " << v << ": '" << c.error << "' "
                                    << c.warnings << " vs '" << d.error << "' " << d.warnings;
      extended_through_damage += d.warnings > 0 && index && !index->empty();
      ++cases;
    }
  }
  EXPECT_EQ(cases, 180);
  EXPECT_GT(unindexed, 40);
  EXPECT_GT(extended_through_damage, 20);
}

TEST(ScanIndex, DamageJustBelowACropIsFoundAsLibjpegFindsIt) {
  // A row damaged in the middle of the image, the index recorded above it: crops ending in the
  // rows just above (whose chroma libjpeg upsamples with the damaged row's) and crops through it
  // give libjpeg's result, warnings included; a crop above it is still cut through the index.
  const std::vector<std::string> paths = real_jpegs();
  if (paths.size() < 40) GTEST_SKIP() << "shared data not found";
  int cases = 0, warned = 0, cut_above = 0;
  for (size_t f = 0; f < 40; f += 4) {
    const auto file = read_bytes(paths[f]);
    ImageDecoder probe;
    const ImageInfo info = probe.open(file.data(), file.size());
    // Where each row starts, from an index of the whole undamaged file.
    detail::JpegDecoder mapper;
    mapper.scan_indexes = std::make_shared<ScanIndexCache>(int64_t{1} << 30);
    decode(mapper, file, 0, 1, 0, 0, info.width, info.height);
    const auto full = mapper.scan_indexes->find(0);
    if (!full || full->empty() || full->rows < 12) continue;
    int mcu_h = 8;
    while ((info.height + mcu_h - 1) / mcu_h > full->mcu_rows) mcu_h *= 2;
    const int m = full->rows / 2;  // the damaged row
    const size_t per_row = static_cast<size_t>(full->points_per_row());
    const uint32_t from = full->bits[static_cast<size_t>(m) * per_row] >> 3;
    const uint32_t to = full->bits[static_cast<size_t>(m + 1) * per_row] >> 3;
    ASSERT_LT(from + 4, to);
    std::vector<uint8_t> damaged = file;
    // The scan's data starts where the header ends: the offset of the SOS segment's end.
    const size_t scan = [&] {
      detail::JpegDecoder d;
      d.read_header(file.data(), file.size(), DecodeOptions{});
      return d.entropy_begin;
    }();
    // A marker where data should be: libjpeg warns once it reads that far.
    damaged[scan + from + (to - from) / 2] = 0xFF;
    damaged[scan + from + (to - from) / 2 + 1] = 0xD3;
    detail::JpegDecoder ours, theirs;
    ours.scan_indexes = std::make_shared<ScanIndexCache>(int64_t{1} << 30);
    const int w = info.width;
    decode(ours, damaged, 1, 1, 0, 0, w, (m - 4) * mcu_h);  // recorded down to about m - 3
    for (int end : {m - 2, m - 1, m, m + 1, m + 2}) {       // crops ending in MCU row `end`
      for (int last_rows : {1, mcu_h / 2, mcu_h}) {
        const int y1 = end * mcu_h + last_rows, y0 = std::max(0, y1 - 3 * mcu_h);
        const Outcome a = decode(ours, damaged, 1, 1, w / 4, y0, w / 2, y1);
        const Outcome b = decode(theirs, damaged, -1, 1, w / 4, y0, w / 2, y1);
        ASSERT_EQ(a.warnings, b.warnings) << paths[f] << " rows ending in " << end << "+"
                                          << last_rows << ": '" << a.error << "' / '" << b.error;
        ASSERT_EQ(a.error, b.error) << paths[f];
        ASSERT_EQ(a.first_warning, b.first_warning) << paths[f];
        // Where both are clean, the same pixels in the rectangle (away from a cut's edges).
        if (b.warnings == 0 && b.error.empty()) {
          const int top = a.origin_y > 0 ? a.origin_y + 2 : 0;
          const int bottom = a.origin_y + a.height - 2;
          for (int y = std::max(y0, top); y < std::min(y1, bottom); ++y)
            for (int x = w / 4 + 2; x < w / 2 - 2; ++x)
              ASSERT_EQ(a.at(x, y, 1), b.at(x, y, 1)) << paths[f] << " at " << x << "," << y;
        }
        warned += b.warnings > 0;
        ++cases;
      }
    }
    const Outcome above = decode(ours, damaged, 1, 1, w / 4, 0, w / 2, (m - 4) * mcu_h);
    cut_above += above.ours && above.mode == Mode::kSeek;
  }
  EXPECT_GT(cases, 100);
  EXPECT_GT(warned, 30);
  EXPECT_GT(cut_above, 5);
}

TEST(ScanIndex, HeaderWarningsAreCountedOnceInACut) {
  // A JFIF version libjpeg does not know is a warning of its header: the cut reads the same
  // header again, and still reports the one warning libjpeg reports.
  const std::vector<std::string> paths = real_jpegs();
  if (paths.empty()) GTEST_SKIP() << "shared data not found";
  int tried = 0;
  for (size_t f = 0; f < 10 && f < paths.size(); ++f) {
    auto file = read_bytes(paths[f]);
    const auto jfif = std::search(file.begin(), file.end(), std::begin("JFIF"), std::end("JFIF"));
    if (jfif == file.end() || jfif - file.begin() > 32) continue;
    jfif[5] = 3;  // major version 3
    ImageDecoder probe;
    const ImageInfo info = probe.open(file.data(), file.size());
    detail::JpegDecoder ours, theirs;
    ours.scan_indexes = std::make_shared<ScanIndexCache>(int64_t{1} << 30);
    const int w = info.width, h = info.height;
    decode(ours, file, 1, 1, 0, 0, w, h / 2);
    const Outcome a = decode(ours, file, 1, 1, w / 4, h / 8, w / 2, h / 3);
    const Outcome b = decode(theirs, file, -1, 1, w / 4, h / 8, w / 2, h / 3);
    ASSERT_TRUE(a.ours && a.mode == Mode::kSeek) << paths[f];
    EXPECT_EQ(b.warnings, 1) << paths[f];
    EXPECT_EQ(a.warnings, b.warnings) << paths[f];
    EXPECT_EQ(a.first_warning, b.first_warning) << paths[f];
    ++tried;
  }
  EXPECT_GT(tried, 3);
}

TEST(ScanIndex, AnotherFilesIndexIsNotUsed) {
  // Two files under one key (a cache shared by mistake, a file replaced): the second is not
  // entered through the first's index.
  const std::vector<std::string> paths = real_jpegs();
  if (paths.size() < 2) GTEST_SKIP() << "shared data not found";
  const auto a = read_bytes(paths[0]), b = read_bytes(paths[1]);
  detail::JpegDecoder ours, theirs;
  ours.scan_indexes = std::make_shared<ScanIndexCache>(int64_t{1} << 30);
  ImageDecoder probe;
  const ImageInfo info = probe.open(a.data(), a.size());
  decode(ours, a, 1, 1, 0, 0, info.width, info.height);
  ASSERT_TRUE(ours.scan_indexes->find(1) && !ours.scan_indexes->find(1)->empty());
  const Outcome with = decode(ours, b, 1, 2, 8, 8, 64, 64);
  const Outcome plain = decode(theirs, b, -1, 2, 8, 8, 64, 64);
  EXPECT_FALSE(with.ours && with.mode == Mode::kSeek);
  EXPECT_TRUE(with.same_result(plain));
}

std::shared_ptr<ScanIndex> index_of(int rows, int max_rows, uint32_t fingerprint = 7) {
  auto x = std::make_shared<ScanIndex>();
  x->file_size = 1000;
  x->fingerprint = fingerprint;
  x->mcus_per_row = 4;
  x->mcu_rows = 10;
  x->step = 1;
  x->components = 3;
  x->rows = rows;
  x->max_rows = max_rows;
  x->bits.assign(static_cast<size_t>(rows) * 4, 0);
  x->dc.assign(x->bits.size() * 3, 0);
  return x;
}

TEST(ScanIndex, TheCacheKeepsTheLongestIndexOfAFileAndCountsItsBytes) {
  ScanIndexCache cache(int64_t{1} << 20);
  cache.insert(1, index_of(2, 10));
  const auto two = static_cast<int64_t>(index_of(2, 10)->bytes());
  EXPECT_EQ(cache.bytes(), two);
  cache.insert(1, index_of(5, 10));  // longer: replaces
  EXPECT_EQ(cache.find(1)->rows, 5);
  EXPECT_EQ(cache.bytes(), static_cast<int64_t>(index_of(5, 10)->bytes()));
  cache.insert(1, index_of(3, 10));  // shorter: kept out
  EXPECT_EQ(cache.find(1)->rows, 5);
  cache.insert(1, index_of(5, 5));  // as long, not to be recorded further: replaces
  EXPECT_EQ(cache.find(1)->max_rows, 5);
  cache.insert(1, index_of(2, 10, 8));  // another file's: replaces whatever its length
  EXPECT_EQ(cache.find(1)->fingerprint, 8u);
  EXPECT_EQ(cache.bytes(), two);
  auto none = std::make_shared<ScanIndex>();
  none->file_size = 1000;
  none->fingerprint = 8;
  cache.insert(1, none);  // the same file cannot be indexed after all: kept out (the index works)
  EXPECT_FALSE(cache.find(1)->empty());
  cache.insert(2, none);
  EXPECT_EQ(cache.size(), 2);
  EXPECT_EQ(cache.indexed(), 1);
  cache.insert(2, index_of(4, 10, 8));  // an empty one stays: the file was found not indexable
  EXPECT_TRUE(cache.find(2)->empty());
  // Threads inserting and finding at once: the counts add up (TSan checks the rest).
  ScanIndexCache shared(int64_t{1} << 30);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&shared, t] {
      for (int k = 0; k < 200; ++k) {
        shared.insert(static_cast<uint64_t>(k), index_of(1 + (k + t) % 7, 10));
        const auto found = shared.find(static_cast<uint64_t>((k * 7) % 200));
        if (found) {
          EXPECT_GE(found->rows, 1);
        }
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(shared.size(), 200);
  int64_t bytes = 0;
  for (uint64_t k = 0; k < 200; ++k) bytes += static_cast<int64_t>(shared.find(k)->bytes());
  EXPECT_EQ(shared.bytes(), bytes);
}

TEST(ScanIndex, TheCacheStopsAtItsBudget) {
  const std::vector<std::string> paths = real_jpegs();
  if (paths.size() < 20) GTEST_SKIP() << "shared data not found";
  auto cache = std::make_shared<ScanIndexCache>(20000);
  ImageDecoder d({}, cache);
  for (int64_t k = 0; k < 20; ++k) {
    const auto file = read_bytes(paths[static_cast<size_t>(k)]);
    d.open(file.data(), file.size(), k);
    d.decode(2, 0, 0, 40, 40);
  }
  EXPECT_LE(cache->bytes(), 20000);
  EXPECT_GT(cache->size(), 2);
  EXPECT_LT(cache->size(), 20);
  ScanIndexCache none(0);
  none.insert(1, std::make_shared<ScanIndex>());
  EXPECT_EQ(none.size(), 0);
  // Without a key, or with scan_index off, nothing is recorded.
  auto unused = std::make_shared<ScanIndexCache>(int64_t{1} << 30);
  ImageDecoder off(DecodeOptions{.scan_index = false}, unused), keyless({}, unused);
  const auto file = read_bytes(paths[0]);
  off.open(file.data(), file.size(), 5);
  off.decode(1, 0, 0, 100, 100);
  keyless.open(file.data(), file.size());
  keyless.decode(1, 0, 0, 100, 100);
  EXPECT_EQ(unused->size(), 0);
}

}  // namespace
}  // namespace stoker::decode
