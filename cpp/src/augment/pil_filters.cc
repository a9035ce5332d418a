#include "pil_filters.h"

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

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

// The form with AVX2 reads the source as float64, each pixel 4 doubles (R, G, B, 0), converted
// once: a tap is then one aligned load, where converting its bytes took three operations, two
// of them on the one port that also shuffles (the bicubic's 16 taps a pixel were bound there).
STOKER_AVX2 void to_doubles(const uint8_t* in, size_t pixels, double* out) {
  size_t k = 0;
  for (; k + 2 <= pixels; k += 2, in += 6, out += 8) {  // 8 bytes hold 2 pixels and 2 more
    int64_t word;
    std::memcpy(&word, in, 8);
    const __m128i bytes =
        _mm_shuffle_epi8(_mm_cvtsi64_si128(word),
                         _mm_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, -1, -1, -1, -1, -1, -1, -1, -1));
    const __m128i ints = _mm_cvtepu8_epi32(bytes);
    _mm256_store_pd(out, _mm256_cvtepi32_pd(ints));
    _mm256_store_pd(out + 4, _mm256_cvtepi32_pd(_mm_cvtepu8_epi32(_mm_srli_si128(bytes, 4))));
  }
  for (; k < pixels; ++k, in += 3, out += 4) {
    out[0] = in[0], out[1] = in[1], out[2] = in[2], out[3] = 0;
  }
}

// The source as float64 (Doubles), in this thread's buffer, 32-byte aligned.
STOKER_AVX2 const char* float64_image(const uint8_t* in, int w, int h) {
  thread_local std::vector<double> doubles;
  const size_t pixels = static_cast<size_t>(w) * static_cast<size_t>(h);
  doubles.resize(4 * pixels + 4);  // and room to start at 32 bytes
  double* image = doubles.data() + (-(reinterpret_cast<uintptr_t>(doubles.data()) / 8) & 3);
  to_doubles(in, pixels, image);
  return reinterpret_cast<const char*>(image);
}

// Where the taps are read from, and how: a pixel's three values (and a fourth, unused) as four
// doubles at a byte offset. The image's own bytes: 3 a pixel, each tap widened in the register
// (to 64 bits, then 2^52 + v as a double's bits, less 2^52: exact, and one operation on the port
// that shuffles where a conversion from int32 takes two).
struct Bytes {
  static constexpr int32_t kPixel = 3;
  [[gnu::always_inline]] STOKER_AVX2 inline static __m256d at(const char* p) {
    int32_t word;
    std::memcpy(&word, p, 4);
    const __m256i magic = _mm256_set1_epi64x(0x4330000000000000);
    const __m256i wide = _mm256_or_si256(_mm256_cvtepu8_epi64(_mm_cvtsi32_si128(word)), magic);
    return _mm256_sub_pd(_mm256_castsi256_pd(wide), _mm256_castsi256_pd(magic));
  }
};

// The float64 copy (to_doubles): 32 bytes a pixel, each tap one aligned load. For a rotation's
// bicubic (16 taps a pixel, bound by the taps' widening) its cost, a pass writing 32 bytes a
// pixel, pays.
struct Doubles {
  static constexpr int32_t kPixel = 32;
  [[gnu::always_inline]] STOKER_AVX2 inline static __m256d at(const char* p) {
    return _mm256_load_pd(reinterpret_cast<const double*>(p));
  }
};

// Where a pixel's taps are: tap (row k, column j) of its 2 x 2 or 4 x 4 neighbours.
// Inside the image, at fixed steps from the first.
template <class Source>
struct Interior {
  const char* first;
  ptrdiff_t row_bytes;
  [[gnu::always_inline]] STOKER_AVX2 inline __m256d operator()(int k, int j) const {
    return Source::at(first + k * row_bytes + Source::kPixel * j);
  }
};

// At an edge, each row's and column's offset clipped to the image (Pillow's XCLIP, YCLIP).
template <class Source, int kTaps>
struct Clipped {
  const char* image;
  int32_t rows[kTaps], cols[kTaps];
  [[gnu::always_inline]] STOKER_AVX2 inline __m256d operator()(int k, int j) const {
    return Source::at(image + rows[k] + cols[j]);
  }
};

