#include "stoker/augment/augment.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numbers>
#include <string>
#include <type_traits>

#include "kernels.h"
#include "pil_filters.h"
#include "stoker/core/error.h"
#include "stoker/core/random.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace stoker::augment {

namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// The per-pixel float loops, built twice: for the baseline, and for CPUs with AVX2 and FMA,
// where std::fma and std::floor are single instructions instead of library calls and the
// compiler vectorises what it can; detail::use_avx2_fma() picks at run time (the tests force
// the baseline and compare bytes). No contraction either way (-ffp-contract=off): the same
// bytes. STOKER_TWICE(ret, name, (params), (args)) { body } defines name() so.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define STOKER_TARGET_AVX2_FMA __attribute__((target("avx2,fma")))
#else
#define STOKER_TARGET_AVX2_FMA
#endif
#define STOKER_TWICE(ret, name, params, args)                                       \
  [[gnu::always_inline]] static inline ret name##_body params;                      \
  STOKER_TARGET_AVX2_FMA static ret name##_avx2 params { return name##_body args; } \
  ret name params {                                                                 \
    if (detail::use_avx2_fma()) return name##_avx2 args;                            \
    return name##_body args;                                                        \
  }                                                                                 \
  [[gnu::always_inline]] static inline ret name##_body params

// Python's KeyedDraws for one sample: a name's stream, its words in order.
class Draw {
 public:
  Draw(uint64_t stream, uint64_t seed, int64_t epoch, int64_t sample)
      : rng_(seed, stream ^ (static_cast<uint64_t>(epoch) * kGolden),
             static_cast<uint64_t>(sample)) {}

  uint64_t bits() { return rng_.next_u64(); }
  // uniform(name, low, high): float32 from the top 24 bits, low + (high - low) * u in float32.
  float uniform(double low = 0.0, double high = 1.0) {
    const float u = static_cast<float>(bits() >> 40) * (1.0f / 16777216.0f);
    return static_cast<float>(low) + static_cast<float>(high - low) * u;
  }
  bool bernoulli(double p) { return uniform() < static_cast<float>(p); }
  int64_t integers(int64_t high) {
    return static_cast<int64_t>(((bits() >> 33) * static_cast<uint64_t>(high)) >> 31);
  }

 private:
  KeyedRandom rng_;
};

uint8_t to_u8(float v) {  // clamp to [0, 255], then truncate (torch's cast)
  return static_cast<uint8_t>(std::clamp(v, 0.0f, 255.0f));
}

// Rounded half to even (torch's round, std::nearbyint) for 0 <= v < 2^23, without the libm
// call std::nearbyint is on a baseline x86-64 build: adding 2^23 leaves no fraction bits, the
// float addition rounds half to even.
float round_even(float v) {
  constexpr float kShift = 8388608.0f;
  return (v + kShift) - kShift;
}

size_t pixels_of(const ImageView& im) {
  return static_cast<size_t>(im.width) * static_cast<size_t>(im.height);
}

// Luma as torchvision takes it for uint8 input: 0.2989 R, then + 0.587 G and + 0.114 B (torch's
// add with alpha, a fused multiply-add), floored.
[[gnu::always_inline]] inline float luma(const uint8_t* p) {
  const float r = static_cast<float>(p[0]) * 0.2989f;
  return std::floor(
      std::fma(static_cast<float>(p[2]), 0.114f, std::fma(static_cast<float>(p[1]), 0.587f, r)));
}

// torch's add(base, other, alpha=rest) in float32: a fused multiply-add (torch's vectorised CPU
// kernels and its CUDA kernel fuse it), worked out in double, where the product is exact and the
// sum, for these magnitudes, too (std::fma is a library call without -mfma).
float add_scaled(float base, float other, float rest) {
  return static_cast<float>(static_cast<double>(base) +
                            static_cast<double>(other) * static_cast<double>(rest));
}

// img * ratio + other * (1 - ratio), as torchvision's _blend in float32:
// image1.mul(ratio).add_(image2, alpha=1.0 - ratio), `rest` being 1 - ratio worked out in double
// and rounded to float (rest_of()).
uint8_t blend(uint8_t x, float other, float ratio, float rest) {
  return to_u8(add_scaled(static_cast<float>(x) * ratio, other, rest));
}

float rest_of(double factor) { return static_cast<float>(1.0 - factor); }

// Pillow's luma (Convert.c's rgb2l: ITU-R 601-2 in 16-bit fixed point, rounded), which
// ImageEnhance.Color blends with and ImageEnhance.Contrast averages.
[[gnu::always_inline]] inline int pil_luma(const uint8_t* p) {
  return (p[0] * 19595 + p[1] * 38470 + p[2] * 7471 + 0x8000) >> 16;
}

// Pillow's Image.blend(degenerate, image, alpha) of one value (Blend.c), as ImageEnhance's
// enhance(factor) calls it: degenerate + alpha (value - degenerate) in float32, alpha the factor
// rounded to float, the product and the sum each rounded (Pillow's x86-64 wheels are built
// without FMA, so nothing fuses them), clipped to [0, 255] and truncated (within [0, 1] the
// value cannot leave [degenerate, value], so Pillow's unclipped branch is the same).
[[gnu::always_inline]] inline uint8_t pil_blend(float degenerate, float value, float alpha) {
  return to_u8(degenerate + alpha * (value - degenerate));
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define STOKER_AUGMENT_PIXELS_AVX2 1
// Eight pixels at a time in AVX2 with FMA: the same float32 operations as luma() and blend()
// (_mm256_fmadd_ps is std::fma's single rounding, as add_scaled's float64 sum is).

// 24 bytes of RGB (8 pixels) as three vectors of 8 floats.
STOKER_TARGET_AVX2_FMA inline void load_rgb8(const uint8_t* p, __m256& r, __m256& g, __m256& b) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));      // bytes 0-15
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8));  // bytes 8-23
  const __m128i x = _mm_shuffle_epi8(  // pixels 0-3: R0-3 G0-3 B0-3
      a, _mm_setr_epi8(0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11, -1, -1, -1, -1));
  const __m128i y = _mm_shuffle_epi8(  // pixels 4-7 (bytes 12-23)
      c, _mm_setr_epi8(4, 7, 10, 13, 5, 8, 11, 14, 6, 9, 12, 15, -1, -1, -1, -1));
  const __m128i rg = _mm_unpacklo_epi32(x, y);  // R0-3 R4-7 G0-3 G4-7
  const __m128i bb = _mm_unpackhi_epi32(x, y);  // B0-3 B4-7
  r = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(rg));
  g = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(rg, 8)));
  b = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bb));
}

// Eight values in [0, 255] (int32) as 8 bytes in the low half.
STOKER_TARGET_AVX2_FMA inline __m128i bytes8(__m256i v) {
  const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  return _mm_packus_epi16(w, w);
}

// Three channels of 8 pixels (int32 in [0, 255]) stored as 24 bytes of RGB.
STOKER_TARGET_AVX2_FMA inline void store_rgb8(uint8_t* p, __m256i r, __m256i g, __m256i b) {
  const __m128i rg = _mm_unpacklo_epi64(bytes8(r), bytes8(g));  // R0-7 G0-7
  const __m128i bb = bytes8(b);
  const __m128i lo = _mm_or_si128(
      _mm_shuffle_epi8(rg, _mm_setr_epi8(0, 8, -1, 1, 9, -1, 2, 10, -1, 3, 11, -1, 4, 12, -1, 5)),
      _mm_shuffle_epi8(bb,
                       _mm_setr_epi8(-1, -1, 0, -1, -1, 1, -1, -1, 2, -1, -1, 3, -1, -1, 4, -1)));
  const __m128i hi = _mm_or_si128(
      _mm_shuffle_epi8(rg,
                       _mm_setr_epi8(13, -1, 6, 14, -1, 7, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1)),
      _mm_shuffle_epi8(bb,
                       _mm_setr_epi8(-1, 5, -1, -1, 6, -1, -1, 7, -1, -1, -1, -1, -1, -1, -1, -1)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), lo);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p + 16), hi);
}

// luma() of 8 pixels.
STOKER_TARGET_AVX2_FMA inline __m256 luma8(__m256 r, __m256 g, __m256 b) {
  const __m256 red = _mm256_mul_ps(r, _mm256_set1_ps(0.2989f));
  return _mm256_floor_ps(
      _mm256_fmadd_ps(b, _mm256_set1_ps(0.114f), _mm256_fmadd_ps(g, _mm256_set1_ps(0.587f), red)));
}

// blend() of 8 values: to_u8(fma(other, rest, x * ratio)), torch's fused add in one rounding
// (add_scaled works it out in double where there is no FMA instruction).
STOKER_TARGET_AVX2_FMA inline __m256i blend8(__m256 x, __m256 other, __m256 ratio, __m256 rest) {
  const __m256 v = _mm256_fmadd_ps(other, rest, _mm256_mul_ps(x, ratio));
  return _mm256_cvttps_epi32(
      _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(255.0f)));
}

// pil_luma() of 8 pixels in float32: every partial sum is an integer below 2^24 (at most
// 255 x 65536 + 2^15), so exact, and the shift is a product by 2^-16, floored.
STOKER_TARGET_AVX2_FMA inline __m256 pil_luma8(__m256 r, __m256 g, __m256 b) {
  const __m256 sum = _mm256_fmadd_ps(
      b, _mm256_set1_ps(7471.0f),
      _mm256_fmadd_ps(g, _mm256_set1_ps(38470.0f),
                      _mm256_fmadd_ps(r, _mm256_set1_ps(19595.0f), _mm256_set1_ps(32768.0f))));
  return _mm256_floor_ps(_mm256_mul_ps(sum, _mm256_set1_ps(1.0f / 65536.0f)));
}

// pil_blend() of 8 values: a product, then a sum (no FMA), clipped, truncated.
STOKER_TARGET_AVX2_FMA inline __m256i pil_blend8(__m256 degenerate, __m256 value, __m256 alpha) {
  const __m256 v =
      _mm256_add_ps(degenerate, _mm256_mul_ps(alpha, _mm256_sub_ps(value, degenerate)));
  return _mm256_cvttps_epi32(
      _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(255.0f)));
}

// These return how many pixels they did (a multiple of 8); the caller does the rest.
STOKER_TARGET_AVX2_FMA size_t luma_sum_avx2(const uint8_t* p, size_t n, int64_t& sum) {
  size_t k = 0;
  while (k + 8 <= n) {
    // int32 lanes: up to 2^16 steps of 8 values <= 255 before they are added up
    __m256i acc = _mm256_setzero_si256();
    for (size_t steps = 0; steps < 65536 && k + 8 <= n; ++steps, k += 8, p += 24) {
      __m256 r, g, b;
      load_rgb8(p, r, g, b);
      acc = _mm256_add_epi32(acc, _mm256_cvttps_epi32(luma8(r, g, b)));
    }
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
    for (const int32_t v : lanes) sum += v;
  }
  return k;
}

