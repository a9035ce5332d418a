#include "stoker/transform/resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "stoker/core/error.h"

// The two passes are plain integer loops; on x86-64 Linux they are also compiled for AVX2 and the
// loader picks the variant once (ifunc), so the library still runs on any x86-64 CPU.
#if defined(__x86_64__) && defined(__linux__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define STOKER_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef STOKER_VECTOR_CLONES
#define STOKER_VECTOR_CLONES
#endif

namespace stoker::transform {

namespace {

constexpr int kChannels = 3;
// Pillow's 8-bit fixed point: 8 bits of pixel, 2 of headroom for filters with negative lobes.
constexpr int kPrecisionBits = 32 - 8 - 2;
constexpr int32_t kRoundingHalf = int32_t{1} << (kPrecisionBits - 1);

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
      : in_size(in),
        out_size(out),
        in0(static_cast<float>(box0)),
        in1(static_cast<float>(box1)) {
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
      for (int x = 0; x < count; ++x) ww += bilinear_filter((x + first - c + 0.5) * inv_filterscale);
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

// Pillow's clip8: the accumulator holds value << 22 plus the rounding half.
inline uint8_t clip8(int32_t acc) {
  const int32_t v = acc >> kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// GCC/Clang vector extensions: the same source becomes AVX2 in the avx2 clone and SSE2 in the
// default one, with no intrinsics and no -O3 needed for vectorisation.
using V4u8 = uint8_t __attribute__((vector_size(4)));
using V4i32 = int32_t __attribute__((vector_size(16)));
using V8u8 = uint8_t __attribute__((vector_size(8)));
using V8i32 = int32_t __attribute__((vector_size(32)));

// In place, by reference: passing a 32-byte vector by value would tie the default clone's ABI
// to AVX.
template <typename V>
inline void clip8_lanes(V& acc) {
  acc >>= kPrecisionBits;
  acc = acc < 0 ? 0 : acc;
  acc = acc > 255 ? 255 : acc;
}

// One row of the horizontal pass, one output pixel at a time: each tap's R, G, B go through one
// 4-lane multiply-add. The 4-byte load reads one byte past the tap's pixel; `kExactLoads` reads
// exactly 3 bytes instead, for the last row of a buffer, where that byte may not exist.
template <bool kExactLoads>
inline void horizontal_row(const uint8_t* row, uint8_t* dst, int out_width, const int* bounds,
                           const int32_t* coeffs, int ksize) {
  for (int xx = 0; xx < out_width; ++xx) {
    const uint8_t* p = row + static_cast<ptrdiff_t>(bounds[2 * xx]) * kChannels;
    const int n = bounds[2 * xx + 1];
    const int32_t* k = coeffs + static_cast<ptrdiff_t>(xx) * ksize;
    V4i32 acc = {kRoundingHalf, kRoundingHalf, kRoundingHalf, 0};
    for (int t = 0; t < n; ++t) {
      V4u8 px = {0, 0, 0, 0};
      std::memcpy(&px, p + 3 * t, kExactLoads ? 3 : 4);
      acc += __builtin_convertvector(px, V4i32) * k[t];
    }
    clip8_lanes(acc);
    dst[3 * xx + 0] = static_cast<uint8_t>(acc[0]);
    dst[3 * xx + 1] = static_cast<uint8_t>(acc[1]);
    dst[3 * xx + 2] = static_cast<uint8_t>(acc[2]);
  }
}

// Along rows: out pixel xx of each row is the weighted sum of in pixels
// [bounds[2xx], bounds[2xx] + bounds[2xx+1]) with coefficients coeffs[xx * ksize ...].
// Rows are `in_stride` apart; every row but the last may be read one byte past its end (that
// byte lies before the next row).
STOKER_VECTOR_CLONES
void horizontal_pass(const uint8_t* in, ptrdiff_t in_stride, uint8_t* out, ptrdiff_t out_stride,
                     int rows, int out_width, const int* bounds, const int32_t* coeffs,
                     int ksize) {
  for (int r = 0; r + 1 < rows; ++r) {
    horizontal_row<false>(in + r * in_stride, out + r * out_stride, out_width, bounds, coeffs,
                          ksize);
  }
  if (rows > 0) {
    horizontal_row<true>(in + (rows - 1) * in_stride, out + (rows - 1) * out_stride, out_width,
                         bounds, coeffs, ksize);
  }
}

// Along columns: out row yy is the weighted sum of in rows [bounds[2yy], +bounds[2yy+1]), each
// `row_bytes` wide, 8 bytes (any mix of channels) per vector.
STOKER_VECTOR_CLONES
void vertical_pass(const uint8_t* in, ptrdiff_t in_stride, uint8_t* out, ptrdiff_t out_stride,
                   int out_rows, int row_bytes, const int* bounds, const int32_t* coeffs,
                   int ksize) {
  for (int yy = 0; yy < out_rows; ++yy) {
    const uint8_t* first_row = in + static_cast<ptrdiff_t>(bounds[2 * yy]) * in_stride;
    const int n = bounds[2 * yy + 1];
    const int32_t* k = coeffs + static_cast<ptrdiff_t>(yy) * ksize;
    uint8_t* dst = out + yy * out_stride;
    auto column_block = [&](int i) {
      V8i32 acc = {kRoundingHalf, kRoundingHalf, kRoundingHalf, kRoundingHalf,
                   kRoundingHalf, kRoundingHalf, kRoundingHalf, kRoundingHalf};
      const uint8_t* p = first_row + i;
      for (int t = 0; t < n; ++t, p += in_stride) {
        V8u8 px;
        std::memcpy(&px, p, 8);
        acc += __builtin_convertvector(px, V8i32) * k[t];
      }
      clip8_lanes(acc);
      const V8u8 v = __builtin_convertvector(acc, V8u8);
      std::memcpy(dst + i, &v, 8);
    };
    int i = 0;
    for (; i + 8 <= row_bytes; i += 8) column_block(i);
    if (i < row_bytes) {
      if (row_bytes >= 8) {
        // Redo the last 8 bytes: the overlap rewrites the same values, and nothing is read
        // outside the row.
        column_block(row_bytes - 8);
      } else {
        for (; i < row_bytes; ++i) {
          int32_t acc = kRoundingHalf;
          for (int t = 0; t < n; ++t) acc += first_row[t * in_stride + i] * k[t];
          dst[i] = clip8(acc);
        }
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
    throw Error(ErrorCode::kInternal,
                "resize: source region [" + std::to_string(src.origin_x) + ", " +
                    std::to_string(src.origin_x + src.width) + ") x [" +
                    std::to_string(src.origin_y) + ", " +
                    std::to_string(src.origin_y + src.height) +
                    ") does not cover the filter taps [" + std::to_string(x_lo) + ", " +
                    std::to_string(x_hi) + ") x [" + std::to_string(y_lo) + ", " +
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

  if (!need_v) {
    // Only the horizontal pass; y is the identity so rows map one to one.
    shift_bounds(bounds_x_, src.origin_x);
    horizontal_pass(src_at(src.origin_x, 0), src.stride, dst, dst_stride, out_height, out_width,
                    bounds_x_.data(), coeffs_x_.data(), ax.ksize);
    return;
  }
  if (!need_h) {
    // Only the vertical pass, over full rows (x is the identity, so the region spans them).
    shift_bounds(bounds_y_, src.origin_y);
    vertical_pass(src_at(0, src.origin_y), src.stride, dst, dst_stride, out_height,
                  out_width * kChannels, bounds_y_.data(), coeffs_y_.data(), ay.ksize);
    return;
  }

  if (horizontal_first(src.image_width, src.image_height, out_width, out_height)) {
    // Horizontal pass over only the rows the vertical pass reads, into an 8-bit intermediate.
    const int rows = y_hi - y_lo;
    const ptrdiff_t temp_stride = ptrdiff_t{out_width} * kChannels;
    temp_.resize(static_cast<size_t>(temp_stride) * static_cast<size_t>(rows));
    shift_bounds(bounds_x_, src.origin_x);
    shift_bounds(bounds_y_, y_lo);
    horizontal_pass(src_at(src.origin_x, y_lo), src.stride, temp_.data(), temp_stride, rows,
                    out_width, bounds_x_.data(), coeffs_x_.data(), ax.ksize);
    vertical_pass(temp_.data(), temp_stride, dst, dst_stride, out_height, out_width * kChannels,
                  bounds_y_.data(), coeffs_y_.data(), ay.ksize);
  } else {
    // Vertical pass first. Pillow runs it over every column; only those the horizontal pass
    // reads are computed here, which gives the same bytes where it matters.
    const int cols = x_hi - x_lo;
    const ptrdiff_t temp_stride = ptrdiff_t{cols} * kChannels;
    temp_.resize(static_cast<size_t>(temp_stride) * static_cast<size_t>(out_height));
    shift_bounds(bounds_y_, src.origin_y);
    shift_bounds(bounds_x_, x_lo);
    vertical_pass(src_at(x_lo, src.origin_y), src.stride, temp_.data(), temp_stride, out_height,
                  cols * kChannels, bounds_y_.data(), coeffs_y_.data(), ay.ksize);
    horizontal_pass(temp_.data(), temp_stride, dst, dst_stride, out_height, out_width,
                    bounds_x_.data(), coeffs_x_.data(), ax.ksize);
  }
}

}  // namespace stoker::transform