// The filters, the three channels of a pixel (and a fourth, unused) in one vector of doubles,
// each operation the portable form's (p2 = -v1 + v3 is v3 - v1, the same double). Where an
// offset is 0 (every pixel of a shear or a translation has one: the map keeps rows or columns
// on the pixel grid), the pass along it gives its first tap's value exactly (v + (w - v) 0 is
// v; p1 + 0 (...) is p1), so it is skipped: the same bytes, a quarter of the bicubic's work.
struct BilinearAvx2 {
  static constexpr int kTaps = 2, kFirst = 0;

  template <class Tap>
  [[gnu::always_inline]] STOKER_AVX2 inline static __m256d across(const Tap& tap, int k,
                                                                  __m256d d) {
    const __m256d a = tap(k, 0);
    return _mm256_add_pd(a, _mm256_mul_pd(_mm256_sub_pd(tap(k, 1), a), d));
  }

  template <class Tap>
  [[gnu::always_inline]] STOKER_AVX2 inline static __m256d filter(const Tap& tap, double dx,
                                                                  double dy) {
    const __m256d vdx = _mm256_set1_pd(dx);
    if (dy == 0) return across(tap, 0, vdx);
    const __m256d v1 = dx == 0 ? tap(0, 0) : across(tap, 0, vdx);
    const __m256d v2 = dx == 0 ? tap(1, 0) : across(tap, 1, vdx);
    return _mm256_add_pd(v1, _mm256_mul_pd(_mm256_sub_pd(v2, v1), _mm256_set1_pd(dy)));
  }
};

[[gnu::always_inline]] STOKER_AVX2 inline __m256d cubic4(__m256d v1, __m256d v2, __m256d v3,
                                                         __m256d v4, __m256d d) {
  const __m256d p2 = _mm256_sub_pd(v3, v1);
  const __m256d p3 = _mm256_sub_pd(
      _mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(2.0), _mm256_sub_pd(v1, v2)), v3), v4);
  const __m256d p4 = _mm256_add_pd(_mm256_sub_pd(_mm256_sub_pd(v2, v1), v3), v4);
  return _mm256_add_pd(
      v2, _mm256_mul_pd(
              d, _mm256_add_pd(p2, _mm256_mul_pd(d, _mm256_add_pd(p3, _mm256_mul_pd(d, p4))))));
}

struct BicubicAvx2 {
  static constexpr int kTaps = 4, kFirst = -1;

  template <class Tap>
  [[gnu::always_inline]] STOKER_AVX2 inline static __m256d across(const Tap& tap, int k,
                                                                  __m256d d) {
    return cubic4(tap(k, 0), tap(k, 1), tap(k, 2), tap(k, 3), d);
  }

  template <class Tap>
  [[gnu::always_inline]] STOKER_AVX2 inline static __m256d filter(const Tap& tap, double dx,
                                                                  double dy) {
    const __m256d vdx = _mm256_set1_pd(dx);
    __m256d v;
    if (dy == 0) {
      v = across(tap, 1, vdx);
    } else if (dx == 0) {
      v = cubic4(tap(0, 1), tap(1, 1), tap(2, 1), tap(3, 1), _mm256_set1_pd(dy));
    } else {
      v = cubic4(across(tap, 0, vdx), across(tap, 1, vdx), across(tap, 2, vdx), across(tap, 3, vdx),
                 _mm256_set1_pd(dy));
    }
    // v <= 0 -> 0, v >= 255 -> 255, else truncated (max and min keep v between)
    return _mm256_min_pd(_mm256_max_pd(v, _mm256_setzero_pd()), _mm256_set1_pd(255.0));
  }
};

// Four pixels' doubles in [0, 255] (R, G, B, unused each) truncated to 12 bytes of RGB.
STOKER_AVX2 inline __m128i pack4(const __m256d (&v)[4]) {
  const __m128i a = _mm_packus_epi32(_mm256_cvttpd_epi32(v[0]), _mm256_cvttpd_epi32(v[1]));
  const __m128i b = _mm_packus_epi32(_mm256_cvttpd_epi32(v[2]), _mm256_cvttpd_epi32(v[3]));
  return _mm_shuffle_epi8(_mm_packus_epi16(a, b),
                          _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1));
}