STOKER_TARGET_AVX2_FMA size_t pil_luma_sum_avx2(const uint8_t* p, size_t n, int64_t& sum) {
  size_t k = 0;
  while (k + 8 <= n) {
    __m256i acc = _mm256_setzero_si256();  // as luma_sum_avx2's
    for (size_t steps = 0; steps < 65536 && k + 8 <= n; ++steps, k += 8, p += 24) {
      __m256 r, g, b;
      load_rgb8(p, r, g, b);
      acc = _mm256_add_epi32(acc, _mm256_cvttps_epi32(pil_luma8(r, g, b)));
    }
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
    for (const int32_t v : lanes) sum += v;
  }
  return k;
}

STOKER_TARGET_AVX2_FMA size_t pil_color_avx2(uint8_t* p, size_t n, float alpha) {
  const __m256 a = _mm256_set1_ps(alpha);
  size_t k = 0;
  for (; k + 8 <= n; k += 8, p += 24) {
    __m256 r, g, b;
    load_rgb8(p, r, g, b);
    const __m256 gray = pil_luma8(r, g, b);
    store_rgb8(p, pil_blend8(gray, r, a), pil_blend8(gray, g, a), pil_blend8(gray, b, a));
  }
  return k;
}

STOKER_TARGET_AVX2_FMA size_t saturation_avx2(uint8_t* p, size_t n, float ratio, float rest) {
  const __m256 vr = _mm256_set1_ps(ratio);
  const __m256 vrest = _mm256_set1_ps(rest);
  size_t k = 0;
  for (; k + 8 <= n; k += 8, p += 24) {
    __m256 r, g, b;
    load_rgb8(p, r, g, b);
    const __m256 gray = luma8(r, g, b);
    store_rgb8(p, blend8(r, gray, vr, vrest), blend8(g, gray, vr, vrest),
               blend8(b, gray, vr, vrest));
  }
  return k;
}

// sum_taps() and round_row() (GaussianBlur's rows), 8 floats a step, the same operations.
STOKER_TARGET_AVX2_FMA size_t sum_taps_avx2(float* out, const float* const* srcs, const float* taps,
                                            int count, size_t n) {
  size_t k = 0;
  for (; k + 8 <= n; k += 8) {
    __m256 sum = _mm256_setzero_ps();
    for (int j = 0; j < count; ++j)
      sum = _mm256_add_ps(
          sum, _mm256_mul_ps(_mm256_loadu_ps(srcs[j] + k), _mm256_broadcast_ss(taps + j)));
    _mm256_storeu_ps(out + k, sum);
  }
  return k;
}

STOKER_TARGET_AVX2_FMA size_t round_row_avx2(const float* acc, uint8_t* out, size_t n) {
  const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(255.0f),
               shift = _mm256_set1_ps(8388608.0f);  // round_even's
  size_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 v = _mm256_max_ps(_mm256_loadu_ps(acc + k), zero);
    const __m256 rounded = _mm256_sub_ps(_mm256_add_ps(v, shift), shift);
    const __m256 clamped = _mm256_min_ps(_mm256_max_ps(rounded, zero), top);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + k), bytes8(_mm256_cvttps_epi32(clamped)));
  }
  return k;
}

// std::clamp(x, 0, 1) of 8 floats; b where `take_b`, a elsewhere.
STOKER_TARGET_AVX2_FMA inline __m256 clamp01(__m256 x) {
  return _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(1.0f)), _mm256_setzero_ps());
}
STOKER_TARGET_AVX2_FMA inline __m256 select(__m256 a, __m256 b, __m256 take_b) {
  return _mm256_blendv_ps(a, b, take_b);
}

// adjust_hue() of 8 pixels at a time: the same float32 operations (IEEE division, no FMA),
// fmod(x, 1) as x - trunc(x) (exact for |x| < 2^23) and the sextant's pick as blends.
STOKER_TARGET_AVX2_FMA size_t hue_avx2(uint8_t* p, size_t n, float factor) {
  const __m256 to_unit = _mm256_set1_ps(static_cast<float>(1.0 / 255.0));
  const __m256 sixth = _mm256_set1_ps(static_cast<float>(1.0 / 6.0));
  const __m256 back = _mm256_set1_ps(static_cast<float>(256.0 - 1e-3));
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f),
               four = _mm256_set1_ps(4.0f), six = _mm256_set1_ps(6.0f);
  const __m256 shift = _mm256_set1_ps(factor);
  constexpr int kTrunc = _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC;
  size_t k = 0;
  for (; k + 8 <= n; k += 8, p += 24) {
    __m256 r, g, b;
    load_rgb8(p, r, g, b);
    r = _mm256_mul_ps(r, to_unit), g = _mm256_mul_ps(g, to_unit), b = _mm256_mul_ps(b, to_unit);
    const __m256 maxc = _mm256_max_ps(_mm256_max_ps(r, g), b);
    const __m256 minc = _mm256_min_ps(_mm256_min_ps(r, g), b);
    const __m256 eqc = _mm256_cmp_ps(maxc, minc, _CMP_EQ_OQ);
    const __m256 spread = _mm256_sub_ps(maxc, minc);
    const __m256 sat = _mm256_div_ps(spread, select(maxc, one, eqc));
    const __m256 divisor = select(spread, one, eqc);
    const __m256 rc = _mm256_div_ps(_mm256_sub_ps(maxc, r), divisor);
    const __m256 gc = _mm256_div_ps(_mm256_sub_ps(maxc, g), divisor);
    const __m256 bc = _mm256_div_ps(_mm256_sub_ps(maxc, b), divisor);
    const __m256 max_is_r = _mm256_cmp_ps(maxc, r, _CMP_EQ_OQ);
    const __m256 max_is_g = _mm256_cmp_ps(maxc, g, _CMP_EQ_OQ);
    const __m256 hg = _mm256_mul_ps(_mm256_sub_ps(_mm256_add_ps(rc, two), bc),
                                    _mm256_and_ps(_mm256_andnot_ps(max_is_r, max_is_g), one));
    const __m256 hr = _mm256_mul_ps(_mm256_sub_ps(bc, gc), _mm256_and_ps(max_is_r, one));
    const __m256 hb = _mm256_mul_ps(_mm256_sub_ps(_mm256_add_ps(gc, four), rc),
                                    _mm256_andnot_ps(max_is_r, _mm256_andnot_ps(max_is_g, one)));
    __m256 hue = _mm256_add_ps(_mm256_mul_ps(_mm256_add_ps(_mm256_add_ps(hr, hg), hb), sixth), one);
    hue = _mm256_sub_ps(hue, _mm256_round_ps(hue, kTrunc));
    hue = _mm256_add_ps(hue, shift);
    hue = _mm256_sub_ps(hue, _mm256_round_ps(hue, kTrunc));
    hue = select(hue, _mm256_add_ps(hue, one), _mm256_cmp_ps(hue, zero, _CMP_LT_OQ));
    const __m256 h6 = _mm256_mul_ps(hue, six), sextant = _mm256_floor_ps(h6);
    const __m256 f = _mm256_sub_ps(h6, sextant);
    const __m256 sxf = _mm256_mul_ps(sat, f), one_minus_s = _mm256_sub_ps(one, sat);
    const __m256 v = maxc, pv = clamp01(_mm256_mul_ps(one_minus_s, v));
    const __m256 qv = clamp01(_mm256_mul_ps(_mm256_sub_ps(one, sxf), v));
    const __m256 tv = clamp01(_mm256_mul_ps(_mm256_add_ps(sxf, one_minus_s), v));
    // sextant 6 (a hue that rounded up to 1) is sextant 0
    const __m256 at1 = _mm256_cmp_ps(sextant, one, _CMP_EQ_OQ);
    const __m256 at2 = _mm256_cmp_ps(sextant, two, _CMP_EQ_OQ);
    const __m256 at3 = _mm256_cmp_ps(sextant, _mm256_set1_ps(3.0f), _CMP_EQ_OQ);
    const __m256 at4 = _mm256_cmp_ps(sextant, four, _CMP_EQ_OQ);
    const __m256 at5 = _mm256_cmp_ps(sextant, _mm256_set1_ps(5.0f), _CMP_EQ_OQ);
    // kPick: R {v, q, p, p, t, v}, G {t, v, v, q, p, p}, B {p, p, t, v, v, q}
    const __m256 red = select(select(select(v, qv, at1), pv, _mm256_or_ps(at2, at3)), tv, at4);
    const __m256 green =
        select(select(select(tv, v, _mm256_or_ps(at1, at2)), qv, at3), pv, _mm256_or_ps(at4, at5));
    const __m256 blue = select(select(select(pv, tv, at2), v, _mm256_or_ps(at3, at4)), qv, at5);
    store_rgb8(p, _mm256_cvttps_epi32(_mm256_mul_ps(red, back)),
               _mm256_cvttps_epi32(_mm256_mul_ps(green, back)),
               _mm256_cvttps_epi32(_mm256_mul_ps(blue, back)));
  }
  return k;
}

STOKER_TARGET_AVX2_FMA size_t grayscale_avx2(uint8_t* p, size_t n) {
  size_t k = 0;
  for (; k + 8 <= n; k += 8, p += 24) {
    __m256 r, g, b;
    load_rgb8(p, r, g, b);
    const __m128i gray = bytes8(_mm256_cvttps_epi32(luma8(r, g, b)));  // each value thrice:
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(p),
        _mm_shuffle_epi8(gray, _mm_setr_epi8(0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5)));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p + 16),
                     _mm_shuffle_epi8(gray, _mm_setr_epi8(5, 5, 6, 6, 6, 7, 7, 7, -1, -1, -1, -1,
                                                          -1, -1, -1, -1)));
  }
  return k;
}
// 16 bytes as int16.
STOKER_TARGET_AVX2_FMA inline __m256i words16(const uint8_t* p) {
  return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Sharpness on bytes 3 <= x < 3 + 16 k of a row (`mid`; `up` and `down` its neighbours, all
// the original's): 16 bytes a step, the 3 x 3 sum in int16, then sharpness_value()'s float32
// operations 8 at a time (torchvision's blend, or with kPillow Pillow's). Returns the bytes done.
template <bool kPillow>
STOKER_TARGET_AVX2_FMA size_t sharpness_row_avx2(const uint8_t* up, const uint8_t* mid,
                                                 const uint8_t* down, uint8_t* out, size_t row,
                                                 float alpha) {
  const __m256 a = _mm256_set1_ps(alpha), thirteen = _mm256_set1_ps(13.0f),
               two = _mm256_set1_ps(2.0f), by26 = _mm256_set1_ps(1.0f / 26.0f),
               top = _mm256_set1_ps(255.0f), zero = _mm256_setzero_ps();
  size_t x = 3;
  for (; x + 16 + 3 <= row; x += 16) {
    const __m256i centre = words16(mid + x);
    const __m256i k = _mm256_add_epi16(
        _mm256_add_epi16(_mm256_add_epi16(words16(up + x - 3), words16(up + x)),
                         _mm256_add_epi16(words16(up + x + 3), words16(mid + x - 3))),
        _mm256_add_epi16(
            _mm256_add_epi16(_mm256_add_epi16(words16(mid + x + 3), words16(down + x - 3)),
                             _mm256_add_epi16(words16(down + x), words16(down + x + 3))),
            _mm256_add_epi16(centre, _mm256_slli_epi16(centre, 2))));
    __m256i half[2];
    for (int h = 0; h < 2; ++h) {
      const __m256 sum = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(
          h == 0 ? _mm256_castsi256_si128(k) : _mm256_extracti128_si256(k, 1)));
      const __m256 inner = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(
          h == 0 ? _mm256_castsi256_si128(centre) : _mm256_extracti128_si256(centre, 1)));
      const __m256 smooth =
          _mm256_floor_ps(_mm256_mul_ps(_mm256_fmadd_ps(sum, two, thirteen), by26));
      if constexpr (kPillow) {
        half[h] = pil_blend8(smooth, inner, a);
      } else {
        const __m256 v = _mm256_fmadd_ps(_mm256_sub_ps(smooth, inner), a, inner);
        half[h] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(v, zero), top));
      }
    }
    const __m256i words = _mm256_permute4x64_epi64(_mm256_packus_epi32(half[0], half[1]), 0xD8);
    const __m128i bytes =
        _mm_packus_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + x), bytes);
  }
  return x - 3;
}
#endif

