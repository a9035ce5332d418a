#include "pil_filters.h"

#include <cmath>
#include <cstddef>
#include <cstring>

#include "kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define STOKER_PIL_FILTERS_AVX2 1
#include <immintrin.h>
#endif

namespace stoker::augment::detail {

namespace {

// Pillow's XCLIP and YCLIP: a neighbour past the edge is the edge pixel.
inline int clip(int v, int n) { return v < 0 ? 0 : (v < n ? v : n - 1); }

inline void put_fill(uint8_t* out, const std::array<uint8_t, 3>& fill) {
  out[0] = fill[0], out[1] = fill[1], out[2] = fill[2];
}

// The portable forms: Pillow's filter on one pixel, channel by channel, its operations on its
// types (the first pass's differences of bytes are ints, exact; the rest float64).
struct BilinearPixel {
  const uint8_t* in;
  int w, h;
  size_t row;

  void operator()(int x, int y, double dx, double dy, uint8_t* out) const {
    const uint8_t* r0 = in + static_cast<size_t>(clip(y, h)) * row;
    const uint8_t* r1 = in + static_cast<size_t>(clip(y + 1, h)) * row;
    const size_t x0 = static_cast<size_t>(clip(x, w)) * 3,
                 x1 = static_cast<size_t>(clip(x + 1, w)) * 3;
    for (int c = 0; c < 3; ++c) {
      const double v1 = r0[x0 + c] + (r0[x1 + c] - r0[x0 + c]) * dx;
      const double v2 = r1[x0 + c] + (r1[x1 + c] - r1[x0 + c]) * dx;
      out[c] = static_cast<uint8_t>(v1 + (v2 - v1) * dy);
    }
  }
};

inline double cubic(double v1, double v2, double v3, double v4, double d) {
  const double p1 = v2, p2 = -v1 + v3, p3 = 2 * (v1 - v2) + v3 - v4, p4 = -v1 + v2 - v3 + v4;
  return p1 + d * (p2 + d * (p3 + d * p4));
}

inline double cubic_bytes(const uint8_t* r, const size_t (&xs)[4], int c, double d) {
  const int v1 = r[xs[0] + c], v2 = r[xs[1] + c], v3 = r[xs[2] + c], v4 = r[xs[3] + c];
  const int p2 = -v1 + v3, p3 = 2 * (v1 - v2) + v3 - v4, p4 = -v1 + v2 - v3 + v4;
  return v2 + d * (p2 + d * (p3 + d * p4));
}

struct BicubicPixel {
  const uint8_t* in;
  int w, h;
  size_t row;

  void operator()(int x, int y, double dx, double dy, uint8_t* out) const {
    const size_t xs[4] = {
        static_cast<size_t>(clip(x - 1, w)) * 3, static_cast<size_t>(clip(x, w)) * 3,
        static_cast<size_t>(clip(x + 1, w)) * 3, static_cast<size_t>(clip(x + 2, w)) * 3};
    const uint8_t* rows[4];
    for (int k = 0; k < 4; ++k) rows[k] = in + static_cast<size_t>(clip(y - 1 + k, h)) * row;
    for (int c = 0; c < 3; ++c) {
      const double v = cubic(cubic_bytes(rows[0], xs, c, dx), cubic_bytes(rows[1], xs, c, dx),
                             cubic_bytes(rows[2], xs, c, dx), cubic_bytes(rows[3], xs, c, dx), dy);
      out[c] = v <= 0.0 ? 0 : v >= 255.0 ? 255 : static_cast<uint8_t>(v);
    }
  }
};

// Every output pixel: its source coordinates as Pillow's affine_transform computes them, the
// fill outside, else `pixel` at the sample point's top-left neighbour (x, y) and its offsets.
template <class Pixel>
void affine_portable(uint8_t* out, const std::array<double, 6>& m, int w, int h,
                     const std::array<uint8_t, 3>& fill, const Pixel& pixel) {
  for (int y = 0; y < h; ++y) {
    const double yc = y + 0.5;
    const double by = m[1] * yc, ey = m[4] * yc;
    uint8_t* o = out + static_cast<size_t>(y) * 3 * static_cast<size_t>(w);
    for (int x = 0; x < w; ++x, o += 3) {
      const double xc = x + 0.5;
      const double u = m[0] * xc + by + m[2], v = m[3] * xc + ey + m[5];
      if (u < 0.0 || u >= w || v < 0.0 || v >= h) {
        put_fill(o, fill);
        continue;
      }
      const double fx = std::floor(u - 0.5), fy = std::floor(v - 0.5);
      pixel(static_cast<int>(fx), static_cast<int>(fy), (u - 0.5) - fx, (v - 0.5) - fy, o);
    }
  }
}

#ifdef STOKER_PIL_FILTERS_AVX2

#define STOKER_AVX2 __attribute__((target("avx2")))

// A pixel's three bytes (and the byte after them) as four doubles.
STOKER_AVX2 inline __m256d load_pixel(const uint8_t* p) {
  int32_t word;
  std::memcpy(&word, p, 4);
  return _mm256_cvtepi32_pd(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(word)));
}

// Four doubles in [0, 255] truncated, their first three stored as bytes.
STOKER_AVX2 inline void store_pixel(uint8_t* out, __m256d v) {
  const __m128i i = _mm256_cvttpd_epi32(v);
  const __m128i bytes = _mm_packus_epi16(_mm_packus_epi32(i, i), _mm_setzero_si128());
  const uint32_t word = static_cast<uint32_t>(_mm_cvtsi128_si32(bytes));
  std::memcpy(out, &word, 3);
}

// The forms with AVX2: the three channels of a pixel (and a fourth, unused) in one vector of
// doubles, each operation the portable form's (p2 = -v1 + v3 is v3 - v1, the same double).
struct BilinearPixelAvx2 {
  const uint8_t* in;
  int w, h;
  size_t row;