// One pixel at (fx, fy) with offsets (dx, dy), its taps clipped to the image.
template <class Filter, class Source>
[[gnu::always_inline]] STOKER_AVX2 inline __m256d clipped(const char* image, int fx, int fy,
                                                          double dx, double dy, int w, int h) {
  Clipped<Source, Filter::kTaps> tap{image, {}, {}};
  for (int j = 0; j < Filter::kTaps; ++j) {
    tap.cols[j] = Source::kPixel * clip(fx + Filter::kFirst + j, w);
    tap.rows[j] = Source::kPixel * w * clip(fy + Filter::kFirst + j, h);
  }
  return Filter::filter(tap, dx, dy);
}

// affine_portable's coordinates four pixels at a time (the same float64 operations); a pixel
// whose taps are all inside the image reads them at fixed steps, one at an edge clips each.
template <class Filter, class Source>
STOKER_AVX2 void affine_avx2(const uint8_t* in, uint8_t* out, const std::array<double, 6>& m, int w,
                             int h, const std::array<uint8_t, 3>& fill) {
  constexpr int kFirst = Filter::kFirst, kLast = Filter::kFirst + Filter::kTaps - 1;
  const char* bytes = reinterpret_cast<const char*>(in);
  if constexpr (std::is_same_v<Source, Doubles>) bytes = float64_image(in, w, h);
  const ptrdiff_t row_bytes = Source::kPixel * static_cast<ptrdiff_t>(w);
  const __m256d fill_v = _mm256_setr_pd(fill[0], fill[1], fill[2], 0);
  const __m256d m0 = _mm256_set1_pd(m[0]), m2 = _mm256_set1_pd(m[2]);
  const __m256d m3 = _mm256_set1_pd(m[3]), m5 = _mm256_set1_pd(m[5]);
  const __m256d half = _mm256_set1_pd(0.5), zero = _mm256_setzero_pd();
  const __m256d wd = _mm256_set1_pd(w), hd = _mm256_set1_pd(h);
  // a pixel's taps are all inside where kFirst <= fx and fx + kLast < w (likewise fy)
  const __m128i low = _mm_set1_epi32(-kFirst - 1), high_x = _mm_set1_epi32(w - kLast),
                high_y = _mm_set1_epi32(h - kLast);
  alignas(32) double dxs[4], dys[4];
  alignas(16) int32_t firsts[4], xs[4], ys[4];
  for (int y = 0; y < h; ++y) {
    const double yc = y + 0.5;
    const double by = m[1] * yc, ey = m[4] * yc;
    const __m256d vby = _mm256_set1_pd(by), vey = _mm256_set1_pd(ey);
    uint8_t* o = out + static_cast<size_t>(y) * 3 * static_cast<size_t>(w);
    __m256d xc = _mm256_setr_pd(0.5, 1.5, 2.5, 3.5);  // x + k + 0.5, exact
    int x = 0;
    for (; x + 4 <= w; x += 4, o += 12, xc = _mm256_add_pd(xc, _mm256_set1_pd(4.0))) {
      const __m256d u = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(m0, xc), vby), m2);
      const __m256d v = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(m3, xc), vey), m5);
      const __m256d inside = _mm256_and_pd(
          _mm256_and_pd(_mm256_cmp_pd(u, zero, _CMP_GE_OQ), _mm256_cmp_pd(u, wd, _CMP_LT_OQ)),
          _mm256_and_pd(_mm256_cmp_pd(v, zero, _CMP_GE_OQ), _mm256_cmp_pd(v, hd, _CMP_LT_OQ)));
      const int lanes = _mm256_movemask_pd(inside);
      __m256d result[4] = {fill_v, fill_v, fill_v, fill_v};
      if (lanes != 0) {
        const __m256d su = _mm256_sub_pd(u, half), sv = _mm256_sub_pd(v, half);
        // outside lanes are set to 0 first: their coordinates may not fit an int
        const __m256d fx = _mm256_and_pd(_mm256_floor_pd(su), inside);
        const __m256d fy = _mm256_and_pd(_mm256_floor_pd(sv), inside);
        _mm256_store_pd(dxs, _mm256_sub_pd(su, fx));
        _mm256_store_pd(dys, _mm256_sub_pd(sv, fy));
        const __m128i ix = _mm256_cvttpd_epi32(fx), iy = _mm256_cvttpd_epi32(fy);
        const __m128i in_x = _mm_and_si128(_mm_cmpgt_epi32(ix, low), _mm_cmplt_epi32(ix, high_x));
        const __m128i in_y = _mm_and_si128(_mm_cmpgt_epi32(iy, low), _mm_cmplt_epi32(iy, high_y));
        const int interior = _mm_movemask_ps(_mm_castsi128_ps(_mm_and_si128(in_x, in_y)));
        const __m128i first =
            _mm_add_epi32(_mm_mullo_epi32(_mm_add_epi32(iy, _mm_set1_epi32(kFirst)),
                                          _mm_set1_epi32(static_cast<int32_t>(row_bytes))),
                          _mm_mullo_epi32(_mm_add_epi32(ix, _mm_set1_epi32(kFirst)),
                                          _mm_set1_epi32(Source::kPixel)));
        _mm_store_si128(reinterpret_cast<__m128i*>(firsts), first);
        _mm_store_si128(reinterpret_cast<__m128i*>(xs), ix);
        _mm_store_si128(reinterpret_cast<__m128i*>(ys), iy);
        for (int k = 0; k < 4; ++k) {
          if (!(lanes >> k & 1)) continue;
          if (interior >> k & 1) {
            result[k] =
                Filter::filter(Interior<Source>{bytes + firsts[k], row_bytes}, dxs[k], dys[k]);
          } else {
            result[k] = clipped<Filter, Source>(bytes, xs[k], ys[k], dxs[k], dys[k], w, h);
          }
        }
      }
      const __m128i rgb = pack4(result);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(o), rgb);
      const int32_t last = _mm_cvtsi128_si32(_mm_srli_si128(rgb, 8));
      std::memcpy(o + 8, &last, 4);
    }
    for (; x < w; ++x, o += 3) {  // the row's last pixels, one at a time
      const double xs1 = x + 0.5;
      const double u = m[0] * xs1 + by + m[2], v = m[3] * xs1 + ey + m[5];
      if (u < 0.0 || u >= w || v < 0.0 || v >= h) {
        put_fill(o, fill);
        continue;
      }
      const double fx = std::floor(u - 0.5), fy = std::floor(v - 0.5);
      const __m256d one[4] = {
          clipped<Filter, Source>(bytes, static_cast<int>(fx), static_cast<int>(fy), (u - 0.5) - fx,
                                  (v - 0.5) - fy, w, h),
          fill_v, fill_v, fill_v};
      const int32_t rgb = _mm_cvtsi128_si32(pack4(one));
      std::memcpy(o, &rgb, 3);
    }
  }
}

