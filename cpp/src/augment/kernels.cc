#include "kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define STOKER_AUGMENT_X86 1
#include <immintrin.h>
#endif

namespace stoker::augment::detail {

namespace {

std::atomic<bool> force_portable{false};
std::atomic<int> affine_gathers{-1};  // set_affine_gathers_for_testing

// Where an affine map puts output pixel (x, y)'s source, in real arithmetic: the pixel
// (floor(u), floor(v)) for u = ux x + uy y + u0 and v = vx x + vy y + v0, which the map's own
// formula, rounding in float, computes to within `slack`.
struct Linear {
  double ux, uy, u0, vx, vy, v0, slack;
};

// PIL's: u = m0 (x + 0.5) + m1 (y + 0.5) + m2, in float64 (its rounding and ours, in the
// constants, far under 2^-46 of the magnitudes).
Linear pil_linear(const std::array<double, 6>& m, int w, int h) {
  const double size = std::abs(m[0]) * (w + 1) + std::abs(m[1]) * (h + 1) + std::abs(m[2]) +
                      std::abs(m[3]) * (w + 1) + std::abs(m[4]) * (h + 1) + std::abs(m[5]) + 1;
  return {m[0],          m[1], 0.5 * (m[0] + m[1]) + m[2], m[3], m[4], 0.5 * (m[3] + m[4]) + m[5],
          size * 0x1p-46};
}

// torchvision's: ix = nearbyint(((g + 1) w - 1) / 2) for g = xc t0 + yc t1 + t2 (xc = x +
// (1 - w) / 2, yc likewise) is floor(u) for u = (g + 1) w / 2, but where u is an integer (a
// tie, which the slack covers). Its float32 steps round each under 2^-24 of terms at most
// (|xc t0| + |yc t1| + |t2| + 1) w: 8 of them bound the slack.
Linear torchvision_linear(const std::array<float, 6>& t, int w, int h) {
  const double x0 = (1.0 - w) * 0.5, y0 = (1.0 - h) * 0.5, hw = 0.5 * w, hh = 0.5 * h;
  const double su = std::abs(x0 * t[0]) + std::abs(y0 * t[1]) + std::abs(t[2]) + 1;
  const double sv = std::abs(x0 * t[3]) + std::abs(y0 * t[4]) + std::abs(t[5]) + 1;
  return {t[0] * hw,
          t[1] * hw,
          (x0 * t[0] + y0 * t[1] + t[2] + 1) * hw,
          t[3] * hh,
          t[4] * hh,
          (x0 * t[3] + y0 * t[4] + t[5] + 1) * hh,
          (std::max(su * w, sv * h) + 1) * 0x1p-21};
}

void apply_tables_portable(uint8_t* p, size_t count, const Tables& tables) {
  const uint8_t* t0 = tables[0].data();
  const uint8_t* t1 = tables[1].data();
  const uint8_t* t2 = tables[2].data();
  for (size_t k = 0; k < count; ++k, p += 3) {
    p[0] = t0[p[0]];
    p[1] = t1[p[1]];
    p[2] = t2[p[2]];
  }
}

void gather_row_portable(const uint8_t* in, const int32_t* from, int width, uint8_t* out,
                         const std::array<uint8_t, 3>& fill) {
  for (int x = 0; x < width; ++x, out += 3) {
    const uint8_t* src = from[x] >= 0 ? in + from[x] : fill.data();
    out[0] = src[0], out[1] = src[1], out[2] = src[2];
  }
}

// The portable forms of the rows' sources: pixels x0 <= x < x1 of row y, from[x - x0].
void pil_affine_row_portable(const std::array<double, 6>& m, int y, int x0, int x1, int w, int h,
                             int32_t* from) {
  const double yc = y + 0.5;
  const double by = m[1] * yc, ey = m[4] * yc;
  const int row = w * 3;
  for (int x = x0; x < x1; ++x) {
    const double xc = x + 0.5;
    const double fx = std::floor(m[0] * xc + by + m[2]);
    const double fy = std::floor(m[3] * xc + ey + m[5]);
    from[x - x0] = fx >= 0 && fx < w && fy >= 0 && fy < h
                       ? static_cast<int32_t>(fy) * row + static_cast<int32_t>(fx) * 3
                       : -1;
  }
}

void torchvision_affine_row_portable(const std::array<float, 6>& t, int y, int x0, int x1, int w,
                                     int h, int32_t* from) {
  const float fw = static_cast<float>(w), fh = static_cast<float>(h);
  const float yc = static_cast<float>(y) + (1.0f - fh) * 0.5f;
  const float shift = (1.0f - fw) * 0.5f;
  const int row = w * 3;
  for (int x = x0; x < x1; ++x) {
    const float xc = static_cast<float>(x) + shift;
    const float gx = xc * t[0] + yc * t[1] + t[2], gy = xc * t[3] + yc * t[4] + t[5];
    const float ix = std::nearbyint(((gx + 1.0f) * fw - 1.0f) / 2.0f);
    const float iy = std::nearbyint(((gy + 1.0f) * fh - 1.0f) / 2.0f);
    from[x - x0] = ix >= 0 && ix < fw && iy >= 0 && iy < fh
                       ? static_cast<int32_t>(iy) * row + static_cast<int32_t>(ix) * 3
                       : -1;
  }
}

#ifdef STOKER_AUGMENT_X86

bool cpu_has_vbmi() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vbmi");
  }();
  return has;
}

