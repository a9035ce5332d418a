#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "stoker/core/error.h"
#include "stoker/core/random.h"
#include "stoker/transform/crop.h"
#include "stoker/transform/resize.h"

namespace stoker::transform {

namespace detail {
void set_portable_resample_for_testing(bool portable);  // defined in resize.cc
}  // namespace detail

namespace {

// ---------------------------------------------------------------------------------------------
// random_resized_crop

bool is_integer(double v) { return v == std::floor(v); }

// torchvision's get_params written out again, line for line, drawing from the same generator.
Box reference_random_resized_crop(int width, int height, KeyedRandom& rng,
                                  const RandomResizedCropOptions& o) {
  const double area = double(height) * double(width);
  const double log_lo = std::log(o.ratio_min), log_hi = std::log(o.ratio_max);
  for (int attempt = 0; attempt < o.tries; ++attempt) {
    const double target_area = area * rng.uniform(o.scale_min, o.scale_max);
    const double aspect_ratio = std::exp(rng.uniform(log_lo, log_hi));
    const int w = int(std::nearbyint(std::sqrt(target_area * aspect_ratio)));
    const int h = int(std::nearbyint(std::sqrt(target_area / aspect_ratio)));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int i = int(rng.below(uint64_t(height - h + 1)));
      const int j = int(rng.below(uint64_t(width - w + 1)));
      return Box{double(j), double(i), double(j + w), double(i + h)};
    }
  }
  const double in_ratio = double(width) / double(height);
  int w = width, h = height;
  if (in_ratio < o.ratio_min) {
    h = int(std::nearbyint(w / o.ratio_min));
  } else if (in_ratio > o.ratio_max) {
    w = int(std::nearbyint(h * o.ratio_max));
  }
  const int i = (height - h) / 2, j = (width - w) / 2;
  return Box{double(j), double(i), double(j + w), double(i + h)};
}

TEST(RandomResizedCrop, BoxesAreIntegerAndInsideTheImage) {
  const int sizes[][2] = {{500, 375}, {375, 500}, {64, 64}, {1, 1}, {3, 1000}, {1000, 3}};
  for (const auto& s : sizes) {
    for (uint64_t index = 0; index < 2000; ++index) {
      KeyedRandom rng(42, 0, index);
      const Box b = random_resized_crop(s[0], s[1], rng);
      ASSERT_TRUE(is_integer(b.x0) && is_integer(b.y0) && is_integer(b.x1) && is_integer(b.y1));
      ASSERT_GE(b.x0, 0);
      ASSERT_GE(b.y0, 0);
      ASSERT_LE(b.x1, s[0]);
      ASSERT_LE(b.y1, s[1]);
      ASSERT_GE(b.width(), 1);
      ASSERT_GE(b.height(), 1);
    }
  }
}

TEST(RandomResizedCrop, MatchesReferenceDrawForDraw) {
  const RandomResizedCropOptions options[] = {
      {}, {.scale_min = 0.5, .scale_max = 0.9, .ratio_min = 0.5, .ratio_max = 2.0, .tries = 3}};
  for (const auto& o : options) {
    for (uint64_t index = 0; index < 5000; ++index) {
      KeyedRandom a(7, 3, index), b(7, 3, index);
      const Box got = random_resized_crop(500, 375, a, o);
      const Box want = reference_random_resized_crop(500, 375, b, o);
      ASSERT_EQ(got.x0, want.x0);
      ASSERT_EQ(got.y0, want.y0);
      ASSERT_EQ(got.x1, want.x1);
      ASSERT_EQ(got.y1, want.y1);
      // Same number of draws consumed: the generators are still in step.
      ASSERT_EQ(a.next_u64(), b.next_u64());
    }
  }
}

TEST(RandomResizedCrop, FallbackIsTheCentredCropOfAllowedRatio) {
  // Every try asks for a crop at least 24 pixels tall, so a 10-pixel-tall image always falls
  // back: h = 10, w = round(10 * 4/3) = 13, centred: j = (1000 - 13) // 2 = 493.
  KeyedRandom rng(1, 2, 3);
  Box b = random_resized_crop(1000, 10, rng);
  EXPECT_EQ(b.x0, 493);
  EXPECT_EQ(b.y0, 0);
  EXPECT_EQ(b.x1, 506);
  EXPECT_EQ(b.y1, 10);
  // Transposed: w = 10, h = round(10 / 0.75) = 13, i = 493.
  b = random_resized_crop(10, 1000, rng);
  EXPECT_EQ(b.x0, 0);
  EXPECT_EQ(b.y0, 493);
  EXPECT_EQ(b.x1, 10);
  EXPECT_EQ(b.y1, 506);
  // No tries: the whole image when its ratio is allowed (500/375 is exactly 4/3).
  b = random_resized_crop(500, 375, rng, {.tries = 0});
  EXPECT_EQ(b.x0, 0);
  EXPECT_EQ(b.y0, 0);
  EXPECT_EQ(b.x1, 500);
  EXPECT_EQ(b.y1, 375);
}

TEST(RandomResizedCrop, FallbackRoundsHalfToEven) {
  // 5 / ratio_min 2 = 2.5 exactly; Python's round gives 2 (std::round would give 3). Every try
  // wants w >= sqrt(500 * 0.08 * 2) > 5, so the fallback is certain.
  KeyedRandom rng(0, 0, 0);
  const Box b = random_resized_crop(5, 100, rng, {.ratio_min = 2.0, .ratio_max = 4.0});
  EXPECT_EQ(b.x0, 0);
  EXPECT_EQ(b.x1, 5);
  EXPECT_EQ(b.y0, 49);
  EXPECT_EQ(b.y1, 51);
}

TEST(RandomResizedCrop, AbsurdRatiosGiveBoxesInsideTheImage) {
  // ratio (1e-20, 1e20) is accepted, and most draws then ask for a side far outside int's range:
  // converting that to int was undefined behaviour (found by fuzz_decode under UBSan). Such draws
  // are refused like any other that does not fit.
  for (uint64_t i = 0; i < 200; ++i) {
    KeyedRandom rng(0, 0, i);
    const Box b = random_resized_crop(103, 150, rng, {.ratio_min = 1e-20, .ratio_max = 1e20});
    EXPECT_GE(b.x0, 0);
    EXPECT_GE(b.y0, 0);
    EXPECT_LE(b.x1, 103);
    EXPECT_LE(b.y1, 150);
    EXPECT_LT(b.x0, b.x1);
    EXPECT_LT(b.y0, b.y1);
  }
}

TEST(RandomResizedCrop, RejectsBadArguments) {
  KeyedRandom rng(0, 0, 0);
  EXPECT_THROW(random_resized_crop(0, 10, rng), Error);
  EXPECT_THROW(random_resized_crop(10, 10, rng, {.scale_min = 0.9, .scale_max = 0.1}), Error);
  EXPECT_THROW(random_resized_crop(10, 10, rng, {.ratio_min = 0.0}), Error);
}

// The expected area fraction of torchvision's algorithm on W x H, by integration rather than
// sampling: each try succeeds with probability p and then has mean area fraction m; after ten
// failures the fallback (the whole image, for an allowed ratio) has fraction 1.
double expected_area_fraction(int width, int height, const RandomResizedCropOptions& o) {
  const int n = 1000;  // midpoint rule on an n x n grid of (scale, log ratio)
  const double area = double(width) * height;
  const double log_lo = std::log(o.ratio_min), log_hi = std::log(o.ratio_max);
  double success = 0, success_area = 0;
  for (int a = 0; a < n; ++a) {
    const double s = o.scale_min + (o.scale_max - o.scale_min) * (a + 0.5) / n;
    for (int r = 0; r < n; ++r) {
      const double ratio = std::exp(log_lo + (log_hi - log_lo) * (r + 0.5) / n);
      const int w = int(std::nearbyint(std::sqrt(area * s * ratio)));
      const int h = int(std::nearbyint(std::sqrt(area * s / ratio)));
      if (0 < w && w <= width && 0 < h && h <= height) {
        success += 1;
        success_area += double(w) * h / area;
      }
    }
  }
  const double p = success / (double(n) * n);
  const double m = success_area / success;
  double expected = 0, fail = 1;
  for (int t = 0; t < o.tries; ++t) {
    expected += fail * p * m;
    fail *= 1 - p;
  }
  const double in_ratio = double(width) / height;
  EXPECT_TRUE(in_ratio >= o.ratio_min && in_ratio <= o.ratio_max);  // fallback = whole image
  return expected + fail * 1.0;
}

TEST(RandomResizedCrop, AreaAndPositionStatistics) {
  const int width = 500, height = 375, draws = 20000;
  const RandomResizedCropOptions options;
  const double expected = expected_area_fraction(width, height, options);
  double sum = 0, sum_sq = 0, centre_x = 0, centre_y = 0;
  for (int index = 0; index < draws; ++index) {
    KeyedRandom rng(2024, 0, uint64_t(index));
    const Box b = random_resized_crop(width, height, rng, options);
    const double f = b.width() * b.height() / (double(width) * height);
    sum += f;
    sum_sq += f * f;
    centre_x += (b.x0 + b.x1) / 2 / width;
    centre_y += (b.y0 + b.y1) / 2 / height;
  }
  const double mean = sum / draws;
  const double sd = std::sqrt(sum_sq / draws - mean * mean);
  const double standard_error = sd / std::sqrt(double(draws));
  EXPECT_NEAR(mean, expected, 5 * standard_error) << "expected " << expected;
  // Crops are placed uniformly, so their centres average to the image centre.
  EXPECT_NEAR(centre_x / draws, 0.5, 0.01);
  EXPECT_NEAR(centre_y / draws, 0.5, 0.01);
}

// ---------------------------------------------------------------------------------------------
// resize_center_crop

TEST(ResizeCenterCrop, LandscapeByHand) {
  // 500x375, Resize(256): the short side 375 -> 256, the long one int(256 * 500 / 375) = 341.
  // CenterCrop(224): top = round(32 / 2) = 16, left = round(117 / 2) = round(58.5) = 58 (even).
  const Box b = resize_center_crop(500, 375, 256, 224);
  EXPECT_DOUBLE_EQ(b.x0, 58 * (500.0 / 341));
  EXPECT_DOUBLE_EQ(b.x1, 282 * (500.0 / 341));
  EXPECT_DOUBLE_EQ(b.y0, 16 * (375.0 / 256));   // 23.4375
  EXPECT_DOUBLE_EQ(b.y1, 240 * (375.0 / 256));  // 351.5625
  EXPECT_DOUBLE_EQ(b.y0, 23.4375);
  EXPECT_DOUBLE_EQ(b.y1, 351.5625);
  EXPECT_NEAR(b.x0, 85.0439882697947, 1e-12);
  EXPECT_NEAR(b.x1, 413.4897360703812, 1e-12);
}

TEST(ResizeCenterCrop, PortraitAndSquare) {
  const Box p = resize_center_crop(375, 500, 256, 224);
  EXPECT_DOUBLE_EQ(p.x0, 23.4375);
  EXPECT_DOUBLE_EQ(p.y0, 58 * (500.0 / 341));
  // Already at the resize size: a no-op resize, then an exact integer crop.
  const Box s = resize_center_crop(256, 256, 256, 224);
  EXPECT_EQ(s.x0, 16);
  EXPECT_EQ(s.y0, 16);
  EXPECT_EQ(s.x1, 240);
  EXPECT_EQ(s.y1, 240);
  // 300x451: int(256 * 451 / 300) = 384 (384.85 truncated), top = 80.
  const Box t = resize_center_crop(300, 451, 256, 224);
  EXPECT_DOUBLE_EQ(t.x0, 18.75);
  EXPECT_DOUBLE_EQ(t.y0, 80 * (451.0 / 384));
}

TEST(ResizeCenterCrop, ExtremeAspectRatioDoesNotOverflow) {
  // A 1x3000000 image resized to 65758 on its short side has a long side of 1.97e11: the crop's
  // offset in the resized image does not fit an int (undefined behaviour, found by fuzz_decode),
  // but its box in source pixels is an ordinary one, centred.
  const Box b = resize_center_crop(1, 3000000, 65758, 224);
  EXPECT_GE(b.x0, 0);
  EXPECT_LE(b.x1, 1);
  EXPECT_LT(b.x0, b.x1);
  EXPECT_GT(b.y0, 0);
  EXPECT_LT(b.y1, 3000000);
  EXPECT_LT(b.y0, b.y1);
  EXPECT_NEAR((b.y0 + b.y1) / 2, 1500000, 1);
}

TEST(ResizeCenterCrop, RefusesCropsThatNeedPadding) {
  EXPECT_THROW(resize_center_crop(500, 375, 200, 224), Error);
  EXPECT_THROW(resize_center_crop(0, 375, 256, 224), Error);
}

// ---------------------------------------------------------------------------------------------
// Resampler

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;  // RGB8, rows packed
  uint8_t* at(int x, int y) { return pixels.data() + (size_t(y) * width + x) * 3; }
  const uint8_t* at(int x, int y) const { return pixels.data() + (size_t(y) * width + x) * 3; }
};

