#include "media/yuv.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace stoker::media::detail {

namespace {
constexpr int kShift = 14;
}

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
// function clones, chosen at load time.
__attribute__((target_clones("avx2", "default"))) void yuv_to_rgb(
    const YuvPlanes& p, const YuvMatrix& m, int x0, int y0, int x1, int y1, uint8_t* rgb,
    int rgb_stride) {
  if (x1 <= x0 || y1 <= y0) return;
  const int cw = (p.width + (1 << p.chroma_shift_x) - 1) >> p.chroma_shift_x;
  const int ch = (p.height + (1 << p.chroma_shift_y) - 1) >> p.chroma_shift_y;
  const int n = x1 - x0;
  // The chroma of the region's columns for one luma row, x 16: x 4 from each axis' blend (c0 and
  // c1: one chroma column either side of the region, for its edge pixels).
  thread_local std::vector<int32_t> u_col, v_col, u_wide, v_wide;
  thread_local std::vector<uint8_t> planar;
  const int c0 = std::max((x0 >> p.chroma_shift_x) - 1, 0), c1 = std::min(cw, ((x1 - 1) >> p.chroma_shift_x) + 2);
  u_col.resize(static_cast<size_t>(c1 - c0));
  v_col.resize(static_cast<size_t>(c1 - c0));
  u_wide.resize(static_cast<size_t>(c1 - c0) << p.chroma_shift_x);
  v_wide.resize(static_cast<size_t>(c1 - c0) << p.chroma_shift_x);
  planar.resize(static_cast<size_t>(n) * 3);

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
      for (int c = 0; c <= last; ++c) {
        const int before = std::max(c - 1, 0), after = std::min(c + 1, last);
        const size_t k = static_cast<size_t>(c);
        u_wide[2 * k] = 3 * u_col[k] + u_col[static_cast<size_t>(before)];
        v_wide[2 * k] = 3 * v_col[k] + v_col[static_cast<size_t>(before)];
        u_wide[2 * k + 1] = 3 * u_col[k] + u_col[static_cast<size_t>(after)];
        v_wide[2 * k + 1] = 3 * v_col[k] + v_col[static_cast<size_t>(after)];
      }
    } else {
      for (int c = 0; c <= last; ++c) {
        u_wide[static_cast<size_t>(c)] = 4 * u_col[static_cast<size_t>(c)];
        v_wide[static_cast<size_t>(c)] = 4 * v_col[static_cast<size_t>(c)];
      }
    }
    const int32_t* __restrict us = u_wide.data() + (x0 - (c0 << p.chroma_shift_x));
    const int32_t* __restrict vs = v_wide.data() + (x0 - (c0 << p.chroma_shift_x));
    const uint8_t* __restrict luma = p.y + static_cast<ptrdiff_t>(y) * p.y_stride + x0;
    // Planar first (a loop the compiler vectorises: local coefficients, no aliasing), then
    // interleaved.
    uint8_t* __restrict rs = planar.data();
    uint8_t* __restrict gs = rs + n;
    uint8_t* __restrict bs = gs + n;
    const int32_t ys = m.y_scale, yo = m.y_offset, rv = m.r_v, gu = m.g_u, gv = m.g_v, bu = m.b_u;
    for (int i = 0; i < n; ++i) {
      const int32_t l = ys * (luma[i] - yo);
      const int32_t u = us[i] - 2048, v = vs[i] - 2048;  // 128 x 16
      rs[i] = static_cast<uint8_t>(std::clamp((l + rv * v) >> kShift, 0, 255));
      gs[i] = static_cast<uint8_t>(std::clamp((l + gu * u + gv * v) >> kShift, 0, 255));
      bs[i] = static_cast<uint8_t>(std::clamp((l + bu * u) >> kShift, 0, 255));
    }
    uint8_t* out = rgb + static_cast<ptrdiff_t>(y) * rgb_stride + 3 * x0;
    for (int i = 0; i < n; ++i) {
      out[3 * i] = rs[i];
      out[3 * i + 1] = gs[i];
      out[3 * i + 2] = bs[i];
    }
  }
}

}  // namespace stoker::media::detail