bool cpu_has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}

// Intel's cores since Haswell gather 8 dwords in a few cycles; AMD's Zen cores microcode it.
bool cpu_gathers_fast() {
  static const bool fast = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") != 0;
  }();
  return fast;
}

bool cpu_has_avx2_fma() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
}

#define STOKER_VBMI __attribute__((target("avx512f,avx512bw,avx512vbmi")))

// A 256-entry table in four registers: permutex2var picks a byte from the first or the second
// 128 by the index's low 7 bits, the index's top bit chooses which half.
struct Table512 {
  __m512i q[4];
};

STOKER_VBMI inline Table512 load_table(const std::array<uint8_t, 256>& t) {
  Table512 r;
  for (int i = 0; i < 4; ++i) r.q[i] = _mm512_loadu_si512(t.data() + 64 * i);
  return r;
}

STOKER_VBMI inline __m512i look_up(const Table512& t, __m512i v) {
  const __m512i low = _mm512_permutex2var_epi8(t.q[0], v, t.q[1]);
  const __m512i high = _mm512_permutex2var_epi8(t.q[2], v, t.q[3]);
  return _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), low, high);
}

STOKER_VBMI void apply_tables_vbmi(uint8_t* p, size_t count, const Tables& tables) {
  const size_t bytes = count * 3;
  const Table512 t0 = load_table(tables[0]);
  size_t k = 0;
  if (tables[0] == tables[1] && tables[1] == tables[2]) {
    for (; k + 64 <= bytes; k += 64)
      _mm512_storeu_si512(p + k, look_up(t0, _mm512_loadu_si512(p + k)));
    for (; k < bytes; ++k) p[k] = tables[0][p[k]];  // one table: any byte, any channel
    return;
  }
  const Table512 t1 = load_table(tables[1]), t2 = load_table(tables[2]);
  // 192 bytes (64 pixels) a step, three registers whose bytes' channels cycle from 0, 1, 2.
  __mmask64 is1[3] = {0, 0, 0}, is2[3] = {0, 0, 0};
  for (int b = 0; b < 3; ++b) {
    for (int j = 0; j < 64; ++j) {
      const int channel = (64 * b + j) % 3;
      if (channel == 1) is1[b] |= __mmask64{1} << j;
      if (channel == 2) is2[b] |= __mmask64{1} << j;
    }
  }
  for (; k + 192 <= bytes; k += 192) {
    for (int b = 0; b < 3; ++b) {
      const __m512i v = _mm512_loadu_si512(p + k + 64 * b);
      __m512i r = look_up(t0, v);
      r = _mm512_mask_blend_epi8(is1[b], r, look_up(t1, v));
      r = _mm512_mask_blend_epi8(is2[b], r, look_up(t2, v));
      _mm512_storeu_si512(p + k + 64 * b, r);
    }
  }
  apply_tables_portable(p + k, (bytes - k) / 3, tables);
}

