#include "media/yuv.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace stoker::media::detail {

namespace {
constexpr int kShift = 14;
std::atomic<bool> g_portable{false};

// One row's pixels: luma, and chroma already upsampled to the luma's columns (x 16), to packed
// RGB. The portable form; rgb_row_avx2 gives the same bytes.
void rgb_row_portable(const uint8_t* __restrict luma, const int32_t* __restrict us,
                      const int32_t* __restrict vs, int n, const YuvMatrix& m,
                      uint8_t* __restrict out) {
  for (int i = 0; i < n; ++i) {
    const int32_t l = m.y_scale * (luma[i] - m.y_offset);
    const int32_t u = us[i] - 2048, v = vs[i] - 2048;  // 128 x 16
    out[3 * i] = static_cast<uint8_t>(std::clamp((l + m.r_v * v) >> kShift, 0, 255));
    out[3 * i + 1] =
        static_cast<uint8_t>(std::clamp((l + m.g_u * u + m.g_v * v) >> kShift, 0, 255));
    out[3 * i + 2] = static_cast<uint8_t>(std::clamp((l + m.b_u * u) >> kShift, 0, 255));
  }
}

#if defined(__x86_64__)
// 16 int32 (8 + 8) to 16 bytes, saturated.
__attribute__((target("avx2"), always_inline)) inline __m128i bytes(__m256i a, __m256i b) {
  const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
  return _mm_packus_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
}

// 16 pixels a step: the same int32 arithmetic 8 lanes wide; the two saturating packs clamp to
// 0-255 as std::clamp does; three byte shuffles a plane interleave them.
__attribute__((target("avx2"))) void rgb_row_avx2(const uint8_t* luma, const int32_t* us,
                                                  const int32_t* vs, int n, const YuvMatrix& m,
                                                  uint8_t* out) {
  const __m256i ys = _mm256_set1_epi32(m.y_scale), yo = _mm256_set1_epi32(m.y_offset);
  const __m256i rv = _mm256_set1_epi32(m.r_v), gu = _mm256_set1_epi32(m.g_u);
  const __m256i gv = _mm256_set1_epi32(m.g_v), bu = _mm256_set1_epi32(m.b_u);
  const __m256i half = _mm256_set1_epi32(2048);
  // Output byte k of a 48-byte group is plane k % 3's byte k / 3: the shuffles that place
  // each plane's bytes in the three 16-byte outputs (-1: zero, another plane's place).
  alignas(16) static constexpr int8_t kPlace[3][3][16] = {
      {{0, -1, -1, 1, -1, -1, 2, -1, -1, 3, -1, -1, 4, -1, -1, 5},
       {-1, -1, 6, -1, -1, 7, -1, -1, 8, -1, -1, 9, -1, -1, 10, -1},
       {-1, 11, -1, -1, 12, -1, -1, 13, -1, -1, 14, -1, -1, 15, -1, -1}},
      {{-1, 0, -1, -1, 1, -1, -1, 2, -1, -1, 3, -1, -1, 4, -1, -1},
       {5, -1, -1, 6, -1, -1, 7, -1, -1, 8, -1, -1, 9, -1, -1, 10},
       {-1, -1, 11, -1, -1, 12, -1, -1, 13, -1, -1, 14, -1, -1, 15, -1}},
      {{-1, -1, 0, -1, -1, 1, -1, -1, 2, -1, -1, 3, -1, -1, 4, -1},
       {-1, 5, -1, -1, 6, -1, -1, 7, -1, -1, 8, -1, -1, 9, -1, -1},
       {10, -1, -1, 11, -1, -1, 12, -1, -1, 13, -1, -1, 14, -1, -1, 15}}};
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i r[2], g[2], b[2];
    for (int h = 0; h < 2; ++h) {
      const int k = i + 8 * h;
      const __m256i y8 =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(luma + k)));
      const __m256i l = _mm256_mullo_epi32(ys, _mm256_sub_epi32(y8, yo));
      const __m256i u =
          _mm256_sub_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(us + k)), half);
      const __m256i v =
          _mm256_sub_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vs + k)), half);
      r[h] = _mm256_srai_epi32(_mm256_add_epi32(l, _mm256_mullo_epi32(rv, v)), kShift);
      g[h] = _mm256_srai_epi32(_mm256_add_epi32(_mm256_add_epi32(l, _mm256_mullo_epi32(gu, u)),
                                                _mm256_mullo_epi32(gv, v)),
                               kShift);
      b[h] = _mm256_srai_epi32(_mm256_add_epi32(l, _mm256_mullo_epi32(bu, u)), kShift);
    }
    const __m128i planes[3] = {bytes(r[0], r[1]), bytes(g[0], g[1]), bytes(b[0], b[1])};
    for (int part = 0; part < 3; ++part) {
      __m128i o = _mm_setzero_si128();
      for (int c = 0; c < 3; ++c)
        o = _mm_or_si128(
            o, _mm_shuffle_epi8(planes[c],
                                _mm_load_si128(reinterpret_cast<const __m128i*>(kPlace[c][part]))));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 3 * i + 16 * part), o);
    }
  }
  rgb_row_portable(luma + i, us + i, vs + i, n - i, m, out + 3 * i);
}
#endif

