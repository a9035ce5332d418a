#include "stoker/transform/resize.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>

#include "stoker/core/error.h"

// The passes have a portable scalar form and, on x86-64, an AVX2 form chosen at run time, so the
// library still runs on any x86-64 CPU without -march flags. (GCC 12 neither vectorises the
// scalar loops at -O2 nor lowers vector-extension widening to vpmovzx, hence intrinsics.)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define STOKER_RESIZE_AVX2 1
#include <immintrin.h>
#define STOKER_TARGET_AVX2 __attribute__((target("avx2")))
#endif

namespace stoker::transform {

namespace detail {
// Test hook: forces the portable kernels so that a test run on an AVX2 machine covers both.
void set_portable_resample_for_testing(bool portable);
}  // namespace detail

namespace {

constexpr int kChannels = 3;
// Pillow's 8-bit fixed point: 8 bits of pixel, 2 of headroom for filters with negative lobes.
constexpr int kPrecisionBits = 32 - 8 - 2;
constexpr int32_t kRoundingHalf = int32_t{1} << (kPrecisionBits - 1);

std::atomic<bool> force_portable{false};

// Pillow's bilinear (triangle) filter, support 1.
double bilinear_filter(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

// One axis of a resample, set up exactly as Pillow's precompute_coeffs does. Pillow receives the
// box as C floats (PyArg "ffff"), so the box edges are rounded to float first and the width is a
// float subtraction; doing the same keeps coefficients bit-identical for fractional boxes.
// (Built without FMA contraction of `in0 + (xx + 0.5) * scale`, as Pillow's wheels are.)
struct Axis {
  int in_size = 0;
  int out_size = 0;
  float in0 = 0, in1 = 0;
  double scale = 0;
  double support = 0;
  double inv_filterscale = 0;
  int ksize = 0;

  Axis(int in, double box0, double box1, int out)
      : in_size(in), out_size(out), in0(static_cast<float>(box0)), in1(static_cast<float>(box1)) {
    scale = static_cast<double>(in1 - in0) / out_size;
    const double filterscale = scale < 1.0 ? 1.0 : scale;
    support = 1.0 * filterscale;
    inv_filterscale = 1.0 / filterscale;
    ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  }

  double center(int xx) const { return in0 + (xx + 0.5) * scale; }

  // First tap and tap count of output xx, clipped to [0, in_size) as Pillow clips.
  void taps(int xx, int* first, int* count) const {
    const double c = center(xx);
    int lo = static_cast<int>(c - support + 0.5);
    if (lo < 0) lo = 0;
    int hi = static_cast<int>(c + support + 0.5);
    if (hi > in_size) hi = in_size;
    *first = lo;
    *count = hi > lo ? hi - lo : 0;
  }

  // Pillow does not resample an axis whose output equals the input and whose box is all of it.
  bool needed() const {
    return out_size != in_size || in0 != 0.0f || in1 != static_cast<float>(out_size);
  }

  // Union of [first, first + count) over all outputs.
  void hull(int* lo, int* hi) const {
    *lo = in_size;
    *hi = 0;
    for (int xx = 0; xx < out_size; ++xx) {
      int first, count;
      taps(xx, &first, &count);
      if (count == 0) continue;
      *lo = std::min(*lo, first);
      *hi = std::max(*hi, first + count);
    }
    if (*lo > *hi) *lo = *hi = 0;
  }

  // Fills the fixed-point table: output xx's taps go to slot `mirror ? out-1-xx : xx`, with
  // (first tap, count) in `bounds` and ksize coefficients (zero-padded) in `coeffs`.
  // Returns the tap hull, as hull() would.
  void build(bool mirror, std::vector<int32_t>& coeffs, std::vector<int>& bounds, int* lo,
             int* hi) const {
    coeffs.assign(static_cast<size_t>(out_size) * static_cast<size_t>(ksize), 0);
    bounds.resize(static_cast<size_t>(out_size) * 2);
    *lo = in_size;
    *hi = 0;
    for (int xx = 0; xx < out_size; ++xx) {
      const double c = center(xx);
      int first, count;
      taps(xx, &first, &count);
      // Two passes over the taps instead of a scratch array: the filter is a pure function, so
      // the second evaluation equals the first and the normalisation matches Pillow's k /= ww.
      double ww = 0.0;
      for (int x = 0; x < count; ++x)
        ww += bilinear_filter((x + first - c + 0.5) * inv_filterscale);
      const int slot = mirror ? out_size - 1 - xx : xx;
      int32_t* k = coeffs.data() + static_cast<size_t>(slot) * ksize;
      for (int x = 0; x < count; ++x) {
        double w = bilinear_filter((x + first - c + 0.5) * inv_filterscale);
        if (ww != 0.0) w /= ww;
        // Pillow's normalize_coeffs_8bpc: round half away from zero by truncation.
        k[x] = w < 0 ? static_cast<int32_t>(-0.5 + w * (1 << kPrecisionBits))
                     : static_cast<int32_t>(0.5 + w * (1 << kPrecisionBits));
      }
      bounds[static_cast<size_t>(slot) * 2] = first;
      bounds[static_cast<size_t>(slot) * 2 + 1] = count;
      if (count > 0) {
        *lo = std::min(*lo, first);
        *hi = std::max(*hi, first + count);
      }
    }
    if (*lo > *hi) *lo = *hi = 0;
  }
};

// The horizontal table: per output pixel xx, its first tap (a pixel index in the pass's input
// row) and tap count in bounds[2xx], bounds[2xx+1], and ksize coefficients from coeffs[xx*ksize].
// For the AVX2 kernel the same table regrouped by pairs (2p, 2p+1): pair_taps[p*pair_stride] is
// the pair's tap count n, followed by n (byte offset of pixel 2p's tap, of pixel 2p+1's tap);
// pair_coeffs[(p*ksize + t)*8 ...] holds {k, k, k, 0, k', k', k', 0} for tap t of each. The
// shorter pixel's extra taps repeat its last tap with weight 0, so every read is a real tap.
struct HorizontalTable {
  const int* bounds;
  const int32_t* coeffs;
  int ksize;
  const int* pair_taps;
  const int32_t* pair_coeffs;
  int pair_stride;
};

// Pillow's clip8: the accumulator holds value << 22 plus the rounding half.
inline uint8_t clip8(int32_t acc) {
  const int32_t v = acc >> kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

void horizontal_row_scalar(const uint8_t* row, uint8_t* dst, int out_width,
                           const HorizontalTable& table) {
  for (int xx = 0; xx < out_width; ++xx) {
    const uint8_t* p = row + static_cast<ptrdiff_t>(table.bounds[2 * xx]) * kChannels;
    const int n = table.bounds[2 * xx + 1];
    const int32_t* k = table.coeffs + static_cast<ptrdiff_t>(xx) * table.ksize;
    int32_t s0 = kRoundingHalf, s1 = kRoundingHalf, s2 = kRoundingHalf;
    for (int t = 0; t < n; ++t) {
      s0 += p[3 * t + 0] * k[t];
      s1 += p[3 * t + 1] * k[t];
      s2 += p[3 * t + 2] * k[t];
    }
    dst[3 * xx + 0] = clip8(s0);
    dst[3 * xx + 1] = clip8(s1);
    dst[3 * xx + 2] = clip8(s2);
  }
}

void vertical_pass_scalar(const uint8_t* in, ptrdiff_t in_stride, uint8_t* out,
                          ptrdiff_t out_stride, int out_rows, int row_bytes, const int* bounds,
                          const int32_t* coeffs, int ksize) {
  for (int yy = 0; yy < out_rows; ++yy) {
    const uint8_t* first_row = in + static_cast<ptrdiff_t>(bounds[2 * yy]) * in_stride;
    const int n = bounds[2 * yy + 1];
    const int32_t* k = coeffs + static_cast<ptrdiff_t>(yy) * ksize;
    uint8_t* dst = out + yy * out_stride;
    for (int i = 0; i < row_bytes; ++i) {
      int32_t acc = kRoundingHalf;
      for (int t = 0; t < n; ++t) acc += first_row[t * in_stride + i] * k[t];
      dst[i] = clip8(acc);
    }
  }
}

#ifdef STOKER_RESIZE_AVX2

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Two output pixels per 256-bit register, one tap per step: each 128-bit half holds one pixel's
// R, G, B (and a fourth byte times weight 0). Loading 4 bytes per tap reads one byte past the
// tap's pixel, which exists in every row but the buffer's last, so that row is done in scalar.
STOKER_TARGET_AVX2
void horizontal_pass_avx2(const uint8_t* in, ptrdiff_t in_stride, uint8_t* out,
                          ptrdiff_t out_stride, int rows, int out_width,
                          const HorizontalTable& table) {
  const __m256i half = _mm256_set1_epi32(kRoundingHalf);
  const int pairs = (out_width + 1) / 2;
  // Locals, not table fields: the byte stores below may alias anything, which would make the
  // compiler reload the fields for every pixel.
  const int* const pair_taps = table.pair_taps;
  const auto* const pair_coeffs = reinterpret_cast<const __m256i*>(table.pair_coeffs);
  const ptrdiff_t taps_stride = table.pair_stride;
  const ptrdiff_t coeffs_stride = table.ksize;
  for (int r = 0; r + 1 < rows; ++r) {
    const uint8_t* row = in + r * in_stride;
    uint8_t* dst = out + r * out_stride;
    for (int p = 0; p < pairs; ++p) {
      const int* taps = pair_taps + p * taps_stride;
      const int n = taps[0];
      const int* offsets = taps + 1;
      const __m256i* k = pair_coeffs + p * coeffs_stride;
      __m256i acc = half;
      for (int t = 0; t < n; ++t) {
        __m128i px = _mm_cvtsi32_si128(static_cast<int>(load_u32(row + offsets[2 * t])));
        px = _mm_insert_epi32(px, static_cast<int>(load_u32(row + offsets[2 * t + 1])), 1);
        acc = _mm256_add_epi32(
            acc, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(px), _mm256_loadu_si256(k + t)));
      }
      acc = _mm256_srai_epi32(acc, kPrecisionBits);
      // Saturating packs are exactly clip8's clamp to [0, 255].
      __m256i bytes = _mm256_packs_epi32(acc, acc);
      bytes = _mm256_packus_epi16(bytes, bytes);
      const uint32_t a = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128(bytes)));
      const uint32_t b =
          static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(bytes, 1)));
      // 4-byte stores run one byte into the next pixel, which is written after; the row's last
      // pixel gets exactly 3 bytes. (Constant sizes: a variable one becomes a byte loop.)
      const int xx = 2 * p;
      uint8_t* d = dst + 3 * xx;
      if (xx + 2 < out_width) {
        std::memcpy(d, &a, 4);
        std::memcpy(d + 3, &b, 4);
      } else if (xx + 1 < out_width) {
        std::memcpy(d, &a, 4);
        std::memcpy(d + 3, &b, 3);
      } else {
        std::memcpy(d, &a, 3);
      }
    }
  }
  if (rows > 0) {
    horizontal_row_scalar(in + (rows - 1) * in_stride, out + (rows - 1) * out_stride, out_width,
                          table);
  }
}