// The fill, 8 pixels and more: a chunk of 8 wholly outside takes its first 24 bytes, and a
// pixel copied 4 bytes at a time can read it as a source pixel.
struct FillRun {
  alignas(16) uint8_t bytes[32];
  explicit FillRun(const std::array<uint8_t, 3>& fill) {
    for (int k = 0; k < 32; ++k) bytes[k] = fill[static_cast<size_t>(k % 3)];
  }
};

// Eight pixels of the fill, 24 bytes at `out`.
__attribute__((target("avx2"))) inline void store_fill8(uint8_t* out, const FillRun& fill8) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                   _mm_load_si128(reinterpret_cast<const __m128i*>(fill8.bytes)));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 16),
                   _mm_load_si128(reinterpret_cast<const __m128i*>(fill8.bytes + 16)));
}

// The fill as a gathered lane: its 3 bytes and a 4th that packing drops.
__attribute__((target("avx2"))) inline __m256i fill_lanes(const std::array<uint8_t, 3>& fill) {
  return _mm256_set1_epi32(fill[0] | fill[1] << 8 | fill[2] << 16);
}

// Eight gathered lanes of 4 bytes, a pixel's 3 and one dropped, stored as 24 bytes at `out` and
// 4 more that the next step rewrites (28 in all).
__attribute__((target("avx2"))) inline void store_packed8(uint8_t* out, __m256i lanes) {
  const __m256i pack = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1, 0,
                                        1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  const __m256i px = _mm256_shuffle_epi8(lanes, pack);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(px));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 12), _mm256_extracti128_si256(px, 1));
}

// Eight pixels a step: a chunk whose sources follow each other is two loads, a chunk wholly
// outside the fill; otherwise a gather of 4 bytes at each source (the pixel and the next byte),
// the fill where the source is outside, packed to 24 bytes. Each step stores up to 28 bytes,
// the last 4 rewritten by the next.
__attribute__((target("avx2"))) void gather_row_avx2(const uint8_t* in, const int32_t* from,
                                                     int width, uint8_t* out,
                                                     const std::array<uint8_t, 3>& fill) {
  const __m256i fill4 = fill_lanes(fill);
  const __m256i steps = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
  const __m256i zero = _mm256_setzero_si256();
  const FillRun fill8(fill);
  int x = 0;
  for (; x + 10 <= width; x += 8) {
    const __m256i at = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + x));
    uint8_t* o = out + 3 * x;
    if (_mm256_movemask_ps(_mm256_castsi256_ps(at)) == 0xFF) {  // every source < 0: outside
      store_fill8(o, fill8);
      continue;
    }
    const int32_t first = from[x];
    const __m256i run = _mm256_add_epi32(_mm256_set1_epi32(first), steps);
    if (first >= 0 && _mm256_movemask_epi8(_mm256_cmpeq_epi32(at, run)) == -1) {
      const uint8_t* src = in + first;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(o + 16),
                       _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 16)));
      continue;
    }
    const __m256i outside = _mm256_cmpgt_epi32(zero, at);
    __m256i px = _mm256_i32gather_epi32(reinterpret_cast<const int*>(in),
                                        _mm256_andnot_si256(outside, at), 1);
    store_packed8(o, _mm256_blendv_epi8(px, fill4, outside));
  }
  gather_row_portable(in, from + x, width - x, out + 3 * x, fill);
}

// A pixel's 3 bytes and the byte after it, from `in` to `out`.
inline void copy_pixel4(uint8_t* out, const uint8_t* in) {
  uint32_t pixel;
  std::memcpy(&pixel, in, 4);
  std::memcpy(out, &pixel, 4);
}

// Offsets of the pixels `inside` (all ones) as row * iy + 3 * ix, -1 elsewhere.
__attribute__((target("avx2"))) inline __m128i offsets(__m128i ix, __m128i iy, __m128i inside,
                                                       int row) {
  const __m128i at = _mm_add_epi32(_mm_mullo_epi32(iy, _mm_set1_epi32(row)),
                                   _mm_mullo_epi32(ix, _mm_set1_epi32(3)));
  return _mm_or_si128(_mm_and_si128(inside, at), _mm_andnot_si128(inside, _mm_set1_epi32(-1)));
}