// The sum of the image's luma values (contrast's mean): one pass.
int64_t luma_sum(const uint8_t* p, size_t n) {
  int64_t sum = 0;  // of integers: exact, as torch's float32 sum is while under 2^24
  size_t k = 0;
#ifdef STOKER_AUGMENT_PIXELS_AVX2
  if (detail::use_avx2_fma()) k = luma_sum_avx2(p, n, sum);
#endif
  for (p += 3 * k; k < n; ++k, p += 3) sum += static_cast<int64_t>(luma(p));
  return sum;
}

// The same, of the image as `tables` would make it.
STOKER_TWICE(int64_t, luma_sum_mapped, (const uint8_t* p, size_t n, const detail::Tables& tables),
             (p, n, tables)) {
  int64_t sum = 0;
  for (size_t k = 0; k < n; ++k, p += 3) {
    const uint8_t q[3] = {tables[0][p[0]], tables[1][p[1]], tables[2][p[2]]};
    sum += static_cast<int64_t>(luma(q));
  }
  return sum;
}

// The sum of the image's Pillow luma values (ImageEnhance.Contrast's mean), and of the image as
// `tables` would make it.
int64_t pil_luma_sum(const uint8_t* p, size_t n) {
  int64_t sum = 0;
  size_t k = 0;
#ifdef STOKER_AUGMENT_PIXELS_AVX2
  if (detail::use_avx2_fma()) k = pil_luma_sum_avx2(p, n, sum);
#endif
  for (p += 3 * k; k < n; ++k, p += 3) sum += pil_luma(p);
  return sum;
}

int64_t pil_luma_sum_mapped(const uint8_t* p, size_t n, const detail::Tables& tables) {
  int64_t sum = 0;
  for (size_t k = 0; k < n; ++k, p += 3) {
    const uint8_t q[3] = {tables[0][p[0]], tables[1][p[1]], tables[2][p[2]]};
    sum += pil_luma(q);
  }
  return sum;
}

void count_values(const uint8_t* p, size_t n, int64_t (&counts)[3][256]) {
  // Two pixels a step into two sets of counts: neighbouring pixels, often of one value, then
  // add to different counters instead of waiting on each other's (15-20% faster on photos).
  uint32_t part[2][3][256] = {};  // under 2^32 each: an image is under 2^31 bytes
  size_t k = 0;
  for (; k + 2 <= n; k += 2, p += 6) {
    ++part[0][0][p[0]], ++part[0][1][p[1]], ++part[0][2][p[2]];
    ++part[1][0][p[3]], ++part[1][1][p[4]], ++part[1][2][p[5]];
  }
  if (k < n) ++part[0][0][p[0]], ++part[0][1][p[1]], ++part[0][2][p[2]];
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v) counts[c][v] = int64_t{part[0][c][v]} + part[1][c][v];
}

// A run of point ops (each maps a value to a value through the image's own parameters),
// deferred and fused: one table per channel, computed with each op's own arithmetic over the
// 256 values, composed op after op, and one pass over the image at the end (flush()). An op
// that looks at the image (contrast's mean, autocontrast's range, equalize's histogram) sees it
// as the earlier ops of the run left it: the histograms of the image as the run found it,
// mapped through the tables so far, or for the luma, which mixes the channels, one read of the
// image through them.
class PointOps {
 public:
  explicit PointOps(ImageView image) : image_(image) { reset(); }
  PointOps(const PointOps&) = delete;
  PointOps& operator=(const PointOps&) = delete;
  ~PointOps() = default;

  void brightness(float factor) {
    map_all([&](int v) { return to_u8(static_cast<float>(v) * factor); });
  }

  void contrast(double factor) {
    const size_t n = pixels_of(image_);
    const int64_t sum =
        pending_ ? luma_sum_mapped(image_.pixels, n, tables_) : luma_sum(image_.pixels, n);
    const float mean = static_cast<float>(sum) / static_cast<float>(n);
    const float ratio = static_cast<float>(factor), rest = rest_of(factor);
    map_all([&](int v) { return blend(static_cast<uint8_t>(v), mean, ratio, rest); });
  }

  // Pillow's ImageEnhance.Contrast(image).enhance(factor): a blend with the image's mean Pillow
  // luma as Pillow takes it (ImageStat's sum / count of the L histogram in double, then
  // int(mean + 0.5)), every channel through one table.
  void pil_contrast(double factor) {
    const size_t n = pixels_of(image_);
    const int64_t sum =
        pending_ ? pil_luma_sum_mapped(image_.pixels, n, tables_) : pil_luma_sum(image_.pixels, n);
    const double mean = static_cast<double>(sum) / static_cast<double>(n);
    const auto level = static_cast<float>(static_cast<int>(mean + 0.5));
    const auto alpha = static_cast<float>(factor);
    map_all([&](int v) { return pil_blend(level, static_cast<float>(v), alpha); });
  }

  void posterize(int bits) {
    bits = std::clamp(bits, 0, 8);
    const int mask = ((1 << bits) - 1) << (8 - bits);
    map_all([&](int v) { return static_cast<uint8_t>(v & mask); });
  }

  void solarize(float threshold) {
    map_all([&](int v) {
      return static_cast<uint8_t>(static_cast<float>(v) >= threshold ? 255 - v : v);
    });
  }

  void solarize_add(int add) {  // timm: values below 128 raised by `add`
    map_all([&](int v) {
      return v < 128 ? to_u8(static_cast<float>(v) + static_cast<float>(add))
                     : static_cast<uint8_t>(v);
    });
  }

  void invert() {
    map_all([](int v) { return static_cast<uint8_t>(255 - v); });
  }

  void autocontrast() {
    for (int c = 0; c < 3; ++c) {
      const std::array<int64_t, 256> h = histogram(c);
      int lo = 0, hi = 255;
      while (lo < 255 && h[static_cast<size_t>(lo)] == 0) ++lo;
      while (hi > 0 && h[static_cast<size_t>(hi)] == 0) --hi;
      if (lo >= hi) continue;
      const float low = static_cast<float>(lo);
      const float inv_scale = static_cast<float>(hi - lo) * static_cast<float>(1.0 / 255.0);
      uint8_t t[256];
      for (int v = 0; v < 256; ++v) t[v] = to_u8((static_cast<float>(v) - low) / inv_scale);
      map(c, t);
    }
  }

  // Pillow's ImageOps.autocontrast(image): each channel's [lo, hi] (its lowest and highest
  // values) stretched to [0, 255] with Python's float64 arithmetic, entry by entry:
  // int(v * scale + offset), scale = 255 / (hi - lo), offset = -lo * scale, clipped; a channel
  // with one value kept.
  void pil_autocontrast() {
    for (int c = 0; c < 3; ++c) {
      const std::array<int64_t, 256> h = histogram(c);
      int lo = 0, hi = 255;
      while (lo < 255 && h[static_cast<size_t>(lo)] == 0) ++lo;
      while (hi > 0 && h[static_cast<size_t>(hi)] == 0) --hi;
      if (hi <= lo) continue;
      const double scale = 255.0 / static_cast<double>(hi - lo);
      const double offset = static_cast<double>(-lo) * scale;
      uint8_t t[256];
      for (int v = 0; v < 256; ++v) {
        const auto moved = static_cast<int64_t>(static_cast<double>(v) * scale + offset);
        t[v] = static_cast<uint8_t>(std::clamp<int64_t>(moved, 0, 255));
      }
      map(c, t);
    }
  }

  void equalize() {
    const auto n = static_cast<int64_t>(pixels_of(image_));
    for (int c = 0; c < 3; ++c) {
      const std::array<int64_t, 256> hist = histogram(c);
      int top = 255;
      while (top > 0 && hist[static_cast<size_t>(top)] == 0) --top;  // the top value
      const int64_t step = (n - hist[static_cast<size_t>(top)]) / 255;
      if (step == 0) continue;
      uint8_t t[256];
      t[0] = 0;
      int64_t cum = 0;
      for (int k = 1; k < 256; ++k) {
        cum += hist[static_cast<size_t>(k - 1)];
        t[k] = static_cast<uint8_t>(std::min<int64_t>((cum + step / 2) / step, 255));
      }
      map(c, t);
    }
  }

  // The tables so far, applied: the image is what the ops made it.
  void flush() {
    if (pending_) detail::apply_tables(image_.pixels, pixels_of(image_), tables_);
    reset();
  }

 private:
  void reset() {
    for (auto& table : tables_)
      for (int v = 0; v < 256; ++v) table[static_cast<size_t>(v)] = static_cast<uint8_t>(v);
    pending_ = false;
    counted_ = false;
  }

  template <class F>
  void map_all(F f) {
    uint8_t t[256];
    for (int v = 0; v < 256; ++v) t[v] = f(v);
    for (int c = 0; c < 3; ++c) map(c, t);
  }

  void map(int c, const uint8_t* t) {
    for (uint8_t& v : tables_[static_cast<size_t>(c)]) v = t[v];
    pending_ = true;
  }

  // Channel c's histogram of the image as the ops so far left it.
  std::array<int64_t, 256> histogram(int c) {
    if (!counted_) count_values(image_.pixels, pixels_of(image_), counts_);
    counted_ = true;
    std::array<int64_t, 256> h{};
    for (int v = 0; v < 256; ++v)
      h[tables_[static_cast<size_t>(c)][static_cast<size_t>(v)]] += counts_[c][v];
    return h;
  }

  ImageView image_;
  detail::Tables tables_;
  bool pending_ = false;
  bool counted_ = false;  // counts_ holds the histograms of the image as the run found it
  int64_t counts_[3][256];
};

enum TimmOp : int {
  kAutoContrast,
  kEqualize,
  kInvert,
  kRotate,
  kPosterize,
  kSolarize,
  kSolarizeAdd,
  kColor,
  kContrast,
  kBrightness,
  kSharpness,
  kShearX,
  kShearY,
  kTranslateXRel,
  kTranslateYRel,
  kNumTimmOps
};

constexpr int kTorchvisionOps = 14;

void color_jitter(const ColorJitterOptions& o, ImageView image, uint64_t seed, int64_t epoch,
                  int64_t sample);
