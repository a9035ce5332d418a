#include <gtest/gtest.h>
#include <malloc.h>
#include <time.h>
#include <webp/decode.h>
#include <webp/encode.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "decode/detail/decoders.h"
#include "decode/jpeg_outcome_test.h"
#include "stoker/core/error.h"
#include "stoker/core/image_size.h"
#include "stoker/decode/image_decoder.h"
#include "stoker/decode/mask_decoder.h"

namespace stoker::decode {
namespace {

namespace fs = std::filesystem;
using test_support::decode_jpeg;
using test_support::JpegOutcome;
using test_support::read_bytes;

// This thread's CPU time. A refusal that must come before any decoding is bounded in CPU, not
// wall time: on a machine shared with other jobs a few microseconds of work can wait tens of
// milliseconds for a core, while a bomb decoded would still burn seconds of CPU.
std::chrono::nanoseconds thread_cpu_time() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

// A smooth RGB test picture, so DCT scaling and chroma subsampling keep it close to the original.
std::vector<uint8_t> gradient(int w, int h) {
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &px[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<uint8_t>(255 * x / (w - 1));
      p[1] = static_cast<uint8_t>(255 * y / (h - 1));
      p[2] = static_cast<uint8_t>(128 + 100 * std::sin(x * 0.02) * std::cos(y * 0.03));
    }
  return px;
}

double mean_abs_diff(const DecodedRegion& r, const std::vector<uint8_t>& ref, int ref_w,
                     int denom) {
  double sum = 0;
  int n = 0;
  for (int y = 0; y < r.height; ++y)
    for (int x = 0; x < r.width; ++x)
      for (int c = 0; c < 3; ++c) {
        // Compare with the reference pixel at the centre of the scaled pixel.
        const int sx = (r.origin_x + x) * denom + denom / 2,
                  sy = (r.origin_y + y) * denom + denom / 2;
        sum += std::abs(int(r.pixels[y * r.stride + x * 3 + c]) -
                        int(ref[(static_cast<size_t>(sy) * ref_w + sx) * 3 + c]));
        ++n;
      }
  return sum / n;
}

TEST(ImageDecoder, JpegRoundTripFullAndScaled) {
  const int w = 640, h = 480;
  const auto px = gradient(w, h);
  const auto jpeg = encode_jpeg(px.data(), w, h, w * 3, 95);
  ImageDecoder d;
  const ImageInfo& info = d.open(jpeg.data(), jpeg.size());
  EXPECT_EQ(info.format, ImageFormat::kJpeg);
  EXPECT_EQ(info.width, w);
  EXPECT_EQ(info.height, h);
  EXPECT_EQ(d.max_scale_denom(), 8);
  const DecodedRegion& full = d.decode_full();
  EXPECT_EQ(full.width, w);
  EXPECT_EQ(full.height, h);
  EXPECT_LT(mean_abs_diff(full, px, w, 1), 2.0);
  for (int denom : {2, 4, 8}) {
    d.open(jpeg.data(), jpeg.size());
    const DecodedRegion& r = d.decode(denom, 0, 0, w / denom, h / denom);
    EXPECT_EQ(r.scaled_width, w / denom);
    EXPECT_EQ(r.width, w / denom);
    EXPECT_LT(mean_abs_diff(r, px, w, denom), 4.0) << "denom " << denom;
  }
}

TEST(ImageDecoder, FastIdctIsCloseToTheAccurateOne) {
  // Real photos (not a smooth gradient, whose high frequencies the two IDCTs agree on): the fast
  // IDCT changes pixels, but stays within a PSNR bound of the accurate decode (40-46 dB on these
  // files at full size). Only 8x8 IDCTs have a fast variant: at 1/4 scale (luma 2x2, 4:2:0
  // chroma 4x4) the option changes nothing; at 1/2, 4:2:0 chroma is still 8x8 (libjpeg
  // upsamples it in the IDCT), so there it does.
  const std::string dir = std::string(STOKER_SHARED_DATA) + "/imagenet-sample";
  if (!fs::exists(dir)) GTEST_SKIP() << "shared data not found";
  ImageDecoder accurate, fast(DecodeOptions{.fast_idct = true});
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (++files > 20) break;
    const auto bytes = read_bytes(e.path().string());
    for (int denom : {1, 2, 4}) {
      accurate.open(bytes.data(), bytes.size());
      const DecodedRegion a = accurate.decode(denom, 0, 0, 1 << 20, 1 << 20);
      const std::vector<uint8_t> a_px(a.pixels, a.pixels + a.stride * a.height);
      fast.open(bytes.data(), bytes.size());
      const DecodedRegion& f = fast.decode(denom, 0, 0, 1 << 20, 1 << 20);
      ASSERT_EQ(f.width, a.width);
      ASSERT_EQ(f.height, a.height);
      double squared = 0;
      for (int y = 0; y < a.height; ++y)
        for (int x = 0; x < a.width * 3; ++x) {
          const double d = double(f.pixels[y * f.stride + x]) - a_px[y * a.stride + x];
          squared += d * d;
        }
      const double mse = squared / (double(a.width) * a.height * 3);
      if (denom == 4) {
        EXPECT_EQ(mse, 0.0) << e.path();
        continue;
      }
      if (denom == 1) {
        EXPECT_GT(mse, 0.0) << e.path() << ": the fast IDCT was not used";
      }
      if (mse > 0) {
        EXPECT_GT(10 * std::log10(255.0 * 255.0 / mse), 37.0) << e.path() << " at 1/" << denom;
      }
    }
  }
  EXPECT_EQ(files, 21);
}

TEST(ImageDecoder, CropDecodesOnlyTheRectangleAndMatchesFullDecode) {
  const int w = 640, h = 480;
  const auto px = gradient(w, h);
  const auto jpeg = encode_jpeg(px.data(), w, h, w * 3, 90);
  ImageDecoder d;
  d.open(jpeg.data(), jpeg.size());
  const DecodedRegion full = d.decode_full();
  const std::vector<uint8_t> full_px(full.pixels, full.pixels + full.stride * full.height);
  d.open(jpeg.data(), jpeg.size());
  const DecodedRegion& r = d.decode(1, 100, 50, 300, 200);
  EXPECT_LE(r.origin_x, 100);
  EXPECT_GE(r.origin_x + r.width, 300);
  EXPECT_EQ(r.origin_y, 50);
  EXPECT_EQ(r.height, 150);
  EXPECT_LT(r.width, w);  // really cropped
  // Fancy upsampling treats the crop's edge columns as image edges: libjpeg's output differs there,
  // so the decoder's callers ask for a margin (kCropMargin). Inside it, pixels are identical.
  int worst_inside = 0, worst_edge = 0;
  for (int y = 0; y < r.height; ++y)
    for (int x = 0; x < r.width; ++x)
      for (int c = 0; c < 3; ++c) {
        const int diff =
            std::abs(int(r.pixels[y * r.stride + x * 3 + c]) -
                     int(full_px[(r.origin_y + y) * full.stride + (r.origin_x + x) * 3 + c]));
        const bool edge = x < 2 || x >= r.width - 2 || y < 2 || y >= r.height - 2;
        (edge ? worst_edge : worst_inside) = std::max(edge ? worst_edge : worst_inside, diff);
      }
  EXPECT_EQ(worst_inside, 0);
  EXPECT_LE(worst_edge, 8);
}

TEST(ImageDecoder, ProgressiveDcOnlyMatchesFullProgressiveDecodeAtEighth) {
  // A progressive file from the shared corpus; at 1/8 the DC scans alone must give the same pixels
  // as decoding every scan (the 1/8 IDCT reads only the DC coefficient).
  const std::string path = std::string(STOKER_SHARED_DATA) +
                           "/jpeg-variety/libjxl-testdata/flower/flower.png.im_q85_420_progr.jpg";
  if (!fs::exists(path)) GTEST_SKIP() << "shared data not found";
  const auto bytes = read_bytes(path);
  ImageDecoder d;
  ASSERT_TRUE(d.open(bytes.data(), bytes.size()).progressive);
  const DecodedRegion& dc = d.decode(8, 0, 0, 10000, 10000);
  const std::vector<uint8_t> dc_px(dc.pixels, dc.pixels + dc.stride * dc.height);
  const int dw = dc.width, dh = dc.height;
  // Reference: all scans at 1/4 then compare against the 2x2 box mean would be inexact; instead
  // compare with the DC-only pixels being a close downscale of the full image.
  d.open(bytes.data(), bytes.size());
  const DecodedRegion& full = d.decode_full();
  EXPECT_EQ(dw, scaled_size(full.width, 8));
  EXPECT_EQ(dh, scaled_size(full.height, 8));
  double err = 0;
  for (int y = 0; y < dh - 1; ++y)
    for (int x = 0; x < dw - 1; ++x)
      for (int c = 0; c < 3; ++c) {
        double mean = 0;
        for (int yy = 0; yy < 8; ++yy)
          for (int xx = 0; xx < 8; ++xx)
            mean += full.pixels[(y * 8 + yy) * full.stride + (x * 8 + xx) * 3 + c];
        err += std::abs(mean / 64 - dc_px[y * dw * 3 + x * 3 + c]);
      }
  EXPECT_LT(err / ((dw - 1) * (dh - 1) * 3), 6.0);
}

TEST(ImageDecoder, OpenWithoutDecodeThenOpenAgain) {
  // A sample whose transform fails after open() must not poison the thread's decoder.
  const auto px = gradient(64, 48);
  const auto jpeg = encode_jpeg(px.data(), 64, 48, 64 * 3, 90);
  ImageDecoder d;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(d.open(jpeg.data(), jpeg.size()).width, 64);
  EXPECT_EQ(d.decode_full().height, 48);
}

// The JPEG without its segments of one marker type (FF xx + length + payload).
std::vector<uint8_t> without_segments(const std::vector<uint8_t>& jpeg, uint8_t marker) {
  std::vector<uint8_t> out(jpeg.begin(), jpeg.begin() + 2);  // SOI
  size_t pos = 2;
  while (pos + 4 <= jpeg.size() && jpeg[pos] == 0xFF) {
    const size_t end = pos + 2 + (size_t{jpeg[pos + 2]} << 8 | jpeg[pos + 3]);
    if (jpeg[pos + 1] == 0xDA) break;  // the scan: everything from here on is kept
    if (jpeg[pos + 1] != marker) out.insert(out.end(), jpeg.begin() + pos, jpeg.begin() + end);
    pos = end;
  }
  out.insert(out.end(), jpeg.begin() + pos, jpeg.end());
  return out;
}

std::vector<uint8_t> pixels_of(const DecodedRegion& r) {
  std::vector<uint8_t> out;
  for (int y = 0; y < r.height; ++y)
    out.insert(out.end(), r.pixels + y * r.stride, r.pixels + y * r.stride + r.width * 3);
  return out;
}

TEST(ImageDecoder, NoHuffmanTableCarriesOverToTheNextImage) {
  // libjpeg keeps the tables an image defines for the next image on the same decompress object.
  // A Motion-JPEG style frame, which leaves out the standard Huffman tables, must decode with
  // those, not with the optimised tables of the image this thread decoded before (found by
  // fuzz_decode: the same sample gave other pixels the second time).
  const auto px = gradient(64, 48);
  const auto standard = encode_jpeg(px.data(), 64, 48, 64 * 3, 90);
  std::vector<uint8_t> optimised;  // the transcoder writes per-image (optimised) tables
  ASSERT_TRUE(add_restart_markers(standard.data(), standard.size(), 1, optimised));
  const auto frame = without_segments(standard, 0xC4);
  ASSERT_LT(frame.size(), standard.size());

  ImageDecoder fresh;
  fresh.open(frame.data(), frame.size());
  const auto expected = pixels_of(fresh.decode_full());
  EXPECT_EQ(fresh.warnings(), 0);

  ImageDecoder reused;
  reused.open(optimised.data(), optimised.size());
  reused.decode_full();
  reused.open(frame.data(), frame.size());
  EXPECT_EQ(pixels_of(reused.decode_full()), expected);
  EXPECT_EQ(reused.warnings(), 0);
}

// One decompress object serves every image (jpeg_decoder.cc): each image's tables are forgotten
// and their memory handed out again, so thousands of images leave the heap as it was. Kept
// instead, each image's tables (libjpeg's permanent pool: ~1.5 KB here) would pile up.
TEST(ImageDecoder, ADecoderUsedForManyImagesKeepsItsMemory) {
  const auto px = gradient(32, 24);
  const auto standard = encode_jpeg(px.data(), 32, 24, 32 * 3, 90);
  std::vector<uint8_t> optimised;
  ASSERT_TRUE(add_restart_markers(standard.data(), standard.size(), 1, optimised));
  const auto frame = without_segments(standard, 0xC4);  // standard Huffman tables, installed
  ImageDecoder d;
  auto decode_all = [&](int n) {
    for (int i = 0; i < n; ++i) {
      const auto& bytes = i % 3 == 0 ? standard : i % 3 == 1 ? optimised : frame;
      d.open(bytes.data(), bytes.size());
      d.decode_full();
    }
  };
  decode_all(30);  // the decoder's buffers at their size
  const size_t before = mallinfo2().uordblks;
  decode_all(6000);
  const size_t after = mallinfo2().uordblks;
  EXPECT_LT(after, before + 64 * 1024) << before << " -> " << after << " bytes in use";
}

TEST(ImageDecoder, ErrorsAreClassified) {
  ImageDecoder d;
  const uint8_t html[] = "<html><body>not found</body></html>";
  try {
    d.open(html, sizeof html);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
  const uint8_t truncated[] = {0xFF, 0xD8, 0xFF, 0xE0, 0x00};
  try {
    d.open(truncated, sizeof truncated);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptData);
  }
  EXPECT_THROW(d.open(nullptr, 0), Error);
}

TEST(ImageDecoder, TruncatedJpegDecodesWithAWarningThatNamesTheDamage) {
  const auto px = gradient(128, 96);
  const auto jpeg = encode_jpeg(px.data(), 128, 96, 128 * 3, 90);
  ImageDecoder d;
  d.open(jpeg.data(), jpeg.size());
  d.decode_full();
  EXPECT_EQ(d.warnings(), 0);
  EXPECT_EQ(d.first_warning(), "");
  const std::vector<uint8_t> cut(jpeg.begin(), jpeg.begin() + jpeg.size() / 2);
  d.open(cut.data(), cut.size());
  EXPECT_EQ(d.decode_full().height, 96);  // libjpeg fills the missing rows
  EXPECT_GE(d.warnings(), 1);
  EXPECT_NE(d.first_warning().find("Premature end of JPEG file"), std::string::npos)
      << d.first_warning();
  d.open(jpeg.data(), jpeg.size());  // the next image starts with no warnings
  EXPECT_EQ(d.warnings(), 0);
  EXPECT_EQ(d.first_warning(), "");
}

TEST(ImageDecoder, ReadToEndFindsDamageAfterTheLastRow) {
  const auto px = gradient(128, 96);
  auto jpeg = encode_jpeg(px.data(), 128, 96, 128 * 3, 90);
  ImageDecoder strict(DecodeOptions{.read_to_end = true});
  strict.open(jpeg.data(), jpeg.size());
  strict.decode_full();
  EXPECT_EQ(strict.warnings(), 0);  // a clean file is clean to its EOI
  // The EOI marker zeroed, as a block zero-filled by a crash would: every row still decodes.
  std::fill(jpeg.end() - 2, jpeg.end(), uint8_t{0});
  ImageDecoder loader_like;
  loader_like.open(jpeg.data(), jpeg.size());
  EXPECT_EQ(loader_like.decode_full().height, 96);
  EXPECT_EQ(loader_like.warnings(), 0);  // it stops after the last row and sees nothing
  strict.open(jpeg.data(), jpeg.size());
  EXPECT_EQ(strict.decode_full().height, 96);
  EXPECT_GE(strict.warnings(), 1);
  EXPECT_FALSE(strict.first_warning().empty());
}

TEST(ImageDecoder, PixelLimitRefusesBeforeDecoding) {
  const auto px = gradient(64, 64);
  const auto jpeg = encode_jpeg(px.data(), 64, 64, 64 * 3, 90);
  ImageDecoder d(DecodeOptions{.max_pixels = 1000});
  try {
    d.open(jpeg.data(), jpeg.size());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceLimit);
  }
}