// Offsets (3 w iy + 3 ix) of eight pixels whose source coordinates are whole floats, -1 where
// they fall outside the w x h image.
__attribute__((target("avx2"))) inline __m256i offsets8(__m256 ix, __m256 iy, int w, int h) {
  const __m256 zero = _mm256_setzero_ps(), vw = _mm256_set1_ps(static_cast<float>(w)),
               vh = _mm256_set1_ps(static_cast<float>(h));
  const __m256 in = _mm256_and_ps(
      _mm256_and_ps(_mm256_cmp_ps(ix, zero, _CMP_GE_OQ), _mm256_cmp_ps(ix, vw, _CMP_LT_OQ)),
      _mm256_and_ps(_mm256_cmp_ps(iy, zero, _CMP_GE_OQ), _mm256_cmp_ps(iy, vh, _CMP_LT_OQ)));
  const __m256i inside = _mm256_castps_si256(in);
  const __m256i at = _mm256_add_epi32(
      _mm256_mullo_epi32(_mm256_cvttps_epi32(_mm256_and_ps(iy, in)), _mm256_set1_epi32(3 * w)),
      _mm256_mullo_epi32(_mm256_cvttps_epi32(_mm256_and_ps(ix, in)), _mm256_set1_epi32(3)));
  return _mm256_or_si256(_mm256_and_si256(inside, at),
                         _mm256_andnot_si256(inside, _mm256_set1_epi32(-1)));
}

// PIL's coordinates of four pixels (x' = xc), exactly: the same float64 operations in the same
// order (no FMA).
__attribute__((target("avx2,fma"))) inline void pil_exact4(const std::array<double, 6>& m,
                                                           __m256d by, __m256d ey, __m256d xc,
                                                           int w, int h, int32_t* from) {
  const __m256d zero = _mm256_setzero_pd(), wd = _mm256_set1_pd(w), hd = _mm256_set1_pd(h);
  const __m256d fx = _mm256_floor_pd(_mm256_add_pd(
      _mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(m[0]), xc), by), _mm256_set1_pd(m[2])));
  const __m256d fy = _mm256_floor_pd(_mm256_add_pd(
      _mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(m[3]), xc), ey), _mm256_set1_pd(m[5])));
  const __m256d in = _mm256_and_pd(
      _mm256_and_pd(_mm256_cmp_pd(fx, zero, _CMP_GE_OQ), _mm256_cmp_pd(fx, wd, _CMP_LT_OQ)),
      _mm256_and_pd(_mm256_cmp_pd(fy, zero, _CMP_GE_OQ), _mm256_cmp_pd(fy, hd, _CMP_LT_OQ)));
  // Inside, 0 <= fx < w and 0 <= fy < h convert exactly; outside, 0 stands in.
  const __m128i ix = _mm256_cvttpd_epi32(_mm256_and_pd(fx, in));
  const __m128i iy = _mm256_cvttpd_epi32(_mm256_and_pd(fy, in));
  const __m128i inside = _mm256_cvttpd_epi32(_mm256_and_pd(in, _mm256_set1_pd(-1.0)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(from), offsets(ix, iy, inside, 3 * w));
}