void torchvision_augment(const TorchvisionAugmentOptions& o, ImageView image, uint64_t seed,
                         int64_t epoch, int64_t sample, std::vector<uint8_t>& scratch);

bool signed_op(int op) {
  return op == kRotate || op == kShearX || op == kShearY || op == kTranslateXRel ||
         op == kTranslateYRel;
}

// timm's level (0..10) to the op's magnitude (LEVEL_TO_ARG), before the sign.
double timm_magnitude(int op, double level) {
  switch (op) {
    case kRotate: return level / 10.0 * 30.0;
    case kPosterize: return std::trunc(level / 10.0 * 4);
    case kSolarize: return std::trunc(level / 10.0 * 256);
    case kSolarizeAdd: return std::trunc(level / 10.0 * 110);
    case kColor:
    case kContrast:
    case kBrightness:
    case kSharpness: return level / 10.0 * 1.8 + 0.1;
    case kShearX:
    case kShearY: return level / 10.0 * 0.3;
    case kTranslateXRel:
    case kTranslateYRel: return level / 10.0 * 0.45;
    default: return level;
  }
}

// One of timm's ops: a point op joins the run in `points`; any other applies the run first.
void timm_op(PointOps& points, ImageView image, int op, double m,
             const std::array<uint8_t, 3>& fill, Resample filter, std::vector<uint8_t>& scratch) {
  switch (op) {
    case kAutoContrast: return points.pil_autocontrast();
    case kEqualize: return points.equalize();
    case kInvert: return points.invert();
    case kPosterize: return points.posterize(static_cast<int>(std::clamp(m, 0.0, 8.0)));
    case kSolarize: return points.solarize(static_cast<float>(m));
    case kSolarizeAdd: return points.solarize_add(static_cast<int>(std::clamp(m, 0.0, 255.0)));
    case kContrast: return points.pil_contrast(m);
    case kBrightness: return points.brightness(static_cast<float>(m));  // Pillow's too
    default: break;
  }
  points.flush();
  switch (op) {
    case kRotate: pil_rotate(image, m, fill, scratch, filter); break;
    case kColor: pil_color(image, m); break;
    case kSharpness: pil_sharpness(image, m); break;
    case kShearX: pil_affine(image, {1, m, 0, 0, 1, 0}, fill, scratch, filter); break;
    case kShearY: pil_affine(image, {1, 0, 0, m, 1, 0}, fill, scratch, filter); break;
    case kTranslateXRel:
      pil_affine(image, {1, 0, m * image.width, 0, 1, 0}, fill, scratch, filter);
      break;
    case kTranslateYRel:
      pil_affine(image, {1, 0, 0, 0, 1, m * image.height}, fill, scratch, filter);
      break;
    default: break;
  }
}

void timm_rand_augment(const TimmRandAugmentOptions& o, ImageView image, uint64_t seed,
                       int64_t epoch, int64_t sample, std::vector<uint8_t>& scratch) {
  PointOps points(image);
  for (const auto& streams : o.streams) {
    const int op = static_cast<int>(Draw(streams[0], seed, epoch, sample).integers(kNumTimmOps));
    const bool active = Draw(streams[1], seed, epoch, sample).bernoulli(o.prob);
    double level = o.magnitude;
    if (o.magnitude_std > 0) {
      Draw d(streams[2], seed, epoch, sample);
      const double u1 = d.uniform(), u2 = d.uniform();
      const double normal = std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(2 * std::numbers::pi * u2);
      level = level + o.magnitude_std * normal;
    }
    level = std::clamp(level, 0.0, o.magnitude_max);
    double m = timm_magnitude(op, level);
    if (Draw(streams[3], seed, epoch, sample).bernoulli(0.5) && signed_op(op)) m = -m;
    const Resample filter = o.interpolation[static_cast<size_t>(
        Draw(streams[4], seed, epoch, sample)
            .integers(static_cast<int64_t>(o.interpolation.size())))];
    if (active) timm_op(points, image, op, m, o.fill, filter, scratch);
  }
  points.flush();
}

void random_erasing(const RandomErasingOptions& o, ImageView image, uint64_t seed, int64_t epoch,
                    int64_t sample) {
  constexpr int kTries = 10;
  const bool apply = Draw(o.streams[0], seed, epoch, sample).bernoulli(o.p);
  Draw area_draw(o.streams[1], seed, epoch, sample), ratio_draw(o.streams[2], seed, epoch, sample);
  const float area = static_cast<float>(static_cast<double>(image.height) * image.width);
  const double log_r0 = std::log(o.ratio[0]), log_r1 = std::log(o.ratio[1]);
  int64_t h = 0, w = 0;
  bool found = false;
  for (int k = 0; k < kTries; ++k) {  // every try drawn, as the batch op draws all ten
    const float target = area * area_draw.uniform(o.scale[0], o.scale[1]);
    const float aspect = std::exp(ratio_draw.uniform(log_r0, log_r1));
    const auto th = static_cast<int64_t>(std::nearbyint(std::sqrt(target * aspect)));
    const auto tw = static_cast<int64_t>(std::nearbyint(std::sqrt(target / aspect)));
    if (!found && th < image.height && tw < image.width) {
      found = true;
      h = th;
      w = tw;
    }
  }
  Draw at(o.streams[3], seed, epoch, sample);
  const float u_i = at.uniform(), u_j = at.uniform();
  if (!found || !apply) return;
  const int64_t i = std::max<int64_t>(
      0, static_cast<int64_t>(std::floor(u_i * static_cast<float>(image.height - h + 1))));
  const int64_t j = std::max<int64_t>(
      0, static_cast<int64_t>(std::floor(u_j * static_cast<float>(image.width - w + 1))));
  erase(image, i, j, h, w, o.value);
}

void color_jitter(const ColorJitterOptions& o, ImageView image, uint64_t seed, int64_t epoch,
                  int64_t sample) {
  const std::array<std::array<double, 2>, 4> ranges{o.brightness, o.contrast, o.saturation, o.hue};
  float factor[4];
  for (int k = 0; k < 4; ++k)
    factor[k] = Draw(o.streams[k], seed, epoch, sample).uniform(ranges[k][0], ranges[k][1]);
  Draw order_draw(o.streams[4], seed, epoch, sample);
  float keys[4];
  for (float& key : keys) key = order_draw.uniform();
  int order[4] = {0, 1, 2, 3};  // the argsort of four uniforms: a uniform permutation
  std::stable_sort(order, order + 4, [&](int a, int b) { return keys[a] < keys[b]; });
  PointOps points(image);  // brightness and contrast fuse when one follows the other
  for (const int k : order) {
    const double identity = k == 3 ? 0.0 : 1.0;
    if (ranges[k][0] == identity && ranges[k][1] == identity) continue;
    if (k == 0) {
      points.brightness(factor[k]);
    } else if (k == 1) {
      points.contrast(factor[k]);
    } else {
      points.flush();
      if (k == 2)
        adjust_saturation(image, factor[k]);
      else
        adjust_hue(image, factor[k]);
    }
  }
  points.flush();
}

// torchvision's op list (RandAugment, TrivialAugmentWide), in stoker.augment.policies' order.
enum TorchvisionOp : int {
  kTvIdentity,
  kTvShearX,
  kTvShearY,
  kTvTranslateX,
  kTvTranslateY,
  kTvRotate,
  kTvBrightness,
  kTvColor,
  kTvContrast,
  kTvSharpness,
  kTvPosterize,
  kTvSolarize,
  kTvAutoContrast,
  kTvEqualize,
};

// torchvision's _get_inverse_affine_matrix in float64, as stoker.augment.functional computes
// it: rotation `angle`, translation (tx, ty), scale 1, shear (sx, sy) in degrees, about the
// centre (cx, cy) given relative to the image's centre.
std::array<double, 6> inverse_affine(double cx, double cy, double angle, double tx, double ty,
                                     double shear_x, double shear_y) {
  constexpr double kDegToRad = 0.017453292519943295;
  const double rot = angle * kDegToRad, sx = shear_x * kDegToRad, sy = shear_y * kDegToRad;
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -(a * std::tan(sx) + std::sin(rot));
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = std::cos(rot) - c * std::tan(sx);
  const double m0 = d / 1.0, m1 = -b / 1.0, m3 = -c / 1.0, m4 = a / 1.0;
  return {m0, m1, cx - m0 * (cx + tx) - m1 * (cy + ty),
          m3, m4, cy - m3 * (cx + tx) - m4 * (cy + ty)};
}

void torchvision_augment(const TorchvisionAugmentOptions& o, ImageView image, uint64_t seed,
                         int64_t epoch, int64_t sample, std::vector<uint8_t>& scratch) {
  constexpr double kRadToDeg = 57.29577951308232;
  PointOps points(image);
  for (const auto& streams : o.streams) {
    const int op =
        static_cast<int>(Draw(streams[0], seed, epoch, sample).integers(kTorchvisionOps));
    const int64_t bin = o.bins > 1 ? Draw(streams[2], seed, epoch, sample).integers(o.bins) : 0;
    const bool negate = Draw(streams[1], seed, epoch, sample).bernoulli(0.5) && op >= kTvShearX &&
                        op <= kTvSharpness;
    double m = o.magnitudes[static_cast<size_t>(op) * static_cast<size_t>(o.bins) +
                            static_cast<size_t>(bin)];
    if (negate) m = -m;
    const double w = image.width, h = image.height;
    switch (op) {  // a point op joins the run; any other applies the run first
      case kTvBrightness: points.brightness(static_cast<float>(1.0 + m)); continue;
      case kTvContrast: points.contrast(1.0 + m); continue;
      case kTvPosterize: points.posterize(static_cast<int>(std::clamp(m, 0.0, 8.0))); continue;
      case kTvSolarize: points.solarize(static_cast<float>(255.0 * m)); continue;
      case kTvAutoContrast: points.autocontrast(); continue;
      case kTvEqualize: points.equalize(); continue;
      case kTvIdentity: continue;
      default: points.flush();
    }
    switch (op) {
      case kTvShearX:
        torchvision_affine(image,
                           inverse_affine(-w * 0.5, -h * 0.5, 0, 0, 0, std::atan(m) * kRadToDeg, 0),
                           o.fill_outside, o.fill, scratch);
        break;
      case kTvShearY:
        torchvision_affine(image,
                           inverse_affine(-w * 0.5, -h * 0.5, 0, 0, 0, 0, std::atan(m) * kRadToDeg),
                           o.fill_outside, o.fill, scratch);
        break;
      case kTvTranslateX:
        torchvision_affine(image, inverse_affine(0, 0, 0, std::trunc(m), 0, 0, 0), o.fill_outside,
                           o.fill, scratch);
        break;
      case kTvTranslateY:
        torchvision_affine(image, inverse_affine(0, 0, 0, 0, std::trunc(m), 0, 0), o.fill_outside,
                           o.fill, scratch);
        break;
      case kTvRotate: {
        double turn = std::fmod(m, 360.0);  // torch's remainder: the sign of the divisor
        if (turn != 0 && turn < 0) turn += 360.0;
        torchvision_affine(image, inverse_affine(0, 0, -turn, 0, 0, 0, 0), o.fill_outside, o.fill,
                           scratch);
        break;
      }
      case kTvColor: adjust_saturation(image, 1.0 + m); break;
      case kTvSharpness: adjust_sharpness(image, 1.0 + m); break;
      default: break;
    }
  }
  points.flush();
}

}  // namespace