#define STOKER_AVX512 __attribute__((target("avx512f")))
// GCC 12's AVX-512 intrinsics pass an undefined vector as the unused merge source, which its
// -Wmaybe-uninitialized takes for a read of an uninitialised value.
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// With AVX-512, two pixels a vector (R, G, B, unused of each): a rotation's pixels whose taps
// are inside the image, two by two, each tap a pixel's half loaded at a time from the float64
// copy. Every operation is the AVX2 form's on each half: the same doubles, the same bytes.
[[gnu::always_inline]] STOKER_AVX512 inline __m512d pair_at(const char* a, const char* b) {
  return _mm512_insertf64x4(
      _mm512_castpd256_pd512(_mm256_load_pd(reinterpret_cast<const double*>(a))),
      _mm256_load_pd(reinterpret_cast<const double*>(b)), 1);
}

[[gnu::always_inline]] STOKER_AVX512 inline __m512d pair_of(double a, double b) {
  return _mm512_insertf64x4(_mm512_set1_pd(a), _mm256_set1_pd(b), 1);
}

struct BilinearPair {
  // pixels a and b, their first taps at `fa` and `fb`, rows `rb` bytes apart
  [[gnu::always_inline]] STOKER_AVX512 inline static __m512d filter(const char* fa, const char* fb,
                                                                    ptrdiff_t rb, __m512d dx,
                                                                    __m512d dy) {
    const __m512d a = pair_at(fa, fb), b = pair_at(fa + 32, fb + 32);
    const __m512d c = pair_at(fa + rb, fb + rb), d = pair_at(fa + rb + 32, fb + rb + 32);
    const __m512d v1 = _mm512_add_pd(a, _mm512_mul_pd(_mm512_sub_pd(b, a), dx));
    const __m512d v2 = _mm512_add_pd(c, _mm512_mul_pd(_mm512_sub_pd(d, c), dx));
    return _mm512_add_pd(v1, _mm512_mul_pd(_mm512_sub_pd(v2, v1), dy));
  }
};