// Rewrites the size in a JPEG's SOF0 (baseline) header.
void set_jpeg_size(std::vector<uint8_t>& jpeg, int width, int height) {
  for (size_t i = 2; i + 9 < jpeg.size(); ++i)
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {
      jpeg[i + 5] = static_cast<uint8_t>(height >> 8), jpeg[i + 6] = static_cast<uint8_t>(height);
      jpeg[i + 7] = static_cast<uint8_t>(width >> 8), jpeg[i + 8] = static_cast<uint8_t>(width);
      return;
    }
  FAIL() << "no SOF0 marker";
}

TEST(ImageDecoder, JpegBombIsRefusedFromItsHeader) {
  // 3 kB claiming 16000x16000 (under max_pixels): at least a bit per 8x8 block means 500 kB.
  const auto px = gradient(64, 64);
  auto jpeg = encode_jpeg(px.data(), 64, 64, 64 * 3, 90);
  set_jpeg_size(jpeg, 16000, 16000);
  ImageDecoder d;
  const auto t0 = thread_cpu_time();
  try {
    d.open(jpeg.data(), jpeg.size());
    FAIL() << "a bomb must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptData);
    EXPECT_NE(e.reason().find("decompression bomb"), std::string::npos) << e.reason();
    EXPECT_NE(e.reason().find("16000x16000"), std::string::npos) << e.reason();
  }
  EXPECT_LT(thread_cpu_time() - t0, std::chrono::milliseconds(50));
  // A size the bytes can hold is not refused by this check: 64x64 claimed as 200x200.
  auto fine = encode_jpeg(px.data(), 64, 64, 64 * 3, 90);
  set_jpeg_size(fine, 200, 200);
  EXPECT_EQ(d.open(fine.data(), fine.size()).width, 200);
}

