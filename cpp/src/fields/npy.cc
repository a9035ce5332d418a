#include "stoker/fields/npy.h"

#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "stoker/core/error.h"

namespace stoker::fields {

namespace {

static_assert(std::numeric_limits<double>::is_iec559 && std::numeric_limits<float>::is_iec559,
              "float16 conversions and float -> float rounding assume IEEE 754");

[[noreturn]] void npy_error(ErrorCode code, const std::string& why) {
  throw Error(code, "npy: " + why);
}

// ---- The header: a Python literal -------------------------------------------------------------

struct PyValue {
  enum class Kind { kString, kInt, kBool, kNone, kTuple, kList };
  Kind kind = Kind::kNone;
  std::string text;            // kString
  int64_t number = 0;          // kInt, clamped to int64's range; kBool: 0 or 1
  std::vector<PyValue> items;  // kTuple, kList
};

constexpr int kMaxNesting = 32;

class PyLiteralReader {
 public:
  PyLiteralReader(std::string_view text, bool allow_long_suffix)
      : s_(text), allow_long_suffix_(allow_long_suffix) {}

  // The header dict, as (key, value) pairs in file order.
  std::vector<std::pair<std::string, PyValue>> read_dict() {
    skip_space();
    expect('{', "the header is not a Python dict literal");
    std::vector<std::pair<std::string, PyValue>> entries;
    for (;;) {
      skip_space();
      if (peek() == '}') break;
      if (peek() != '\'' && peek() != '"') fail("a header key is not a string");
      std::string key = read_string();
      skip_space();
      expect(':', "expected ':' after a header key");
      PyValue value = read_value(1);
      entries.emplace_back(std::move(key), std::move(value));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') fail("expected ',' or '}' in the header dict");
    }
    ++pos_;  // '}'
    skip_space();
    if (pos_ != s_.size()) fail("junk after the header dict");
    return entries;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    npy_error(ErrorCode::kCorruptData, why + " (header byte " + std::to_string(pos_) + ")");
  }
  int peek() const { return pos_ < s_.size() ? static_cast<unsigned char>(s_[pos_]) : -1; }
  void expect(char c, const char* why) {
    if (peek() != static_cast<unsigned char>(c)) fail(why);
    ++pos_;
  }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' ||
                                s_[pos_] == '\r' || s_[pos_] == '\f' || s_[pos_] == '\v'))
      ++pos_;
  }
  bool word(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    const size_t end = pos_ + w.size();
    if (end < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[end])) || s_[end] == '_'))
      return false;  // "Trueish" is a name, not True
    pos_ = end;
    return true;
  }

  std::string read_string() {
    const char quote = s_[pos_++];
    std::string out;
    for (;;) {
      if (pos_ >= s_.size() || s_[pos_] == '\n') fail("unterminated string");
      const char c = s_[pos_++];
      if (c == quote) return out;
      if (c == '\\') {
        if (pos_ >= s_.size()) fail("unterminated string");
        out.push_back(s_[pos_++]);  // the escaped character itself; only names of fields use it
        continue;
      }
      out.push_back(c);
    }
  }

  int64_t read_int() {
    bool negative = false;
    if (peek() == '-') {
      negative = true;
      ++pos_;
      skip_space();
    }
    if (peek() < '0' || peek() > '9') fail("expected a value");
    // Clamped rather than refused: a dimension too large for int64 is over any limit anyway.
    constexpr uint64_t kTwo63 = uint64_t{1} << 63;
    uint64_t magnitude = 0;
    while (peek() >= '0' && peek() <= '9') {
      const auto digit = static_cast<uint64_t>(s_[pos_++] - '0');
      magnitude = magnitude > (kTwo63 - digit) / 10 ? kTwo63 : magnitude * 10 + digit;
    }
    if (allow_long_suffix_ && (peek() == 'L' || peek() == 'l')) ++pos_;
    if (negative) return magnitude >= kTwo63 ? INT64_MIN : -static_cast<int64_t>(magnitude);
    return magnitude >= kTwo63 ? INT64_MAX : static_cast<int64_t>(magnitude);
  }

  // "(...)" or "[...]": a tuple needs a comma unless empty ("(3)" is the int 3, as in Python).
  PyValue read_sequence(char close, PyValue::Kind kind, int depth) {
    ++pos_;
    PyValue v;
    v.kind = kind;
    bool comma = false;
    for (;;) {
      skip_space();
      if (peek() == static_cast<unsigned char>(close)) break;
      v.items.push_back(read_value(depth + 1));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        comma = true;
        continue;
      }
      if (peek() != static_cast<unsigned char>(close)) fail("expected ',' or a closing bracket");
    }
    ++pos_;
    if (kind == PyValue::Kind::kTuple && v.items.size() == 1 && !comma) {
      PyValue inner = std::move(v.items[0]);
      return inner;  // parenthesised expression
    }
    return v;
  }

  PyValue read_value(int depth) {
    if (depth > kMaxNesting) fail("nested too deep");
    skip_space();
    PyValue v;
    const int c = peek();
    if (c == '\'' || c == '"') {
      v.kind = PyValue::Kind::kString;
      v.text = read_string();
    } else if (c == '(') {
      return read_sequence(')', PyValue::Kind::kTuple, depth);
    } else if (c == '[') {
      return read_sequence(']', PyValue::Kind::kList, depth);
    } else if (word("True")) {
      v.kind = PyValue::Kind::kBool;
      v.number = 1;
    } else if (word("False")) {
      v.kind = PyValue::Kind::kBool;
    } else if (word("None")) {
      v.kind = PyValue::Kind::kNone;
    } else {
      v.kind = PyValue::Kind::kInt;
      v.number = read_int();
    }
    return v;
  }

  std::string_view s_;
  size_t pos_ = 0;
  bool allow_long_suffix_;
};