// 16 bytes (any mix of channels) per step, in two 8-lane int32 accumulators.
STOKER_TARGET_AVX2
void vertical_pass_avx2(const uint8_t* in, ptrdiff_t in_stride, uint8_t* out, ptrdiff_t out_stride,
                        int out_rows, int row_bytes, const int* bounds, const int32_t* coeffs,
                        int ksize) {
  if (row_bytes < 16) {
    vertical_pass_scalar(in, in_stride, out, out_stride, out_rows, row_bytes, bounds, coeffs,
                         ksize);
    return;
  }
  const __m256i half = _mm256_set1_epi32(kRoundingHalf);
  for (int yy = 0; yy < out_rows; ++yy) {
    const uint8_t* first_row = in + static_cast<ptrdiff_t>(bounds[2 * yy]) * in_stride;
    const int n = bounds[2 * yy + 1];
    const int32_t* k = coeffs + static_cast<ptrdiff_t>(yy) * ksize;
    uint8_t* dst = out + yy * out_stride;
    for (int i = 0;; i += 16) {
      // The last block is moved back to end at the row's end: it rewrites a few bytes with the
      // same values and never reads outside the row.
      if (i + 16 > row_bytes) i = row_bytes - 16;
      __m256i lo = half, hi = half;
      const uint8_t* p = first_row + i;
      for (int t = 0; t < n; ++t, p += in_stride) {
        const __m256i kt = _mm256_set1_epi32(k[t]);
        const __m128i b0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
        const __m128i b1 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8));
        lo = _mm256_add_epi32(lo, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(b0), kt));
        hi = _mm256_add_epi32(hi, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(b1), kt));
      }
      lo = _mm256_srai_epi32(lo, kPrecisionBits);
      hi = _mm256_srai_epi32(hi, kPrecisionBits);
      // packs works within 128-bit lanes; the permute puts lo's 8 values before hi's.
      const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
      const __m128i bytes =
          _mm_packus_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), bytes);
      if (i + 16 >= row_bytes) break;
    }
  }
}

