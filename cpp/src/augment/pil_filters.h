// Pillow's bilinear and bicubic affine resampling, as Image.transform(size, AFFINE, m,
// BILINEAR or BICUBIC, fillcolor=fill) computes it on an RGB image (libImaging/Geometry.c: the
// generic transform with bilinear_filter32RGB and bicubic_filter32RGB), byte for byte: timm's
// rotate, shear and translate run it.
//
// Output pixel (x, y) samples the source at (u, v) = (m0 x' + m1 y' + m2, m3 x' + m4 y' + m5),
// x' = x + 0.5, y' = y + 0.5, in float64 (the products added left to right, no fused
// multiply-add). Outside 0 <= u < width, 0 <= v < height it is the fill; inside, the source's
// pixel centres nearest (u - 0.5, v - 0.5) are blended, a neighbour past the image's edge
// taken as the edge pixel: bilinear, v1 = a + (b - a) dx along each of two rows, then
// v1 + (v2 - v1) dy; bicubic, Pillow's cubic (a = -1, four taps: p1 = v2, p2 = v3 - v1,
// p3 = 2 (v1 - v2) + v3 - v4, p4 = -v1 + v2 - v3 + v4, v = p1 + d (p2 + d (p3 + d p4))) along
// four rows, then down them, clipped to [0, 255]. Every value is truncated to a byte, as Pillow
// casts it. Each form (the portable one and, on CPUs with AVX2, four channels of a pixel in
// one vector of doubles) does these operations in this order, so both give Pillow's bytes.
#pragma once

#include <array>
#include <cstdint>

namespace stoker::augment::detail {

// `in`: the source, width x height RGB, with 4 readable bytes past its last pixel (the vector
// form loads 4 bytes a pixel); `out` another buffer of the same size.
void pil_bilinear_affine(const uint8_t* in, uint8_t* out, const std::array<double, 6>& m, int width,
                         int height, const std::array<uint8_t, 3>& fill);
void pil_bicubic_affine(const uint8_t* in, uint8_t* out, const std::array<double, 6>& m, int width,
                        int height, const std::array<uint8_t, 3>& fill);

// Tests: false keeps rotations on the AVX2 form where the CPU has AVX-512 (to compare it too).
void allow_avx512_for_testing(bool allowed);

}  // namespace stoker::augment::detail