TEST(ImageDecoder, DecodeMemoryLimitStopsALargeProgressiveFile) {
  // A progressive file keeps every coefficient of the image in memory: 2 bytes per coefficient.
  const std::string path = std::string(STOKER_SHARED_DATA) +
                           "/jpeg-variety/libjxl-testdata/flower/flower.png.im_q85_420_progr.jpg";
  if (!fs::exists(path)) GTEST_SKIP() << "shared data not found";
  const auto bytes = read_bytes(path);
  ImageDecoder small(DecodeOptions{.max_decode_memory = 1 << 20});
  ASSERT_TRUE(small.open(bytes.data(), bytes.size()).progressive);
  try {
    small.decode(8, 0, 0, 64, 64);
    FAIL() << "the coefficient buffer exceeds 1 MB";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceLimit);
    EXPECT_NE(e.reason().find("max_decode_memory"), std::string::npos) << e.reason();
  }
  // The same decoder goes on working; the default limit lets the file through.
  ImageDecoder fine;
  fine.open(bytes.data(), bytes.size());
  EXPECT_GT(fine.decode_full().width, 0);
  // A baseline file's decoded pixels count too.
  const auto px = gradient(256, 256);
  const auto jpeg = encode_jpeg(px.data(), 256, 256, 256 * 3, 90);
  small.open(jpeg.data(), jpeg.size());
  EXPECT_EQ(small.decode_full().width, 256);  // 192 kB
  ImageDecoder tiny(DecodeOptions{.max_decode_memory = 100000});
  tiny.open(jpeg.data(), jpeg.size());
  EXPECT_THROW(tiny.decode_full(), Error);
}

// A PNG holding only a signature, an IHDR (with its CRC) and an IEND.
std::vector<uint8_t> png_header_only(uint32_t width, uint32_t height) {
  auto crc32 = [](const uint8_t* p, size_t n) {
    uint32_t c = 0xFFFFFFFF;
    for (size_t i = 0; i < n; ++i) {
      c ^= p[i];
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
    }
    return ~c;
  };
  auto be32 = [](std::vector<uint8_t>& v, uint32_t x) {
    for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<uint8_t>(x >> s));
  };
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  be32(png, 13);
  const size_t type_at = png.size();
  png.insert(png.end(), {'I', 'H', 'D', 'R'});
  be32(png, width);
  be32(png, height);
  png.insert(png.end(), {8, 2, 0, 0, 0});  // 8-bit RGB, no interlace
  be32(png, crc32(png.data() + type_at, 17));
  be32(png, 0);
  png.insert(png.end(), {'I', 'E', 'N', 'D', 0xAE, 0x42, 0x60, 0x82});
  return png;
}

TEST(ImageDecoder, PngBombAndMemoryLimitAreRefusedFromTheHeader) {
  ImageDecoder d;
  const auto bomb = png_header_only(10000, 10000);  // 300 MB raw in 57 bytes
  try {
    d.open(bomb.data(), bomb.size());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptData);
    EXPECT_NE(e.reason().find("decompression bomb"), std::string::npos) << e.reason();
  }
  auto big = png_header_only(20000, 20000);      // 1.6 GB of RGBA: over the default limit
  big.resize(big.size() + (1200000000 / 1032));  // enough bytes not to be taken for a bomb
  try {
    d.open(big.data(), big.size());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceLimit);
    EXPECT_NE(e.reason().find("max_decode_memory"), std::string::npos) << e.reason();
  }
}

TEST(ImageDecoder, PngVarietyGrayPaletteAlpha) {
  const std::string dir = std::string(STOKER_SHARED_DATA) + "/png-variety";
  if (!fs::exists(dir)) GTEST_SKIP() << "shared data not found";
  int decoded = 0;
  ImageDecoder d;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().extension() != ".png") continue;
    const auto bytes = read_bytes(e.path().string());
    try {
      const ImageInfo& info = d.open(bytes.data(), bytes.size());
      const DecodedRegion& r = d.decode_full();
      ASSERT_EQ(r.width, info.width);
      ASSERT_EQ(r.height, info.height);
      ++decoded;
    } catch (const Error& err) {
      // Broken files must fail with stoker's error, never crash; counted, not asserted.
    }
  }
  EXPECT_GT(decoded, 300);
}

}  // namespace
}  // namespace stoker::decode