// Eight pixels a step, first in float32: v = x' m0 + (y' m1 + m2) (and the same for y) is
// within `margin` of the float64 value PIL's formula gives (float32's rounding of m0, of the
// row's constant and of the product and sum, each under 2^-24 of the magnitudes, with a factor
// of 4 to spare), so where every v of the eight is further than that from an integer both
// floor to the same integer; otherwise (about 1 pixel in 10^4) the eight are worked out in
// float64 as the portable form does.
__attribute__((target("avx2,fma"))) void pil_affine_row_avx2(const std::array<double, 6>& m, int y,
                                                             int w, int h, int32_t* from) {
  const double yc = y + 0.5;
  const double by = m[1] * yc, ey = m[4] * yc;
  const double cx = by + m[2], cy = ey + m[5];
  const auto margin = [w](double slope, double constant) {
    return static_cast<float>((std::abs(slope) * (w + 1) + std::abs(constant) + 1) * 0x1p-22);
  };
  const float margin_x = margin(m[0], cx), margin_y = margin(m[3], cy);
  int x = 0;
  if (margin_x < 0.125f && margin_y < 0.125f) {
    const __m256 m0 = _mm256_set1_ps(static_cast<float>(m[0]));
    const __m256 m3 = _mm256_set1_ps(static_cast<float>(m[3]));
    const __m256 kx = _mm256_set1_ps(static_cast<float>(cx));
    const __m256 ky = _mm256_set1_ps(static_cast<float>(cy));
    const __m256 low_x = _mm256_set1_ps(margin_x), high_x = _mm256_set1_ps(1.0f - margin_x);
    const __m256 low_y = _mm256_set1_ps(margin_y), high_y = _mm256_set1_ps(1.0f - margin_y);
    const __m256d by4 = _mm256_set1_pd(by), ey4 = _mm256_set1_pd(ey);
    for (; x + 8 <= w; x += 8) {
      const __m256 xc =
          _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(
                            _mm256_set1_epi32(x), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))),
                        _mm256_set1_ps(0.5f));
      const __m256 vx = _mm256_fmadd_ps(xc, m0, kx), vy = _mm256_fmadd_ps(xc, m3, ky);
      const __m256 fx = _mm256_floor_ps(vx), fy = _mm256_floor_ps(vy);
      const __m256 dx = _mm256_sub_ps(vx, fx), dy = _mm256_sub_ps(vy, fy);
      const __m256 sure = _mm256_and_ps(_mm256_and_ps(_mm256_cmp_ps(dx, low_x, _CMP_GT_OQ),
                                                      _mm256_cmp_ps(dx, high_x, _CMP_LT_OQ)),
                                        _mm256_and_ps(_mm256_cmp_ps(dy, low_y, _CMP_GT_OQ),
                                                      _mm256_cmp_ps(dy, high_y, _CMP_LT_OQ)));
      if (_mm256_movemask_ps(sure) != 0xFF) {
        const __m256d xd = _mm256_add_pd(
            _mm256_cvtepi32_pd(_mm_add_epi32(_mm_set1_epi32(x), _mm_setr_epi32(0, 1, 2, 3))),
            _mm256_set1_pd(0.5));
        pil_exact4(m, by4, ey4, xd, w, h, from + x);
        pil_exact4(m, by4, ey4, _mm256_add_pd(xd, _mm256_set1_pd(4.0)), w, h, from + x + 4);
        continue;
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(from + x), offsets8(fx, fy, w, h));
    }
  }
  pil_affine_row_portable(m, y, x, w, w, h, from + x);
}

// Eight pixels a step, the same float32 operations in the same order (no FMA); the rounding
// is nearbyint's (to nearest, ties to even).
__attribute__((target("avx2"))) void torchvision_affine_row_avx2(const std::array<float, 6>& t,
                                                                 int y, int w, int h,
                                                                 int32_t* from) {
  const float fw = static_cast<float>(w), fh = static_cast<float>(h);
  const __m256 yc = _mm256_set1_ps(static_cast<float>(y) + (1.0f - fh) * 0.5f);
  const __m256 shift = _mm256_set1_ps((1.0f - fw) * 0.5f);
  // x / 2 and x * 0.5 are the same float (a power of two), the product cheaper.
  const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
  const __m256 vw = _mm256_set1_ps(fw), vh = _mm256_set1_ps(fh);
  const __m256 ycx = _mm256_mul_ps(yc, _mm256_set1_ps(t[1])),
               ycy = _mm256_mul_ps(yc, _mm256_set1_ps(t[4]));
  const __m256 t0 = _mm256_set1_ps(t[0]), t2 = _mm256_set1_ps(t[2]);
  const __m256 t3 = _mm256_set1_ps(t[3]), t5 = _mm256_set1_ps(t[5]);
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  int x = 0;
  for (; x + 8 <= w; x += 8) {
    const __m256 xc =
        _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(
                          _mm256_set1_epi32(x), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))),
                      shift);
    const __m256 gx = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(xc, t0), ycx), t2);
    const __m256 gy = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(xc, t3), ycy), t5);
    const __m256 ix = _mm256_round_ps(
        _mm256_mul_ps(_mm256_sub_ps(_mm256_mul_ps(_mm256_add_ps(gx, one), vw), one), half),
        kNearest);
    const __m256 iy = _mm256_round_ps(
        _mm256_mul_ps(_mm256_sub_ps(_mm256_mul_ps(_mm256_add_ps(gy, one), vh), one), half),
        kNearest);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(from + x), offsets8(ix, iy, w, h));
  }
  torchvision_affine_row_portable(t, y, x, w, w, h, from + x);
}