// The same formula golden_pil_hashes() were made from in Python (a uint32 hash of x, y, channel).
Image hashed_image(int width, int height) {
  Image im{width, height, std::vector<uint8_t>(size_t(width) * height * 3)};
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (uint32_t c = 0; c < 3; ++c) {
        uint32_t h = (uint32_t(x) * 0x9E3779B1u) ^ (uint32_t(y) * 0x85EBCA77u) ^ (c * 0xC2B2AE3Du);
        h ^= h >> 15;
        h *= 0x2C1B3C6Du;
        h ^= h >> 12;
        im.at(x, y)[c] = uint8_t(h & 255);
      }
    }
  }
  return im;
}

Image random_image(int width, int height, uint64_t seed) {
  Image im{width, height, std::vector<uint8_t>(size_t(width) * height * 3)};
  KeyedRandom rng(seed, 0, 0);
  for (auto& v : im.pixels) v = uint8_t(rng.next_u64());
  return im;
}

RegionView whole(const Image& im) {
  return RegionView{im.pixels.data(), im.width, im.height, ptrdiff_t(im.width) * 3, 0, 0,
                    im.width,         im.height};
}

RegionView region(const Image& im, const PixelRect& r) {
  RegionView v = whole(im);
  v.pixels = im.at(r.x0, r.y0);
  v.width = r.width();
  v.height = r.height();
  v.origin_x = r.x0;
  v.origin_y = r.y0;
  return v;
}