[[gnu::always_inline]] STOKER_AVX512 inline __m512d cubic8(__m512d v1, __m512d v2, __m512d v3,
                                                           __m512d v4, __m512d d) {
  const __m512d p2 = _mm512_sub_pd(v3, v1);
  const __m512d p3 = _mm512_sub_pd(
      _mm512_add_pd(_mm512_mul_pd(_mm512_set1_pd(2.0), _mm512_sub_pd(v1, v2)), v3), v4);
  const __m512d p4 = _mm512_add_pd(_mm512_sub_pd(_mm512_sub_pd(v2, v1), v3), v4);
  return _mm512_add_pd(
      v2, _mm512_mul_pd(
              d, _mm512_add_pd(p2, _mm512_mul_pd(d, _mm512_add_pd(p3, _mm512_mul_pd(d, p4))))));
}

struct BicubicPair {
  [[gnu::always_inline]] STOKER_AVX512 inline static __m512d across(const char* ra, const char* rb,
                                                                    __m512d d) {
    return cubic8(pair_at(ra, rb), pair_at(ra + 32, rb + 32), pair_at(ra + 64, rb + 64),
                  pair_at(ra + 96, rb + 96), d);
  }

  [[gnu::always_inline]] STOKER_AVX512 inline static __m512d filter(const char* fa, const char* fb,
                                                                    ptrdiff_t rb, __m512d dx,
                                                                    __m512d dy) {
    const __m512d v =
        cubic8(across(fa, fb, dx), across(fa + rb, fb + rb, dx),
               across(fa + 2 * rb, fb + 2 * rb, dx), across(fa + 3 * rb, fb + 3 * rb, dx), dy);
    return _mm512_min_pd(_mm512_max_pd(v, _mm512_setzero_pd()), _mm512_set1_pd(255.0));
  }
};