  STOKER_AVX2 [[gnu::always_inline]] inline void operator()(int x, int y, double dx, double dy,
                                                            uint8_t* out) const {
    const uint8_t* r0 = in + static_cast<size_t>(clip(y, h)) * row;
    const uint8_t* r1 = in + static_cast<size_t>(clip(y + 1, h)) * row;
    const size_t x0 = static_cast<size_t>(clip(x, w)) * 3,
                 x1 = static_cast<size_t>(clip(x + 1, w)) * 3;
    const __m256d vdx = _mm256_set1_pd(dx);
    const __m256d a = load_pixel(r0 + x0), b = load_pixel(r0 + x1);
    const __m256d c = load_pixel(r1 + x0), d = load_pixel(r1 + x1);
    const __m256d v1 = _mm256_add_pd(a, _mm256_mul_pd(_mm256_sub_pd(b, a), vdx));
    const __m256d v2 = _mm256_add_pd(c, _mm256_mul_pd(_mm256_sub_pd(d, c), vdx));
    store_pixel(out, _mm256_add_pd(v1, _mm256_mul_pd(_mm256_sub_pd(v2, v1), _mm256_set1_pd(dy))));
  }
};

STOKER_AVX2 [[gnu::always_inline]] inline __m256d cubic4(__m256d v1, __m256d v2, __m256d v3,
                                                         __m256d v4, __m256d d) {
  const __m256d p2 = _mm256_sub_pd(v3, v1);
  const __m256d p3 = _mm256_sub_pd(
      _mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(2.0), _mm256_sub_pd(v1, v2)), v3), v4);
  const __m256d p4 = _mm256_add_pd(_mm256_sub_pd(_mm256_sub_pd(v2, v1), v3), v4);
  return _mm256_add_pd(
      v2, _mm256_mul_pd(
              d, _mm256_add_pd(p2, _mm256_mul_pd(d, _mm256_add_pd(p3, _mm256_mul_pd(d, p4))))));
}

struct BicubicPixelAvx2 {
  const uint8_t* in;
  int w, h;
  size_t row;

  STOKER_AVX2 [[gnu::always_inline]] inline __m256d across(int y, const size_t (&xs)[4],
                                                           __m256d d) const {
    const uint8_t* r = in + static_cast<size_t>(clip(y, h)) * row;
    return cubic4(load_pixel(r + xs[0]), load_pixel(r + xs[1]), load_pixel(r + xs[2]),
                  load_pixel(r + xs[3]), d);
  }

  STOKER_AVX2 [[gnu::always_inline]] inline void operator()(int x, int y, double dx, double dy,
                                                            uint8_t* out) const {
    const size_t xs[4] = {
        static_cast<size_t>(clip(x - 1, w)) * 3, static_cast<size_t>(clip(x, w)) * 3,
        static_cast<size_t>(clip(x + 1, w)) * 3, static_cast<size_t>(clip(x + 2, w)) * 3};
    const __m256d vdx = _mm256_set1_pd(dx);
    const __m256d v = cubic4(across(y - 1, xs, vdx), across(y, xs, vdx), across(y + 1, xs, vdx),
                             across(y + 2, xs, vdx), _mm256_set1_pd(dy));
    // v <= 0 -> 0, v >= 255 -> 255, else truncated (max and min keep v between)
    store_pixel(out, _mm256_min_pd(_mm256_max_pd(v, _mm256_setzero_pd()), _mm256_set1_pd(255.0)));
  }
};