// ---- descr ------------------------------------------------------------------------------------

DType dtype_from_descr(const std::string& descr) {
  std::string_view d = descr;
  char order = '=';
  if (!d.empty() && (d[0] == '<' || d[0] == '>' || d[0] == '|' || d[0] == '=')) {
    order = d[0];
    d.remove_prefix(1);
  }
  const std::string quoted = "'" + descr + "'";
  if (d.empty()) npy_error(ErrorCode::kUnsupported, "dtype " + quoted + " is not supported");
  const char kind = d[0];
  const std::string_view size = d.substr(1);
  switch (kind) {
    case 'O':
      npy_error(ErrorCode::kUnsupported,
                "dtype " + quoted + ": object arrays are pickled Python objects, never loaded");
    case 'V':
      npy_error(ErrorCode::kUnsupported,
                "dtype " + quoted + ": structured/void dtypes are not supported");
    case 'S':
    case 'a':
    case 'U':
      npy_error(ErrorCode::kUnsupported, "dtype " + quoted + ": strings are not supported");
    case 'c':
      npy_error(ErrorCode::kUnsupported, "dtype " + quoted + ": complex numbers are not supported");
    case 'M':
    case 'm':
      npy_error(ErrorCode::kUnsupported, "dtype " + quoted + ": datetimes are not supported");
    default:
      break;
  }
  DType t;
  if (kind == 'b' && size == "1") {
    t = DType::kBool;
  } else if (kind == 'u' && size == "1") {
    t = DType::kUInt8;
  } else if (kind == 'i' && size == "1") {
    t = DType::kInt8;
  } else if (kind == 'u' && size == "2") {
    t = DType::kUInt16;
  } else if (kind == 'i' && size == "2") {
    t = DType::kInt16;
  } else if (kind == 'u' && size == "4") {
    t = DType::kUInt32;
  } else if (kind == 'i' && size == "4") {
    t = DType::kInt32;
  } else if (kind == 'u' && size == "8") {
    t = DType::kUInt64;
  } else if (kind == 'i' && size == "8") {
    t = DType::kInt64;
  } else if (kind == 'f' && size == "2") {
    t = DType::kFloat16;
  } else if (kind == 'f' && size == "4") {
    t = DType::kFloat32;
  } else if (kind == 'f' && size == "8") {
    t = DType::kFloat64;
  } else {
    npy_error(ErrorCode::kUnsupported,
              "dtype " + quoted + " is not supported (bool, u1 i1 u2 i2 u4 i4 u8 i8 f2 f4 f8 are)");
  }
  if (order == '>' && dtype_size(t) > 1)
    npy_error(ErrorCode::kUnsupported, "dtype " + quoted +
                                           ": big-endian data is not supported (save it as '<" +
                                           std::string(d) + "')");
  return t;
}

uint32_t load_u16_le(const uint8_t* p) { return p[0] | (uint32_t{p[1]} << 8); }
uint32_t load_u32_le(const uint8_t* p) {
  return p[0] | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

}  // namespace

int64_t NpyArray::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