void check(const Step& step) {
  if (step.kind == StepKind::kTimmRandAugment) {
    const auto& o = step.timm_rand_augment;
    STOKER_CHECK(o.prob >= 0 && o.prob <= 1 && o.magnitude_max >= 0 && o.magnitude_std >= 0 &&
                     std::isfinite(o.magnitude) && std::isfinite(o.magnitude_std) &&
                     std::isfinite(o.magnitude_max),
                 ErrorCode::kInvalidArgument,
                 "TimmRandAugment: prob in [0, 1], magnitude_max and magnitude_std finite, >= 0");
    STOKER_CHECK(!o.interpolation.empty() && o.interpolation.size() < 256 &&
                     std::all_of(o.interpolation.begin(), o.interpolation.end(),
                                 [](Resample r) { return r <= Resample::kBicubic; }),
                 ErrorCode::kInvalidArgument,
                 "TimmRandAugment: interpolation holds 1 to 255 of nearest, bilinear, bicubic");
  } else if (step.kind == StepKind::kRandomErasing) {
    const auto& o = step.random_erasing;
    STOKER_CHECK(o.p >= 0 && o.p <= 1 && o.scale[0] >= 0 && o.scale[0] <= o.scale[1] &&
                     o.scale[1] <= 1 && o.ratio[0] > 0 && o.ratio[0] <= o.ratio[1] &&
                     std::isfinite(o.ratio[1]),
                 ErrorCode::kInvalidArgument,
                 "RandomErasing: p in [0, 1], 0 <= scale[0] <= scale[1], 0 < ratio[0] <= ratio[1]");
  } else if (step.kind == StepKind::kColorJitter) {
    const auto& o = step.color_jitter;
    const bool ok = o.brightness[0] >= 0 && o.brightness[0] <= o.brightness[1] &&
                    o.contrast[0] >= 0 && o.contrast[0] <= o.contrast[1] && o.saturation[0] >= 0 &&
                    o.saturation[0] <= o.saturation[1] && o.hue[0] >= -0.5 &&
                    o.hue[0] <= o.hue[1] && o.hue[1] <= 0.5;
    STOKER_CHECK(ok, ErrorCode::kInvalidArgument,
                 "ColorJitter: factor ranges within [0, inf), hue within [-0.5, 0.5]");
  } else if (step.kind == StepKind::kRandomGrayscale) {
    STOKER_CHECK(step.random_grayscale.p >= 0 && step.random_grayscale.p <= 1,
                 ErrorCode::kInvalidArgument, "RandomGrayscale: p in [0, 1]");
  } else if (step.kind == StepKind::kGaussianBlur) {
    const auto& o = step.gaussian_blur;
    STOKER_CHECK(o.kernel_width > 0 && o.kernel_width % 2 == 1 && o.kernel_height > 0 &&
                     o.kernel_height % 2 == 1 && o.kernel_width <= 255 && o.kernel_height <= 255 &&
                     o.sigma_min > 0 && o.sigma_min <= o.sigma_max,
                 ErrorCode::kInvalidArgument,
                 "GaussianBlur: odd kernel sizes up to 255, 0 < sigma min <= max");
  } else {
    const auto& o = step.torchvision_augment;
    STOKER_CHECK(o.bins >= 1 && o.magnitudes.size() == static_cast<size_t>(kTorchvisionOps) *
                                                           static_cast<size_t>(o.bins),
                 ErrorCode::kInvalidArgument, "RandAugment: magnitudes holds 14 ops x bins values");
    for (const double m : o.magnitudes)
      STOKER_CHECK(std::isfinite(m), ErrorCode::kInvalidArgument,
                   "RandAugment: every magnitude must be finite");
  }
}

void apply(const std::vector<Step>& steps, ImageView image, uint64_t seed, int64_t epoch,
           int64_t sample) {
  if (image.width <= 0 || image.height <= 0) return;
  thread_local std::vector<uint8_t> scratch;
  thread_local std::vector<float> planes;
  for (const Step& step : steps) {
    switch (step.kind) {
      case StepKind::kTimmRandAugment:
        timm_rand_augment(step.timm_rand_augment, image, seed, epoch, sample, scratch);
        break;
      case StepKind::kRandomErasing:
        random_erasing(step.random_erasing, image, seed, epoch, sample);
        break;
      case StepKind::kColorJitter:
        color_jitter(step.color_jitter, image, seed, epoch, sample);
        break;
      case StepKind::kRandomGrayscale:
        if (Draw(step.random_grayscale.stream, seed, epoch, sample)
                .bernoulli(step.random_grayscale.p))
          rgb_to_grayscale(image);
        break;
      case StepKind::kGaussianBlur: {
        const auto& o = step.gaussian_blur;
        const float sigma = Draw(o.stream, seed, epoch, sample).uniform(o.sigma_min, o.sigma_max);
        gaussian_blur(image, o.kernel_width, o.kernel_height, sigma, sigma, planes);
        break;
      }
      case StepKind::kTorchvisionAugment:
        torchvision_augment(step.torchvision_augment, image, seed, epoch, sample, scratch);
        break;
    }
  }
}

namespace {

// apply_op's PIL geometry: "pil_rotate", "pil_shear_x", ... with "_bilinear" or "_bicubic" after
// the name for Pillow's filters (nearest without).
void pil_op(ImageView image, std::string_view op, double m, const std::array<uint8_t, 3>& fill,
            std::vector<uint8_t>& scratch) {
  Resample filter = Resample::kNearest;
  for (const auto& [suffix, r] : {std::pair{std::string_view("_bilinear"), Resample::kBilinear},
                                  std::pair{std::string_view("_bicubic"), Resample::kBicubic}}) {
    if (op.ends_with(suffix)) {
      op.remove_suffix(suffix.size());
      filter = r;
    }
  }
  if (op == "pil_rotate")
    pil_rotate(image, m, fill, scratch, filter);
  else if (op == "pil_shear_x")
    pil_affine(image, {1, m, 0, 0, 1, 0}, fill, scratch, filter);
  else if (op == "pil_shear_y")
    pil_affine(image, {1, 0, 0, m, 1, 0}, fill, scratch, filter);
  else if (op == "pil_translate_x")
    pil_affine(image, {1, 0, m, 0, 1, 0}, fill, scratch, filter);
  else if (op == "pil_translate_y")
    pil_affine(image, {1, 0, 0, 0, 1, m}, fill, scratch, filter);
  else
    throw Error(ErrorCode::kInvalidArgument, "no augmentation op named '" + std::string(op) + "'");
}

}  // namespace

void apply_op(ImageView image, std::string_view op, double magnitude,
              const std::array<uint8_t, 3>& fill) {
  if (image.width <= 0 || image.height <= 0) return;
  thread_local std::vector<uint8_t> scratch;
  thread_local std::vector<float> planes;
  constexpr double kRadToDeg = 57.29577951308232;
  const double m = magnitude, w = image.width, h = image.height;
  const auto f = static_cast<float>(m);
  PointOps points(image);
  if (op == "brightness")
    points.brightness(f);
  else if (op == "contrast")
    points.contrast(m);
  else if (op == "posterize")
    points.posterize(static_cast<int>(std::clamp(m, 0.0, 8.0)));
  else if (op == "solarize")
    points.solarize(f);
  else if (op == "solarize_add")
    points.solarize_add(static_cast<int>(std::clamp(m, 0.0, 255.0)));
  else if (op == "invert")
    points.invert();
  else if (op == "autocontrast")
    points.autocontrast();
  else if (op == "equalize")
    points.equalize();
  else if (op == "pil_contrast")
    points.pil_contrast(m);
  else if (op == "pil_autocontrast")
    points.pil_autocontrast();
  else if (op == "pil_color")
    pil_color(image, m);
  else if (op == "pil_sharpness")
    pil_sharpness(image, m);
  else if (op == "saturation")
    adjust_saturation(image, m);
  else if (op == "sharpness")
    adjust_sharpness(image, m);
  else if (op == "hue")
    adjust_hue(image, f);
  else if (op == "grayscale")
    rgb_to_grayscale(image);
  else if (op == "gaussian_blur")
    gaussian_blur(image, 9, 9, f, f, planes);
  else if (op == "rotate")
    torchvision_affine(image, inverse_affine(0, 0, -m, 0, 0, 0, 0), true, fill, scratch);
  else if (op == "shear_x")
    torchvision_affine(image,
                       inverse_affine(-w * 0.5, -h * 0.5, 0, 0, 0, std::atan(m) * kRadToDeg, 0),
                       true, fill, scratch);
  else if (op == "shear_y")
    torchvision_affine(image,
                       inverse_affine(-w * 0.5, -h * 0.5, 0, 0, 0, 0, std::atan(m) * kRadToDeg),
                       true, fill, scratch);
  else if (op == "translate_x")
    torchvision_affine(image, inverse_affine(0, 0, 0, std::trunc(m), 0, 0, 0), true, fill, scratch);
  else if (op == "translate_y")
    torchvision_affine(image, inverse_affine(0, 0, 0, 0, std::trunc(m), 0, 0), true, fill, scratch);
  else if (op.starts_with("pil_"))
    pil_op(image, op, m, fill, scratch);
  else
    throw Error(ErrorCode::kInvalidArgument, "no augmentation op named '" + std::string(op) + "'");
  points.flush();
}

void adjust_brightness(ImageView image, float factor) {
  PointOps ops(image);
  ops.brightness(factor);
  ops.flush();
}

void adjust_saturation(ImageView image, double factor) {
  const float ratio = static_cast<float>(factor), rest = rest_of(factor);
  uint8_t* p = image.pixels;
  const size_t n = pixels_of(image);
  size_t k = 0;
#ifdef STOKER_AUGMENT_PIXELS_AVX2
  if (detail::use_avx2_fma()) k = saturation_avx2(p, n, ratio, rest);
#endif
  for (p += 3 * k; k < n; ++k, p += 3) {
    const float gray = luma(p);
    for (int c = 0; c < 3; ++c) p[c] = blend(p[c], gray, ratio, rest);
  }
}

void adjust_contrast(ImageView image, double factor) {
  PointOps ops(image);
  ops.contrast(factor);
  ops.flush();
}