namespace stoker::decode {
namespace {

TEST(RestartRoi, CropsDecodeExactlyAsTheFullImage) {
  // Real photos, rewritten with restart markers every 1 or 2 MCUs: any rectangle decodes to the
  // same pixels as the original file's full decode, through the cut-down stream.
  const std::string dir = std::string(STOKER_SHARED_DATA) + "/imagenet-sample";
  if (!fs::exists(dir)) GTEST_SKIP() << "shared data not found";
  int files = 0, cut = 0;
  ImageDecoder d, plain(DecodeOptions{.restart_roi = false});
  uint64_t rng = 12345;
  auto next = [&](int n) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>((rng >> 33) % static_cast<uint64_t>(n));
  };
  for (const auto& e : fs::directory_iterator(dir)) {
    if (++files > 40) break;
    const auto original = read_bytes(e.path().string());
    std::vector<uint8_t> marked;
    if (!add_restart_markers(original.data(), original.size(), 1 + files % 2, marked)) continue;
    ++cut;
    const ImageInfo info = d.open(original.data(), original.size());
    for (int denom : {1, 2}) {
      plain.open(original.data(), original.size());
      const DecodedRegion full = plain.decode(denom, 0, 0, 1 << 20, 1 << 20);
      const std::vector<uint8_t> full_px(full.pixels, full.pixels + full.stride * full.height);
      for (int t = 0; t < 4; ++t) {
        const int w = scaled_size(info.width, denom), h = scaled_size(info.height, denom);
        const int x0 = next(w / 2), y0 = next(h / 2);
        const int x1 = x0 + 8 + next(w - x0 - 8), y1 = y0 + 8 + next(h - y0 - 8);
        d.open(marked.data(), marked.size());
        const DecodedRegion& r = d.decode(denom, x0, y0, x1, y1);
        ASSERT_LE(r.origin_x, x0);
        ASSERT_LE(r.origin_y, y0);
        ASSERT_GE(r.origin_x + r.width, x1);
        ASSERT_GE(r.origin_y + r.height, y1);
        EXPECT_EQ(r.scaled_width, w);
        // Exact away from the cut's own edges (fancy upsampling sees them as image edges).
        for (int y = std::max(y0, r.origin_y + 2); y < std::min(y1, r.origin_y + r.height - 2); ++y)
          for (int x = std::max(x0, r.origin_x + 2); x < std::min(x1, r.origin_x + r.width - 2);
               ++x)
            for (int c = 0; c < 3; ++c)
              ASSERT_EQ(r.pixels[(y - r.origin_y) * r.stride + (x - r.origin_x) * 3 + c],
                        full_px[y * full.stride + x * 3 + c])
                  << e.path() << " denom " << denom << " at " << x << "," << y;
      }
    }
  }
  EXPECT_GT(cut, 30);
}

TEST(RestartRoi, FillBytesBeforeMarkersChangeNothing) {
  // FF FF ... FF Dn is a marker too: fill bytes before restart markers (legal, and kept by the
  // cut, which copies each row's run of intervals in one piece) decode to the same pixels.
  const auto px = gradient(96, 64);
  const auto jpeg = encode_jpeg(px.data(), 96, 64, 96 * 3, 90);
  std::vector<uint8_t> marked;
  ASSERT_TRUE(add_restart_markers(jpeg.data(), jpeg.size(), 1, marked));
  std::vector<uint8_t> filled;
  int fills = 0;
  for (size_t i = 0; i < marked.size(); ++i) {
    if (marked[i] == 0xFF && i + 1 < marked.size() && marked[i + 1] >= 0xD0 &&
        marked[i + 1] <= 0xD7) {
      filled.insert(filled.end(), 1 + fills % 3, 0xFF);  // one to three fill bytes
      ++fills;
    }
    filled.push_back(marked[i]);
  }
  ASSERT_GT(fills, 10);
  ImageDecoder a, b;
  a.open(marked.data(), marked.size());
  b.open(filled.data(), filled.size());
  const DecodedRegion& ra = a.decode(1, 20, 18, 70, 50);
  const DecodedRegion& rb = b.decode(1, 20, 18, 70, 50);
  ASSERT_EQ(ra.origin_x, rb.origin_x);
  ASSERT_EQ(ra.origin_y, rb.origin_y);
  ASSERT_EQ(ra.width, rb.width);
  ASSERT_EQ(ra.height, rb.height);
  EXPECT_LT(ra.width, 96);  // a cut, not the whole image
  EXPECT_EQ(b.warnings(), 0);
  for (int y = 0; y < ra.height; ++y)
    ASSERT_EQ(0, std::memcmp(ra.pixels + y * ra.stride, rb.pixels + y * rb.stride, ra.width * 3));
}

TEST(RestartHuffman, TablesAsLibjpegBuildsThem) {
  // Canonical codes: three of length 2 are 00, 01, 10 (11 is reserved); a fourth is refused, as
  // libjpeg refuses it, before it could index the lookup table.
  JHUFF_TBL table{};
  table.bits[2] = 3;
  table.huffval[0] = 0x11;
  table.huffval[1] = 0x22;
  table.huffval[2] = 0x33;
  detail::HuffmanTable t;
  ASSERT_TRUE(t.build(table));
  constexpr int k = detail::HuffmanTable::kLookahead;
  EXPECT_EQ(t.fast[0b00 << (k - 2)], (2 << 8) | 0x11);
  EXPECT_EQ(t.fast[(0b01 << (k - 2)) + 5], (2 << 8) | 0x22);
  EXPECT_EQ(t.fast[(0b10 << (k - 2)) | 1], (2 << 8) | 0x33);
  EXPECT_EQ(t.fast[0b11 << (k - 2)], 0);  // no code
  EXPECT_EQ(t.max_code[2], 2);
  EXPECT_EQ(t.max_code[1], -1);
  table.bits[2] = 4;  // 00, 01, 10, 11: all ones
  EXPECT_FALSE(t.build(table));
  JHUFF_TBL wide{};
  wide.bits[1] = 1;   // 0
  wide.bits[12] = 5;  // 1000 0000 0000 ...: longer than the lookup
  for (int i = 0; i < 6; ++i) wide.huffval[i] = static_cast<UINT8>(i);
  ASSERT_TRUE(wide.bits[12] && t.build(wide));
  EXPECT_EQ(t.fast[0], (1 << 8) | 0);
  EXPECT_EQ(t.fast[1 << (k - 1)], 0);  // a 12-bit code: the slow path
  EXPECT_EQ(t.max_code[12], (1 << 11) + 4);
  EXPECT_EQ(t.value_offset[12] + (1 << 11), 1);  // the first 12-bit code is the second value
}

TEST(RestartHuffman, DecodesAsLibjpegDoes) {
  // Real files (imagenet-sample and jpeg-variety, whatever the transcoder takes: 4:2:0, 4:4:4,
  // grey, CMYK...), rewritten with a restart marker every 1, 2 or 3 MCUs: stoker's Huffman
  // decoder and libjpeg's give the same pixels at every scale, whole or cut, and stoker's runs
  // every one of them to the end.
  const std::string root = std::string(STOKER_SHARED_DATA);
  if (!fs::exists(root + "/imagenet-sample")) GTEST_SKIP() << "shared data not found";
  std::vector<std::string> paths;
  for (const auto& e : fs::directory_iterator(root + "/imagenet-sample"))
    if (paths.size() < 60) paths.push_back(e.path().string());
  for (const auto& e : fs::recursive_directory_iterator(root + "/jpeg-variety")) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".jpg" || ext == ".jpeg" || ext == ".JPEG"))
      paths.push_back(e.path().string());
  }
  std::sort(paths.begin(), paths.end());
  detail::JpegDecoder ours, theirs;
  uint64_t rng = 99;
  auto next = [&](int n) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>((rng >> 33) % static_cast<uint64_t>(std::max(n, 1)));
  };
  int files = 0, decodes = 0;
  for (const std::string& path : paths) {
    const auto original = read_bytes(path);
    std::vector<uint8_t> marked;
    bool cut = false;
    for (int interval = 1 + files % 3; interval >= 1 && !cut; --interval) {
      try {
        cut = add_restart_markers(original.data(), original.size(), interval, marked);
      } catch (const Error&) {
        break;  // a file the transcoder refuses
      }
    }
    if (!cut) continue;
    ++files;
    ImageDecoder probe;
    ImageInfo info;
    try {
      info = probe.open(marked.data(), marked.size());
    } catch (const Error&) {
      continue;
    }
    if (int64_t{info.width} * info.height > (int64_t{1} << 24)) continue;  // keep the test quick
    for (int denom : {1, 2, 4, 8}) {
      const int w = scaled_size(info.width, denom), h = scaled_size(info.height, denom);
      for (int t = 0; t < 2; ++t) {
        const int x0 = t == 0 ? 0 : next(w / 2), y0 = t == 0 ? 0 : next(h / 2);
        const int x1 = t == 0 ? w : x0 + 1 + next(w - x0), y1 = t == 0 ? h : y0 + 1 + next(h - y0);
        const JpegOutcome a = decode_jpeg(ours, marked, denom, x0, y0, x1, y1, true);
        const JpegOutcome b = decode_jpeg(theirs, marked, denom, x0, y0, x1, y1, false);
        ASSERT_TRUE(a.same_result(b))
            << path << " at 1/" << denom << " (" << x0 << "," << y0 << ")-(" << x1 << "," << y1
            << "): " << a.error << " / " << b.error;
        EXPECT_TRUE(a.ours) << path;
        EXPECT_TRUE(a.error.empty()) << path << ": " << a.error;
        ++decodes;
      }
    }
  }
  EXPECT_GT(files, 70);
  EXPECT_GT(decodes, 500);
}

