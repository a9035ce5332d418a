// Fuzz target: a .npy member of a sample, as Array and Boxes fields read it (fields/npy.h,
// fields/box_source.h). The input is the whole file: parse_npy with the default limits and with
// tight ones, convert_elements of the parsed array to every dtype (float32 first: what a float
// batch gets), and parse_npy_boxes.
//
// Beyond "no crash": an array that parses lies at the very end of the input with exactly the bytes
// its shape says; tighter limits only ever refuse, never change a result; converting to its own
// dtype copies; every value of a dtype narrower than 64-bit integers survives float64 and back (NaN
// stays NaN) and agrees with the float32 conversion; boxes come 4 finite numbers and a class >= -1
// each, one per row of the array.
#include <cmath>
#include <cstring>
#include <vector>

#include "fuzz_util.h"
#include "stoker/core/dtype.h"
#include "stoker/core/error.h"
#include "stoker/fields/box_source.h"
#include "stoker/fields/npy.h"

using namespace stoker;
using namespace stoker::fields;

namespace {

constexpr DType kAllTypes[] = {DType::kBool,  DType::kUInt8,   DType::kInt8,    DType::kUInt16,
                               DType::kInt16, DType::kUInt32,  DType::kInt32,   DType::kUInt64,
                               DType::kInt64, DType::kFloat16, DType::kFloat32, DType::kFloat64};

bool is_float(DType t) {
  return t == DType::kFloat16 || t == DType::kFloat32 || t == DType::kFloat64;
}

void check_array(const uint8_t* data, size_t size, const NpyArray& a, const NpyLimits& limits) {
  FUZZ_CHECK(a.shape.size() <= static_cast<size_t>(limits.max_dims));
  for (int64_t d : a.shape) FUZZ_CHECK(d >= 0 && d <= limits.max_elements);
  const int64_t n = a.elements();
  FUZZ_CHECK(n >= 0 && n <= limits.max_elements);
  FUZZ_CHECK(a.bytes == static_cast<size_t>(n) * dtype_size(a.dtype));
  FUZZ_CHECK(a.data >= data && a.data + a.bytes == data + size);
  fuzz::touch(a.data, a.bytes);
}

void check_conversions(const NpyArray& a) {
  // n elements are in the input (a.bytes = n * itemsize of it), so these buffers are bounded by
  // the input's size as well as by max_elements.
  const auto n = static_cast<size_t>(a.elements());
  const size_t item = dtype_size(a.dtype);
  std::vector<float> f32(n);
  convert_elements(a.dtype, a.data, DType::kFloat32, reinterpret_cast<uint8_t*>(f32.data()),
                   a.elements());
  fuzz::touch(reinterpret_cast<const uint8_t*>(f32.data()), n * sizeof(float));

  std::vector<uint8_t> out(n * 8);
  for (DType t : kAllTypes) {
    convert_elements(a.dtype, a.data, t, out.data(), a.elements());
    fuzz::touch(out.data(), n * dtype_size(t));
    if (t == DType::kBool)
      for (size_t i = 0; i < n; ++i) FUZZ_CHECK(out[i] <= 1);
  }

  if (n == 0) return;  // nothing to compare, and memcmp must not see the empty vectors' nullptr

  // To its own dtype: a copy (bool normalised to 0 and 1).
  convert_elements(a.dtype, a.data, a.dtype, out.data(), a.elements());
  if (a.dtype == DType::kBool) {
    for (size_t i = 0; i < n; ++i) FUZZ_CHECK(out[i] == (a.data[i] != 0));
  } else {
    FUZZ_CHECK(std::memcmp(out.data(), a.data, a.bytes) == 0);
  }

  // Through float64 and back: exact for every type whose values float64 holds.
  if (a.dtype == DType::kInt64 || a.dtype == DType::kUInt64) return;
  std::vector<double> wide(n);
  convert_elements(a.dtype, a.data, DType::kFloat64, reinterpret_cast<uint8_t*>(wide.data()),
                   a.elements());
  std::vector<uint8_t> back(a.bytes);
  convert_elements(DType::kFloat64, reinterpret_cast<const uint8_t*>(wide.data()), a.dtype,
                   back.data(), a.elements());
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(wide[i])) {
      FUZZ_CHECK(is_float(a.dtype) && std::isnan(f32[i]));
      double again;
      convert_elements(a.dtype, back.data() + i * item, DType::kFloat64,
                       reinterpret_cast<uint8_t*>(&again), 1);
      FUZZ_CHECK(std::isnan(again));
      continue;
    }
    if (a.dtype == DType::kBool) {
      FUZZ_CHECK(back[i] == (a.data[i] != 0));
    } else {
      FUZZ_CHECK(std::memcmp(back.data() + i * item, a.data + i * item, item) == 0);
    }
    // float32 directly, or float64 then float32: one rounding either way for these types.
    FUZZ_CHECK(f32[i] == static_cast<float>(wide[i]));
  }
}

void check_boxes(const uint8_t* data, size_t size) {
  const BoxLimits limits;
  RawBoxes boxes;
  try {
    boxes = parse_npy_boxes(data, size, limits);
  } catch (const Error&) {
    return;
  }
  FUZZ_CHECK(boxes.count() <= limits.max_boxes);
  FUZZ_CHECK(boxes.coords.size() == static_cast<size_t>(boxes.count()) * 4);
  for (double c : boxes.coords) FUZZ_CHECK(std::isfinite(c));
  for (int64_t k : boxes.classes) FUZZ_CHECK(k >= -1);
  // One box per row of an array the plain parser reads too.
  const NpyArray a = parse_npy(data, size);
  FUZZ_CHECK(a.shape.size() == 1 || a.shape.size() == 2);
  FUZZ_CHECK(a.shape[0] == boxes.count());
  if (a.shape.size() == 2 && a.shape[1] == 4)
    for (int64_t k : boxes.classes) FUZZ_CHECK(k == -1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const NpyLimits defaults;
  const NpyLimits tight{.max_elements = 7, .max_dims = 2, .max_header_bytes = 200};
  bool parsed = false;
  NpyArray a;
  try {
    a = parse_npy(data, size, defaults);
    parsed = true;
  } catch (const Error&) {
  }
  if (parsed) {
    check_array(data, size, a, defaults);
    check_conversions(a);
  }
  try {
    const NpyArray t = parse_npy(data, size, tight);
    check_array(data, size, t, tight);
    FUZZ_CHECK(parsed && t.dtype == a.dtype && t.shape == a.shape && t.data == a.data);
  } catch (const Error&) {
  }
  check_boxes(data, size);
  return 0;
}