namespace {

// The sharpness blend at byte x of a row: the 3 x 3 sum k of [[1, 1, 1], [1, 5, 1], [1, 1, 1]],
// smoothed to k / 13 rounded (never within 1 / 26 of a half, so torch's float convolution, and
// Pillow's SMOOTH filter, float32 taps of 1/13 and 5/13 summed to within 1e-3, round the same);
// then torchvision's blend inner + (smooth - inner) alpha in one rounding (alpha = 1 - factor),
// or with kPillow Pillow's, pil_blend(smooth, inner, factor).
template <bool kPillow>
uint8_t sharpness_value(const uint8_t* up, const uint8_t* mid, const uint8_t* down, size_t x,
                        float alpha) {
  const int k = up[x - 3] + up[x] + up[x + 3] + mid[x - 3] + 5 * mid[x] + mid[x + 3] + down[x - 3] +
                down[x] + down[x + 3];
  const float inner = static_cast<float>(mid[x]);
  const float smooth = static_cast<float>((2 * k + 13) / 26);
  if constexpr (kPillow) return pil_blend(smooth, inner, alpha);
  return to_u8(add_scaled(inner, smooth - inner, alpha));
}

// The border rows and columns are kept (torchvision's and Pillow's filters leave them so).
template <bool kPillow>
void sharpen(ImageView image, float alpha) {
  const int w = image.width, h = image.height;
  if (w <= 2 || h <= 2) return;
  const size_t row = static_cast<size_t>(w) * 3;
  thread_local std::vector<uint8_t> original;  // the smoothing reads the original rows
  original.assign(image.pixels, image.pixels + row * h);
  for (int y = 1; y < h - 1; ++y) {
    const uint8_t* up = original.data() + (y - 1) * row;
    const uint8_t* mid = up + row;
    const uint8_t* down = mid + row;
    uint8_t* out = image.pixels + y * row;
    size_t x = 3;
#ifdef STOKER_AUGMENT_PIXELS_AVX2
    if (detail::use_avx2_fma()) x += sharpness_row_avx2<kPillow>(up, mid, down, out, row, alpha);
#endif
    for (; x < row - 3; ++x) out[x] = sharpness_value<kPillow>(up, mid, down, x, alpha);
  }
}

}  // namespace

void adjust_sharpness(ImageView image, double factor) {
  sharpen<false>(image, rest_of(factor));  // torchvision: inner.add_(smooth - inner, alpha)
}

void pil_color(ImageView image, double factor) {
  const auto alpha = static_cast<float>(factor);
  uint8_t* p = image.pixels;
  const size_t n = pixels_of(image);
  size_t k = 0;
#ifdef STOKER_AUGMENT_PIXELS_AVX2
  if (detail::use_avx2_fma()) k = pil_color_avx2(p, n, alpha);
#endif
  for (p += 3 * k; k < n; ++k, p += 3) {
    const auto gray = static_cast<float>(pil_luma(p));
    for (int c = 0; c < 3; ++c) p[c] = pil_blend(gray, static_cast<float>(p[c]), alpha);
  }
}

void pil_contrast(ImageView image, double factor) {
  PointOps ops(image);
  ops.pil_contrast(factor);
  ops.flush();
}

void pil_sharpness(ImageView image, double factor) {
  sharpen<true>(image, static_cast<float>(factor));
}

void pil_autocontrast(ImageView image) {
  PointOps ops(image);
  ops.pil_autocontrast();
  ops.flush();
}

void posterize(ImageView image, int bits) {
  PointOps ops(image);
  ops.posterize(bits);
  ops.flush();
}

void solarize(ImageView image, float threshold) {
  PointOps ops(image);
  ops.solarize(threshold);
  ops.flush();
}

void solarize_add(ImageView image, int add) {
  PointOps ops(image);
  ops.solarize_add(add);
  ops.flush();
}

void invert(ImageView image) {
  PointOps ops(image);
  ops.invert();
  ops.flush();
}

void autocontrast(ImageView image) {
  PointOps ops(image);
  ops.autocontrast();
  ops.flush();
}

void equalize(ImageView image) {
  PointOps ops(image);
  ops.equalize();
  ops.flush();
}

namespace {

// The source image for an affine map: a copy of the image, one byte longer (gather_row reads 4
// bytes a pixel).
const uint8_t* affine_source(ImageView image, std::vector<uint8_t>& scratch) {
  const size_t bytes = pixels_of(image) * 3;
  STOKER_CHECK(bytes < (size_t{1} << 31), ErrorCode::kInvalidArgument,
               "an image to rotate, shear or translate must be under 2 GiB");
  scratch.resize(bytes + 16);  // slack: gathers read 4 bytes a pixel, run copies 16 at once
  std::memcpy(scratch.data(), image.pixels, bytes);
  return scratch.data();
}

// A row of `width` pixels of `fill`, to copy from.
const uint8_t* fill_row(const std::array<uint8_t, 3>& fill, int width) {
  thread_local std::vector<uint8_t> row;
  thread_local std::array<uint8_t, 3> made{};
  const size_t bytes = static_cast<size_t>(width) * 3 + 16;  // slack, as affine_source's
  if (row.size() < bytes || made != fill) {  // made once per fill (a byte loop: 1 us a row)
    row.resize(std::max(bytes, row.size()));
    for (size_t k = 0; k < row.size(); ++k) row[k] = fill[k % 3];
    made = fill;
  }
  return row.data();
}

// Output row `out` as source row `in` (null: outside, all fill) moved sideways: pixel x from
// column x + shift, the fill where that is outside. `in` may be `out` (the pixels moved first).
void shifted_row(uint8_t* out, const uint8_t* in, int shift, int w, const uint8_t* fill) {
  if (in == nullptr || shift >= w || shift <= -w) {
    std::memcpy(out, fill, 3 * static_cast<size_t>(w));
    return;
  }
  const int begin = std::max(0, -shift), end = std::min(w, w - shift);  // 0 <= x + shift < w
  std::memmove(out + 3 * begin, in + 3 * (begin + shift), 3 * static_cast<size_t>(end - begin));
  std::memcpy(out, fill, 3 * static_cast<size_t>(begin));
  std::memcpy(out + 3 * end, fill, 3 * static_cast<size_t>(w - end));
}

// A map that moves each output row sideways as a whole (a shear along x, a translation): row y
// is source row `from` (-1: outside) moved by `shift`; or, where rounding could break the row
// apart (`whole` false), it is mapped pixel by pixel.
struct RowShift {
  int32_t from = -1, shift = 0;
  bool whole = false;
};

// The plan applied: in place where every source row is at or below its output row, or every one
// at or above, and every row moves whole (the rows taken in the order that reads each before it
// is written); otherwise from a copy, `pixelwise(y, source, out)` mapping the rows that do not
// move whole.
template <class Pixelwise>
void apply_row_shifts(ImageView image, const std::vector<RowShift>& plan, const uint8_t* fills,
                      std::vector<uint8_t>& scratch, Pixelwise pixelwise) {
  const int w = image.width, h = image.height;
  const size_t row = static_cast<size_t>(w) * 3;
  bool whole = true, down = true, up = true;
  for (int y = 0; y < h; ++y) {
    const RowShift& r = plan[static_cast<size_t>(y)];
    whole = whole && r.whole;
    if (r.from >= 0) down = down && r.from >= y, up = up && r.from <= y;
  }
  if (whole && (down || up)) {
    for (int k = 0; k < h; ++k) {
      const int y = down ? k : h - 1 - k;
      const RowShift& r = plan[static_cast<size_t>(y)];
      shifted_row(image.pixels + y * row, r.from < 0 ? nullptr : image.pixels + r.from * row,
                  r.shift, w, fills);
    }
    return;
  }
  const uint8_t* source = affine_source(image, scratch);
  for (int y = 0; y < h; ++y) {
    const RowShift& r = plan[static_cast<size_t>(y)];
    uint8_t* out = image.pixels + y * row;
    if (r.whole) {
      shifted_row(out, r.from < 0 ? nullptr : source + r.from * row, r.shift, w, fills);
    } else {
      pixelwise(y, source, out);
    }
  }
}

// `rows` rows of `bytes` bytes, `src` a `src_step` apart to `dst` a `dst_step` apart.
template <class Bytes>
inline void copy_column(uint8_t* dst, size_t dst_step, const uint8_t* src, size_t src_step,
                        int rows, Bytes bytes) {
  for (int y = 0; y < rows; ++y, dst += dst_step, src += src_step) std::memcpy(dst, src, bytes);
}

// A map that moves each output column up or down as a whole (a shear along y): column x reads
// source column `column` (3 times it; -1: outside) from row y + shift[x]. Neighbouring columns
// that read neighbouring source columns at the same shift form a run (a shear by m moves a
// run of 1 / m columns at once: 3.7 at RandAugment's 0.27), copied whole into each row, the
// fill where its source row is outside: an image is then a few thousand short copies, where
// gathering its pixels one by one took an AVX2 gather for every eight.
void apply_column_shifts(ImageView image, const std::vector<int32_t>& columns,
                         const std::vector<int32_t>& shifts, const std::array<uint8_t, 3>& fill,
                         std::vector<uint8_t>& scratch) {
  const int w = image.width, h = image.height;
  const size_t row = static_cast<size_t>(w) * 3;
  const uint8_t* source = affine_source(image, scratch);
  const uint8_t* fills = fill_row(fill, w);
  struct Run {
    int32_t x, bytes, column, shift;  // column -1: every row of the run is the fill
  };
  thread_local std::vector<Run> runs;
  runs.clear();
  for (int32_t x = 0; x < w; ++x) {
    const int32_t column = columns[static_cast<size_t>(x)];
    const int32_t shift = column < 0 ? 0 : shifts[static_cast<size_t>(x)];
    if (!runs.empty()) {
      Run& last = runs.back();
      const bool follows = column < 0 ? last.column < 0
                                      : last.column >= 0 && last.shift == shift &&
                                            last.column + last.bytes == column;
      if (follows) {
        last.bytes += 3;
        continue;
      }
    }
    runs.push_back({x, 3, column, shift});
  }
  // Run by run down the image (its 14 kB of lines stay in L1 for the next run's columns),
  // 16 bytes a row where they fit: the bytes past the run are rewritten by the runs after it,
  // which is why a run within 16 bytes of the row's end copies its own bytes only.
  for (const Run& r : runs) {
    int y0 = 0, y1 = 0;  // the rows whose source is inside; above and below, the fill
    if (r.column >= 0) {
      y0 = std::clamp(-r.shift, 0, h);
      y1 = std::clamp(h - r.shift, y0, h);
    }
    uint8_t* dst = image.pixels + 3 * static_cast<size_t>(r.x);
    const uint8_t* fill = fills + 3 * r.x;
    const uint8_t* src =
        y1 > y0 ? source + static_cast<size_t>(y0 + r.shift) * row + r.column : fill;
    const auto copy = [&](auto bytes) {  // 16 as a constant: one vector move a row
      copy_column(dst, row, fill, 0, y0, bytes);
      copy_column(dst + y0 * row, row, src, row, y1 - y0, bytes);
      copy_column(dst + y1 * row, row, fill, 0, h - y1, bytes);
    };
    if (r.bytes <= 16 && 3 * static_cast<size_t>(r.x) + 16 <= row) {
      copy(std::integral_constant<size_t, 16>{});
    } else {
      copy(static_cast<size_t>(r.bytes));
    }
  }
}

// A shift as an int: a whole row's width or more is as good as any (all fill).
int32_t clamp_shift(double shift, int w) {
  return static_cast<int32_t>(std::clamp(shift, -static_cast<double>(w), static_cast<double>(w)));
}

// The plans of the shortcuts below, built twice (STOKER_TWICE: std::floor and std::nearbyint
// single instructions with AVX2). The bounds scale by powers of two (exact products).

// PIL's shear along x (m0 = 1, m3 = 0), row by row.
STOKER_TWICE(void, pil_row_plan, (const std::array<double, 6>& m, int w, int h, RowShift* plan),
             (m, w, h, plan)) {
  RowShift across;  // the shift along x, the same for every row of a translation (m1 = 0)
  for (int y = 0; y < h; ++y) {
    const double yc = y + 0.5;
    if (y == 0 || m[1] != 0) {
      const double by = m[1] * yc;
      const double first = 0.5 + by + m[2];
      const double fraction = first - std::floor(first);
      const double bound = (w + std::abs(by) + std::abs(m[2]) + 1) * 0x1p-48;
      across = {-1, clamp_shift(std::floor(first), w), fraction > bound && fraction < 1 - bound};
    }
    const double fy = std::floor(0.0 + m[4] * yc + m[5]);
    plan[y] = {fy >= 0 && fy < h ? static_cast<int32_t>(fy) : -1, across.shift, across.whole};
  }
}

// PIL's shear along y (m1 = 0, m4 = 1), column by column: false where a column cannot move whole.
STOKER_TWICE(bool, pil_column_plan,
             (const std::array<double, 6>& m, int w, int h, int32_t* columns, int32_t* shifts),
             (m, w, h, columns, shifts)) {
  for (int x = 0; x < w; ++x) {
    const double xc = x + 0.5;
    const double fx = std::floor(m[0] * xc + 0.0 + m[2]);
    const double first = m[3] * xc + 0.5 + m[5];
    const double fraction = first - std::floor(first);
    const double bound = (h + std::abs(m[3] * xc) + std::abs(m[5]) + 1) * 0x1p-48;
    if (!(fraction > bound && fraction < 1 - bound)) return false;
    columns[x] = fx >= 0 && fx < w ? static_cast<int32_t>(fx) * 3 : -1;
    shifts[x] = clamp_shift(std::floor(first), h);
  }
  return true;
}

// torchvision's shear along x, row by row.
STOKER_TWICE(void, torchvision_row_plan,
             (const std::array<float, 6>& theta, int w, int h, RowShift* plan),
             (theta, w, h, plan)) {
  const float fw = static_cast<float>(w), fh = static_cast<float>(h);
  const float x0 = (1.0f - fw) * 0.5f;
  RowShift across;  // the shift along x, the same for every row of a translation (theta1 = 0)
  for (int y = 0; y < h; ++y) {
    const float yc = static_cast<float>(y) + (1.0f - fh) * 0.5f;
    if (y == 0 || theta[1] != 0) {
      const float gx = x0 * theta[0] + yc * theta[1] + theta[2];
      const float u0 = ((gx + 1.0f) * fw - 1.0f) / 2.0f;
      const double eps = static_cast<double>(w) *
                         (4 + std::abs(gx) + std::abs(yc * theta[1]) + std::abs(theta[2]) +
                          std::abs(x0 * theta[0])) *
                         0x1p-20;
      across = {-1, clamp_shift(std::nearbyint(u0), w),
                std::abs(u0 - std::floor(u0) - 0.5) > 2 * eps};
    }
    const float gy = x0 * theta[3] + yc * theta[4] + theta[5];
    const float iy = std::nearbyint(((gy + 1.0f) * fh - 1.0f) / 2.0f);
    plan[y] = {iy >= 0 && iy < fh ? static_cast<int32_t>(iy) : -1, across.shift, across.whole};
  }
}

// torchvision's shear along y, column by column: false where a column cannot move whole.
STOKER_TWICE(bool, torchvision_column_plan,
             (const std::array<float, 6>& theta, int w, int h, int32_t* columns, int32_t* shifts),
             (theta, w, h, columns, shifts)) {
  const float fw = static_cast<float>(w), fh = static_cast<float>(h);
  const float y0 = (1.0f - fh) * 0.5f;
  for (int x = 0; x < w; ++x) {
    const float xc = static_cast<float>(x) + (1.0f - fw) * 0.5f;
    const float gx = xc * theta[0] + y0 * theta[1] + theta[2];
    const float gy = xc * theta[3] + y0 * theta[4] + theta[5];
    const float ix = std::nearbyint(((gx + 1.0f) * fw - 1.0f) / 2.0f);
    const float v0 = ((gy + 1.0f) * fh - 1.0f) / 2.0f;
    const double eps = static_cast<double>(h) *
                       (4 + std::abs(gy) + std::abs(xc * theta[3]) + std::abs(theta[5]) +
                        std::abs(y0 * theta[4])) *
                       0x1p-20;
    if (!(std::abs(v0 - std::floor(v0) - 0.5) > 2 * eps)) return false;
    columns[x] = ix >= 0 && ix < fw ? static_cast<int32_t>(ix) * 3 : -1;
    shifts[x] = clamp_shift(std::nearbyint(v0), h);
  }
  return true;
}

}  // namespace