bool cpu_has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}

#endif  // STOKER_RESIZE_AVX2

bool use_avx2() {
#ifdef STOKER_RESIZE_AVX2
  return cpu_has_avx2() && !force_portable.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

// Along rows: rows are `in_stride` apart and every row but the last may be read one byte past
// the last tap (that byte lies before the next row).
void horizontal_pass(const uint8_t* in, ptrdiff_t in_stride, uint8_t* out, ptrdiff_t out_stride,
                     int rows, int out_width, const HorizontalTable& table, bool avx2) {
#ifdef STOKER_RESIZE_AVX2
  if (avx2) {
    horizontal_pass_avx2(in, in_stride, out, out_stride, rows, out_width, table);
    return;
  }
#endif
  (void)avx2;
  for (int r = 0; r < rows; ++r) {
    horizontal_row_scalar(in + r * in_stride, out + r * out_stride, out_width, table);
  }
}

// Along columns: out row yy is the weighted sum of in rows [bounds[2yy], +bounds[2yy+1]), each
// `row_bytes` wide.
void vertical_pass(const uint8_t* in, ptrdiff_t in_stride, uint8_t* out, ptrdiff_t out_stride,
                   int out_rows, int row_bytes, const int* bounds, const int32_t* coeffs, int ksize,
                   bool avx2) {
#ifdef STOKER_RESIZE_AVX2
  if (avx2) {
    vertical_pass_avx2(in, in_stride, out, out_stride, out_rows, row_bytes, bounds, coeffs, ksize);
    return;
  }
#endif
  (void)avx2;
  vertical_pass_scalar(in, in_stride, out, out_stride, out_rows, row_bytes, bounds, coeffs, ksize);
}

// Regroups the horizontal table by output pairs for horizontal_pass_avx2 (see HorizontalTable).
// `bounds` must already be relative to the pass's input row.
void build_pairs(int out_width, int ksize, const std::vector<int>& bounds,
                 const std::vector<int32_t>& coeffs, std::vector<int>& pair_taps,
                 std::vector<int32_t>& pair_coeffs) {
  const int pairs = (out_width + 1) / 2;
  const int stride = 1 + 2 * ksize;
  pair_taps.assign(static_cast<size_t>(pairs) * stride, 0);
  pair_coeffs.assign(static_cast<size_t>(pairs) * ksize * 8, 0);
  for (int p = 0; p < pairs; ++p) {
    int* taps = pair_taps.data() + static_cast<size_t>(p) * stride;
    int32_t* k = pair_coeffs.data() + static_cast<size_t>(p) * ksize * 8;
    // An odd width's last pair computes its one pixel twice and stores it once.
    const int px[2] = {2 * p, std::min(2 * p + 1, out_width - 1)};
    const int n = std::max(bounds[2 * px[0] + 1], bounds[2 * px[1] + 1]);
    taps[0] = n;
    for (int half = 0; half < 2; ++half) {
      const int first = bounds[2 * px[half]];
      const int count = bounds[2 * px[half] + 1];
      const int32_t* src = coeffs.data() + static_cast<size_t>(px[half]) * ksize;
      for (int t = 0; t < n; ++t) {
        // Past its own taps a pixel re-reads its last one with weight 0 (n > 0 implies some
        // pixel of the pair has taps; one with none reads the pair's first tap instead).
        const int tap = count > 0 ? first + std::min(t, count - 1) : bounds[2 * px[1 - half]];
        taps[1 + 2 * t + half] = tap * kChannels;
        const int32_t w = t < count ? src[t] : 0;
        for (int c = 0; c < 3; ++c) k[t * 8 + half * 4 + c] = w;
      }
    }
  }
}

// Pillow's _resize checks, applied to the box as Pillow sees it (rounded to float). Written so
// that a NaN edge fails them.
void check_box(const Box& box, int out_width, int out_height, int image_width, int image_height) {
  STOKER_CHECK(out_width > 0 && out_height > 0, ErrorCode::kInvalidArgument,
               "resize: output size must be positive, got " + std::to_string(out_width) + "x" +
                   std::to_string(out_height));
  STOKER_CHECK(image_width > 0 && image_height > 0, ErrorCode::kInvalidArgument,
               "resize: image size must be positive, got " + std::to_string(image_width) + "x" +
                   std::to_string(image_height));
  const float x0 = static_cast<float>(box.x0), y0 = static_cast<float>(box.y0);
  const float x1 = static_cast<float>(box.x1), y1 = static_cast<float>(box.y1);
  const bool inside = x0 >= 0 && y0 >= 0 && x1 <= static_cast<float>(image_width) &&
                      y1 <= static_cast<float>(image_height) && x1 - x0 >= 0 && y1 - y0 >= 0;
  STOKER_CHECK(inside, ErrorCode::kInvalidArgument,
               "resize: box (" + std::to_string(box.x0) + ", " + std::to_string(box.y0) + ", " +
                   std::to_string(box.x1) + ", " + std::to_string(box.y1) +
                   ") is empty or not inside the " + std::to_string(image_width) + "x" +
                   std::to_string(image_height) + " image");
}

// Pillow 13 runs the vertical pass first when the height shrinks by more than twice as many
// pixels as the width does (judged on the whole image, not the box); earlier Pillow always ran
// the horizontal pass first. The order changes the 8-bit intermediate, so it is copied exactly.
bool horizontal_first(int image_width, int image_height, int out_width, int out_height) {
  const int64_t dy = int64_t{image_height} - out_height;
  const int64_t dx = int64_t{image_width} - out_width;
  return !(dy > 0 && dy > dx * 2);
}

void shift_bounds(std::vector<int>& bounds, int by) {
  for (size_t i = 0; i < bounds.size(); i += 2) bounds[i] -= by;
}

}  // namespace

