// The worker form of stoker.augment's ops. Their equality with the torch batch ops, draw for draw
// and pixel for pixel, is tests/python/test_augment_workers.py's; here, what each op must do on
// its own, with values worked out by hand.
#include "stoker/augment/augment.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels.h"
#include "pil_filters.h"
#include "stoker/core/error.h"

namespace stoker::augment {
namespace {

struct Picture {
  int width, height;
  std::vector<uint8_t> pixels;
  Picture(int w, int h) : width(w), height(h), pixels(static_cast<size_t>(w) * h * 3) {
    for (size_t k = 0; k < pixels.size(); ++k) pixels[k] = static_cast<uint8_t>((k * 37) % 251);
  }
  ImageView view() { return {pixels.data(), width, height}; }
  uint8_t at(int x, int y, int c) const {
    return pixels[(static_cast<size_t>(y) * width + x) * 3 + c];
  }
};

TEST(Augment, PointOpsByHand) {
  Picture p(4, 2);
  p.pixels[0] = 200, p.pixels[1] = 100, p.pixels[2] = 13;
  Picture q = p;
  invert(q.view());
  EXPECT_EQ(q.pixels[0], 55);
  q = p;
  posterize(q.view(), 3);  // the top three bits
  EXPECT_EQ(q.pixels[0], 192);
  EXPECT_EQ(q.pixels[1], 96);
  q = p;
  solarize(q.view(), 100.0f);  // at or above: inverted
  EXPECT_EQ(q.pixels[0], 55);
  EXPECT_EQ(q.pixels[1], 155);
  EXPECT_EQ(q.pixels[2], 13);
  q = p;
  solarize_add(q.view(), 120);  // below 128: raised, clipped
  EXPECT_EQ(q.pixels[0], 200);
  EXPECT_EQ(q.pixels[1], 220);
  EXPECT_EQ(q.pixels[2], 133);
  q = p;
  adjust_brightness(q.view(), 1.5f);  // truncated, clipped
  EXPECT_EQ(q.pixels[0], 255);
  EXPECT_EQ(q.pixels[1], 150);
  EXPECT_EQ(q.pixels[2], 19);
}

TEST(Augment, SaturationZeroIsTheLuma) {
  Picture p(3, 3);
  adjust_saturation(p.view(), 0.0f);
  for (int y = 0; y < 3; ++y)
    for (int x = 0; x < 3; ++x) {
      EXPECT_EQ(p.at(x, y, 0), p.at(x, y, 1));
      EXPECT_EQ(p.at(x, y, 1), p.at(x, y, 2));
    }
}

TEST(Augment, AutocontrastStretchesEachChannelAndKeepsAFlatOne) {
  Picture p(2, 1);
  // R: 50 and 150 -> 0 and 254: 100 / (100 * float(1 / 255)) is 254.99998, truncated, as
  // torchvision's autocontrast on uint8; G flat at 7; B: 0 and 255 already.
  p.pixels = {50, 7, 0, 150, 7, 255};
  autocontrast(p.view());
  EXPECT_EQ(p.pixels, (std::vector<uint8_t>{0, 7, 0, 254, 7, 255}));
}

TEST(Augment, EqualizeSpreadsLevelsAndKeepsAChannelWithOneValue) {
  Picture p(256, 1);
  for (int x = 0; x < 256; ++x) {
    p.pixels[x * 3] = static_cast<uint8_t>(x / 2);  // 0..127, two pixels each
    p.pixels[x * 3 + 1] = 9;
    p.pixels[x * 3 + 2] = static_cast<uint8_t>(x);
  }
  Picture q = p;
  equalize(q.view());
  // R: step = (256 - 2) / 255 = 0: kept, as PIL; G: one value: kept; B: already uniform.
  EXPECT_EQ(q.pixels, p.pixels);
  Picture r(510, 1);
  for (int x = 0; x < 510; ++x) r.pixels[x * 3] = static_cast<uint8_t>(x / 4);  // 0..127
  equalize(r.view());
  // step = (510 - 2) / 255 = 1: lut[k] = cumulative count below k (+0): 0, 4, 8, ...
  EXPECT_EQ(r.pixels[0], 0);
  EXPECT_EQ(r.pixels[4 * 3], 4);
  EXPECT_EQ(r.pixels[8 * 3], 8);
  EXPECT_EQ(r.pixels[509 * 3], 255);  // 127: 508 below, clipped
}

TEST(Augment, SharpnessKeepsTheBorderAndOneIsTheImage) {
  Picture p(5, 4);
  Picture q = p;
  adjust_sharpness(q.view(), 1.0f);
  EXPECT_EQ(q.pixels, p.pixels);
  adjust_sharpness(q.view(), 0.0f);  // the smoothed image inside, the border as it was
  for (int x = 0; x < 5; ++x) EXPECT_EQ(q.at(x, 0, 0), p.at(x, 0, 0));
  int k = 0;
  for (int dy = -1; dy <= 1; ++dy)
    for (int dx = -1; dx <= 1; ++dx) k += p.at(2 + dx, 1 + dy, 1) * (dx == 0 && dy == 0 ? 5 : 1);
  EXPECT_EQ(q.at(2, 1, 1), (2 * k + 13) / 26);
}

TEST(Augment, AffineMovesPixelsAndFillsOutside) {
  Picture p(6, 4);
  Picture q = p;
  std::vector<uint8_t> scratch;
  pil_affine(q.view(), {1, 0, 0, 0, 1, 0}, {1, 2, 3}, scratch);
  EXPECT_EQ(q.pixels, p.pixels);
  pil_affine(q.view(), {1, 0, 2, 0, 1, 0}, {1, 2, 3}, scratch);  // reads 2 to the right
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 4; ++x) EXPECT_EQ(q.at(x, y, 2), p.at(x + 2, y, 2));
    EXPECT_EQ(q.at(4, y, 0), 1);
    EXPECT_EQ(q.at(5, y, 2), 3);
  }
}

