#include "stoker/core/npy.h"

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

namespace stoker {

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
    case 'U': npy_error(ErrorCode::kUnsupported, "dtype " + quoted + ": strings are not supported");
    case 'c':
      npy_error(ErrorCode::kUnsupported, "dtype " + quoted + ": complex numbers are not supported");
    case 'M':
    case 'm':
      npy_error(ErrorCode::kUnsupported, "dtype " + quoted + ": datetimes are not supported");
    default: break;
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

NpyHeader parse_npy_header(const uint8_t* data, size_t size, uint64_t file_size,
                           const NpyLimits& limits) {
  STOKER_CHECK(size <= file_size, ErrorCode::kInvalidArgument, "npy: more bytes than the file");
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
  if (header_len > file_size - prefix)
    npy_error(ErrorCode::kCorruptData,
              "header length " + std::to_string(header_len) + " runs past the end of the file");
  if (header_len > limits.max_header_bytes)
    npy_error(ErrorCode::kResourceLimit, "header of " + std::to_string(header_len) +
                                             " bytes is over the limit of " +
                                             std::to_string(limits.max_header_bytes));

  if (header_len > size - prefix)
    npy_error(ErrorCode::kInvalidArgument, "npy: the header's bytes were not all given");
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

  NpyHeader out;
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
  const uint64_t present = file_size - prefix - header_len;
  if (present != bytes)
    npy_error(ErrorCode::kCorruptData,
              "the shape needs " + std::to_string(bytes) + " bytes of data, the file has " +
                  std::to_string(present) +
                  (present < bytes ? " (truncated)" : " (trailing bytes)"));
  out.data_offset = prefix + header_len;
  out.data_bytes = bytes;
  return out;
}

NpyArray parse_npy(const uint8_t* data, size_t size, const NpyLimits& limits) {
  const NpyHeader header = parse_npy_header(data, size, size, limits);
  NpyArray out;
  out.dtype = header.dtype;
  out.shape = header.shape;
  out.data = data + header.data_offset;
  out.bytes = static_cast<size_t>(header.data_bytes);
  return out;
}

}  // namespace stoker
