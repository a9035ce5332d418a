// The augmentations' inner loops that run at memory speed (augment.cc holds the ops; this, how
// their bytes are rewritten): 256-entry tables applied to interleaved RGB, and the pixel copies
// of the geometric ops. Each has a portable form and a SIMD form chosen at run time (AVX-512
// VBMI for the tables, AVX2 for the copies, on x86-64 CPUs that have them); both give the same
// bytes, which augment_test checks with the portable forms forced.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace stoker::augment::detail {

// One table per channel: value v of channel c becomes tables[c][v].
using Tables = std::array<std::array<uint8_t, 256>, 3>;

// pixels[3k + c] = tables[c][pixels[3k + c]] for k < count.
void apply_tables(uint8_t* pixels, size_t count, const Tables& tables);

// Output row `out` (`width` pixels) from the source image `in` (rows of `row_bytes`): pixel x
// is the source pixel at byte offset from[x], or `fill` where from[x] < 0. `in` must have one
// readable byte past its last pixel (the SIMD form loads 4 bytes per pixel).
void gather_row(const uint8_t* in, const int32_t* from, int width, uint8_t* out,
                const std::array<uint8_t, 3>& fill);

// The source of each pixel of output row y (`from`, as gather_row takes it) for an image of
// width x height whose rows are 3 * width bytes apart:
// PIL's Image.transform(AFFINE, m, NEAREST): the pixel under (m0 x' + m1 y' + m2,
// m3 x' + m4 y' + m5), x' = x + 0.5, y' = y + 0.5, floored, in float64;
void pil_affine_row(const std::array<double, 6>& m, int y, int width, int height, int32_t* from);
// torchvision's affine with nearest sampling (F.affine on a tensor): the output grid in
// centred coordinates times theta (t = t00, t10, t20, t01, t11, t21, each already divided by
// half the size), then grid_sample's nearest pixel, in float32.
void torchvision_affine_row(const std::array<float, 6>& t, int y, int width, int height,
                            int32_t* from);

// A whole image under one of the maps above: output pixel (x, y) of `out` from `in` (its copy,
// with the same slack as gather_row's), the fill outside. With AVX2, the rows' coordinates are
// stepped in fixed point and their pixels gathered at once (the rows' form where the image is
// too large for it), the bytes the same.
void pil_affine_image(const uint8_t* in, uint8_t* out, const std::array<double, 6>& m, int width,
                      int height, const std::array<uint8_t, 3>& fill);
void torchvision_affine_image(const uint8_t* in, uint8_t* out, const std::array<float, 6>& t,
                              int width, int height, const std::array<uint8_t, 3>& fill);

// Whether the loops built for AVX2 and FMA run (augment.cc's STOKER_TWICE): the CPU has both
// and the tests have not forced the portable forms.
bool use_avx2_fma();

// Whether the tests forced the portable forms (augment.cc then also leaves its shortcuts for
// translations and shears, so that they are compared with the pixel-by-pixel map).
bool portable_forced();

// Tests: true forces the portable forms.
void set_portable_kernels_for_testing(bool portable);
// The nearest-neighbour affine maps' copies in their SIMD form: -1 as the CPU prefers (gathers on
// Intel, 4-byte copies elsewhere), 0 the copies, 1 the gathers.
void set_affine_gathers_for_testing(int gathers);

}  // namespace stoker::augment::detail