// affine_avx2's loop for a map across both axes (a rotation) on the float64 copy, eight pixels'
// coordinates at a time, pairs of pixels whose taps are inside filtered together (Pair), the
// others one by one as affine_avx2 does them (Filter).
template <class Filter, class Pair>
STOKER_AVX512 void affine_2d_avx512(const uint8_t* in, uint8_t* out, const std::array<double, 6>& m,
                                    int w, int h, const std::array<uint8_t, 3>& fill) {
  constexpr int kFirst = Filter::kFirst, kLast = Filter::kFirst + Filter::kTaps - 1;
  const char* bytes = float64_image(in, w, h);
  const ptrdiff_t row_bytes = 32 * static_cast<ptrdiff_t>(w);
  const __m256d fill_v = _mm256_setr_pd(fill[0], fill[1], fill[2], 0);
  const __m512d m0 = _mm512_set1_pd(m[0]), m2 = _mm512_set1_pd(m[2]);
  const __m512d m3 = _mm512_set1_pd(m[3]), m5 = _mm512_set1_pd(m[5]);
  const __m512d half = _mm512_set1_pd(0.5), zero = _mm512_setzero_pd();
  const __m512d wd = _mm512_set1_pd(w), hd = _mm512_set1_pd(h);
  const __m256i low = _mm256_set1_epi32(-kFirst - 1), high_x = _mm256_set1_epi32(w - kLast),
                high_y = _mm256_set1_epi32(h - kLast);
  alignas(64) double dxs[8], dys[8];
  alignas(32) int32_t firsts[8], xs[8], ys[8];
  for (int y = 0; y < h; ++y) {
    const double yc = y + 0.5;
    const double by = m[1] * yc, ey = m[4] * yc;
    const __m512d vby = _mm512_set1_pd(by), vey = _mm512_set1_pd(ey);
    uint8_t* o = out + static_cast<size_t>(y) * 3 * static_cast<size_t>(w);
    __m512d xc = _mm512_setr_pd(0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5);  // exact
    int x = 0;
    for (; x + 8 <= w; x += 8, o += 24, xc = _mm512_add_pd(xc, _mm512_set1_pd(8.0))) {
      const __m512d u = _mm512_add_pd(_mm512_add_pd(_mm512_mul_pd(m0, xc), vby), m2);
      const __m512d v = _mm512_add_pd(_mm512_add_pd(_mm512_mul_pd(m3, xc), vey), m5);
      const int lanes =
          _mm512_cmp_pd_mask(u, zero, _CMP_GE_OQ) & _mm512_cmp_pd_mask(u, wd, _CMP_LT_OQ) &
          _mm512_cmp_pd_mask(v, zero, _CMP_GE_OQ) & _mm512_cmp_pd_mask(v, hd, _CMP_LT_OQ);
      __m128i result[8];
      const __m128i fill_i = _mm256_cvttpd_epi32(fill_v);
      if (lanes == 0) {
        for (__m128i& r : result) r = fill_i;
      } else {
        const __m512d su = _mm512_sub_pd(u, half), sv = _mm512_sub_pd(v, half);
        // outside lanes are set to 0 first: their coordinates may not fit an int
        const __m512d fx = _mm512_maskz_mov_pd(static_cast<__mmask8>(lanes), _mm512_floor_pd(su));
        const __m512d fy = _mm512_maskz_mov_pd(static_cast<__mmask8>(lanes), _mm512_floor_pd(sv));
        _mm512_store_pd(dxs, _mm512_sub_pd(su, fx));
        _mm512_store_pd(dys, _mm512_sub_pd(sv, fy));
        const __m256i ix = _mm512_cvttpd_epi32(fx), iy = _mm512_cvttpd_epi32(fy);
        const __m256i in_x =
            _mm256_and_si256(_mm256_cmpgt_epi32(ix, low), _mm256_cmpgt_epi32(high_x, ix));
        const __m256i in_y =
            _mm256_and_si256(_mm256_cmpgt_epi32(iy, low), _mm256_cmpgt_epi32(high_y, iy));
        const int interior =
            _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_and_si256(in_x, in_y))) & lanes;
        const __m256i first =
            _mm256_add_epi32(_mm256_mullo_epi32(_mm256_add_epi32(iy, _mm256_set1_epi32(kFirst)),
                                                _mm256_set1_epi32(static_cast<int32_t>(row_bytes))),
                             _mm256_slli_epi32(_mm256_add_epi32(ix, _mm256_set1_epi32(kFirst)), 5));
        _mm256_store_si256(reinterpret_cast<__m256i*>(firsts), first);
        _mm256_store_si256(reinterpret_cast<__m256i*>(xs), ix);
        _mm256_store_si256(reinterpret_cast<__m256i*>(ys), iy);
        for (int k = 0; k < 8; k += 2) {
          if ((interior >> k & 3) == 3) {
            const __m256i two = _mm512_cvttpd_epi32(
                Pair::filter(bytes + firsts[k], bytes + firsts[k + 1], row_bytes,
                             pair_of(dxs[k], dxs[k + 1]), pair_of(dys[k], dys[k + 1])));
            result[k] = _mm256_castsi256_si128(two);
            result[k + 1] = _mm256_extracti128_si256(two, 1);
            continue;
          }
          for (int j = k; j < k + 2; ++j) {
            __m256d one = fill_v;
            if (interior >> j & 1) {
              one = Filter::filter(Interior<Doubles>{bytes + firsts[j], row_bytes}, dxs[j], dys[j]);
            } else if (lanes >> j & 1) {
              one = clipped<Filter, Doubles>(bytes, xs[j], ys[j], dxs[j], dys[j], w, h);
            }
            result[j] = _mm256_cvttpd_epi32(one);
          }
        }
      }
      for (int k = 0; k < 8; k += 4) {  // 12 bytes of RGB from each four
        const __m128i rgb =
            _mm_shuffle_epi8(_mm_packus_epi16(_mm_packus_epi32(result[k], result[k + 1]),
                                              _mm_packus_epi32(result[k + 2], result[k + 3])),
                             _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(o + 3 * k), rgb);
        const int32_t last = _mm_cvtsi128_si32(_mm_srli_si128(rgb, 8));
        std::memcpy(o + 3 * k + 8, &last, 4);
      }
    }
    for (; x < w; ++x, o += 3) {  // the row's last pixels, one at a time
      const double xs1 = x + 0.5;
      const double u = m[0] * xs1 + by + m[2], v = m[3] * xs1 + ey + m[5];
      if (u < 0.0 || u >= w || v < 0.0 || v >= h) {
        put_fill(o, fill);
        continue;
      }
      const double fx = std::floor(u - 0.5), fy = std::floor(v - 0.5);
      const __m256d one[4] = {
          clipped<Filter, Doubles>(bytes, static_cast<int>(fx), static_cast<int>(fy),
                                   (u - 0.5) - fx, (v - 0.5) - fy, w, h),
          fill_v, fill_v, fill_v};
      const int32_t rgb = _mm_cvtsi128_si32(pack4(one));
      std::memcpy(o, &rgb, 3);
    }
  }
}