// A whole image under a nearest-neighbour affine map, each row's coordinates stepped in fixed
// point and its pixels copied as they are found, eight at a time (the per-row form computes
// them in float, stores them and reads them back: twice the time for a rotation). On AMD the
// copies are scalar, 4 bytes each from offsets taken out of the register: on a Zen 4, 22 us a
// 224 x 224 rotation against 30 with AVX2 gathers (microcoded) and 37-56 with the offsets
// stored and reloaded (store forwarding). On Intel, one masked gather of the 8 pixels: on a
// Xeon (AVX-512), 35 us against 39 with the copies. The image's last 8 pixels, whose 4th byte
// would land past it, are copied 3 bytes each. Output pixel
// (x, y) is source pixel (floor(u), floor(v)) of the map's `Linear` form, kept in F fractional
// bits: U = round(2^F (uy y + u0)) + x round(2^F ux) is within 2^-F (x + 1) / 2 of 2^F u, and
// the formula's float rounding within `slack`; so where U's fraction is further than both from
// an integer, floor(U 2^-F) is the formula's pixel, and the eight where one is not are worked
// out by `exact` (the portable form's arithmetic): at 224 x 224, 1 group in 1,000 for PIL's
// maps, 1 in 110 for torchvision's (its float32 slack is wider). False, having written nothing,
// where the image is too large for the fixed point.
template <class Exact>
__attribute__((target("avx2"))) bool affine_image_avx2(const uint8_t* in, uint8_t* out, int w,
                                                       int h, const Linear& map,
                                                       const std::array<uint8_t, 3>& fill,
                                                       Exact exact) {
  double most = std::max(w, h);
  for (const double x : {0.0, static_cast<double>(w)})
    for (const double y : {0.0, static_cast<double>(h)})
      most = std::max({most, std::abs(map.ux * x + map.uy * y + map.u0),
                       std::abs(map.vx * x + map.vy * y + map.v0)});
  int bits = 22;  // U and V stay under 2^30: no int32 sum overflows
  while (bits >= 12 && most + 2 >= std::ldexp(1.0, 30 - bits)) --bits;
  const double one = std::ldexp(1.0, bits);
  const double margin = (map.slack + (w + 1) * 0.5 / one) * one + 2;
  if (bits < 12 || margin >= one / 64) return false;  // most pixels would take `exact`
  const int32_t near = static_cast<int32_t>(std::ceil(margin));
  const int32_t step_u = static_cast<int32_t>(std::llround(map.ux * one));
  const int32_t step_v = static_cast<int32_t>(std::llround(map.vx * one));
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i lanes_u = _mm256_mullo_epi32(lanes, _mm256_set1_epi32(step_u));
  const __m256i lanes_v = _mm256_mullo_epi32(lanes, _mm256_set1_epi32(step_v));
  const __m256i eight_u = _mm256_set1_epi32(8 * step_u), eight_v = _mm256_set1_epi32(8 * step_v);
  const __m256i fraction = _mm256_set1_epi32((1 << bits) - 1);
  const __m256i near1 = _mm256_set1_epi32(near), near2 = _mm256_set1_epi32(2 * near);
  // 0 <= U < w 2^F, as unsigned: a negative U is above the bound
  const __m256i last_u = _mm256_set1_epi32((w << bits) - 1),
                last_v = _mm256_set1_epi32((h << bits) - 1);
  const __m256i row_bytes = _mm256_set1_epi32(3 * w);
  alignas(32) int32_t exact_from[8];
  const FillRun fill8(fill);
  const __m256i ones = _mm256_set1_epi32(-1);
  const int forced = affine_gathers.load(std::memory_order_relaxed);
  const bool gathers = forced < 0 ? cpu_gathers_fast() : forced == 1;
  const __m256i fill4 = fill_lanes(fill);
  const auto fixed = [one](double value) {  // to nearest (cvtsd2si: llround is a libm call)
    return static_cast<int32_t>(_mm_cvtsd_si64(_mm_set_sd(value * one)));
  };
  for (int y = 0; y < h; ++y) {
    __m256i u = _mm256_add_epi32(_mm256_set1_epi32(fixed(map.uy * y + map.u0)), lanes_u);
    __m256i v = _mm256_add_epi32(_mm256_set1_epi32(fixed(map.vy * y + map.v0)), lanes_v);
    uint8_t* o = out + static_cast<size_t>(y) * 3 * static_cast<size_t>(w);
    int x = 0;
    for (; x + 8 <= w;
         x += 8, o += 24, u = _mm256_add_epi32(u, eight_u), v = _mm256_add_epi32(v, eight_v)) {
      const __m256i doubt = _mm256_or_si256(
          _mm256_cmpgt_epi32(near2, _mm256_and_si256(_mm256_add_epi32(u, near1), fraction)),
          _mm256_cmpgt_epi32(near2, _mm256_and_si256(_mm256_add_epi32(v, near1), fraction)));
      __m256i at, inside;
      if (_mm256_testz_si256(doubt, doubt)) {
        inside = _mm256_and_si256(_mm256_cmpeq_epi32(_mm256_min_epu32(u, last_u), u),
                                  _mm256_cmpeq_epi32(_mm256_min_epu32(v, last_v), v));
        const __m256i ix = _mm256_srai_epi32(u, bits), iy = _mm256_srai_epi32(v, bits);
        at = _mm256_add_epi32(_mm256_mullo_epi32(iy, row_bytes),
                              _mm256_add_epi32(ix, _mm256_add_epi32(ix, ix)));
      } else {
        exact(y, x, x + 8, exact_from);
        at = _mm256_load_si256(reinterpret_cast<const __m256i*>(exact_from));
        inside = _mm256_cmpgt_epi32(at, _mm256_set1_epi32(-1));
      }
      const int lanes_inside = _mm256_movemask_ps(_mm256_castsi256_ps(inside));
      if (lanes_inside == 0) {  // wholly outside
        store_fill8(o, fill8);
        continue;
      }
      if (x + 8 < w || y + 1 < h) {
        // Each pixel's 4th byte is rewritten by the next pixel (the last's by the next chunk,
        // hence not the image's last). Where gathers are fast (Intel), one gather of 4 bytes a
        // lane, the fill where outside, packed to 24 bytes; else eight 4-byte copies.
        if (gathers) {
          store_packed8(o, _mm256_mask_i32gather_epi32(fill4, reinterpret_cast<const int*>(in), at,
                                                       inside, 1));
          continue;
        }
        if (lanes_inside != 0xFF) at = _mm256_or_si256(at, _mm256_xor_si256(inside, ones));
        const __m128i lo = _mm256_castsi256_si128(at), hi = _mm256_extracti128_si256(at, 1);
        const uint64_t a = static_cast<uint64_t>(_mm_cvtsi128_si64(lo)),
                       b = static_cast<uint64_t>(_mm_extract_epi64(lo, 1)),
                       c = static_cast<uint64_t>(_mm_cvtsi128_si64(hi)),
                       d = static_cast<uint64_t>(_mm_extract_epi64(hi, 1));
        const bool all_inside = lanes_inside == 0xFF;
        const auto copy = [&](int k, uint64_t offset) {
          const int32_t from = static_cast<int32_t>(offset);
          copy_pixel4(o + 3 * k, all_inside || from >= 0 ? in + from : fill8.bytes);
        };
        copy(0, a), copy(1, a >> 32), copy(2, b), copy(3, b >> 32);
        copy(4, c), copy(5, c >> 32), copy(6, d), copy(7, d >> 32);
        continue;
      }
      // the image's last 8 pixels: 3 bytes each
      _mm256_store_si256(reinterpret_cast<__m256i*>(exact_from),
                         _mm256_or_si256(at, _mm256_xor_si256(inside, ones)));
      gather_row_portable(in, exact_from, 8, o, fill);
    }
    if (x < w) {
      exact(y, x, w, exact_from);
      gather_row_portable(in, exact_from, w - x, o, fill);
    }
  }
  return true;
}