TEST(Augment, EraseIsCutAtTheEdges) {
  Picture p(5, 5);
  erase(p.view(), 3, -2, 10, 4, {7, 8, 9});
  for (int y = 0; y < 5; ++y)
    for (int x = 0; x < 5; ++x)
      EXPECT_EQ(p.at(x, y, 0) == 7 && p.at(x, y, 1) == 8 && p.at(x, y, 2) == 9, y >= 3 && x < 2)
          << x << "," << y;
}

TEST(Augment, GreyStaysGreyAndFlatStaysFlat) {
  Picture p(9, 7);
  rgb_to_grayscale(p.view());
  for (int y = 0; y < 7; ++y)
    for (int x = 0; x < 9; ++x)
      EXPECT_TRUE(p.at(x, y, 0) == p.at(x, y, 1) && p.at(x, y, 1) == p.at(x, y, 2));
  Picture grey = p;
  adjust_hue(grey.view(), 0.3f);  // no hue to turn
  EXPECT_EQ(grey.pixels, p.pixels);
  Picture flat(9, 7);
  std::fill(flat.pixels.begin(), flat.pixels.end(), uint8_t{90});
  std::vector<float> planes;
  gaussian_blur(flat.view(), 5, 3, 1.5f, 0.7f, planes);
  for (uint8_t v : flat.pixels) EXPECT_EQ(v, 90);
}

TEST(Augment, HueTurnsRedTowardsGreen) {
  Picture p(1, 1);
  p.pixels = {255, 0, 0};
  adjust_hue(p.view(), 1.0f / 3.0f);  // a third of the wheel
  EXPECT_EQ(p.pixels[1], 255);
  EXPECT_LE(p.pixels[0], 1);
  EXPECT_EQ(p.pixels[2], 0);
}

