// numpy's .npy files, read from untrusted sample members (Array and Boxes fields), and the element
// conversions that write such an array into a batch buffer of another dtype.
//
// What parse_npy accepts (format versions 1.0, 2.0 and 3.0; numpy's NEP 1):
//   magic "\x93NUMPY", major 1-3, minor 0, a little-endian header length (2 bytes in 1.0, 4 after),
//   then the header: a Python dict literal with exactly the keys 'descr', 'fortran_order' and
//   'shape' (any order, no key twice), followed by whitespace only. Read by a small tokenizer of
//   its own (no eval, no JSON parser): strings in ' or " (a backslash escapes the next character),
//   True, False, None, integers (an 'L' suffix, as Python 2's numpy wrote, is allowed in versions
//   1.0 and 2.0), tuples ("()", "(3,)", "(3, 4)"; "(3)" is not a tuple), lists, whitespace and
//   trailing commas; nested at most 32 deep.
//   'descr' a dtype string of the allow-list: b1 (bool), u1 i1 u2 i2 u4 i4 u8 i8 f2 f4 f8. Byte
//   order '<', '=' or '|' (numpy: native; stoker runs on little-endian machines), or none; for the
//   one-byte types any order, '>' included, since it means nothing there.
//   'fortran_order' False; 'shape' a tuple of non-negative integers (C order). A 0-d array (shape
//   ()) has one element.
//   The data: exactly product(shape) * itemsize bytes, up to the end of the input.
// Refused, as stoker::Error with
//   kCorruptData:  bad magic, input shorter than its prefix, header length past the end, a header
//                  that is not such a dict (missing, extra or repeated keys, a value of the wrong
//                  type, negative dimensions, junk after the dict), data not exactly the size the
//                  shape says (truncated, or trailing bytes).
//   kUnsupported:  versions other than 1.0, 2.0, 3.0; object dtypes ('O': pickled Python objects,
//                  never unpickled here), structured/record dtypes (a list as 'descr', or 'V'),
//                  strings ('S', 'a', 'U'), complex, datetimes, long double, any other dtype
//                  string; big-endian ('>') multi-byte types; fortran_order True (column-major
//                  data is not transposed: save it with np.ascontiguousarray).
//   kResourceLimit: a header longer than max_header_bytes; more than max_dims dimensions; one
//                  dimension, or the product of all (computed overflow-checked), above
//                  max_elements.
//   kInvalidArgument: negative limits.
// Nothing is allocated from a size read from the file: the array points into the input, and the
// header is read only once its length is known to be within max_header_bytes.
//
// Thread safety: all functions are pure; call them from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "stoker/core/dtype.h"

namespace stoker::fields {

struct NpyLimits {
  int64_t max_elements = int64_t{1} << 26;
  int max_dims = 8;
  // numpy's own default (np.load's max_header_size): headers numpy writes for the accepted dtypes
  // are under 256 bytes; larger ones are a structured dtype or an attack on the tokenizer.
  size_t max_header_bytes = 10000;
};

struct NpyArray {
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;     // C order
  const uint8_t* data = nullptr;  // points into the parsed buffer (which must outlive it);
                                  // little-endian elements, not necessarily aligned
  size_t bytes = 0;               // exactly product(shape) * dtype_size(dtype)
  int64_t elements() const;       // product(shape); 1 for shape ()
};

NpyArray parse_npy(const uint8_t* data, size_t size, const NpyLimits& limits = {});

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