#endif  // STOKER_AUGMENT_X86

}  // namespace

void apply_tables(uint8_t* pixels, size_t count, const Tables& tables) {
#ifdef STOKER_AUGMENT_X86
  if (cpu_has_vbmi() && !force_portable.load(std::memory_order_relaxed))
    return apply_tables_vbmi(pixels, count, tables);
#endif
  apply_tables_portable(pixels, count, tables);
}

void gather_row(const uint8_t* in, const int32_t* from, int width, uint8_t* out,
                const std::array<uint8_t, 3>& fill) {
#ifdef STOKER_AUGMENT_X86
  if (cpu_has_avx2() && !force_portable.load(std::memory_order_relaxed))
    return gather_row_avx2(in, from, width, out, fill);
#endif
  gather_row_portable(in, from, width, out, fill);
}

void pil_affine_row(const std::array<double, 6>& m, int y, int width, int height, int32_t* from) {
#ifdef STOKER_AUGMENT_X86
  if (cpu_has_avx2_fma() && !force_portable.load(std::memory_order_relaxed))
    return pil_affine_row_avx2(m, y, width, height, from);
#endif
  pil_affine_row_portable(m, y, 0, width, width, height, from);
}

void torchvision_affine_row(const std::array<float, 6>& t, int y, int width, int height,
                            int32_t* from) {
#ifdef STOKER_AUGMENT_X86
  if (cpu_has_avx2() && !force_portable.load(std::memory_order_relaxed))
    return torchvision_affine_row_avx2(t, y, width, height, from);
#endif
  torchvision_affine_row_portable(t, y, 0, width, width, height, from);
}