TEST(Augment, TorchvisionAffineIdentityAndTranslation) {
  Picture p(6, 4);
  Picture q = p;
  std::vector<uint8_t> scratch;
  torchvision_affine(q.view(), {1, 0, 0, 0, 1, 0}, true, {1, 2, 3}, scratch);
  EXPECT_EQ(q.pixels, p.pixels);
  // the inverse map reads x - 2: the image moves 2 to the right, the fill comes in on the left
  torchvision_affine(q.view(), {1, 0, -2, 0, 1, 0}, true, {1, 2, 3}, scratch);
  for (int y = 0; y < 4; ++y) {
    EXPECT_EQ(q.at(0, y, 0), 1);
    EXPECT_EQ(q.at(1, y, 2), 3);
    for (int x = 2; x < 6; ++x) EXPECT_EQ(q.at(x, y, 1), p.at(x - 2, y, 1));
  }
}

TEST(Augment, StepsAreKeyedAndCheckedBeforeTheyRun) {
  Step step;
  step.timm_rand_augment.prob = 1.0;
  step.timm_rand_augment.streams = {{1, 2, 3, 4}, {5, 6, 7, 8}};
  Picture a(16, 12), b(16, 12), c(16, 12);
  apply({step}, a.view(), 1, 0, 42);
  apply({step}, b.view(), 1, 0, 42);
  EXPECT_EQ(a.pixels, b.pixels);
  bool differs = false;
  for (int64_t sample = 0; sample < 8 && !differs; ++sample) {
    Picture d(16, 12);
    apply({step}, d.view(), 1, 0, sample + 100);
    differs = d.pixels != a.pixels;
  }
  EXPECT_TRUE(differs);
  step.timm_rand_augment.prob = 2.0;
  EXPECT_THROW(check(step), Error);
}

// Every op's bytes are the same whichever kernels run them: the SIMD forms (AVX-512 VBMI
// tables, AVX2 gathers and coordinates, where this CPU has them) and the portable ones, on
// noise at sizes that leave every tail (odd widths, a pixel, a column, a row).
TEST(AugmentKernels, EveryOpGivesTheSameBytesWithAndWithoutSimd) {
  struct Op {
    const char* name;
    double magnitude;
  };
  const std::vector<Op> ops = {
      {"brightness", 1.7},
      {"brightness", 0.3},
      {"contrast", 1.9},
      {"contrast", 0.2},
      {"saturation", 1.8},
      {"sharpness", 1.9},
      {"hue", 0.3},
      {"hue", -0.5},
      {"grayscale", 0},
      {"posterize", 3},
      {"solarize", 100},
      {"solarize_add", 60},
      {"invert", 0},
      {"autocontrast", 0},
      {"equalize", 0},
      {"gaussian_blur", 1.2},
      {"rotate", 27},
      {"rotate", 301},
      {"shear_x", 0.3},
      {"shear_y", -0.25},
      {"translate_x", 37},
      {"translate_y", -11},
      {"pil_rotate", 13},
      {"pil_rotate", -30},
      {"pil_shear_x", 0.27},
      {"pil_shear_y", -0.3},
      {"pil_translate_x", 20.6},
      {"pil_translate_y", -7.3},
      {"pil_rotate_bilinear", 13},
      {"pil_rotate_bicubic", -29.5},
      {"pil_shear_x_bilinear", 0.27},
      {"pil_shear_y_bicubic", -0.3},
      {"pil_translate_x_bicubic", 20.6},
      {"pil_translate_y_bilinear", -7.3},
      {"pil_color", 1.72},
      {"pil_color", 0.1},
      {"pil_contrast", 1.9},
      {"pil_contrast", 0.37},
      {"pil_sharpness", 1.9},
      {"pil_sharpness", 0.1},
      {"pil_autocontrast", 0},
  };
  std::mt19937 rng(5);
  for (const auto& [w, h] : {std::pair{224, 224}, {37, 19}, {1, 1}, {1, 9}, {300, 2}}) {
    Picture noise(w, h);
    for (uint8_t& v : noise.pixels) v = static_cast<uint8_t>(rng() % 200 + 20);
    for (const Op& op : ops) {
      Picture portable = noise, simd = noise;
      detail::set_portable_kernels_for_testing(true);
      apply_op(portable.view(), op.name, op.magnitude, {9, 8, 7});
      detail::set_portable_kernels_for_testing(false);
      apply_op(simd.view(), op.name, op.magnitude, {9, 8, 7});
      EXPECT_EQ(portable.pixels, simd.pixels)
          << op.name << " " << op.magnitude << " " << w << "x" << h;
      if (w == 224) {  // the op did something
        EXPECT_NE(simd.pixels, noise.pixels) << op.name;
      }
    }
  }
  Picture p(8, 8);
  EXPECT_THROW(apply_op(p.view(), "spin", 1, {0, 0, 0}), Error);
}