// 4:2:x chroma columns [begin, end) of [0, last] to luma columns: each centred between its
// two, a quarter of the neighbour beyond (the edges repeated), x 4.
void widen_portable(const int32_t* col, int last, int32_t* wide, int begin, int end) {
  for (int c = begin; c < end; ++c) {
    const int before = std::max(c - 1, 0), after = std::min(c + 1, last);
    wide[2 * c] = 3 * col[c] + col[before];
    wide[2 * c + 1] = 3 * col[c] + col[after];
  }
}

#if defined(__x86_64__)
// Columns 1 to last - 1, 8 a step (their neighbours are inside); the edges and the tail by the
// portable loop.
__attribute__((target("avx2"))) void widen_avx2(const int32_t* col, int last, int32_t* wide) {
  widen_portable(col, last, wide, 0, 1);
  int c = 1;
  for (; c + 8 <= last; c += 8) {
    const __m256i here = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + c));
    const __m256i three = _mm256_add_epi32(here, _mm256_add_epi32(here, here));
    const __m256i even =
        _mm256_add_epi32(three, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + c - 1)));
    const __m256i odd =
        _mm256_add_epi32(three, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + c + 1)));
    const __m256i lo = _mm256_unpacklo_epi32(even, odd), hi = _mm256_unpackhi_epi32(even, odd);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(wide + 2 * c),
                        _mm256_permute2x128_si256(lo, hi, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(wide + 2 * c + 8),
                        _mm256_permute2x128_si256(lo, hi, 0x31));
  }
  widen_portable(col, last, wide, c, last + 1);
}
#endif

// Whether the AVX2 forms run: the CPU has AVX2 and the tests have not forced the portable ones.
bool use_avx2() {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 && !g_portable.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void widen(const int32_t* col, int last, int32_t* wide) {
#if defined(__x86_64__)
  if (use_avx2()) return widen_avx2(col, last, wide);
#endif
  widen_portable(col, last, wide, 0, last + 1);
}

void rgb_row(const uint8_t* luma, const int32_t* us, const int32_t* vs, int n, const YuvMatrix& m,
             uint8_t* out) {
#if defined(__x86_64__)
  if (use_avx2()) return rgb_row_avx2(luma, us, vs, n, m, out);
#endif
  rgb_row_portable(luma, us, vs, n, m, out);
}
}  // namespace

void set_portable_yuv_for_testing(bool portable) { g_portable.store(portable); }

YuvMatrix yuv_matrix(bool bt709, bool full_range) {
  const double kr = bt709 ? 0.2126 : 0.299, kb = bt709 ? 0.0722 : 0.114, kg = 1 - kr - kb;
  const double y_scale = full_range ? 1.0 : 255.0 / 219.0;
  const double c_scale = (full_range ? 1.0 : 255.0 / 224.0) / 16.0;  // chroma arrives x 16
  const double one = 1 << kShift;
  auto fixed = [&](double v) { return static_cast<int32_t>(std::lround(v * one)); };
  return YuvMatrix{fixed(y_scale),
                   full_range ? 0 : 16,
                   fixed(2 * (1 - kr) * c_scale),
                   fixed(-2 * kb * (1 - kb) / kg * c_scale),
                   fixed(-2 * kr * (1 - kr) / kg * c_scale),
                   fixed(2 * (1 - kb) * c_scale)};
}