void detail::set_portable_resample_for_testing(bool portable) {
  force_portable.store(portable, std::memory_order_relaxed);
}

PixelRect resample_support(const Box& box, int out_width, int out_height, int image_width,
                           int image_height) {
  check_box(box, out_width, out_height, image_width, image_height);
  PixelRect rect;
  Axis(image_width, box.x0, box.x1, out_width).hull(&rect.x0, &rect.x1);
  Axis(image_height, box.y0, box.y1, out_height).hull(&rect.y0, &rect.y1);
  return rect;
}

void Resampler::resize(const RegionView& src, const Box& box, uint8_t* dst, int out_width,
                       int out_height, ptrdiff_t dst_stride, bool flip_horizontal) {
  check_box(box, out_width, out_height, src.image_width, src.image_height);
  STOKER_CHECK(src.pixels != nullptr && src.width > 0 && src.height > 0 &&
                   src.stride >= ptrdiff_t{src.width} * kChannels,
               ErrorCode::kInvalidArgument, "resize: empty source region or stride too small");
  STOKER_CHECK(src.origin_x >= 0 && src.origin_y >= 0 &&
                   int64_t{src.origin_x} + src.width <= src.image_width &&
                   int64_t{src.origin_y} + src.height <= src.image_height,
               ErrorCode::kInvalidArgument, "resize: source region is not inside its image");
  STOKER_CHECK(dst != nullptr && dst_stride >= ptrdiff_t{out_width} * kChannels,
               ErrorCode::kInvalidArgument, "resize: no destination or stride too small");

  // A box of the output's size at whole-pixel offsets (RandomCrop, a crop of raw pixels):
  // bilinear at scale 1 puts a coefficient of exactly 1 on one pixel and 0 on its neighbours,
  // so Pillow's result is the pixels themselves, copied here without the filter.
  const auto fx0 = static_cast<float>(box.x0), fy0 = static_cast<float>(box.y0);
  if (static_cast<float>(box.x1) - fx0 == static_cast<float>(out_width) &&
      static_cast<float>(box.y1) - fy0 == static_cast<float>(out_height) &&
      fx0 == std::floor(fx0) && fy0 == std::floor(fy0)) {
    const int x0 = static_cast<int>(fx0), y0 = static_cast<int>(fy0);
    if (x0 >= src.origin_x && y0 >= src.origin_y && x0 + out_width <= src.origin_x + src.width &&
        y0 + out_height <= src.origin_y + src.height) {
      for (int y = 0; y < out_height; ++y) {
        const uint8_t* in = src.pixels +
                            static_cast<ptrdiff_t>(y0 + y - src.origin_y) * src.stride +
                            static_cast<ptrdiff_t>(x0 - src.origin_x) * kChannels;
        uint8_t* row = dst + y * dst_stride;
        if (!flip_horizontal) {
          std::memcpy(row, in, static_cast<size_t>(out_width) * kChannels);
        } else {
          const uint8_t* p = in + static_cast<ptrdiff_t>(out_width - 1) * kChannels;
          for (int x = 0; x < out_width; ++x, p -= kChannels, row += kChannels) {
            row[0] = p[0];
            row[1] = p[1];
            row[2] = p[2];
          }
        }
      }
      return;
    }
  }

  const Axis ax(src.image_width, box.x0, box.x1, out_width);
  const Axis ay(src.image_height, box.y0, box.y1, out_height);
  // Mirroring rides on the horizontal pass (its table is built in reverse); when Pillow would skip
  // that pass its identity coefficients (exactly 1 << 22 and 0) copy pixels unchanged, so running
  // it anyway changes nothing but the order.
  const bool need_h = ax.needed() || flip_horizontal;
  const bool need_v = ay.needed();

  int x_lo, x_hi, y_lo, y_hi;
  ax.build(flip_horizontal, coeffs_x_, bounds_x_, &x_lo, &x_hi);
  ay.build(false, coeffs_y_, bounds_y_, &y_lo, &y_hi);

  // A skipped pass reads its whole axis; the hull of an identity axis is exactly that.
  if (x_lo < src.origin_x || x_hi > src.origin_x + src.width || y_lo < src.origin_y ||
      y_hi > src.origin_y + src.height) {
    throw Error(ErrorCode::kInternal, "resize: source region [" + std::to_string(src.origin_x) +
                                          ", " + std::to_string(src.origin_x + src.width) +
                                          ") x [" + std::to_string(src.origin_y) + ", " +
                                          std::to_string(src.origin_y + src.height) +
                                          ") does not cover the filter taps [" +
                                          std::to_string(x_lo) + ", " + std::to_string(x_hi) +
                                          ") x [" + std::to_string(y_lo) + ", " +
                                          std::to_string(y_hi) + ")");
  }
  auto src_at = [&](int x, int y) {
    return src.pixels + static_cast<ptrdiff_t>(y - src.origin_y) * src.stride +
           static_cast<ptrdiff_t>(x - src.origin_x) * kChannels;
  };

  if (!need_h && !need_v) {
    // Same size, whole image: Pillow returns a copy.
    for (int y = 0; y < out_height; ++y) {
      std::memcpy(dst + y * dst_stride, src_at(0, y), static_cast<size_t>(out_width) * kChannels);
    }
    return;
  }

  const bool avx2 = use_avx2();
  // Makes bounds_x_ relative to the horizontal pass's input, whose pixel 0 is image column
  // `base`, and describes the table.
  auto horizontal_table = [&](int base) {
    shift_bounds(bounds_x_, base);
    if (avx2) build_pairs(out_width, ax.ksize, bounds_x_, coeffs_x_, pair_taps_x_, pair_coeffs_x_);
    return HorizontalTable{bounds_x_.data(),    coeffs_x_.data(),      ax.ksize,
                           pair_taps_x_.data(), pair_coeffs_x_.data(), 1 + 2 * ax.ksize};
  };

  if (!need_v) {
    // Only the horizontal pass; y is the identity so rows map one to one.
    horizontal_pass(src_at(src.origin_x, 0), src.stride, dst, dst_stride, out_height, out_width,
                    horizontal_table(src.origin_x), avx2);
    return;
  }
  if (!need_h) {
    // Only the vertical pass, over full rows (x is the identity, so the region spans them).
    shift_bounds(bounds_y_, src.origin_y);
    vertical_pass(src_at(0, src.origin_y), src.stride, dst, dst_stride, out_height,
                  out_width * kChannels, bounds_y_.data(), coeffs_y_.data(), ay.ksize, avx2);
    return;
  }

  if (horizontal_first(src.image_width, src.image_height, out_width, out_height)) {
    // Horizontal pass over only the rows the vertical pass reads, into an 8-bit intermediate.
    const int rows = y_hi - y_lo;
    const ptrdiff_t temp_stride = ptrdiff_t{out_width} * kChannels;
    temp_.resize(static_cast<size_t>(temp_stride) * static_cast<size_t>(rows));
    shift_bounds(bounds_y_, y_lo);
    horizontal_pass(src_at(src.origin_x, y_lo), src.stride, temp_.data(), temp_stride, rows,
                    out_width, horizontal_table(src.origin_x), avx2);
    vertical_pass(temp_.data(), temp_stride, dst, dst_stride, out_height, out_width * kChannels,
                  bounds_y_.data(), coeffs_y_.data(), ay.ksize, avx2);
  } else {
    // Vertical pass first. Pillow runs it over every column; only those the horizontal pass
    // reads are computed here, which gives the same bytes where it matters.
    const int cols = x_hi - x_lo;
    const ptrdiff_t temp_stride = ptrdiff_t{cols} * kChannels;
    temp_.resize(static_cast<size_t>(temp_stride) * static_cast<size_t>(out_height));
    shift_bounds(bounds_y_, src.origin_y);
    vertical_pass(src_at(x_lo, src.origin_y), src.stride, temp_.data(), temp_stride, out_height,
                  cols * kChannels, bounds_y_.data(), coeffs_y_.data(), ay.ksize, avx2);
    horizontal_pass(temp_.data(), temp_stride, dst, dst_stride, out_height, out_width,
                    horizontal_table(x_lo), avx2);
  }
}

}  // namespace stoker::transform