NpyArray parse_npy(const uint8_t* data, size_t size, const NpyLimits& limits) {
  STOKER_CHECK(limits.max_elements >= 0 && limits.max_dims >= 0, ErrorCode::kInvalidArgument,
               "npy: limits must not be negative");
  static constexpr uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (size < 10 || std::memcmp(data, kMagic, sizeof kMagic) != 0)
    npy_error(ErrorCode::kCorruptData, "not a .npy file (no \\x93NUMPY magic)");
  const int major = data[6];
  const int minor = data[7];
  if (major < 1 || major > 3 || minor != 0)
    npy_error(ErrorCode::kUnsupported, "format version " + std::to_string(major) + "." +
                                           std::to_string(minor) +
                                           " is not supported (1.0, 2.0 and 3.0 are)");
  size_t prefix;
  uint64_t header_len;
  if (major == 1) {
    prefix = 10;
    header_len = load_u16_le(data + 8);
  } else {
    if (size < 12) npy_error(ErrorCode::kCorruptData, "truncated before the header length");
    prefix = 12;
    header_len = load_u32_le(data + 8);
  }
  if (header_len > size - prefix)
    npy_error(ErrorCode::kCorruptData,
              "header length " + std::to_string(header_len) + " runs past the end of the file");
  if (header_len > limits.max_header_bytes)
    npy_error(ErrorCode::kResourceLimit, "header of " + std::to_string(header_len) +
                                             " bytes is over the limit of " +
                                             std::to_string(limits.max_header_bytes));

  const std::string_view header(reinterpret_cast<const char*>(data + prefix), header_len);
  const auto entries = PyLiteralReader(header, major < 3).read_dict();
  const PyValue* descr = nullptr;
  const PyValue* fortran = nullptr;
  const PyValue* shape = nullptr;
  for (const auto& [key, value] : entries) {
    const PyValue** slot = key == "descr"           ? &descr
                           : key == "fortran_order" ? &fortran
                           : key == "shape"         ? &shape
                                                    : nullptr;
    if (!slot) npy_error(ErrorCode::kCorruptData, "unexpected header key '" + key + "'");
    if (*slot) npy_error(ErrorCode::kCorruptData, "header key '" + key + "' given twice");
    *slot = &value;
  }
  if (!descr || !fortran || !shape)
    npy_error(ErrorCode::kCorruptData,
              "the header must have the keys 'descr', 'fortran_order' and 'shape'");

  NpyArray out;
  if (descr->kind == PyValue::Kind::kList)
    npy_error(ErrorCode::kUnsupported, "structured (record) dtypes are not supported");
  if (descr->kind != PyValue::Kind::kString)
    npy_error(ErrorCode::kCorruptData, "'descr' must be a dtype string");
  out.dtype = dtype_from_descr(descr->text);

  if (fortran->kind != PyValue::Kind::kBool)
    npy_error(ErrorCode::kCorruptData, "'fortran_order' must be True or False");
  if (fortran->number)
    npy_error(ErrorCode::kUnsupported,
              "fortran_order True (column-major) is not supported; save the array with "
              "np.ascontiguousarray");

  if (shape->kind != PyValue::Kind::kTuple)
    npy_error(ErrorCode::kCorruptData, "'shape' must be a tuple of integers");
  if (shape->items.size() > static_cast<size_t>(limits.max_dims))
    npy_error(ErrorCode::kResourceLimit, std::to_string(shape->items.size()) +
                                             " dimensions, over the limit of " +
                                             std::to_string(limits.max_dims));
  bool empty = false;
  for (const PyValue& d : shape->items) {
    if (d.kind != PyValue::Kind::kInt)
      npy_error(ErrorCode::kCorruptData, "'shape' must be a tuple of integers");
    if (d.number < 0)
      npy_error(ErrorCode::kCorruptData, "negative dimension " + std::to_string(d.number));
    // Each dimension on its own too: (0, 10**30) has no elements but no sane use either.
    if (d.number > limits.max_elements)
      npy_error(ErrorCode::kResourceLimit, "dimension " + std::to_string(d.number) +
                                               " is over the limit of " +
                                               std::to_string(limits.max_elements) + " elements");
    out.shape.push_back(d.number);
    empty = empty || d.number == 0;
  }
  int64_t elements = empty ? 0 : 1;
  for (size_t i = 0; i < out.shape.size() && !empty; ++i)
    if (__builtin_mul_overflow(elements, out.shape[i], &elements) || elements > limits.max_elements)
      npy_error(ErrorCode::kResourceLimit,
                "more than the limit of " + std::to_string(limits.max_elements) + " elements");
  uint64_t bytes;
  if (__builtin_mul_overflow(static_cast<uint64_t>(elements), dtype_size(out.dtype), &bytes))
    npy_error(ErrorCode::kResourceLimit, "the data size overflows 64 bits");
  const uint64_t present = size - prefix - header_len;
  if (present != bytes)
    npy_error(ErrorCode::kCorruptData,
              "the shape needs " + std::to_string(bytes) + " bytes of data, the file has " +
                  std::to_string(present) +
                  (present < bytes ? " (truncated)" : " (trailing bytes)"));
  out.data = data + prefix + header_len;
  out.bytes = static_cast<size_t>(bytes);
  return out;
}

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
    case DType::kBool:
      return f(Bool{});
    case DType::kUInt8:
      return f(uint8_t{});
    case DType::kInt8:
      return f(int8_t{});
    case DType::kUInt16:
      return f(uint16_t{});
    case DType::kInt16:
      return f(int16_t{});
    case DType::kUInt32:
      return f(uint32_t{});
    case DType::kInt32:
      return f(int32_t{});
    case DType::kUInt64:
      return f(uint64_t{});
    case DType::kInt64:
      return f(int64_t{});
    case DType::kFloat16:
      return f(Half{});
    case DType::kFloat32:
      return f(float{});
    case DType::kFloat64:
      return f(double{});
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