// affine_portable's coordinates four pixels at a time (the same float64 operations), each
// pixel inside then filtered on its own.
template <class Pixel>
STOKER_AVX2 void affine_avx2(uint8_t* out, const std::array<double, 6>& m, int w, int h,
                             const std::array<uint8_t, 3>& fill, const Pixel& pixel) {
  const __m256d m0 = _mm256_set1_pd(m[0]), m2 = _mm256_set1_pd(m[2]);
  const __m256d m3 = _mm256_set1_pd(m[3]), m5 = _mm256_set1_pd(m[5]);
  const __m256d half = _mm256_set1_pd(0.5), zero = _mm256_setzero_pd();
  const __m256d wd = _mm256_set1_pd(w), hd = _mm256_set1_pd(h);
  const __m256d steps = _mm256_setr_pd(0.5, 1.5, 2.5, 3.5);
  alignas(32) double dxs[4], dys[4];
  alignas(16) int32_t xs[4], ys[4];
  for (int y = 0; y < h; ++y) {
    const double yc = y + 0.5;
    const __m256d by = _mm256_set1_pd(m[1] * yc), ey = _mm256_set1_pd(m[4] * yc);
    uint8_t* o = out + static_cast<size_t>(y) * 3 * static_cast<size_t>(w);
    int x = 0;
    for (; x + 4 <= w; x += 4, o += 12) {
      const __m256d xc = _mm256_add_pd(_mm256_set1_pd(x), steps);  // x + k + 0.5, exact
      const __m256d u = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(m0, xc), by), m2);
      const __m256d v = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(m3, xc), ey), m5);
      const __m256d inside = _mm256_and_pd(
          _mm256_and_pd(_mm256_cmp_pd(u, zero, _CMP_GE_OQ), _mm256_cmp_pd(u, wd, _CMP_LT_OQ)),
          _mm256_and_pd(_mm256_cmp_pd(v, zero, _CMP_GE_OQ), _mm256_cmp_pd(v, hd, _CMP_LT_OQ)));
      const int lanes = _mm256_movemask_pd(inside);
      if (lanes == 0) {
        for (int k = 0; k < 4; ++k) put_fill(o + 3 * k, fill);
        continue;
      }
      const __m256d su = _mm256_sub_pd(u, half), sv = _mm256_sub_pd(v, half);
      // outside lanes are set to 0 first: their coordinates may not fit an int
      const __m256d fx = _mm256_and_pd(_mm256_floor_pd(su), inside);
      const __m256d fy = _mm256_and_pd(_mm256_floor_pd(sv), inside);
      _mm256_store_pd(dxs, _mm256_sub_pd(su, fx));
      _mm256_store_pd(dys, _mm256_sub_pd(sv, fy));
      _mm_store_si128(reinterpret_cast<__m128i*>(xs), _mm256_cvttpd_epi32(fx));
      _mm_store_si128(reinterpret_cast<__m128i*>(ys), _mm256_cvttpd_epi32(fy));
      for (int k = 0; k < 4; ++k) {
        if (lanes >> k & 1) {
          pixel(xs[k], ys[k], dxs[k], dys[k], o + 3 * k);
        } else {
          put_fill(o + 3 * k, fill);
        }
      }
    }
    const double bys = m[1] * yc, eys = m[4] * yc;
    for (; x < w; ++x, o += 3) {
      const double xc = x + 0.5;
      const double u = m[0] * xc + bys + m[2], v = m[3] * xc + eys + m[5];
      if (u < 0.0 || u >= w || v < 0.0 || v >= h) {
        put_fill(o, fill);
        continue;
      }
      const double fx = std::floor(u - 0.5), fy = std::floor(v - 0.5);
      pixel(static_cast<int>(fx), static_cast<int>(fy), (u - 0.5) - fx, (v - 0.5) - fy, o);
    }
  }
}

#undef STOKER_AVX2
#endif  // STOKER_PIL_FILTERS_AVX2

}  // namespace

void pil_bilinear_affine(const uint8_t* in, uint8_t* out, const std::array<double, 6>& m, int width,
                         int height, const std::array<uint8_t, 3>& fill) {
  const size_t row = static_cast<size_t>(width) * 3;
#ifdef STOKER_PIL_FILTERS_AVX2
  if (use_avx2_fma())
    return affine_avx2(out, m, width, height, fill, BilinearPixelAvx2{in, width, height, row});
#endif
  affine_portable(out, m, width, height, fill, BilinearPixel{in, width, height, row});
}

void pil_bicubic_affine(const uint8_t* in, uint8_t* out, const std::array<double, 6>& m, int width,
                        int height, const std::array<uint8_t, 3>& fill) {
  const size_t row = static_cast<size_t>(width) * 3;
#ifdef STOKER_PIL_FILTERS_AVX2
  if (use_avx2_fma())
    return affine_avx2(out, m, width, height, fill, BicubicPixelAvx2{in, width, height, row});
#endif
  affine_portable(out, m, width, height, fill, BicubicPixel{in, width, height, row});
}

}  // namespace stoker::augment::detail