// Hue's SIMD form on every colour (a 4096 x 4096 image of all 2^24, the greys and each sextant's
// edges among them), for shifts either way and the half turn both ways: the portable bytes.
TEST(AugmentKernels, HueOfEveryColourIsTheSameWithAndWithoutSimd) {
  Picture every(4096, 4096);
  for (size_t k = 0; k < every.pixels.size() / 3; ++k) {
    every.pixels[3 * k] = static_cast<uint8_t>(k >> 16);
    every.pixels[3 * k + 1] = static_cast<uint8_t>(k >> 8);
    every.pixels[3 * k + 2] = static_cast<uint8_t>(k);
  }
  for (const float factor : {0.3f, -0.5f, 0.5f, -0.07f}) {
    Picture portable = every, simd = every;
    detail::set_portable_kernels_for_testing(true);
    adjust_hue(portable.view(), factor);
    detail::set_portable_kernels_for_testing(false);
    adjust_hue(simd.view(), factor);
    size_t differ = 0;
    for (size_t k = 0; k < simd.pixels.size(); ++k) differ += simd.pixels[k] != portable.pixels[k];
    EXPECT_EQ(differ, 0u) << "hue " << factor;
    EXPECT_NE(simd.pixels, every.pixels) << "hue " << factor;
  }
}

// The image under PIL's map (or torchvision's, filled outside) with the portable kernels forced,
// then with the SIMD ones: the SIMD form's 4-byte copies and its gathers must give the same bytes
// (either may be the CPU's choice), and that is returned second.
std::array<Picture, 2> affine_both_ways(const Picture& image, const std::array<double, 6>& m,
                                        bool pil, std::vector<uint8_t>& scratch) {
  std::array<Picture, 3> out{image, image, image};
  for (const int form : {0, 1, 2}) {
    detail::set_portable_kernels_for_testing(form == 0);
    detail::set_affine_gathers_for_testing(form - 1);
    if (pil)
      pil_affine(out[form].view(), m, {1, 2, 3}, scratch);
    else
      torchvision_affine(out[form].view(), m, true, {1, 2, 3}, scratch);
  }
  detail::set_portable_kernels_for_testing(false);
  detail::set_affine_gathers_for_testing(-1);
  EXPECT_EQ(out[1].pixels, out[2].pixels) << "the copies and the gathers differ";
  return {out[0], out[2]};
}