TEST(RestartHuffman, DamagedDataGivesLibjpegsResult) {
  // Bytes of the entropy-coded data overwritten, markers among them: whatever libjpeg makes of
  // it (warnings, grey blocks, an error), stoker's decoder hands the scan back and the result is
  // libjpeg's, warnings included.
  const std::string dir = std::string(STOKER_SHARED_DATA) + "/imagenet-sample";
  if (!fs::exists(dir)) GTEST_SKIP() << "shared data not found";
  std::vector<std::string> paths;
  for (const auto& e : fs::directory_iterator(dir)) paths.push_back(e.path().string());
  std::sort(paths.begin(), paths.end());
  detail::JpegDecoder ours, theirs;
  uint64_t rng = 7;
  auto next = [&](size_t n) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<size_t>((rng >> 33) % n);
  };
  int handed_back = 0, warned = 0, cases = 0;
  for (size_t f = 0; f < 6; ++f) {
    const auto original = read_bytes(paths[f * 7]);
    std::vector<uint8_t> marked;
    if (!add_restart_markers(original.data(), original.size(), 1, marked)) continue;
    ImageDecoder probe;
    const ImageInfo info = probe.open(marked.data(), marked.size());
    const size_t begin = marked.size() / 8;  // past the headers of these files
    for (int v = 0; v < 40; ++v) {
      std::vector<uint8_t> damaged = marked;
      const int edits = 1 + static_cast<int>(next(4));
      for (int e = 0; e < edits; ++e) {
        const size_t at = begin + next(damaged.size() - begin - 2);
        switch (next(4)) {
          case 0: damaged[at] ^= static_cast<uint8_t>(1 + next(255)); break;
          case 1:
            damaged[at] = 0xFF;
            damaged[at + 1] = static_cast<uint8_t>(0xD0 + next(8));
            break;
          case 2:
            damaged[at] = 0xFF;
            damaged[at + 1] = static_cast<uint8_t>(next(256));
            break;
          default: damaged.resize(at); break;  // truncated
        }
        if (damaged.size() < begin + 4) break;
      }
      const int w = info.width, h = info.height;
      for (bool whole : {true, false}) {
        const int x0 = whole ? 0 : w / 4, y0 = whole ? 0 : h / 4;
        const int x1 = whole ? w : w / 2, y1 = whole ? h : h / 2;
        const JpegOutcome a = decode_jpeg(ours, damaged, 1, x0, y0, x1, y1, true);
        const JpegOutcome b = decode_jpeg(theirs, damaged, 1, x0, y0, x1, y1, false);
        ASSERT_TRUE(a.same_result(b))
            << paths[f * 7] << " variant " << v << ": '" << a.error << "' " << a.warnings
            << " warnings vs '" << b.error << "' " << b.warnings;
        handed_back += a.handed_back;
        warned += b.warnings > 0;
        ++cases;
      }
    }
  }
  EXPECT_GT(cases, 300);
  EXPECT_GT(handed_back, 50);  // the hand-back is what this exercises
  EXPECT_GT(warned, 50);
}

TEST(RestartHuffman, TruncatedFilesAndHeaderWarnings) {
  // What the fuzzer found while this decoder was written, on a synthetic picture: (1) a file cut
  // anywhere near its end, some of them right after an MCU's last bit (libjpeg's source warns
  // "premature end" as its look-ahead reaches the end; the bits decoded were all there);
  // (2) a header with a warning of its own (junk before a marker) and a scan handed back to
  // libjpeg: the header is read again for the second try, and its warning is counted once.
  const auto px = gradient(96, 64);
  const auto jpeg = encode_jpeg(px.data(), 96, 64, 96 * 3, 90);
  std::vector<uint8_t> marked;
  ASSERT_TRUE(add_restart_markers(jpeg.data(), jpeg.size(), 1, marked));
  detail::JpegDecoder ours, theirs;
  int warned = 0;
  for (size_t cut = marked.size() - 60; cut < marked.size(); ++cut) {
    const std::vector<uint8_t> truncated(marked.begin(), marked.begin() + cut);
    const JpegOutcome a = decode_jpeg(ours, truncated, 1, 0, 0, 96, 64, true);
    const JpegOutcome b = decode_jpeg(theirs, truncated, 1, 0, 0, 96, 64, false);
    ASSERT_TRUE(a.same_result(b)) << "cut at " << cut << ": " << a.warnings << " warnings ('"
                                  << a.first_warning << "') vs " << b.warnings << " ('"
                                  << b.first_warning << "')";
    warned += b.warnings > 0;
  }
  EXPECT_GT(warned, 40);

  // Junk before the first marker after SOI: libjpeg warns "extraneous bytes" reading the header.
  std::vector<uint8_t> junk(marked.begin(), marked.begin() + 2);
  junk.insert(junk.end(), {0x12, 0x34, 0x56});
  junk.insert(junk.end(), marked.begin() + 2, marked.end());
  // The third restart marker out of sequence: stoker's decoder hands the scan back.
  int seen = 0;
  for (size_t i = junk.size() / 3; i + 1 < junk.size(); ++i)
    if (junk[i] == 0xFF && junk[i + 1] >= 0xD0 && junk[i + 1] <= 0xD7 && ++seen == 3) {
      junk[i + 1] = static_cast<uint8_t>(0xD0 + ((junk[i + 1] - 0xD0 + 4) & 7));
      break;
    }
  ASSERT_EQ(seen, 3);
  const JpegOutcome a = decode_jpeg(ours, junk, 1, 0, 0, 96, 64, true);
  const JpegOutcome b = decode_jpeg(theirs, junk, 1, 0, 0, 96, 64, false);
  EXPECT_TRUE(a.handed_back);
  EXPECT_GE(b.warnings, 2);  // the header's, and the marker's
  EXPECT_TRUE(a.same_result(b)) << a.warnings << " warnings ('" << a.first_warning << "') vs "
                                << b.warnings << " ('" << b.first_warning << "')";
}

TEST(RestartRoi, RefusesWhatItCannotCut) {
  const auto px = gradient(64, 48);
  const auto jpeg = encode_jpeg(px.data(), 64, 48, 64 * 3, 90);
  std::vector<uint8_t> out;
  EXPECT_FALSE(add_restart_markers(jpeg.data(), jpeg.size(), 3, out));  // 4 MCUs per row
  ASSERT_TRUE(add_restart_markers(jpeg.data(), jpeg.size(), 2, out));
  std::vector<uint8_t> again;
  EXPECT_FALSE(add_restart_markers(out.data(), out.size(), 2, again));  // already has them
  const uint8_t junk[] = {0xFF, 0xD8, 0xFF, 0xDB, 0, 3, 0};
  EXPECT_THROW(add_restart_markers(junk, sizeof junk, 1, out), Error);
}

}  // namespace
}  // namespace stoker::decode