namespace {

// Python's round(v, 15): v rounded to 15 decimal places from its exact binary value (glibc's
// printf rounds it so, half to even), read back to the nearest double; for PIL's rotation.
double round15(double v) {
  char text[64];
  std::snprintf(text, sizeof text, "%.15f", v);
  return std::strtod(text, nullptr);
}

}  // namespace

void pil_rotate(ImageView image, double degrees, const std::array<uint8_t, 3>& fill,
                std::vector<uint8_t>& scratch, Resample resample) {
  // Image.rotate: angle % 360.0 (Python's: the divisor's sign), -math.radians(angle), its cos
  // and sin rounded to 15 places, then the centre's move worked out as PIL's Python does.
  double turn = std::fmod(degrees, 360.0);
  turn = turn == 0 ? 0.0 : (turn < 0 ? turn + 360.0 : turn);
  const double angle = -(turn * (std::numbers::pi / 180.0));
  const double cos = round15(std::cos(angle)), sin = round15(std::sin(angle));
  const double cx = image.width / 2.0, cy = image.height / 2.0;
  const double c = cos * -cx + sin * -cy + 0.0, f = -sin * -cx + cos * -cy + 0.0;
  pil_affine(image, {cos, sin, c + cx, -sin, cos, f + cy}, fill, scratch, resample);
}

void pil_affine(ImageView image, const std::array<double, 6>& m, const std::array<uint8_t, 3>& fill,
                std::vector<uint8_t>& scratch, Resample resample) {
  const int w = image.width, h = image.height;
  if (resample != Resample::kNearest) {
    const uint8_t* source = affine_source(image, scratch);
    if (resample == Resample::kBilinear) {
      detail::pil_bilinear_affine(source, image.pixels, m, w, h, fill);
    } else {
      detail::pil_bicubic_affine(source, image.pixels, m, w, h, fill);
    }
    return;
  }
  thread_local std::vector<int32_t> from;
  from.resize(static_cast<size_t>(w));
  auto pixelwise = [&](int y, const uint8_t* source, uint8_t* out) {
    detail::pil_affine_row(m, y, w, h, from.data());
    detail::gather_row(source, from.data(), w, out, fill);
  };
  if (!detail::portable_forced() && m[0] == 1 && m[3] == 0) {
    // A shear along x or a translation: row y reads source row floor((0 + y' m4) + m5) from
    // column floor((x' + y' m1) + m2) = x + floor((0.5 + y' m1) + m2), unless rounding takes a
    // sum across an integer, which it cannot where the first sum's fraction is further than a
    // few ulps of the magnitudes from one.
    thread_local std::vector<RowShift> plan;
    plan.resize(static_cast<size_t>(h));
    pil_row_plan(m, w, h, plan.data());
    return apply_row_shifts(image, plan, fill_row(fill, w), scratch, pixelwise);
  }
  if (!detail::portable_forced() && m[1] == 0 && m[4] == 1) {
    // A shear along y: column x reads source column floor((x' m0 + 0) + m2) from row
    // floor((x' m3 + y') + m5) = y + floor((x' m3 + 0.5) + m5), unless rounding takes a sum
    // across an integer, which it cannot where that sum's fraction is further than a few ulps
    // of the magnitudes from one (else the image is mapped pixel by pixel).
    thread_local std::vector<int32_t> columns, shifts;
    columns.resize(static_cast<size_t>(w));
    shifts.resize(static_cast<size_t>(w));
    const bool whole = pil_column_plan(m, w, h, columns.data(), shifts.data());
    if (whole) return apply_column_shifts(image, columns, shifts, fill, scratch);
  }
  detail::pil_affine_image(affine_source(image, scratch), image.pixels, m, w, h, fill);
}

void erase(ImageView image, int64_t top, int64_t left, int64_t h, int64_t w,
           const std::array<uint8_t, 3>& value) {
  const int64_t y0 = std::max<int64_t>(top, 0), y1 = std::min<int64_t>(top + h, image.height);
  const int64_t x0 = std::max<int64_t>(left, 0), x1 = std::min<int64_t>(left + w, image.width);
  for (int64_t y = y0; y < y1; ++y) {
    uint8_t* p = image.pixels + (y * image.width + x0) * 3;
    for (int64_t x = x0; x < x1; ++x, p += 3) p[0] = value[0], p[1] = value[1], p[2] = value[2];
  }
}

void adjust_hue(ImageView image, float factor) {
  const float to_unit = static_cast<float>(1.0 / 255.0), sixth = static_cast<float>(1.0 / 6.0);
  const float back = static_cast<float>(256.0 - 1e-3);
  uint8_t* p = image.pixels;
  const size_t n = pixels_of(image);
  size_t k = 0;
#ifdef STOKER_AUGMENT_PIXELS_AVX2
  if (detail::use_avx2_fma()) k = hue_avx2(p, n, factor);
#endif
  for (p += 3 * k; k < n; ++k, p += 3) {
    // torchvision's _rgb_to_hsv, op by op in float32
    const float r = static_cast<float>(p[0]) * to_unit, g = static_cast<float>(p[1]) * to_unit,
                b = static_cast<float>(p[2]) * to_unit;
    const float maxc = std::max({r, g, b}), minc = std::min({r, g, b});
    const bool eqc = maxc == minc;
    const float spread = maxc - minc;
    const float sat = spread / (eqc ? 1.0f : maxc);
    const float divisor = eqc ? 1.0f : spread;
    const float rc = (maxc - r) / divisor, gc = (maxc - g) / divisor, bc = (maxc - b) / divisor;
    const bool max_not_r = maxc != r, max_is_g = maxc == g;
    const float hg = (rc + 2.0f - bc) * static_cast<float>(max_is_g && max_not_r);
    const float hr = (bc - gc) * static_cast<float>(!max_not_r);
    const float hb = (gc + 4.0f - rc) * static_cast<float>(max_not_r && !max_is_g);
    float hue = std::fmod((hr + hg + hb) * sixth + 1.0f, 1.0f);
    hue = std::fmod(hue + factor, 1.0f);  // torch's remainder: the sign of the divisor
    if (hue != 0 && hue < 0) hue += 1.0f;
    // torchvision's _hsv_to_rgb
    const float h6 = hue * 6.0f, sextant = std::floor(h6), f = h6 - sextant;
    int64_t i = static_cast<int64_t>(sextant) % 6;
    if (i < 0) i += 6;
    const float sxf = sat * f, one_minus_s = 1.0f - sat, v = maxc;
    const float vpqt[4] = {v, std::clamp(one_minus_s * v, 0.0f, 1.0f),
                           std::clamp((1.0f - sxf) * v, 0.0f, 1.0f),
                           std::clamp((sxf + one_minus_s) * v, 0.0f, 1.0f)};
    static constexpr int kPick[3][6] = {{0, 2, 1, 1, 3, 0}, {3, 0, 0, 2, 1, 1}, {1, 1, 3, 0, 0, 2}};
    for (int c = 0; c < 3; ++c) p[c] = static_cast<uint8_t>(vpqt[kPick[c][i]] * back);
  }
}