Image resize(Resampler& rs, const RegionView& src, const Box& box, int ow, int oh,
             bool flip = false) {
  Image out{ow, oh, std::vector<uint8_t>(size_t(ow) * oh * 3)};
  rs.resize(src, box, out.pixels.data(), ow, oh, ptrdiff_t(ow) * 3, flip);
  return out;
}

// An independent, slow model of Pillow's bilinear resample in double precision: the same
// geometry (float box, triangle widened by the downscale factor, taps clipped to the image,
// Pillow 13's pass order), but real-valued weights and each pass rounded to the nearest 8-bit
// value. Pillow's 22-bit fixed point may differ from it by one.
struct RefWeights {
  std::vector<int> first;
  std::vector<std::vector<double>> w;
};

RefWeights reference_weights(int in_size, double b0, double b1, int out_size) {
  const double lo = float(b0), hi = float(b1);
  const double scale = double(float(hi) - float(lo)) / out_size;
  const double support = std::max(scale, 1.0);  // bilinear support 1, widened when shrinking
  RefWeights r;
  for (int i = 0; i < out_size; ++i) {
    const double centre = lo + (i + 0.5) * scale;
    const int first = std::max(0, int(centre - support + 0.5));
    const int last = std::min(in_size, int(centre + support + 0.5));
    std::vector<double> w;
    double total = 0;
    for (int x = first; x < last; ++x) {
      // Distance from the output centre to the centre of pixel x, in filter units.
      const double d = std::abs(x + 0.5 - centre) / support;
      w.push_back(std::max(0.0, 1.0 - d));
      total += w.back();
    }
    for (auto& v : w) v /= total;
    r.first.push_back(first);
    r.w.push_back(w);
  }
  return r;
}