namespace stoker::decode {
namespace {

// A picture with detail at every scale: smooth gradients and pseudo-random texture, so that lossy
// WebP keeps plenty of chroma to upsample and lossless has something to compress.
std::vector<uint8_t> textured(int w, int h, uint32_t seed) {
  std::vector<uint8_t> px = gradient(w, h);
  for (uint8_t& v : px) {
    seed = seed * 1664525u + 1013904223u;
    v = static_cast<uint8_t>(v / 2 + (seed >> 26));
  }
  return px;
}

std::vector<uint8_t> webp_bytes(uint8_t* data, size_t size) {
  EXPECT_GT(size, 0u) << "libwebp failed to encode";
  std::vector<uint8_t> out(data, data + size);
  WebPFree(data);
  return out;
}

std::vector<uint8_t> encode_webp_lossy(const std::vector<uint8_t>& rgb, int w, int h) {
  uint8_t* out = nullptr;
  const size_t n = WebPEncodeRGB(rgb.data(), w, h, w * 3, 80, &out);
  return webp_bytes(out, n);
}

std::vector<uint8_t> encode_webp_lossless(const std::vector<uint8_t>& rgb, int w, int h) {
  uint8_t* out = nullptr;
  const size_t n = WebPEncodeLosslessRGB(rgb.data(), w, h, w * 3, &out);
  return webp_bytes(out, n);
}

// RGB with an alpha channel that varies across the picture (lossy: an ALPH chunk).
std::vector<uint8_t> encode_webp_lossy_alpha(const std::vector<uint8_t>& rgb, int w, int h) {
  std::vector<uint8_t> rgba(static_cast<size_t>(w) * h * 4);
  for (size_t i = 0; i < static_cast<size_t>(w) * h; ++i) {
    std::copy(&rgb[i * 3], &rgb[i * 3] + 3, &rgba[i * 4]);
    rgba[i * 4 + 3] = static_cast<uint8_t>(i * 7);
  }
  uint8_t* out = nullptr;
  const size_t n = WebPEncodeRGBA(rgba.data(), w, h, w * 4, 80, &out);
  return webp_bytes(out, n);
}

// What Pillow's Image.open(f).convert("RGB") gives: libwebp's default decode to RGBA (fancy
// upsampling on), alpha dropped.
std::vector<uint8_t> decode_like_pillow(const std::vector<uint8_t>& webp) {
  int w = 0, h = 0;
  uint8_t* rgba = WebPDecodeRGBA(webp.data(), webp.size(), &w, &h);
  EXPECT_NE(rgba, nullptr);
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  for (size_t i = 0; i < static_cast<size_t>(w) * h; ++i)
    std::copy(rgba + i * 4, rgba + i * 4 + 3, &rgb[i * 3]);
  WebPFree(rgba);
  return rgb;
}

ErrorCode error_code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "no error raised";
  return ErrorCode::kInternal;
}

TEST(WebpDecoder, LosslessIsExactAndCropsToo) {
  const int w = 203, h = 157;
  const auto px = textured(w, h, 1);
  const auto webp = encode_webp_lossless(px, w, h);
  ASSERT_EQ(sniff_image_format(webp.data(), webp.size()), ImageFormat::kWebp);
  EXPECT_EQ(image_format_extension(ImageFormat::kWebp), "webp");
  ImageDecoder d;
  const ImageInfo& info = d.open(webp.data(), webp.size());
  EXPECT_EQ(info.format, ImageFormat::kWebp);
  EXPECT_EQ(info.width, w);
  EXPECT_EQ(info.height, h);
  EXPECT_EQ(info.components, 3);
  EXPECT_EQ(d.max_scale_denom(), 1);
  EXPECT_EQ(pixels_of(d.decode_full()), px);
  // A lossless crop is the rectangle asked for, to the pixel, odd origins included.
  for (const auto& [x0, y0, x1, y1] : {std::array{1, 1, 2, 2}, std::array{17, 33, 100, 34},
                                       std::array{0, 100, 203, 157}, std::array{150, 0, 203, 9}}) {
    d.open(webp.data(), webp.size());
    const DecodedRegion& r = d.decode(1, x0, y0, x1, y1);
    EXPECT_EQ(r.origin_x, x0);
    EXPECT_EQ(r.origin_y, y0);
    EXPECT_EQ(r.width, x1 - x0);
    EXPECT_EQ(r.height, y1 - y0);
    for (int y = 0; y < r.height; ++y)
      ASSERT_TRUE(std::equal(r.pixels + y * r.stride, r.pixels + y * r.stride + r.width * 3,
                             &px[(static_cast<size_t>(y0 + y) * w + x0) * 3]))
          << "row " << y0 + y;
  }
}

// Every pixel of every region decoded from `webp` equals the whole-image decode, and the region
// covers the rectangle asked for; some regions are really smaller than the image.
void expect_crops_match_full_decode(const std::vector<uint8_t>& webp) {
  ImageDecoder d;
  const ImageInfo info = d.open(webp.data(), webp.size());
  const int w = info.width, h = info.height;
  const auto full = pixels_of(d.decode_full());
  EXPECT_EQ(full, decode_like_pillow(webp));  // Pillow's pixels, bit for bit
  uint64_t rng = 99;
  auto next = [&](int n) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>((rng >> 33) % static_cast<uint64_t>(n));
  };
  int cropped = 0;
  for (int t = 0; t < 60; ++t) {
    // Odd and even origins and ends, single pixels, rectangles touching each image edge.
    int x0 = next(w), y0 = next(h);
    int x1 = x0 + 1 + next(std::min(w - x0, t % 3 == 0 ? 2 : w)),
        y1 = y0 + 1 + next(std::min(h - y0, t % 3 == 0 ? 2 : h));
    if (t % 7 == 1) x0 = 0;
    if (t % 7 == 2) y1 = h;
    SCOPED_TRACE("rectangle " + std::to_string(x0) + "," + std::to_string(y0) + " - " +
                 std::to_string(x1) + "," + std::to_string(y1));
    d.open(webp.data(), webp.size());
    const DecodedRegion& r = d.decode(1, x0, y0, x1, y1);
    ASSERT_LE(r.origin_x, x0);
    ASSERT_LE(r.origin_y, y0);
    ASSERT_GE(r.origin_x + r.width, x1);
    ASSERT_GE(r.origin_y + r.height, y1);
    ASSERT_LE(r.origin_x + r.width, w);
    ASSERT_LE(r.origin_y + r.height, h);
    EXPECT_EQ(r.scaled_width, w);
    EXPECT_EQ(r.scaled_height, h);
    cropped += r.width * r.height < w * h;
    for (int y = 0; y < r.height; ++y)
      for (int x = 0; x < r.width; ++x)
        for (int c = 0; c < 3; ++c)
          ASSERT_EQ(r.pixels[y * r.stride + x * 3 + c],
                    full[(static_cast<size_t>(r.origin_y + y) * w + r.origin_x + x) * 3 + c])
              << "pixel " << r.origin_x + x << "," << r.origin_y + y << " of region at "
              << r.origin_x << "," << r.origin_y;
  }
  EXPECT_GT(cropped, 50);
}

TEST(WebpDecoder, LossyCropsEqualTheFullDecode) {
  const int w = 211, h = 149;  // odd sides: the last chroma sample covers one pixel
  const auto px = textured(w, h, 2);
  expect_crops_match_full_decode(encode_webp_lossy(px, w, h));
  expect_crops_match_full_decode(encode_webp_lossy_alpha(px, w, h));
  const auto even = textured(64, 48, 3);
  expect_crops_match_full_decode(encode_webp_lossy(even, 64, 48));
}

TEST(WebpDecoder, LosslessWithAlphaDropsIt) {
  const int w = 31, h = 17;
  std::vector<uint8_t> rgba(static_cast<size_t>(w) * h * 4);
  for (size_t i = 0; i < rgba.size(); ++i) rgba[i] = static_cast<uint8_t>(i * 37 + 11);
  uint8_t* out = nullptr;
  WebPConfig config;
  ASSERT_TRUE(WebPConfigInit(&config));
  config.lossless = 1;
  config.exact = 1;  // keep RGB under transparent pixels
  WebPPicture pic;
  ASSERT_TRUE(WebPPictureInit(&pic));
  pic.use_argb = 1;
  pic.width = w;
  pic.height = h;
  ASSERT_TRUE(WebPPictureImportRGBA(&pic, rgba.data(), w * 4));
  WebPMemoryWriter writer;
  WebPMemoryWriterInit(&writer);
  pic.writer = WebPMemoryWrite;
  pic.custom_ptr = &writer;
  ASSERT_TRUE(WebPEncode(&config, &pic));
  WebPPictureFree(&pic);
  out = writer.mem;
  const auto webp = webp_bytes(out, writer.size);
  ImageDecoder d;
  EXPECT_EQ(d.open(webp.data(), webp.size()).components, 3);
  const auto got = pixels_of(d.decode_full());
  for (size_t i = 0; i < static_cast<size_t>(w) * h; ++i)
    for (int c = 0; c < 3; ++c) ASSERT_EQ(got[i * 3 + c], rgba[i * 4 + c]) << "pixel " << i;
}