// PIL's and torchvision's affine maps at random angles, shears and shifts (PIL's SIMD form
// takes float32 where no coordinate is near an integer, float64 where one is; translations and
// shears along x take row copies): the same bytes as the portable form, pixel by pixel.
TEST(AugmentKernels, AffineMapsAtRandomGiveTheSameBytesWithAndWithoutSimd) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  Picture noise(61, 47);
  for (uint8_t& v : noise.pixels) v = static_cast<uint8_t>(rng());
  std::vector<uint8_t> scratch;
  for (int trial = 0; trial < 300; ++trial) {
    const double angle = 3.2 * unit(rng), c = std::cos(angle), s = std::sin(angle);
    std::array<double, 6> m{c,  s + 0.3 * unit(rng), 40 * unit(rng),
                            -s, c + 0.3 * unit(rng), 40 * unit(rng)};
    if (trial % 3 == 0)
      m = {1, 0, std::round(30 * unit(rng)) + (trial % 2) * 0.5,
           0, 1, 20 * unit(rng)};          // shifts, some by whole and half pixels
    if (trial % 3 == 1 && trial % 2 == 0)  // shears along x, some by whole-pixel steps
      m = {1, trial % 4 == 0 ? 0.5 : 0.3 * unit(rng), std::round(20 * unit(rng)), 0,
           1, trial % 8 == 0 ? 0.0 : 3 * unit(rng)};
    if (trial % 3 == 1 && trial % 2 == 1)  // shears along y
      m = {1,
           0,
           trial % 5 == 0 ? 0.0 : 3 * unit(rng),
           trial % 7 == 0 ? 0.5 : 0.3 * unit(rng),
           1,
           std::round(20 * unit(rng))};
    for (const bool pil : {true, false}) {
      const auto [portable, simd] = affine_both_ways(noise, m, pil, scratch);
      ASSERT_EQ(portable.pixels, simd.pixels) << "trial " << trial << (pil ? " PIL" : " torch");
    }
  }
}

// Maps whose coordinates fall on pixel edges and centres (quarter turns, halving, steps of a
// quarter pixel), where the SIMD form's fixed point is in doubt and the formula decides, on a
// small image and one large enough to take fewer fraction bits; a slight turn whose last
// eight pixels are inside on an image 8 pixels a step wide (the SIMD form's copies store a
// byte past each pixel, and not past the image); and a map too far out for the fixed point
// (the rows' form). The same bytes as the portable form.
TEST(AugmentKernels, AffineMapsOnPixelEdgesGiveTheSameBytesWithAndWithoutSimd) {
  std::mt19937 rng(13);
  const std::vector<std::array<double, 6>> maps = {{0, 1, 0, -1, 0, 40},
                                                   {0, -1, 46, 1, 0, 0},
                                                   {-1, 0, 60, 0, -1, 46},
                                                   {0.5, 0.25, 3, -0.25, 0.5, 1.5},
                                                   {2, 0, -30, 0, 0.5, 7},
                                                   {0.75, -0.5, 10, 0.5, 0.75, -4},
                                                   {1.25, 0.25, -0.5, 0.25, 1, 0.25},
                                                   {0.996, 0.087, -4.5, -0.087, 0.996, 3},
                                                   {0.8, 0.6, 1e7, -0.6, 0.8, 0}};
  std::vector<uint8_t> scratch;
  for (const auto& [w, h] : {std::pair{61, 47}, {64, 56}, {700, 300}}) {
    Picture noise(w, h);
    for (uint8_t& v : noise.pixels) v = static_cast<uint8_t>(rng());
    for (const auto& m : maps) {
      for (const bool pil : {true, false}) {
        const auto [portable, simd] = affine_both_ways(noise, m, pil, scratch);
        ASSERT_EQ(portable.pixels, simd.pixels)
            << w << "x" << h << " map " << m[0] << " " << m[1] << " " << m[2] << " " << m[3] << " "
            << m[4] << " " << m[5] << (pil ? " PIL" : " torch");
        size_t filled = 0;  // pixels of the fill: some, and all for the map far out
        for (size_t k = 0; k + 2 < simd.pixels.size(); k += 3)
          filled += simd.pixels[k] == 1 && simd.pixels[k + 1] == 2 && simd.pixels[k + 2] == 3;
        if (m[2] < 1e6) {
          EXPECT_LT(filled, simd.pixels.size() / 3);
        } else {
          EXPECT_EQ(filled, simd.pixels.size() / 3);
        }
      }
    }
  }
}