uint8_t round_to_u8(double v) { return uint8_t(std::clamp(std::floor(v + 0.5), 0.0, 255.0)); }

Image reference_horizontal(const Image& in, const RefWeights& rw) {
  const int ow = int(rw.first.size());
  Image out{ow, in.height, std::vector<uint8_t>(size_t(ow) * in.height * 3)};
  for (int y = 0; y < in.height; ++y)
    for (int x = 0; x < ow; ++x)
      for (int c = 0; c < 3; ++c) {
        double s = 0;
        for (size_t t = 0; t < rw.w[x].size(); ++t)
          s += rw.w[x][t] * in.at(rw.first[x] + int(t), y)[c];
        out.at(x, y)[c] = round_to_u8(s);
      }
  return out;
}

Image reference_vertical(const Image& in, const RefWeights& rw) {
  const int oh = int(rw.first.size());
  Image out{in.width, oh, std::vector<uint8_t>(size_t(in.width) * oh * 3)};
  for (int y = 0; y < oh; ++y)
    for (int x = 0; x < in.width; ++x)
      for (int c = 0; c < 3; ++c) {
        double s = 0;
        for (size_t t = 0; t < rw.w[y].size(); ++t)
          s += rw.w[y][t] * in.at(x, rw.first[y] + int(t))[c];
        out.at(x, y)[c] = round_to_u8(s);
      }
  return out;
}