// AVX2 where the CPU has it (32-bit multiplies in vectors), plain x86-64 otherwise: GCC's
// function clones, chosen at load time. Not under TSan: the dynamic loader runs the clones'
// resolver before TSan's runtime has started, and TSan instruments the resolver (a crash at
// load, before main).
#if defined(__SANITIZE_THREAD__)
#define STOKER_YUV_CLONES
#else
#define STOKER_YUV_CLONES __attribute__((target_clones("avx2", "default")))
#endif
STOKER_YUV_CLONES void yuv_to_rgb(const YuvPlanes& p, const YuvMatrix& m, int x0, int y0, int x1,
                                  int y1, uint8_t* rgb, int rgb_stride) {
  if (x1 <= x0 || y1 <= y0) return;
  const int cw = (p.width + (1 << p.chroma_shift_x) - 1) >> p.chroma_shift_x;
  const int ch = (p.height + (1 << p.chroma_shift_y) - 1) >> p.chroma_shift_y;
  const int n = x1 - x0;
  // The chroma of the region's columns for one luma row, x 16: x 4 from each axis' blend (c0 and
  // c1: one chroma column either side of the region, for its edge pixels).
  thread_local std::vector<int32_t> u_col, v_col, u_wide, v_wide;
  const int c0 = std::max((x0 >> p.chroma_shift_x) - 1, 0),
            c1 = std::min(cw, ((x1 - 1) >> p.chroma_shift_x) + 2);
  u_col.resize(static_cast<size_t>(c1 - c0));
  v_col.resize(static_cast<size_t>(c1 - c0));
  u_wide.resize(static_cast<size_t>(c1 - c0) << p.chroma_shift_x);
  v_wide.resize(static_cast<size_t>(c1 - c0) << p.chroma_shift_x);

  for (int y = y0; y < y1; ++y) {
    // Vertical: 4:2:0's chroma rows sit between luma rows: a quarter of the row beyond.
    int a = y >> p.chroma_shift_y, b = a, wa = 4, wb = 0;
    if (p.chroma_shift_y) {
      b = (y & 1) ? std::min(a + 1, ch - 1) : std::max(a - 1, 0);
      wa = 3;
      wb = 1;
    }
    const uint8_t* ua = p.u + static_cast<ptrdiff_t>(a) * p.u_stride;
    const uint8_t* ub = p.u + static_cast<ptrdiff_t>(b) * p.u_stride;
    const uint8_t* va = p.v + static_cast<ptrdiff_t>(a) * p.v_stride;
    const uint8_t* vb = p.v + static_cast<ptrdiff_t>(b) * p.v_stride;
    for (int c = c0; c < c1; ++c) {
      u_col[static_cast<size_t>(c - c0)] = wa * ua[c] + wb * ub[c];
      v_col[static_cast<size_t>(c - c0)] = wa * va[c] + wb * vb[c];
    }
    // Horizontal, likewise: chroma for luma columns [2 * c0, ...), then the region's part.
    const int last = c1 - c0 - 1;
    if (p.chroma_shift_x) {  // centred between their two columns: a quarter beyond
      widen(u_col.data(), last, u_wide.data());
      widen(v_col.data(), last, v_wide.data());
    } else {
      for (int c = 0; c <= last; ++c) {
        u_wide[static_cast<size_t>(c)] = 4 * u_col[static_cast<size_t>(c)];
        v_wide[static_cast<size_t>(c)] = 4 * v_col[static_cast<size_t>(c)];
      }
    }
    const int32_t* __restrict us = u_wide.data() + (x0 - (c0 << p.chroma_shift_x));
    const int32_t* __restrict vs = v_wide.data() + (x0 - (c0 << p.chroma_shift_x));
    const uint8_t* luma = p.y + static_cast<ptrdiff_t>(y) * p.y_stride + x0;
    rgb_row(luma, us, vs, n, m, rgb + static_cast<ptrdiff_t>(y) * rgb_stride + 3 * x0);
  }
}

}  // namespace stoker::media::detail
