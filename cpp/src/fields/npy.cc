#include "stoker/fields/npy.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "stoker/core/error.h"

namespace stoker::fields {

static_assert(std::numeric_limits<double>::is_iec559 && std::numeric_limits<float>::is_iec559,
              "float16 conversions and float -> float rounding assume IEEE 754");

// ---- float16 ----------------------------------------------------------------------------------

uint16_t double_to_half(double value) {
  const uint64_t bits = std::bit_cast<uint64_t>(value);
  const auto sign = static_cast<uint16_t>((bits >> 48) & 0x8000);
  if (std::isnan(value)) {
    // numpy keeps the payload's top bits, and a quiet NaN whose payload would vanish stays a NaN.
    auto h = static_cast<uint16_t>(0x7C00 + ((bits & 0x000FFFFFFFFFFFFFull) >> 42));
    if (h == 0x7C00) ++h;
    return sign | h;
  }
  const double a = std::fabs(value);
  // 65504 is the largest half; half-way to the next binade (65520) rounds to even, i.e. up.
  if (a >= 65520.0) return sign | 0x7C00;
  // Round to nearest, ties to even, of a value below 2^11 (exact in double, as are the steps).
  const auto round_even = [](double v) {
    const double f = std::floor(v);
    const double rest = v - f;
    auto n = static_cast<uint32_t>(f);
    if (rest > 0.5 || (rest == 0.5 && (n & 1))) ++n;
    return n;
  };
  if (a < 0x1p-14) {
    // Subnormal: units of 2^-24; a result of 1024 is the smallest normal, bit pattern 0x0400.
    return sign | static_cast<uint16_t>(round_even(a * 0x1p24));
  }
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): the half exponent is e - 1, in [-14, 15]
  const uint32_t significand = round_even(std::ldexp(a, 11 - e));  // [1024, 2048]
  // A carry to 2048 moves into the exponent field by itself (and to inf from the top binade).
  return sign |
         static_cast<uint16_t>((static_cast<uint32_t>(e - 1 + 15) << 10) + significand - 1024);
}

double half_to_double(uint16_t h) {
  const uint32_t exponent = (h >> 10) & 0x1F;
  const uint32_t mantissa = h & 0x3FF;
  const bool negative = h & 0x8000;
  if (exponent == 0x1F) {
    const uint64_t bits =
        (uint64_t{negative} << 63) | 0x7FF0000000000000ull | (uint64_t{mantissa} << 42);
    return std::bit_cast<double>(bits);  // inf, or NaN with numpy's payload
  }
  const double magnitude = exponent == 0
                               ? std::ldexp(mantissa, -24)
                               : std::ldexp(mantissa + 1024, static_cast<int>(exponent) - 25);
  return negative ? -magnitude : magnitude;
}

// ---- convert_elements -------------------------------------------------------------------------

namespace {

// Tags for the two element types C++ has no type for.
struct Bool {};
struct Half {};
template <typename T>
struct Storage {
  using type = T;
};
template <>
struct Storage<Bool> {
  using type = uint8_t;
};
template <>
struct Storage<Half> {
  using type = uint16_t;
};

// .npy data is little-endian and so is every machine stoker runs on (batches are handed to torch
// in native order): a load is a memcpy, which also allows unaligned data.
static_assert(std::endian::native == std::endian::little, "stoker assumes a little-endian host");

template <typename T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The source element as the widest type of its family: bool and signed -> int64, unsigned ->
// uint64, floats -> double (exact for float16 and float32).
template <typename S>
auto read_element(const uint8_t* p) {
  using St = typename Storage<S>::type;
  const St raw = load_le<St>(p);
  if constexpr (std::is_same_v<S, Bool>) {
    return int64_t{raw != 0};
  } else if constexpr (std::is_same_v<S, Half>) {
    return half_to_double(raw);
  } else if constexpr (std::is_floating_point_v<S>) {
    return static_cast<double>(raw);
  } else if constexpr (std::is_signed_v<S>) {
    return static_cast<int64_t>(raw);
  } else {
    return static_cast<uint64_t>(raw);
  }
}

template <typename D>
D float_to_int(double x) {
  if (std::isnan(x)) return 0;
  const double t = std::trunc(x);
  constexpr double kTwo63 = 0x1p63;
  constexpr double kTwo64 = 0x1p64;
  if constexpr (std::is_same_v<D, uint64_t>) {
    if (t >= 0) return t < kTwo64 ? static_cast<uint64_t>(t) : UINT64_MAX;
  }
  if (t >= -kTwo63 && t < kTwo63) return static_cast<D>(static_cast<int64_t>(t));  // modulo 2^bits
  return t > 0 ? std::numeric_limits<D>::max() : std::numeric_limits<D>::min();
}

template <typename D, typename V>
typename Storage<D>::type cast_element(V v) {
  if constexpr (std::is_same_v<D, Bool>) {
    return v != 0 ? 1 : 0;
  } else if constexpr (std::is_same_v<D, Half>) {
    if constexpr (std::is_same_v<V, double>) {
      return double_to_half(v);
    } else {
      // |v| >= 2^53 rounds twice, but anything from 65520 up is inf either way.
      return double_to_half(static_cast<double>(v));
    }
  } else if constexpr (std::is_floating_point_v<D>) {
    return static_cast<D>(v);  // one IEEE rounding, from the integer or the double
  } else if constexpr (std::is_same_v<V, double>) {
    return float_to_int<D>(v);
  } else {
    return static_cast<D>(v);  // integer -> integer: modulo 2^bits (C++20)
  }
}

template <typename S, typename D>
void convert_loop(const uint8_t* src, uint8_t* dst, int64_t count) {
  using SSt = typename Storage<S>::type;
  using DSt = typename Storage<D>::type;
  if constexpr (std::is_same_v<S, D> && !std::is_same_v<S, Bool>) {
    std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(SSt));
  } else {
    for (int64_t i = 0; i < count; ++i) {
      const DSt out = cast_element<D>(read_element<S>(src + i * sizeof(SSt)));
      std::memcpy(dst + i * sizeof(DSt), &out, sizeof out);
    }
  }
}

// Calls f(S{}) (a tag object) for the C++ type of a DType.
template <typename F>
void with_type(DType t, F&& f) {
  switch (t) {
    case DType::kBool: return f(Bool{});
    case DType::kUInt8: return f(uint8_t{});
    case DType::kInt8: return f(int8_t{});
    case DType::kUInt16: return f(uint16_t{});
    case DType::kInt16: return f(int16_t{});
    case DType::kUInt32: return f(uint32_t{});
    case DType::kInt32: return f(int32_t{});
    case DType::kUInt64: return f(uint64_t{});
    case DType::kInt64: return f(int64_t{});
    case DType::kFloat16: return f(Half{});
    case DType::kFloat32: return f(float{});
    case DType::kFloat64: return f(double{});
  }
  throw_error(ErrorCode::kInvalidArgument, "convert_elements: unknown dtype");
}

}  // namespace

void convert_elements(DType from, const uint8_t* src, DType to, uint8_t* dst, int64_t count) {
  STOKER_CHECK(count >= 0, ErrorCode::kInvalidArgument, "convert_elements: negative count");
  if (count == 0) return;
  with_type(from, [&](auto s) {
    with_type(to, [&](auto d) { convert_loop<decltype(s), decltype(d)>(src, dst, count); });
  });
}

}  // namespace stoker::fields