Image reference_resize(const Image& in, const Box& box, int ow, int oh) {
  const RefWeights wx = reference_weights(in.width, box.x0, box.x1, ow);
  const RefWeights wy = reference_weights(in.height, box.y0, box.y1, oh);
  const int dy = in.height - oh, dx = in.width - ow;
  if (dy > 0 && dy > 2 * dx) return reference_horizontal(reference_vertical(in, wy), wx);
  return reference_vertical(reference_horizontal(in, wx), wy);
}

int max_abs_diff(const Image& a, const Image& b) {
  EXPECT_EQ(a.pixels.size(), b.pixels.size());
  int m = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) m = std::max(m, std::abs(a.pixels[i] - b.pixels[i]));
  return m;
}

uint64_t fnv1a(const std::vector<uint8_t>& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

// Every resampling test runs twice: with the kernels this CPU gets (AVX2 where it has it) and with
// the portable ones.
class ResamplerTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { detail::set_portable_resample_for_testing(GetParam()); }
  void TearDown() override { detail::set_portable_resample_for_testing(false); }
};

INSTANTIATE_TEST_SUITE_P(Kernels, ResamplerTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Portable" : "Native";
                         });

TEST_P(ResamplerTest, SameSizeWholeBoxIsAnExactCopy) {
  const Image im = random_image(37, 23, 1);
  Resampler rs;
  EXPECT_EQ(resize(rs, whole(im), Box{0, 0, 37, 23}, 37, 23).pixels, im.pixels);
  // An integer box of the output's size is a crop (Pillow takes a shortcut; the identity
  // coefficients give the same bytes).
  const Image crop = resize(rs, whole(im), Box{5, 3, 25, 13}, 20, 10);
  for (int y = 0; y < 10; ++y)
    for (int x = 0; x < 20; ++x)
      for (int c = 0; c < 3; ++c) ASSERT_EQ(crop.at(x, y)[c], im.at(x + 5, y + 3)[c]);
}

TEST_P(ResamplerTest, ConstantImageStaysConstant) {
  Image im{200, 100, {}};
  for (int i = 0; i < 200 * 100; ++i) im.pixels.insert(im.pixels.end(), {17, 128, 255});
  Resampler rs;
  const int sizes[][2] = {{100, 50}, {73, 31}, {224, 224}, {199, 100}, {1, 1}};
  for (const auto& s : sizes) {
    const Image out = resize(rs, whole(im), Box{0, 0, 200, 100}, s[0], s[1]);
    for (size_t i = 0; i < out.pixels.size(); i += 3) {
      ASSERT_EQ(out.pixels[i], 17);
      ASSERT_EQ(out.pixels[i + 1], 128);
      ASSERT_EQ(out.pixels[i + 2], 255);
    }
  }
}

