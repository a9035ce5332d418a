// Element types of batch outputs and of arrays read from samples (.npy members). The names are
// numpy's and torch's; the codes are stoker's own and never stored on disk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace stoker {

enum class DType : uint8_t {
  kBool,
  kUInt8,
  kInt8,
  kUInt16,
  kInt16,
  kUInt32,
  kInt32,
  kUInt64,
  kInt64,
  kFloat16,
  kFloat32,
  kFloat64,
};

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kBool:
    case DType::kUInt8:
    case DType::kInt8: return 1;
    case DType::kUInt16:
    case DType::kInt16:
    case DType::kFloat16: return 2;
    case DType::kUInt32:
    case DType::kInt32:
    case DType::kFloat32: return 4;
    case DType::kUInt64:
    case DType::kInt64:
    case DType::kFloat64: return 8;
  }
  return 1;
}

// numpy's name: "uint8", "float32", ...
inline std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kBool: return "bool";
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kUInt16: return "uint16";
    case DType::kInt16: return "int16";
    case DType::kUInt32: return "uint32";
    case DType::kInt32: return "int32";
    case DType::kUInt64: return "uint64";
    case DType::kInt64: return "int64";
    case DType::kFloat16: return "float16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
  }
  return "uint8";
}

// The dtype named `name` ("uint8", ...), if it is one.
inline std::optional<DType> dtype_from_name(std::string_view name) {
  for (int t = 0; t <= static_cast<int>(DType::kFloat64); ++t)
    if (dtype_name(static_cast<DType>(t)) == name) return static_cast<DType>(t);
  return std::nullopt;
}

// A member stored as bare little-endian elements, no header or codec of its own: an array pack's
// row, a window of tokens. Its bytes are exactly product(shape) * dtype_size(dtype).
struct RawLayout {
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
};

}  // namespace stoker
