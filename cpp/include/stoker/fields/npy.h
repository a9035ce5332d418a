// Element conversions that write an array (a .npy member, an array pack's row) into a batch
// buffer of another dtype. The .npy parser itself is stoker/core/npy.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "stoker/core/dtype.h"
#include "stoker/core/npy.h"

namespace stoker::fields {

using stoker::NpyArray;
using stoker::NpyLimits;
using stoker::parse_npy;

// Converts `count` elements of `from` at `src` (little-endian, any alignment) to `to` at `dst`
// (native order, any alignment); the ranges must not overlap. As numpy's
// astype(casting="unsafe") does, wherever numpy's result is defined:
//   - integer -> integer: modulo 2^bits (two's complement): int16 -1 -> uint8 255, 300 -> 44.
//   - integer -> float: rounded to nearest, ties to even (int64 -> float32 in one rounding).
//   - float -> float: rounded to nearest even; overflow gives +-inf; NaN stays NaN. float16 is
//     converted both ways by hand, subnormals included (float64 -> float16 in one rounding, as
//     numpy does).
//   - float -> integer: truncated toward zero. When the truncated value fits in the destination,
//     that value (numpy's on every platform). Otherwise numpy's result depends on the platform
//     and the type (x86-64 goes through int32 for the narrow types, giving 0 for 5e9 -> uint8,
//     and INT_MIN for anything beyond); stoker defines it as: a truncated value that fits in
//     int64 is taken modulo 2^bits like an integer (-1.0 -> uint8 255, 300.0 -> uint8 44, which
//     is also numpy's x86-64 result), uint64 takes [2^63, 2^64) exactly, anything beyond (and
//     +-inf) saturates to the destination's minimum or maximum, and NaN gives 0.
//   - -> bool: value != 0 (NaN -> true, -0.0 -> false). bool ->: 0 or 1; a bool source byte
//     other than 0 reads as true, so bool -> bool writes only 0 and 1.
void convert_elements(DType from, const uint8_t* src, DType to, uint8_t* dst, int64_t count);

// float16 bit patterns <-> double, exact where the value is representable, else rounded to
// nearest even (numpy's npy_double_to_half, NaN payloads included).
uint16_t double_to_half(double value);
double half_to_double(uint16_t bits);

}  // namespace stoker::fields