TEST(WebpDecoder, DamageIsCorruptData) {
  const auto px = textured(96, 64, 4);
  for (const auto& webp : {encode_webp_lossy(px, 96, 64), encode_webp_lossless(px, 96, 64)}) {
    ImageDecoder d;
    // Cut inside the image data: the header still parses, the decode fails.
    const std::vector<uint8_t> half(webp.begin(), webp.begin() + webp.size() / 2);
    EXPECT_EQ(error_code_of([&] {
                d.open(half.data(), half.size());
                d.decode_full();
              }),
              ErrorCode::kCorruptData);
    // Cut inside the headers.
    for (size_t n : {size_t{12}, size_t{16}, size_t{22}, size_t{25}}) {
      const std::vector<uint8_t> cut(webp.begin(), webp.begin() + n);
      EXPECT_EQ(error_code_of([&] {
                  d.open(cut.data(), cut.size());
                  d.decode_full();
                }),
                ErrorCode::kCorruptData)
          << n << " bytes";
    }
    // A bitstream signature destroyed: VP8's start code 9d 01 2a, VP8L's 0x2f.
    auto bad = webp;
    bad[webp[15] == 'L' ? 20 : 23] ^= 0xFF;
    EXPECT_EQ(error_code_of([&] {
                d.open(bad.data(), bad.size());
                d.decode_full();
              }),
              ErrorCode::kCorruptData);
    // The decoder goes on working after each failure.
    d.open(webp.data(), webp.size());
    EXPECT_EQ(d.decode_full().width, 96);
  }
}

TEST(WebpDecoder, LimitsAreEnforcedBeforeDecoding) {
  const auto px = textured(64, 64, 5);
  const auto lossless = encode_webp_lossless(px, 64, 64);
  ImageDecoder few_pixels(DecodeOptions{.max_pixels = 1000});
  EXPECT_EQ(error_code_of([&] { few_pixels.open(lossless.data(), lossless.size()); }),
            ErrorCode::kResourceLimit);
  // A lossless header claiming 16384x16384 (within max_pixels = 2^28) in a file of a few hundred
  // bytes: libwebp would allocate 1 GiB of ARGB before finding out. The header's 14-bit fields
  // (width - 1, height - 1) follow the 0x2f signature at byte 20.
  auto claimed = lossless;
  ASSERT_EQ(claimed[15], 'L');
  const uint32_t bits = (16383u) | (16383u << 14) | (uint32_t{claimed[24]} >> 4 << 28);
  for (int i = 0; i < 4; ++i) claimed[21 + i] = static_cast<uint8_t>(bits >> (8 * i));
  ImageDecoder d;
  const ImageInfo& info = d.open(claimed.data(), claimed.size());
  EXPECT_EQ(info.width, 16384);
  EXPECT_EQ(info.height, 16384);
  const auto t0 = thread_cpu_time();
  try {
    d.decode(1, 0, 0, 10, 10);
    FAIL() << "must be refused before libwebp allocates";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceLimit);
    EXPECT_NE(e.reason().find("max_decode_memory"), std::string::npos) << e.reason();
  }
  EXPECT_LT(thread_cpu_time() - t0, std::chrono::milliseconds(50));
  // A small limit refuses an ordinary file; the same decoder then decodes the next one.
  ImageDecoder small(DecodeOptions{.max_decode_memory = 1 << 20});
  small.open(lossless.data(), lossless.size());
  EXPECT_EQ(error_code_of([&] { small.decode_full(); }), ErrorCode::kResourceLimit);
  ImageDecoder fine;
  fine.open(lossless.data(), lossless.size());
  EXPECT_EQ(pixels_of(fine.decode_full()), px);
}

TEST(WebpDecoder, AnimationIsUnsupported) {
  // RIFF header, then a VP8X chunk with the animation flag and a 100x50 canvas.
  // Sizes are little-endian; the canvas's are width - 1 and height - 1 in 24 bits each.
  const std::string animated(
      "RIFF\x16\0\0\0WEBP"
      "VP8X\x0a\0\0\0"
      "\x02\0\0\0"
      "\x63\0\0\x31\0\0",
      30);
  ImageDecoder d;
  try {
    d.open(reinterpret_cast<const uint8_t*>(animated.data()), animated.size());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(e.reason().find("animated"), std::string::npos) << e.reason();
  }
  EXPECT_EQ(error_code_of([&] { d.decode_full(); }), ErrorCode::kInvalidArgument);
}

// ---- MaskDecoder ----------------------------------------------------------------------------

void put_be32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<uint8_t>(x >> s));
}

