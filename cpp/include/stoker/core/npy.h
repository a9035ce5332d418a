// numpy's .npy files, read from untrusted sample members (Array and Boxes fields) and from the
// column files of array packs (only their header: parse_npy_header).
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

namespace stoker {

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

// The header of a .npy file of `file_size` bytes whose first `size` bytes are at `data` (at least
// the magic, the header length and the header: min(file_size, 12 + max_header_bytes) bytes
// always suffice). The same checks as parse_npy, the data's size included (it must be exactly
// file_size - data_offset): what an array pack's column file needs before it is read row by row.
struct NpyHeader {
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  uint64_t data_offset = 0;  // of the first element, from the start of the file
  uint64_t data_bytes = 0;   // product(shape) * dtype_size(dtype)
};
NpyHeader parse_npy_header(const uint8_t* data, size_t size, uint64_t file_size,
                           const NpyLimits& limits = {});

}  // namespace stoker