// Pillow's bilinear and bicubic affine filters (pil_filters.cc): the portable form (Pillow's
// operations written out), the AVX2 form and, where the CPU has it, the AVX-512 form of a
// rotation give the same bytes, on random maps of every kind (rotations, shears and shifts by
// fractions and by whole pixels, which take the forms' one-axis shortcuts), on an image whose
// width leaves every tail of the 4- and 8-pixel steps and on a 1 x 1 and a 2 x 3 one (every
// tap at an edge).
TEST(AugmentKernels, PillowFiltersGiveTheSameBytesInEveryForm) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::vector<uint8_t> scratch;
  for (const auto& [w, h] : {std::pair{61, 47}, {224, 224}, {1, 1}, {2, 3}}) {
    Picture noise(w, h);
    for (uint8_t& v : noise.pixels) v = static_cast<uint8_t>(rng());
    for (int trial = 0; trial < 60; ++trial) {
      const double angle = 0.6 * unit(rng), c = std::cos(angle), s = std::sin(angle);
      std::array<double, 6> m{c, s, w * 0.3 * unit(rng), -s, c, h * 0.3 * unit(rng)};
      if (trial % 4 == 1) m = {1, 0.3 * unit(rng), 0, 0, 1, std::round(5 * unit(rng))};
      if (trial % 4 == 2) m = {1, 0, std::round(5 * unit(rng)), 0.3 * unit(rng), 1, 0};
      if (trial % 4 == 3)
        m = {1, 0, trial % 8 == 3 ? 20 * unit(rng) : 0, 0, 1, trial % 8 == 3 ? 0 : 20 * unit(rng)};
      for (const Resample filter : {Resample::kBilinear, Resample::kBicubic}) {
        Picture portable = noise, avx2 = noise, best = noise;
        detail::set_portable_kernels_for_testing(true);
        pil_affine(portable.view(), m, {1, 2, 3}, scratch, filter);
        detail::set_portable_kernels_for_testing(false);
        detail::allow_avx512_for_testing(false);
        pil_affine(avx2.view(), m, {1, 2, 3}, scratch, filter);
        detail::allow_avx512_for_testing(true);
        pil_affine(best.view(), m, {1, 2, 3}, scratch, filter);
        ASSERT_EQ(portable.pixels, avx2.pixels) << w << "x" << h << " trial " << trial;
        ASSERT_EQ(portable.pixels, best.pixels) << w << "x" << h << " trial " << trial;
      }
    }
  }
}

// Pillow 13's own bytes for a 5 x 4 image (value 17 x + 53 y + 29 c mod 256 at x, y, channel c)
// under Image.transform(AFFINE, ..., fillcolor=(1, 2, 3)): a turn of 20 degrees about the centre
// (rotate(20)'s matrix) and a shear of 0.3 along x, each bilinear and bicubic. Made with:
//   im = Image.fromarray(np.array([[[(17 * x + 53 * y + 29 * c) % 256 for c in range(3)]
//                                   for x in range(5)] for y in range(4)], np.uint8))
//   list(im.rotate(20, resample=Image.BICUBIC, fillcolor=(1, 2, 3)).tobytes())
TEST(Augment, PillowFiltersAreThoseOfPillow) {
  Picture p(5, 4);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 5; ++x)
      for (int c = 0; c < 3; ++c) p.pixels[(y * 5 + x) * 3 + c] = (17 * x + 53 * y + 29 * c) % 256;
  std::vector<uint8_t> scratch;
  struct Case {
    const char* op;
    double magnitude;
    std::vector<uint8_t> want;
  };
  const std::vector<Case> cases = {
      {"pil_rotate_bilinear", 20, {1,   2,   3,   26,  55,  84,  47,  76,  105, 81,  110, 139,
                                   109, 138, 167, 23,  52,  81,  57,  86,  115, 91,  120, 149,
                                   125, 154, 183, 158, 187, 216, 68,  97,  126, 101, 130, 159,
                                   135, 164, 193, 169, 198, 166, 203, 114, 94,  117, 146, 175,
                                   145, 174, 203, 179, 208, 237, 200, 229, 149, 1,   2,   3}},
      {"pil_rotate_bicubic", 20, {1,   2,   3,   18,  47,  76,  47,  76,  105, 78,  107, 136,
                                  104, 133, 162, 18,  47,  76,  51,  80,  109, 94,  123, 152,
                                  130, 161, 212, 154, 223, 250, 72,  101, 130, 96,  125, 154,
                                  132, 161, 189, 175, 215, 172, 208, 119, 89,  122, 151, 180,
                                  148, 177, 206, 179, 208, 255, 208, 255, 141, 1,   2,   3}},
      {"pil_shear_x_bilinear", 0.3, {2,   31,  60,  19,  48,  77,  36,  65,  94,  53,  82,  111,
                                     68,  97,  126, 60,  89,  118, 77,  106, 135, 94,  123, 152,
                                     111, 140, 169, 121, 150, 179, 118, 147, 176, 135, 164, 193,
                                     152, 181, 210, 169, 198, 227, 1,   2,   3,   176, 205, 234,
                                     193, 222, 239, 210, 227, 12,  227, 0,   29,  1,   2,   3}},
      {"pil_shear_x_bicubic", 0.3, {2,   31,  60,  21,  50,  79,  38,  67,  96,  55,  84,  113,
                                    69,  98,  127, 58,  87,  116, 78,  107, 136, 95,  124, 153,
                                    113, 142, 171, 123, 152, 181, 116, 145, 174, 134, 163, 192,
                                    151, 180, 209, 170, 199, 228, 1,   2,   3,   177, 206, 236,
                                    194, 224, 239, 211, 227, 2,   227, 0,   29,  1,   2,   3}},
  };
  for (const bool portable : {true, false}) {
    detail::set_portable_kernels_for_testing(portable);
    for (const Case& c : cases) {
      Picture q = p;
      apply_op(q.view(), c.op, c.magnitude, {1, 2, 3});
      EXPECT_EQ(q.pixels, c.want) << c.op << (portable ? " portable" : "");
    }
  }
  detail::set_portable_kernels_for_testing(false);
}