namespace {

// A whole image: the fused form where it runs, else each row's sources (`row`), then its pixels.
template <class Exact, class Row>
void affine_image(const uint8_t* in, uint8_t* out, int width, int height, const Linear& map,
                  const std::array<uint8_t, 3>& fill, [[maybe_unused]] Exact exact, Row row) {
#ifdef STOKER_AUGMENT_X86
  if (cpu_has_avx2() && !force_portable.load(std::memory_order_relaxed) &&
      affine_image_avx2(in, out, width, height, map, fill, exact))
    return;
#endif
  thread_local std::vector<int32_t> from;
  from.resize(static_cast<size_t>(width));
  for (int y = 0; y < height; ++y) {
    row(y, from.data());
    gather_row(in, from.data(), width, out + static_cast<size_t>(y) * 3 * width, fill);
  }
}

}  // namespace

void pil_affine_image(const uint8_t* in, uint8_t* out, const std::array<double, 6>& m, int width,
                      int height, const std::array<uint8_t, 3>& fill) {
  affine_image(
      in, out, width, height, pil_linear(m, width, height), fill,
      [&](int y, int x0, int x1, int32_t* from) {
        pil_affine_row_portable(m, y, x0, x1, width, height, from);
      },
      [&](int y, int32_t* from) { pil_affine_row(m, y, width, height, from); });
}

void torchvision_affine_image(const uint8_t* in, uint8_t* out, const std::array<float, 6>& t,
                              int width, int height, const std::array<uint8_t, 3>& fill) {
  affine_image(
      in, out, width, height, torchvision_linear(t, width, height), fill,
      [&](int y, int x0, int x1, int32_t* from) {
        torchvision_affine_row_portable(t, y, x0, x1, width, height, from);
      },
      [&](int y, int32_t* from) { torchvision_affine_row(t, y, width, height, from); });
}

bool use_avx2_fma() {
#ifdef STOKER_AUGMENT_X86
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has && !force_portable.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

bool portable_forced() { return force_portable.load(std::memory_order_relaxed); }

void set_portable_kernels_for_testing(bool portable) { force_portable.store(portable); }
void set_affine_gathers_for_testing(int gathers) { affine_gathers.store(gathers); }

}  // namespace stoker::augment::detail
