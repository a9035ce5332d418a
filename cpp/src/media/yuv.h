#pragma once

// Planar 8-bit YUV (4:2:0, 4:2:2, 4:4:4) to packed RGB for a region of a frame only: what a
// clip's crop needs, rather than the whole frame through swscale's exact-rounding C path (0.5 ms
// a 340x256 frame, more than decoding it). BT.601 or BT.709, limited or full range; chroma
// upsampled bilinearly, each sample centred on the luma pixels it covers (weights 3/4 and 1/4
// on each axis), values truncated as swscale's tables do: within 43-46 dB of PyAV's frames on
// the tests' clips (PyAV's own swscale and Debian's exact-rounding one are 50 dB apart), and
// within one level of the same formula in double precision (media_test). Integer arithmetic,
// 16 pixels a step in AVX2 where the CPU has it, the same bytes as the portable loop.

#include <cstdint>

namespace stoker::media::detail {

struct YuvPlanes {
  const uint8_t* y;
  const uint8_t* u;
  const uint8_t* v;
  int y_stride, u_stride, v_stride;
  int width, height;                   // of the luma plane
  int chroma_shift_x, chroma_shift_y;  // 1, 1: 4:2:0; 1, 0: 4:2:2; 0, 0: 4:4:4
};

struct YuvMatrix {
  int32_t y_scale, y_offset;   // RGB (x 2^14) = y_scale * (Y - y_offset) + ...
  int32_t r_v, g_u, g_v, b_u;  // per unit of chroma x 16 (the upsampler's scale)
};

YuvMatrix yuv_matrix(bool bt709, bool full_range);

// Writes RGB for pixels [x0, x1) x [y0, y1) to `rgb` (rows `rgb_stride` bytes apart, pixel (x, y)
// at rgb + y * rgb_stride + 3 * x); nothing else.
void yuv_to_rgb(const YuvPlanes& p, const YuvMatrix& m, int x0, int y0, int x1, int y1,
                uint8_t* rgb, int rgb_stride);

// Tests: the portable loop everywhere (true), or AVX2 where the CPU has it (false, the default).
void set_portable_yuv_for_testing(bool portable);

}  // namespace stoker::media::detail