#pragma GCC diagnostic pop
#undef STOKER_AVX512
#undef STOKER_AVX2
#endif  // STOKER_PIL_FILTERS_AVX2

// Whether the float64 copy (32 bytes a pixel) is small enough to keep per thread: up to 2^20
// pixels (32 MiB); larger images take the portable form.
bool fits_doubles(int width, int height) {
  return static_cast<int64_t>(width) * height <= (int64_t{1} << 20);
}

// A map along one axis (a shear, a translation): every pixel's offset across it is 0, so a
// pixel reads one row (or column) of taps, 2 or 4 where a rotation reads 4 or 16. These read
// the image's bytes; the others its float64 copy.
bool one_axis(const std::array<double, 6>& m) {
  return (m[0] == 1 && m[1] == 0 && m[2] == std::floor(m[2])) ||
         (m[3] == 0 && m[4] == 1 && m[5] == std::floor(m[5]));
}

std::atomic<bool> avx512_allowed{true};

// Whether the AVX-512 form of a rotation runs: the CPU has AVX-512F and the tests allow it.
bool use_avx512() {
#ifdef STOKER_PIL_FILTERS_AVX2
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return has && avx512_allowed.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

}  // namespace

void pil_bilinear_affine(const uint8_t* in, uint8_t* out, const std::array<double, 6>& m, int width,
                         int height, const std::array<uint8_t, 3>& fill) {
  const size_t row = static_cast<size_t>(width) * 3;
#ifdef STOKER_PIL_FILTERS_AVX2
  if (use_avx2_fma()) {
    if (one_axis(m) || !fits_doubles(width, height))
      return affine_avx2<BilinearAvx2, Bytes>(in, out, m, width, height, fill);
    if (use_avx512())
      return affine_2d_avx512<BilinearAvx2, BilinearPair>(in, out, m, width, height, fill);
    return affine_avx2<BilinearAvx2, Doubles>(in, out, m, width, height, fill);
  }
#endif
  affine_portable(out, m, width, height, fill, BilinearPixel{in, width, height, row});
}

void pil_bicubic_affine(const uint8_t* in, uint8_t* out, const std::array<double, 6>& m, int width,
                        int height, const std::array<uint8_t, 3>& fill) {
  const size_t row = static_cast<size_t>(width) * 3;
#ifdef STOKER_PIL_FILTERS_AVX2
  if (use_avx2_fma()) {
    if (one_axis(m) || !fits_doubles(width, height))
      return affine_avx2<BicubicAvx2, Bytes>(in, out, m, width, height, fill);
    if (use_avx512())
      return affine_2d_avx512<BicubicAvx2, BicubicPair>(in, out, m, width, height, fill);
    return affine_avx2<BicubicAvx2, Doubles>(in, out, m, width, height, fill);
  }
#endif
  affine_portable(out, m, width, height, fill, BicubicPixel{in, width, height, row});
}

void allow_avx512_for_testing(bool allowed) { avx512_allowed.store(allowed); }

}  // namespace stoker::augment::detail