// Pillow 13's own bytes for its enhancers, as timm calls them (ImageEnhance.Color, Contrast,
// Sharpness(image).enhance(factor), ImageOps.autocontrast), in the portable and SIMD forms: a
// 4 x 4 image byte by byte (value (17 x + 53 y + 29 c + 7 x y (c + 1)) mod 256), and a 61 x 47
// image of noise in [20, 219] (byte k: 20 + ((k * 2654435761 mod 2^32) >> 16) mod 200; its
// mean luma 119.65, so Contrast's level is 120, not 119) by the sum of (k + 1) x byte k. Made
// with:
//   im = Image.fromarray(pixels)  # uint8 [h, w, 3]
//   out = np.asarray(ImageEnhance.Color(im).enhance(1.72)).ravel().astype(np.uint64)
//   list(out) or int((out * (np.arange(len(out), dtype=np.uint64) + 1)).sum())
struct Enhanced {
  const char* op;
  double factor;
  std::vector<uint8_t> want;
};

uint64_t weighted_sum(const std::vector<uint8_t>& bytes) {
  uint64_t sum = 0;
  for (size_t k = 0; k < bytes.size(); ++k) sum += (k + 1) * bytes[k];
  return sum;
}

TEST(Augment, PillowEnhancersAreThoseOfPillow) {
  Picture p(4, 4);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x)
      for (int c = 0; c < 3; ++c)
        p.pixels[(y * 4 + x) * 3 + c] =
            static_cast<uint8_t>((17 * x + 53 * y + 29 * c + 7 * x * y * (c + 1)) % 256);
  const std::vector<Enhanced> small = {
      {"pil_color", 1.72, {0,   32,  82,  0,   49,  99,  16,  66,  116, 33,  83,  133,
                           35,  85,  135, 56,  118, 179, 75,  149, 223, 95,  181, 255,
                           88,  138, 188, 111, 185, 255, 155, 253, 0,   255, 0,   90,
                           141, 191, 241, 188, 255, 0,   255, 4,   126, 0,   121, 255}},
      {"pil_contrast", 1.9, {0,   0,   6,   0,   0,   39,  0,   16,  71,  0,   48,  103,
                             0,   52,  107, 42,  111, 179, 88,  170, 251, 134, 229, 255,
                             97,  153, 208, 156, 238, 255, 215, 255, 0,   255, 0,   58,
                             198, 253, 255, 255, 255, 0,   255, 0,   126, 0,   103, 255}},
      {"pil_sharpness", 0.1, {0,   29,  58,  17,  46,  75,  34,  63,  92,  51,  80,  109,
                              53,  82,  111, 77,  113, 131, 101, 126, 151, 125, 175, 225,
                              106, 135, 164, 137, 162, 169, 150, 171, 97,  199, 14,  85,
                              159, 188, 217, 197, 247, 41,  235, 50,  121, 17,  109, 201}},
      {"pil_autocontrast", 0, {0,   16,  41,  18,  35,  62,  36,  53,  84,  55,  72,  106,
                               57,  74,  108, 83,  108, 157, 109, 142, 206, 135, 176, 255,
                               115, 132, 176, 148, 181, 252, 182, 230, 0,   215, 0,   75,
                               172, 190, 244, 213, 254, 19,  254, 39,  121, 18,  103, 224}},
  };
  Picture noise(61, 47);
  for (size_t k = 0; k < noise.pixels.size(); ++k)
    noise.pixels[k] =
        static_cast<uint8_t>(20 + ((static_cast<uint32_t>(k) * 2654435761u) >> 16) % 200);
  ASSERT_EQ(weighted_sum(noise.pixels), 4418709174u);
  const std::vector<std::tuple<const char*, double, uint64_t>> sums = {
      {"pil_color", 0.1, 4398313053},      {"pil_color", 0.55, 4400483873},
      {"pil_color", 1.72, 4451325199},     {"pil_color", 1.9, 4470593208},
      {"pil_contrast", 0.1, 4420504015},   {"pil_contrast", 0.55, 4410334449},
      {"pil_contrast", 1.72, 4471190343},  {"pil_contrast", 1.9, 4492336179},
      {"pil_sharpness", 0.1, 4406725208},  {"pil_sharpness", 0.55, 4405306004},
      {"pil_sharpness", 1.72, 4429981105}, {"pil_sharpness", 1.9, 4444906896},
      {"pil_autocontrast", 0, 4695796091},
  };
  for (const bool portable : {true, false}) {
    detail::set_portable_kernels_for_testing(portable);
    for (const Enhanced& c : small) {
      Picture q = p;
      apply_op(q.view(), c.op, c.factor, {0, 0, 0});
      EXPECT_EQ(q.pixels, c.want) << c.op << (portable ? " portable" : "");
    }
    for (const auto& [op, factor, want] : sums) {
      Picture q = noise;
      apply_op(q.view(), op, factor, {0, 0, 0});
      EXPECT_EQ(weighted_sum(q.pixels), want)
          << op << " " << factor << (portable ? " portable" : "");
    }
  }
  detail::set_portable_kernels_for_testing(false);
}

// Tables with all three channels different and the same, against the value-by-value lookup, on
// lengths around the SIMD form's 64- and 192-byte steps.
TEST(AugmentKernels, TablesApplyPerChannel) {
  detail::Tables tables;
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v) tables[c][v] = static_cast<uint8_t>((v * (c + 3) + 11 * c) % 256);
  detail::Tables same{tables[1], tables[1], tables[1]};
  for (const detail::Tables* t : {&tables, &same}) {
    for (size_t count : {0, 1, 21, 22, 63, 64, 65, 128, 1000}) {
      std::vector<uint8_t> pixels(count * 3), want(count * 3);
      for (size_t k = 0; k < pixels.size(); ++k) {
        pixels[k] = static_cast<uint8_t>((k * 131) % 256);
        want[k] = (*t)[k % 3][pixels[k]];
      }
      detail::apply_tables(pixels.data(), count, *t);
      EXPECT_EQ(pixels, want) << count;
    }
  }
}

}  // namespace
}  // namespace stoker::augment