TEST_P(ResamplerTest, WithinOneOfDoublePrecisionReference) {
  struct Case {
    int w, h, ow, oh;
    Box box;
  };
  const Case cases[] = {
      {333, 333, 224, 224, {0, 0, 333, 333}},  // horizontal pass first
      {500, 375, 224, 224, {0, 0, 500, 375}},
      // vertical pass first:
      {300, 451, 224, 224, {18.75, 93.958333333333343, 281.25, 357.04166666666669}},
      {320, 1000, 160, 200, {0, 0, 320, 1000}},  // vertical first
      {64, 48, 150, 100, {0, 0, 64, 48}},        // upscale
      {97, 83, 40, 61, {3.3, 1.7, 90.1, 80.9}},  // fractional box, mixed directions
      {50, 40, 50, 20, {0, 0, 50, 40}},          // vertical pass only
      {50, 40, 25, 40, {0, 0, 50, 40}},          // horizontal pass only
  };
  Resampler rs;
  for (const auto& c : cases) {
    const Image im = random_image(c.w, c.h, uint64_t(c.w * 1000 + c.h));
    const Image got = resize(rs, whole(im), c.box, c.ow, c.oh);
    EXPECT_LE(max_abs_diff(got, reference_resize(im, c.box, c.ow, c.oh)), 1)
        << c.w << "x" << c.h << " -> " << c.ow << "x" << c.oh;
  }
}

// Hashes of Pillow 13.0.0's Image.resize(size, Image.BILINEAR, box=box) on hashed_image(w, h),
// made once in Python (FNV-1a 64 of the output bytes). Byte-exact agreement with Pillow.
TEST_P(ResamplerTest, ByteIdenticalToPillow) {
  struct Golden {
    int w, h, ow, oh;
    bool has_box;
    Box box;
    uint64_t hash;
  };
  const Golden goldens[] = {
      {500, 375, 224, 224, false, {0.0, 0.0, 500.0, 375.0}, 0xf89d6f6a64ffb323ull},
      {333, 333, 224, 224, false, {0.0, 0.0, 333.0, 333.0}, 0x4a1771f9b25f8256ull},
      {300,
       451,
       224,
       224,
       true,
       {18.75, 93.95833333333334, 281.25, 357.0416666666667},
       0x4970c0f4fb797937ull},
      {500,
       375,
       224,
       224,
       true,
       {85.04398826979472, 23.4375, 413.48973607038124, 351.5625},
       0x4f17cb0c958616fbull},
      {640, 480, 37, 300, false, {0.0, 0.0, 640.0, 480.0}, 0x24cb558d8a539cacull},
      {100, 80, 250, 190, false, {0.0, 0.0, 100.0, 80.0}, 0xb1f375661101bef2ull},
      {320, 1000, 160, 200, false, {0.0, 0.0, 320.0, 1000.0}, 0x0d705061ed6e66c5ull},
      {500, 375, 224, 224, true, {10.0, 20.0, 234.0, 244.0}, 0xfc27399b73715607ull},
      {200, 300, 200, 150, false, {0.0, 0.0, 200.0, 300.0}, 0x9472f89330ab80c1ull},
      {300, 200, 150, 200, false, {0.0, 0.0, 300.0, 200.0}, 0x7a26d1c9efc91389ull},
      {257, 300, 61, 59, true, {3.25, 7.5, 250.125, 299.0}, 0xcedb90a90bcb2090ull},
  };
  Resampler rs;
  for (const auto& g : goldens) {
    const Image im = hashed_image(g.w, g.h);
    const Image out = resize(rs, whole(im), g.box, g.ow, g.oh);
    EXPECT_EQ(fnv1a(out.pixels), g.hash) << g.w << "x" << g.h << " -> " << g.ow << "x" << g.oh;
  }
  // The centre-crop boxes above are what resize_center_crop computes.
  const Box a = resize_center_crop(300, 451, 256, 224);
  EXPECT_EQ(a.y0, goldens[2].box.y0);
  EXPECT_EQ(a.y1, goldens[2].box.y1);
  const Box b = resize_center_crop(500, 375, 256, 224);
  EXPECT_EQ(b.x0, goldens[3].box.x0);
  EXPECT_EQ(b.x1, goldens[3].box.x1);
}