void rgb_to_grayscale(ImageView image) {
  uint8_t* p = image.pixels;
  const size_t n = pixels_of(image);
  size_t k = 0;
#ifdef STOKER_AUGMENT_PIXELS_AVX2
  if (detail::use_avx2_fma()) k = grayscale_avx2(p, n);
#endif
  for (p += 3 * k; k < n; ++k, p += 3) p[0] = p[1] = p[2] = static_cast<uint8_t>(luma(p));
}

namespace {

// torchvision's Gaussian taps: a softmax of -x^2 / sigma^2 over x = linspace(-lim, lim, size),
// lim = (size - 1) / (2 sqrt 2), in float32.
std::vector<float> gaussian_taps(int size, float sigma) {
  const auto start = static_cast<float>(-(size - 1) / (2.0 * std::sqrt(2.0)));
  const float end = -start;
  std::vector<float> taps(static_cast<size_t>(size));
  if (size == 1) return {1.0f};
  const float step = (end - start) / static_cast<float>(size - 1);
  const float s2 = sigma * sigma;
  float top = -INFINITY;
  for (int i = 0; i < size; ++i) {
    const float x = i < size / 2 ? start + step * static_cast<float>(i)
                                 : end - step * static_cast<float>(size - 1 - i);
    taps[static_cast<size_t>(i)] = -(x * x) / s2;
    top = std::max(top, taps[static_cast<size_t>(i)]);
  }
  float sum = 0;
  for (float& t : taps) sum += t = std::exp(t - top);
  for (float& t : taps) t /= sum;
  return taps;
}

int reflect(int i, int n) {  // torch's reflect padding (no edge repeat), folded until inside
  if (n == 1) return 0;
  while (i < 0 || i >= n) i = i < 0 ? -i : 2 * (n - 1) - i;
  return i;
}

}  // namespace

// out[k] = the sum over j < count of srcs[j][k] * taps[j], added in tap order from 0 (each a
// product, then a sum, as torch's convolution adds them: no FMA), for k < n.
void sum_taps(float* out, const float* const* srcs, const float* taps, int count, size_t n) {
  size_t k = 0;
#ifdef STOKER_AUGMENT_PIXELS_AVX2
  if (detail::use_avx2_fma()) k = sum_taps_avx2(out, srcs, taps, count, n);
#endif
  for (; k < n; ++k) {
    float sum = 0.0f;
    for (int j = 0; j < count; ++j) sum += srcs[j][k] * taps[j];
    out[k] = sum;
  }
}

// out[k] = to_u8(round_even(max(acc[k], 0))) for k < n.
void round_row(const float* acc, uint8_t* out, size_t n) {
  size_t k = 0;
#ifdef STOKER_AUGMENT_PIXELS_AVX2
  if (detail::use_avx2_fma()) k = round_row_avx2(acc, out, n);
#endif
  for (; k < n; ++k) out[k] = to_u8(round_even(std::max(acc[k], 0.0f)));
}

void gaussian_blur(ImageView image, int kernel_width, int kernel_height, float sigma_x,
                   float sigma_y, std::vector<float>& scratch) {
  const int w = image.width, h = image.height;
  const std::vector<float> kx = gaussian_taps(kernel_width, sigma_x),
                           ky = gaussian_taps(kernel_height, sigma_y);
  const int rx = kernel_width / 2, ry = kernel_height / 2;
  const size_t row = static_cast<size_t>(w) * 3, padded = static_cast<size_t>(w + 2 * rx) * 3;
  // Each output value sums its taps in tap order: the horizontal pass over a reflect-padded
  // float row, into float rows, then the vertical pass over those rows, rounded back to bytes.
  scratch.assign(row * static_cast<size_t>(h) + padded + row, 0.0f);
  float* rows = scratch.data();
  float* line = rows + row * static_cast<size_t>(h);
  float* acc = line + padded;
  thread_local std::vector<const float*> srcs;
  srcs.resize(static_cast<size_t>(std::max(kernel_width, kernel_height)));
  for (int y = 0; y < h; ++y) {
    const uint8_t* in = image.pixels + y * row;
    for (size_t k = 0; k < row; ++k) line[3 * static_cast<size_t>(rx) + k] = in[k];
    for (int d = 1; d <= rx; ++d) {  // the padding: columns -d and w - 1 + d
      for (const int x : {-d, w - 1 + d}) {
        const uint8_t* from = in + reflect(x, w) * 3;
        float* to = line + (x + rx) * 3;
        to[0] = from[0], to[1] = from[1], to[2] = from[2];
      }
    }
    for (int j = 0; j < kernel_width; ++j) srcs[static_cast<size_t>(j)] = line + j * 3;
    sum_taps(rows + y * row, srcs.data(), kx.data(), kernel_width, row);
  }
  for (int y = 0; y < h; ++y) {
    for (int j = 0; j < kernel_height; ++j)
      srcs[static_cast<size_t>(j)] = rows + static_cast<size_t>(reflect(y + j - ry, h)) * row;
    sum_taps(acc, srcs.data(), ky.data(), kernel_height, row);
    round_row(acc, image.pixels + y * row, row);
  }
}

void torchvision_affine(ImageView image, const std::array<double, 6>& m, bool fill_outside,
                        const std::array<uint8_t, 3>& fill, std::vector<uint8_t>& scratch) {
  // _resample: the output grid (centred pixel coordinates) times theta^T / (w / 2, h / 2) in
  // float32, then grid_sample's nearest pixel (align_corners=False).
  const int w = image.width, h = image.height;
  const float sx = 0.5f * static_cast<float>(w), sy = 0.5f * static_cast<float>(h);
  const std::array<float, 6> theta{static_cast<float>(m[0]) / sx, static_cast<float>(m[1]) / sx,
                                   static_cast<float>(m[2]) / sx, static_cast<float>(m[3]) / sy,
                                   static_cast<float>(m[4]) / sy, static_cast<float>(m[5]) / sy};
  const std::array<uint8_t, 3> outside = fill_outside ? fill : std::array<uint8_t, 3>{0, 0, 0};
  thread_local std::vector<int32_t> from;
  from.resize(static_cast<size_t>(w));
  auto pixelwise = [&](int y, const uint8_t* source, uint8_t* out) {
    detail::torchvision_affine_row(theta, y, w, h, from.data());
    detail::gather_row(source, from.data(), w, out, outside);
  };
  if (!detail::portable_forced() && m[0] == 1 && m[3] == 0) {
    // A shear along x or a translation: column x + 0.5 - w / 2 maps to a float within eps of
    // u0 + x, u0 the row's first, eps under 2^-20 of w times the terms' magnitudes (float32's
    // rounding of theta and of each step); where u0 is further than 2 eps from a half, every x
    // rounds to x + round(u0). The source row is the same for every x (x t01 is +-0).
    thread_local std::vector<RowShift> plan;
    plan.resize(static_cast<size_t>(h));
    torchvision_row_plan(theta, w, h, plan.data());
    return apply_row_shifts(image, plan, fill_row(outside, w), scratch, pixelwise);
  }
  if (!detail::portable_forced() && m[1] == 0 && m[4] == 1) {
    // A shear along y: column x's source column is the same for every y (y t10 is +-0), its
    // row within eps of v0 + y, v0 its value at y = 0 (as for a shear along x above, the roles
    // of x and y swapped); where every column's v0 is further than 2 eps from a half, column x
    // reads row y + round(v0).
    thread_local std::vector<int32_t> columns, shifts;
    columns.resize(static_cast<size_t>(w));
    shifts.resize(static_cast<size_t>(w));
    const bool whole = torchvision_column_plan(theta, w, h, columns.data(), shifts.data());
    if (whole) return apply_column_shifts(image, columns, shifts, outside, scratch);
  }
  detail::torchvision_affine_image(affine_source(image, scratch), image.pixels, theta, w, h,
                                   outside);
}

namespace {

// One image's blend, x * w + y * rest rounded half to even, clamped: scalar, and with AVX2 (no
// FMA: two products and a sum, as torch) chosen at run time, as transform/resize.cc does (GCC 12
// does not vectorise the uint8 <-> float conversions of the scalar loop).
void blend_row_scalar(const uint8_t* a, const uint8_t* b, uint8_t* o, int64_t count, float w,
                      float rest) {
  for (int64_t k = 0; k < count; ++k) {
    float v = static_cast<float>(a[k]) * w + static_cast<float>(b[k]) * rest;
    v = round_even(std::max(v, 0.0f));
    o[k] = static_cast<uint8_t>(std::min(v, 255.0f));
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) void blend_row_avx2(const uint8_t* a, const uint8_t* b, uint8_t* o,
                                                    int64_t count, float w, float rest) {
  const __m256 vw = _mm256_set1_ps(w), vr = _mm256_set1_ps(rest);
  const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(255.0f);
  int64_t k = 0;
  for (; k + 8 <= count; k += 8) {
    const __m256 x = _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a + k))));
    const __m256 y = _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + k))));
    __m256 v = _mm256_add_ps(_mm256_mul_ps(x, vw), _mm256_mul_ps(y, vr));
    v = _mm256_round_ps(_mm256_max_ps(v, zero), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i i = _mm256_cvtps_epi32(_mm256_min_ps(v, top));
    const __m128i words =
        _mm_packus_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(o + k), _mm_packus_epi16(words, words));
  }
  blend_row_scalar(a + k, b + k, o + k, count - k, w, rest);
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") != 0;
  return yes;
}
#endif

void blend_row(const uint8_t* a, const uint8_t* b, uint8_t* o, int64_t count, float w, float rest) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (has_avx2()) return blend_row_avx2(a, b, o, count, w, rest);
#endif
  blend_row_scalar(a, b, o, count, w, rest);
}

}  // namespace

void blend_pairs(const uint8_t* images, uint8_t* out, int64_t n, int64_t pixels, int channels,
                 const float* lam, const bool* paste) {
  const int64_t bytes = pixels * channels;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* a = images + i * bytes;
    const uint8_t* b = images + (n - 1 - i) * bytes;
    uint8_t* o = out + i * bytes;
    if (lam == nullptr) {
      std::copy(a, a + bytes, o);
    } else {
      blend_row(a, b, o, bytes, lam[i], 1.0f - lam[i]);
    }
    if (paste == nullptr) continue;
    const bool* where = paste + i * pixels;
    for (int64_t p = 0; p < pixels; ++p)
      if (where[p]) std::copy(b + p * channels, b + (p + 1) * channels, o + p * channels);
  }
}

}  // namespace stoker::augment