void put_chunk(std::vector<uint8_t>& png, const char* type, const std::vector<uint8_t>& payload) {
  put_be32(png, static_cast<uint32_t>(payload.size()));
  const size_t start = png.size();
  png.insert(png.end(), type, type + 4);
  png.insert(png.end(), payload.begin(), payload.end());
  uint32_t c = 0xFFFFFFFF;
  for (size_t i = start; i < png.size(); ++i) {
    c ^= png[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
  }
  put_be32(png, ~c);
}

// A PNG written independently of libspng: one sample per entry of `samples` (row-major), packed
// MSB first at `bits` per sample, rows unfiltered, Adam7 passes when interlaced, the zlib stream
// made of stored (uncompressed) deflate blocks.
std::vector<uint8_t> make_png(int w, int h, int bits, int colour_type, bool interlaced,
                              const std::vector<uint8_t>& samples, int channels = 1) {
  std::vector<uint8_t> raw;  // filtered scanlines, before compression
  auto add_pass = [&](int x0, int y0, int dx, int dy) {
    const int pw = (w - x0 + dx - 1) / dx, ph = (h - y0 + dy - 1) / dy;
    if (pw <= 0 || ph <= 0) return;  // an empty pass has no scanlines at all
    for (int y = y0; y < h; y += dy) {
      raw.push_back(0);  // filter: none
      std::vector<uint8_t> row((static_cast<size_t>(pw) * bits * channels + 7) / 8, 0);
      int i = 0;
      for (int x = x0; x < w; x += dx, ++i)
        for (int c = 0; c < channels; ++c) {
          const uint8_t v = samples[(static_cast<size_t>(y) * w + x) * channels + c];
          const size_t bit = static_cast<size_t>(i * channels + c) * bits;
          if (bits == 16) {
            row[bit / 8] = v, row[bit / 8 + 1] = v;
          } else {
            row[bit / 8] |= static_cast<uint8_t>(v << (8 - bits - bit % 8));
          }
        }
      raw.insert(raw.end(), row.begin(), row.end());
    }
  };
  if (interlaced) {
    add_pass(0, 0, 8, 8), add_pass(4, 0, 8, 8), add_pass(0, 4, 4, 8), add_pass(2, 0, 4, 4);
    add_pass(0, 2, 2, 4), add_pass(1, 0, 2, 2), add_pass(0, 1, 1, 2);
  } else {
    add_pass(0, 0, 1, 1);
  }
  std::vector<uint8_t> z = {0x78, 0x01};
  size_t pos = 0;
  do {
    const size_t n = std::min<size_t>(65535, raw.size() - pos);
    z.push_back(pos + n == raw.size() ? 1 : 0);
    z.push_back(static_cast<uint8_t>(n)), z.push_back(static_cast<uint8_t>(n >> 8));
    z.push_back(static_cast<uint8_t>(~n)), z.push_back(static_cast<uint8_t>(~n >> 8));
    z.insert(z.end(), raw.begin() + pos, raw.begin() + pos + n);
    pos += n;
  } while (pos < raw.size());
  uint32_t a = 1, b = 0;
  for (uint8_t v : raw) a = (a + v) % 65521, b = (b + a) % 65521;
  put_be32(z, b << 16 | a);

  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<uint8_t> ihdr;
  put_be32(ihdr, w), put_be32(ihdr, h);
  ihdr.insert(ihdr.end(), {static_cast<uint8_t>(bits), static_cast<uint8_t>(colour_type), 0, 0,
                           static_cast<uint8_t>(interlaced)});
  put_chunk(png, "IHDR", ihdr);
  if (colour_type == 3) {  // a full palette, whatever the depth: a mask's colours do not matter
    std::vector<uint8_t> plte;
    for (int i = 0; i < (1 << bits); ++i)
      plte.insert(plte.end(), {uint8_t(i), uint8_t(255 - i), 7});
    put_chunk(png, "PLTE", plte);
  }
  put_chunk(png, "IDAT", z);
  put_chunk(png, "IEND", {});
  return png;
}

std::vector<uint8_t> random_samples(int w, int h, int bits, uint32_t seed, int channels = 1) {
  std::vector<uint8_t> v(static_cast<size_t>(w) * h * channels);
  for (uint8_t& s : v) {
    seed = seed * 1664525u + 1013904223u;
    s = static_cast<uint8_t>((seed >> 24) & ((1u << std::min(bits, 8)) - 1));
  }
  return v;
}

void expect_mask(MaskDecoder& d, const std::vector<uint8_t>& png, int w, int h,
                 const std::vector<uint8_t>& samples) {
  const MaskImage m = d.decode(png.data(), png.size());
  ASSERT_EQ(m.width, w);
  ASSERT_EQ(m.height, h);
  ASSERT_TRUE(std::equal(samples.begin(), samples.end(), m.values));
}

TEST(MaskDecoder, RawSamplesOfEveryDepthAndLayout) {
  MaskDecoder d;
  int cases = 0;
  // Widths not a multiple of 8 (nor of 4 or 2), a single pixel, and sides smaller than the
  // Adam7 grid, where passes are empty.
  for (const auto& [w, h] : {std::pair{37, 23}, std::pair{13, 11}, std::pair{1, 1}, std::pair{3, 5},
                             std::pair{8, 8}, std::pair{64, 2}}) {
    for (int bits : {1, 2, 4, 8})
      for (int colour_type : {0, 3})
        for (bool interlaced : {false, true}) {
          SCOPED_TRACE(std::to_string(w) + "x" + std::to_string(h) + ", " + std::to_string(bits) +
                       "-bit, colour type " + std::to_string(colour_type) +
                       (interlaced ? ", interlaced" : ""));
          const auto samples = random_samples(w, h, bits, static_cast<uint32_t>(w * 131 + bits));
          expect_mask(d, make_png(w, h, bits, colour_type, interlaced, samples), w, h, samples);
          ++cases;
        }
  }
  EXPECT_EQ(cases, 6 * 4 * 2 * 2);
}

TEST(MaskDecoder, ReusedBufferCarriesNothingOver) {
  // A mask of all ones, then an interlaced 1-bit mask of zeros and ones in the same buffer:
  // libspng ORs deinterlaced samples into place, so stale bytes would show through.
  MaskDecoder d;
  const std::vector<uint8_t> ones(40 * 30, 255);
  expect_mask(d, make_png(40, 30, 8, 0, false, ones), 40, 30, ones);
  const auto bitsy = random_samples(39, 29, 1, 5);
  expect_mask(d, make_png(39, 29, 1, 3, true, bitsy), 39, 29, bitsy);
  const auto quads = random_samples(17, 9, 2, 6);
  expect_mask(d, make_png(17, 9, 2, 0, true, quads), 17, 9, quads);
}

TEST(MaskDecoder, RefusesWhatIsNotAMask) {
  MaskDecoder d;
  auto reason_of = [&](const std::vector<uint8_t>& bytes, ErrorCode code) {
    try {
      d.decode(bytes.data(), bytes.size());
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.reason();
      return e.reason();
    }
    ADD_FAILURE() << "no error";
    return std::string();
  };
  EXPECT_NE(
      reason_of(make_png(5, 4, 8, 2, false, random_samples(5, 4, 8, 1, 3)), ErrorCode::kUnsupported)
          .find("not 8-bit RGB"),
      std::string::npos);
  EXPECT_NE(
      reason_of(make_png(5, 4, 16, 0, false, random_samples(5, 4, 8, 1)), ErrorCode::kUnsupported)
          .find("not 16-bit grey"),
      std::string::npos);
  EXPECT_NE(
      reason_of(make_png(5, 4, 8, 4, false, random_samples(5, 4, 8, 1, 2)), ErrorCode::kUnsupported)
          .find("not 8-bit grey+alpha"),
      std::string::npos);
  EXPECT_NE(
      reason_of(make_png(5, 4, 8, 6, false, random_samples(5, 4, 8, 1, 4)), ErrorCode::kUnsupported)
          .find("not 8-bit RGBA"),
      std::string::npos);
  const auto px = gradient(16, 16);
  EXPECT_EQ(reason_of(encode_jpeg(px.data(), 16, 16, 48, 90), ErrorCode::kUnsupported),
            "masks must be PNG (lossless)");
  EXPECT_EQ(reason_of(encode_webp_lossless(px, 16, 16), ErrorCode::kUnsupported),
            "masks must be PNG (lossless)");
  reason_of({'G', 'I', 'F', '8', '9', 'a'}, ErrorCode::kUnsupported);
  reason_of({}, ErrorCode::kCorruptData);
}

TEST(MaskDecoder, DamageIsCorruptData) {
  const auto samples = random_samples(50, 40, 8, 9);
  const auto png = make_png(50, 40, 8, 3, false, samples);
  MaskDecoder d;
  // Cuts inside the signature, the IHDR, the IDAT, and just before the end of the image data.
  // (A file cut after the last IDAT's data, short of its CRC and the IEND, decodes: libspng, like
  // PIL, stops reading once the image is complete.)
  for (size_t n : {size_t{8}, size_t{20}, size_t{40}, png.size() / 2, png.size() - 12 - 4 - 5}) {
    const std::vector<uint8_t> cut(png.begin(), png.begin() + n);
    EXPECT_EQ(error_code_of([&] { d.decode(cut.data(), cut.size()); }), ErrorCode::kCorruptData)
        << "cut at " << n;
  }
  auto bad_crc = png;
  bad_crc[png.size() / 2] ^= 1;  // inside IDAT: its CRC no longer matches
  EXPECT_EQ(error_code_of([&] { d.decode(bad_crc.data(), bad_crc.size()); }),
            ErrorCode::kCorruptData);
  expect_mask(d, png, 50, 40, samples);  // and the decoder goes on working
}

TEST(MaskDecoder, LimitsAreCheckedFromTheHeader) {
  const auto samples = random_samples(100, 100, 8, 3);
  const auto png = make_png(100, 100, 8, 0, false, samples);
  MaskDecoder few_pixels(DecodeOptions{.max_pixels = 9999});
  EXPECT_EQ(error_code_of([&] { few_pixels.decode(png.data(), png.size()); }),
            ErrorCode::kResourceLimit);
  MaskDecoder little_memory(DecodeOptions{.max_decode_memory = 5000});
  EXPECT_EQ(error_code_of([&] { little_memory.decode(png.data(), png.size()); }),
            ErrorCode::kResourceLimit);
  // 100 MB of samples claimed by a file of 57 bytes: refused before zlib runs.
  std::vector<uint8_t> bomb = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<uint8_t> ihdr;
  put_be32(ihdr, 10000), put_be32(ihdr, 10000);
  ihdr.insert(ihdr.end(), {8, 0, 0, 0, 0});
  put_chunk(bomb, "IHDR", ihdr);
  put_chunk(bomb, "IEND", {});
  MaskDecoder d;
  try {
    d.decode(bomb.data(), bomb.size());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptData);
    EXPECT_NE(e.reason().find("decompression bomb"), std::string::npos) << e.reason();
  }
}

}  // namespace
}  // namespace stoker::decode

namespace stoker::decode {
namespace {

// The index's image sizes come from read_image_size, not a decoder: on every real file the
// decoder opens, they are the decoder's. Files it refuses may have either answer.
TEST(ImageSize, HeaderSizesAreTheDecodersOnEveryRealFile) {
  const std::string root = std::string(STOKER_SHARED_DATA);
  if (!fs::exists(root + "/imagenet-sample")) GTEST_SKIP() << "shared data not found";
  int compared = 0;
  ImageDecoder d;
  for (const char* folder : {"imagenet-sample", "jpeg-variety", "png-variety"}) {
    for (const auto& e : fs::recursive_directory_iterator(root + "/" + folder)) {
      if (!e.is_regular_file()) continue;
      const auto bytes = read_bytes(e.path().string());
      ImageInfo info;
      try {
        info = d.open(bytes.data(), bytes.size());
      } catch (const Error&) {
        continue;
      }
      const ImageSizeResult r = read_image_size(bytes.data(), bytes.size());
      ASSERT_EQ(r.status, ImageSizeStatus::kFound) << e.path();
      EXPECT_EQ(r.size.width, static_cast<uint32_t>(info.width)) << e.path();
      EXPECT_EQ(r.size.height, static_cast<uint32_t>(info.height)) << e.path();
      ++compared;
    }
  }
  EXPECT_GT(compared, 1500);
}

}  // namespace
}  // namespace stoker::decode