TEST(Resampler, NativeAndPortableKernelsAgreeOnRandomGeometry) {
  // Small and odd sizes reach the kernels' edge cases: odd output widths, rows shorter than a
  // vector, one-pixel outputs, boxes touching the image edge, mirrored tables.
  KeyedRandom rng(99, 0, 0);
  Resampler rs;
  for (int i = 0; i < 400; ++i) {
    const int w = 1 + int(rng.below(90)), h = 1 + int(rng.below(90));
    const int ow = 1 + int(rng.below(70)), oh = 1 + int(rng.below(70));
    double x0 = rng.uniform(0, w), x1 = rng.uniform(0, w);
    double y0 = rng.uniform(0, h), y1 = rng.uniform(0, h);
    if (x0 > x1) std::swap(x0, x1);
    if (y0 > y1) std::swap(y0, y1);
    Box box{x0, y0, x1, y1};
    if (rng.below(4) == 0) box = Box{0, 0, double(w), double(h)};
    const bool flip = rng.below(2) == 1;
    const Image im = random_image(w, h, uint64_t(i));
    const Image native = resize(rs, whole(im), box, ow, oh, flip);
    detail::set_portable_resample_for_testing(true);
    const Image portable = resize(rs, whole(im), box, ow, oh, flip);
    detail::set_portable_resample_for_testing(false);
    ASSERT_EQ(native.pixels, portable.pixels)
        << w << "x" << h << " box " << x0 << "," << y0 << "," << x1 << "," << y1 << " -> " << ow
        << "x" << oh << (flip ? " flipped" : "");
    if (!flip) {
      ASSERT_LE(max_abs_diff(native, reference_resize(im, box, ow, oh)), 1)
          << w << "x" << h << " -> " << ow << "x" << oh;
    }
  }
}

TEST(Resampler, SupportByHand) {
  // Box (10, 20)-(110, 70) to 50x25: scale 2, support 2. First x output: centre 11, taps
  // [int(9.5), int(13.5)) = [9, 13); last: centre 109, taps [107, 111). Likewise y: [19, 71).
  const PixelRect r = resample_support(Box{10, 20, 110, 70}, 50, 25, 200, 100);
  EXPECT_EQ(r.x0, 9);
  EXPECT_EQ(r.x1, 111);
  EXPECT_EQ(r.y0, 19);
  EXPECT_EQ(r.y1, 71);
  // Clipped to the image at its edges.
  const PixelRect all = resample_support(Box{0, 0, 200, 100}, 50, 25, 200, 100);
  EXPECT_EQ(all.x0, 0);
  EXPECT_EQ(all.x1, 200);
  EXPECT_EQ(all.y0, 0);
  EXPECT_EQ(all.y1, 100);
}

TEST_P(ResamplerTest, RegionCoveringTheSupportGivesTheSameBytes) {
  const Image im = random_image(500, 375, 9);
  struct Case {
    Box box;
    int ow, oh;
  };
  const Case cases[] = {
      {resize_center_crop(500, 375, 256, 224), 224, 224},
      {{120, 40, 453, 373}, 224, 224},
      {{7.25, 100.5, 60.75, 301.0}, 30, 150},  // tall box: still whole-image order rule
      {{200, 100, 300, 200}, 300, 250},        // upscale of a crop
      {{0, 0, 500, 375}, 250, 375},            // horizontal only
  };
  Resampler rs;
  for (const auto& c : cases) {
    const Image want = resize(rs, whole(im), c.box, c.ow, c.oh);
    const PixelRect s = resample_support(c.box, c.ow, c.oh, 500, 375);
    EXPECT_EQ(resize(rs, region(im, s), c.box, c.ow, c.oh).pixels, want.pixels);
    // A larger region works too.
    const PixelRect bigger{std::max(0, s.x0 - 3), std::max(0, s.y0 - 2), std::min(500, s.x1 + 1),
                           std::min(375, s.y1 + 4)};
    EXPECT_EQ(resize(rs, region(im, bigger), c.box, c.ow, c.oh).pixels, want.pixels);
  }
}

