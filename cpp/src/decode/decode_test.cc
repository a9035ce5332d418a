#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "stoker/core/error.h"
#include "stoker/decode/image_decoder.h"

namespace stoker::decode {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
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
  const auto t0 = std::chrono::steady_clock::now();
  try {
    d.open(jpeg.data(), jpeg.size());
    FAIL() << "a bomb must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptData);
    EXPECT_NE(e.reason().find("decompression bomb"), std::string::npos) << e.reason();
    EXPECT_NE(e.reason().find("16000x16000"), std::string::npos) << e.reason();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50));
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