TEST_P(ResamplerTest, RegionMissingATapThrowsInternal) {
  const Image im = random_image(500, 375, 10);
  const Box box = resize_center_crop(500, 375, 256, 224);
  const PixelRect s = resample_support(box, 224, 224, 500, 375);
  Resampler rs;
  const PixelRect short_by_one[] = {{s.x0 + 1, s.y0, s.x1, s.y1},
                                    {s.x0, s.y0 + 1, s.x1, s.y1},
                                    {s.x0, s.y0, s.x1 - 1, s.y1},
                                    {s.x0, s.y0, s.x1, s.y1 - 1}};
  for (const auto& r : short_by_one) {
    try {
      resize(rs, region(im, r), box, 224, 224);
      ADD_FAILURE() << "no error for region " << r.x0 << "," << r.y0 << "," << r.x1 << "," << r.y1;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInternal);
    }
  }
}

TEST_P(ResamplerTest, FlipMirrorsTheOutput) {
  const Image im = random_image(333, 250, 11);
  struct Case {
    Box box;
    int ow, oh;
  };
  const Case cases[] = {{{0, 0, 333, 250}, 224, 224},
                        {{10.5, 3, 300, 240.25}, 99, 224},
                        {{0, 0, 333, 250}, 333, 250},   // no pass needed: flip only
                        {{0, 0, 333, 250}, 333, 120},   // vertical only, plus flip
                        {{0, 0, 333, 250}, 100, 250}};  // horizontal only
  Resampler rs;
  for (const auto& c : cases) {
    const Image plain = resize(rs, whole(im), c.box, c.ow, c.oh);
    const Image flipped = resize(rs, whole(im), c.box, c.ow, c.oh, true);
    for (int y = 0; y < c.oh; ++y)
      for (int x = 0; x < c.ow; ++x)
        for (int ch = 0; ch < 3; ++ch)
          ASSERT_EQ(flipped.at(x, y)[ch], plain.at(c.ow - 1 - x, y)[ch]);
  }
}

TEST_P(ResamplerTest, WritesWithDestinationStride) {
  const Image im = random_image(120, 90, 12);
  Resampler rs;
  const Image packed = resize(rs, whole(im), Box{0, 0, 120, 90}, 50, 40);
  std::vector<uint8_t> padded(size_t(40) * 200, 0xAB);
  rs.resize(whole(im), Box{0, 0, 120, 90}, padded.data(), 50, 40, 200, false);
  for (int y = 0; y < 40; ++y) {
    for (int i = 0; i < 150; ++i) ASSERT_EQ(padded[y * 200 + i], packed.pixels[y * 150 + i]);
    for (int i = 150; i < 200; ++i) ASSERT_EQ(padded[y * 200 + i], 0xAB);
  }
}

TEST(Resampler, RejectsInvalidArguments) {
  const Image im = random_image(40, 30, 13);
  Resampler rs;
  std::vector<uint8_t> out(64 * 64 * 3);
  auto code_of = [&](const RegionView& src, const Box& box, int ow, int oh, ptrdiff_t stride) {
    try {
      rs.resize(src, box, out.data(), ow, oh, stride, false);
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;  // a missing error fails the expectation below
  };
  const auto bad = ErrorCode::kInvalidArgument;
  EXPECT_EQ(code_of(whole(im), Box{0, 0, 41, 30}, 10, 10, 30), bad);    // box past the edge
  EXPECT_EQ(code_of(whole(im), Box{-1, 0, 40, 30}, 10, 10, 30), bad);   // negative offset
  EXPECT_EQ(code_of(whole(im), Box{20, 0, 10, 30}, 10, 10, 30), bad);   // inverted
  EXPECT_EQ(code_of(whole(im), Box{NAN, 0, 10, 30}, 10, 10, 30), bad);  // not a number
  EXPECT_EQ(code_of(whole(im), Box{0, 0, 40, 30}, 0, 10, 30), bad);     // empty output
  EXPECT_EQ(code_of(whole(im), Box{0, 0, 40, 30}, 10, 10, 29), bad);    // stride too small
  RegionView outside = whole(im);
  outside.origin_x = 1;  // the region would end past the image
  EXPECT_EQ(code_of(outside, Box{0, 0, 40, 30}, 10, 10, 30), bad);
  EXPECT_THROW(resample_support(Box{0, 0, 40, 31}, 10, 10, 40, 30), Error);
}

}  // namespace
}  // namespace stoker::transform
