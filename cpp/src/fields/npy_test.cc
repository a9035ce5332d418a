#include "stoker/fields/npy.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "stoker/core/error.h"

namespace stoker::fields {
namespace {

// ---- .npy files as numpy writes them --------------------------------------------------------

// numpy's header: magic, version, little-endian header length, the dict, spaces up to a multiple
// of 64 bytes for the whole prefix, and a newline as the last byte of the header.
std::vector<uint8_t> npy_file(const std::string& dict, const std::vector<uint8_t>& payload,
                              int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  const size_t n = header.size();
  out.push_back(static_cast<uint8_t>(n));
  out.push_back(static_cast<uint8_t>(n >> 8));
  if (major != 1) {
    out.push_back(static_cast<uint8_t>(n >> 16));
    out.push_back(static_cast<uint8_t>(n >> 24));
  }
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

std::string dict(const std::string& descr, const std::string& shape,
                 const std::string& fortran = "False") {
  return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

NpyArray parse(const std::vector<uint8_t>& file, const NpyLimits& limits = {}) {
  return parse_npy(file.data(), file.size(), limits);
}

// The error f() throws (an Error of code kInternal saying so if it throws none).
Error error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return Error(ErrorCode::kInternal, "no error thrown");
}

ErrorCode parse_code(const std::vector<uint8_t>& file, const NpyLimits& limits = {}) {
  const Error e = error_of([&] { parse(file, limits); });
  return e.code();
}

// Written by numpy 2.4: np.save(f, np.arange(6, dtype='<f4').reshape(2, 3) * 0.5)
const uint8_t kNumpyFloat32x2x3[] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00, 0x7b, 0x27, 0x64, 0x65, 0x73, 0x63,
    0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x66, 0x34, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f, 0x72, 0x74,
    0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61, 0x6c, 0x73,
    0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x32, 0x2c, 0x20,
    0x33, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x3f, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0xc0, 0x3f,
    0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x20, 0x40,
};
// np.save(f, np.array([[1, 2, 3, 4, 7], [5, 6, 7, 8, -1]], dtype='<i2'))
const uint8_t kNumpyInt16x2x5[] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00, 0x7b, 0x27, 0x64, 0x65, 0x73,
    0x63, 0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x69, 0x32, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f,
    0x72, 0x74, 0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46,
    0x61, 0x6c, 0x73, 0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20,
    0x28, 0x32, 0x2c, 0x20, 0x35, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a, 0x01, 0x00, 0x02, 0x00, 0x03, 0x00, 0x04,
    0x00, 0x07, 0x00, 0x05, 0x00, 0x06, 0x00, 0x07, 0x00, 0x08, 0x00, 0xff, 0xff,
};
// np.lib.format.write_array(f, np.array([1.5, -2.0, 6e-8, 65504], np.float16), version=(3, 0))
const uint8_t kNumpyFloat16V3[] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x03, 0x00, 0x74, 0x00, 0x00, 0x00, 0x7b, 0x27, 0x64, 0x65,
    0x73, 0x63, 0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x66, 0x32, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f,
    0x72, 0x74, 0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61,
    0x6c, 0x73, 0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x34,
    0x2c, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
    0x00, 0x3e, 0x00, 0xc0, 0x01, 0x00, 0xff, 0x7b,
};

TEST(Npy, ReadsFilesNumpyWrote) {
  const NpyArray f = parse_npy(kNumpyFloat32x2x3, sizeof kNumpyFloat32x2x3);
  EXPECT_EQ(f.dtype, DType::kFloat32);
  EXPECT_EQ(f.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.elements(), 6);
  ASSERT_EQ(f.bytes, 24u);
  EXPECT_EQ(f.data, kNumpyFloat32x2x3 + 128);  // points into the input, after 128 header bytes
  float values[6];
  std::memcpy(values, f.data, sizeof values);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(values[i], 0.5f * static_cast<float>(i));

  const NpyArray s = parse_npy(kNumpyInt16x2x5, sizeof kNumpyInt16x2x5);
  EXPECT_EQ(s.dtype, DType::kInt16);
  EXPECT_EQ(s.shape, (std::vector<int64_t>{2, 5}));
  int16_t ints[10];
  ASSERT_EQ(s.bytes, sizeof ints);
  std::memcpy(ints, s.data, sizeof ints);
  EXPECT_EQ(ints[4], 7);
  EXPECT_EQ(ints[9], -1);

  const NpyArray h = parse_npy(kNumpyFloat16V3, sizeof kNumpyFloat16V3);
  EXPECT_EQ(h.dtype, DType::kFloat16);
  EXPECT_EQ(h.shape, (std::vector<int64_t>{4}));
  float widened[4];
  convert_elements(h.dtype, h.data, DType::kFloat32, reinterpret_cast<uint8_t*>(widened), 4);
  EXPECT_EQ(widened[0], 1.5f);
  EXPECT_EQ(widened[1], -2.0f);
  EXPECT_EQ(widened[2], 0x1p-24f);  // 6e-8 is float16's smallest subnormal
  EXPECT_EQ(widened[3], 65504.0f);
}

TEST(Npy, HeaderIsPaddedLikeNumpys) {
  // The helper writes what numpy writes, byte for byte.
  std::vector<float> values(6);
  for (int i = 0; i < 6; ++i) values[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i);
  EXPECT_EQ(npy_file(dict("<f4", "(2, 3)"), bytes_of(values)),
            std::vector<uint8_t>(std::begin(kNumpyFloat32x2x3), std::end(kNumpyFloat32x2x3)));
}

struct DtypeCase {
  const char* descr;
  DType dtype;
};

TEST(Npy, EveryAcceptedDtypeRoundTrips) {
  const DtypeCase cases[] = {
      {"|b1", DType::kBool},
      {"|u1", DType::kUInt8},
      {"|i1", DType::kInt8},
      {"<u2", DType::kUInt16},
      {"<i2", DType::kInt16},
      {"<u4", DType::kUInt32},
      {"<i4", DType::kInt32},
      {"<u8", DType::kUInt64},
      {"<i8", DType::kInt64},
      {"<f2", DType::kFloat16},
      {"<f4", DType::kFloat32},
      {"<f8", DType::kFloat64},
      // Other spellings of the same: '=' and '|' are native order (little-endian here), no order
      // at all too, and the order of a one-byte type means nothing, '>' included.
      {"=f4", DType::kFloat32},
      {"|i8", DType::kInt64},
      {"u2", DType::kUInt16},
      {"<u1", DType::kUInt8},
      {">u1", DType::kUInt8},
      {"=b1", DType::kBool},
      {">i1", DType::kInt8},
  };
  for (const DtypeCase& c : cases) {
    SCOPED_TRACE(c.descr);
    const size_t item = dtype_size(c.dtype);
    std::vector<uint8_t> payload(3 * 2 * item);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 37 + 1);
    if (c.dtype == DType::kBool)
      for (size_t i = 0; i < payload.size(); ++i) payload[i] = i % 2;
    for (int major = 1; major <= 3; ++major) {
      const auto file = npy_file(dict(c.descr, "(3, 2)"), payload, major);
      const NpyArray a = parse(file);
      EXPECT_EQ(a.dtype, c.dtype);
      EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 2}));
      ASSERT_EQ(a.bytes, payload.size());
      EXPECT_EQ(a.data, file.data() + file.size() - payload.size());
      EXPECT_EQ(std::memcmp(a.data, payload.data(), payload.size()), 0);
      // Converting to its own dtype is a copy.
      std::vector<uint8_t> copy(payload.size());
      convert_elements(a.dtype, a.data, a.dtype, copy.data(), a.elements());
      EXPECT_EQ(copy, payload);
    }
  }
}

TEST(Npy, HeaderSyntax) {
  const auto payload = bytes_of(std::vector<int32_t>{1, 2, 3});
  // Python literal forms numpy (or a person) may write.
  const std::string dicts[] = {
      "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }",
      "{'descr': '<i4', 'fortran_order': False, 'shape': (3,)}",
      "{\"descr\": \"<i4\", \"fortran_order\": False, \"shape\": (3,)}",
      "{'shape': (3,), 'descr': '<i4', 'fortran_order': False}",
      "{\n 'descr' : '<i4' ,\t'fortran_order':False,'shape':( 3 , ) , }",
      "  {'descr': '<i4', 'fortran_order': False, 'shape': (3,), }",
  };
  for (const std::string& d : dicts) {
    SCOPED_TRACE(d);
    const NpyArray a = parse(npy_file(d, payload));
    EXPECT_EQ(a.dtype, DType::kInt32);
    EXPECT_EQ(a.shape, (std::vector<int64_t>{3}));
  }
  // Python 2's numpy wrote long integers with an L (versions 1.0 and 2.0 only).
  EXPECT_EQ(parse(npy_file(dict("<i4", "(1L, 3L)"), payload)).shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(parse(npy_file(dict("<i4", "(1L, 3L)"), payload, 2)).shape,
            (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(parse_code(npy_file(dict("<i4", "(1L, 3L)"), payload, 3)), ErrorCode::kCorruptData);
  // The header need not be padded at all.
  std::vector<uint8_t> bare = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  const std::string d = dict("<i4", "(3,)");
  bare.push_back(static_cast<uint8_t>(d.size()));
  bare.push_back(0);
  bare.insert(bare.end(), d.begin(), d.end());
  bare.insert(bare.end(), payload.begin(), payload.end());
  EXPECT_EQ(parse(bare).elements(), 3);
}

TEST(Npy, ZeroDimensionalAndEmptyArrays) {
  const NpyArray scalar = parse(npy_file(dict("<f8", "()"), bytes_of(std::vector<double>{2.5})));
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_EQ(scalar.elements(), 1);
  EXPECT_EQ(scalar.bytes, 8u);

  const auto file = npy_file(dict("<f8", "(0, 4)"), {});
  const NpyArray empty = parse(file);
  EXPECT_EQ(empty.shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(empty.elements(), 0);
  EXPECT_EQ(empty.bytes, 0u);
  EXPECT_EQ(empty.data, file.data() + file.size());

  // A dimension of 0 makes the product 0, even beside large ones within the limit.
  const NpyLimits limits{.max_elements = 1000, .max_dims = 8};
  EXPECT_EQ(parse(npy_file(dict("<f8", "(1000, 1000, 0)"), {}), limits).elements(), 0);
}

TEST(Npy, RefusesCorruptFiles) {
  const auto payload = bytes_of(std::vector<int32_t>{1, 2, 3});
  const auto good = npy_file(dict("<i4", "(3,)"), payload);
  ASSERT_EQ(parse(good).elements(), 3);

  auto bad_magic = good;
  bad_magic[1] = 'n';
  EXPECT_EQ(parse_code(bad_magic), ErrorCode::kCorruptData);
  EXPECT_EQ(parse_code({0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0}), ErrorCode::kCorruptData);
  EXPECT_EQ(parse_code({0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0, 0}), ErrorCode::kCorruptData);
  EXPECT_EQ(parse_code({}), ErrorCode::kCorruptData);

  auto past_end = good;  // a header length longer than the file
  past_end[8] = 0xFF;
  past_end[9] = 0xFF;
  EXPECT_EQ(parse_code(past_end), ErrorCode::kCorruptData);
  auto past_end_v2 = npy_file(dict("<i4", "(3,)"), payload, 2);
  past_end_v2[11] = 0x80;
  EXPECT_EQ(parse_code(past_end_v2), ErrorCode::kCorruptData);

  // Data not exactly product(shape) * itemsize.
  auto truncated = good;
  truncated.pop_back();
  EXPECT_EQ(parse_code(truncated), ErrorCode::kCorruptData);
  auto trailing = good;
  trailing.push_back(0);
  const Error e = error_of([&] { parse(trailing); });
  EXPECT_EQ(e.code(), ErrorCode::kCorruptData);
  EXPECT_NE(e.reason().find("trailing"), std::string::npos) << e.reason();
  EXPECT_EQ(parse_code(npy_file(dict("<i4", "(4,)"), payload)), ErrorCode::kCorruptData);
  EXPECT_EQ(parse_code(npy_file(dict("<i4", "()"), payload)), ErrorCode::kCorruptData);

  // Headers that are not the dict numpy writes.
  const std::string bad_dicts[] = {
      "",
      "[1, 2]",
      "{'descr': '<i4', 'fortran_order': False}",                                 // no shape
      "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), 'extra': 1}",      // extra key
      "{'descr': '<i4', 'descr': '<i4', 'fortran_order': False, 'shape': (3,)}",  // twice
      "{'descr': '<i4', 'fortran_order': False, 'shape': (3)}",  // (3) is an int, not a tuple
      "{'descr': '<i4', 'fortran_order': False, 'shape': [3]}",
      "{'descr': '<i4', 'fortran_order': False, 'shape': 3}",
      "{'descr': '<i4', 'fortran_order': False, 'shape': (3, -1)}",
      "{'descr': '<i4', 'fortran_order': False, 'shape': ('3',)}",
      "{'descr': '<i4', 'fortran_order': False, 'shape': (3.0,)}",
      "{'descr': '<i4', 'fortran_order': 0, 'shape': (3,)}",
      "{'descr': '<i4', 'fortran_order': Falsey, 'shape': (3,)}",
      "{'descr': 4, 'fortran_order': False, 'shape': (3,)}",
      "{'descr': '<i4, 'fortran_order': False, 'shape': (3,)}",  // unterminated string
      "{'descr': '<i4', 'fortran_order': False, 'shape': (3,),, }",
      "{'descr': '<i4' 'fortran_order': False, 'shape': (3,)}",
      "{'descr': '<i4', 'fortran_order': False, 'shape': (3,)} x",  // junk after the dict
      "{'descr': '<i4', 'fortran_order': False, 'shape': (3,)",
      "{descr: '<i4', 'fortran_order': False, 'shape': (3,)}",
      "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), 'x': " + std::string(40, '(') +
          std::string(40, ')') + "}",  // nested too deep
  };
  for (const std::string& d : bad_dicts) {
    SCOPED_TRACE(d);
    EXPECT_EQ(parse_code(npy_file(d, payload)), ErrorCode::kCorruptData);
  }
}

TEST(Npy, RefusesUnsupportedDtypes) {
  // Made the way numpy writes them (np.save of an object array pickles it: '|O').
  const char* descrs[] = {"|O",   "<O",      "|V8",    "<U5",  "|S3", "|a3", "<c8",
                          "<c16", "<M8[ns]", "<m8[s]", "<f16", "<i3", "<x4", ""};
  for (const char* descr : descrs) {
    SCOPED_TRACE(descr);
    EXPECT_EQ(parse_code(npy_file(dict(descr, "(1,)"), std::vector<uint8_t>(4))),
              ErrorCode::kUnsupported);
  }
  // Big-endian multi-byte types.
  for (const char* descr : {">i4", ">f4", ">u2", ">f8"}) {
    SCOPED_TRACE(descr);
    const Error e =
        error_of([&] { parse(npy_file(dict(descr, "(2,)"), std::vector<uint8_t>(16))); });
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(e.reason().find("big-endian"), std::string::npos) << e.reason();
  }
  // Structured dtypes: a list as descr.
  EXPECT_EQ(parse_code(npy_file("{'descr': [('a', '<f4'), ('b', '<i2')], 'fortran_order': False, "
                                "'shape': (1,), }",
                                std::vector<uint8_t>(6))),
            ErrorCode::kUnsupported);
  // Column-major data is refused, and the reason says so.
  const Error fortran =
      error_of([&] { parse(npy_file(dict("<u2", "(2, 3)", "True"), std::vector<uint8_t>(12))); });
  EXPECT_EQ(fortran.code(), ErrorCode::kUnsupported);
  EXPECT_NE(fortran.reason().find("fortran_order"), std::string::npos) << fortran.reason();
  // Format versions other than 1.0, 2.0, 3.0.
  for (const auto& [major, minor] :
       std::initializer_list<std::pair<int, int>>{{4, 0}, {1, 1}, {0, 0}, {3, 7}}) {
    auto file = npy_file(dict("<i4", "(1,)"), std::vector<uint8_t>(4), major == 1 ? 1 : 2);
    file[6] = static_cast<uint8_t>(major);
    file[7] = static_cast<uint8_t>(minor);
    EXPECT_EQ(parse_code(file), ErrorCode::kUnsupported) << major << "." << minor;
  }
}

TEST(Npy, ResourceLimits) {
  const NpyLimits limits{.max_elements = 100, .max_dims = 3};
  EXPECT_EQ(parse(npy_file(dict("|u1", "(10, 10)"), std::vector<uint8_t>(100)), limits).elements(),
            100);
  EXPECT_EQ(parse_code(npy_file(dict("|u1", "(101,)"), std::vector<uint8_t>(101)), limits),
            ErrorCode::kResourceLimit);
  EXPECT_EQ(parse_code(npy_file(dict("|u1", "(1, 1, 1, 1)"), std::vector<uint8_t>(1)), limits),
            ErrorCode::kResourceLimit);
  // The limits come before the data: a huge shape over a small file is a resource error.
  EXPECT_EQ(parse_code(npy_file(dict("<f8", "(100000, 100000)"), {})), ErrorCode::kResourceLimit);
  // A product that overflows int64 is over any limit.
  const NpyLimits unlimited{.max_elements = INT64_MAX, .max_dims = 8};
  EXPECT_EQ(parse_code(npy_file(dict("<f8", "(4294967296, 4294967296)"), {}), unlimited),
            ErrorCode::kResourceLimit);
  EXPECT_EQ(parse_code(npy_file(dict("<f8", "(99999999999999999999999, 2)"), {}), unlimited),
            ErrorCode::kResourceLimit);
  // With elements at INT64_MAX the byte count would overflow; the data is what is missing then.
  EXPECT_EQ(parse_code(npy_file(dict("|u1", "(9223372036854775807,)"), {}), unlimited),
            ErrorCode::kCorruptData);
  // Every dimension is checked, even beside a 0.
  EXPECT_EQ(parse_code(npy_file(dict("|u1", "(0, 101)"), {}), limits), ErrorCode::kResourceLimit);
  // A header longer than numpy's own limit.
  const std::string long_dict = dict("|u1", "(1,)") + std::string(20000, ' ');
  EXPECT_EQ(parse_code(npy_file(long_dict, std::vector<uint8_t>(1), 2)), ErrorCode::kResourceLimit);
  EXPECT_EQ(parse(npy_file(long_dict, std::vector<uint8_t>(1), 2),
                  {.max_elements = 10, .max_dims = 1, .max_header_bytes = 30000})
                .elements(),
            1);
  EXPECT_EQ(parse_code(npy_file(dict("|u1", "(1,)"), {1}), {.max_elements = -1}),
            ErrorCode::kInvalidArgument);
}

// ---- convert_elements -----------------------------------------------------------------------

template <typename To, typename From>
std::vector<To> convert(DType from, const std::vector<From>& values, DType to) {
  std::vector<To> out(values.size());
  convert_elements(from, reinterpret_cast<const uint8_t*>(values.data()), to,
                   reinterpret_cast<uint8_t*>(out.data()), static_cast<int64_t>(values.size()));
  return out;
}

TEST(ConvertElements, IntegersWrapModulo2ToTheBits) {
  // numpy: np.array([-1, 300, -129], np.int16).astype(np.uint8) == [255, 44, 127]
  EXPECT_EQ(convert<uint8_t>(DType::kInt16, std::vector<int16_t>{-1, 300, -129}, DType::kUInt8),
            (std::vector<uint8_t>{255, 44, 127}));
  EXPECT_EQ(convert<uint64_t>(DType::kInt32, std::vector<int32_t>{-1, 7}, DType::kUInt64),
            (std::vector<uint64_t>{UINT64_MAX, 7}));
  EXPECT_EQ(convert<int8_t>(DType::kUInt64, std::vector<uint64_t>{UINT64_MAX, 200}, DType::kInt8),
            (std::vector<int8_t>{-1, -56}));
  EXPECT_EQ(convert<int64_t>(DType::kUInt32, std::vector<uint32_t>{4294967295u}, DType::kInt64),
            (std::vector<int64_t>{4294967295}));
  EXPECT_EQ(convert<uint16_t>(DType::kInt8, std::vector<int8_t>{-128, 127}, DType::kUInt16),
            (std::vector<uint16_t>{65408, 127}));
}

TEST(ConvertElements, Bool) {
  // A bool byte other than 0 reads as true; bool -> bool writes only 0 and 1.
  EXPECT_EQ(convert<int32_t>(DType::kBool, std::vector<uint8_t>{0, 1, 2, 255}, DType::kInt32),
            (std::vector<int32_t>{0, 1, 1, 1}));
  EXPECT_EQ(convert<uint8_t>(DType::kBool, std::vector<uint8_t>{0, 1, 2}, DType::kBool),
            (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(convert<float>(DType::kBool, std::vector<uint8_t>{0, 7}, DType::kFloat32),
            (std::vector<float>{0.0f, 1.0f}));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(convert<uint8_t>(DType::kFloat64, std::vector<double>{0.0, -0.0, nan, 0.5, -3.0},
                             DType::kBool),
            (std::vector<uint8_t>{0, 0, 1, 1, 1}));
  EXPECT_EQ(convert<uint8_t>(DType::kFloat16, std::vector<uint16_t>{0x0000, 0x8000, 0x0001},
                             DType::kBool),
            (std::vector<uint8_t>{0, 0, 1}));
  EXPECT_EQ(convert<uint8_t>(DType::kInt64, std::vector<int64_t>{0, -1, 256}, DType::kBool),
            (std::vector<uint8_t>{0, 1, 1}));
}

TEST(ConvertElements, IntegersToFloatsRoundToNearestEven) {
  // 2^53 + 1 lies halfway between 2^53 and 2^53 + 2: ties go to the even one.
  EXPECT_EQ(convert<double>(DType::kInt64, std::vector<int64_t>{(int64_t{1} << 53) + 1, -5},
                            DType::kFloat64),
            (std::vector<double>{0x1p53, -5.0}));
  // int64 -> float32 in one rounding (numpy: 16777217 -> 16777216).
  EXPECT_EQ(
      convert<float>(DType::kInt64, std::vector<int64_t>{16777217, 16777219}, DType::kFloat32),
      (std::vector<float>{16777216.0f, 16777220.0f}));
  EXPECT_EQ(convert<float>(DType::kUInt64, std::vector<uint64_t>{UINT64_MAX}, DType::kFloat32),
            (std::vector<float>{0x1p64f}));
}

TEST(ConvertElements, FloatsToIntegersInRangeTruncate) {
  EXPECT_EQ(
      convert<int32_t>(DType::kFloat64, std::vector<double>{-1.5, 2.9, -0.9, 1e9}, DType::kInt32),
      (std::vector<int32_t>{-1, 2, 0, 1000000000}));
  EXPECT_EQ(
      convert<uint8_t>(DType::kFloat32, std::vector<float>{0.0f, 255.9f, 17.5f}, DType::kUInt8),
      (std::vector<uint8_t>{0, 255, 17}));
  // uint64 takes [2^63, 2^64) exactly (numpy: 1.8e19 -> 18000000000000000000).
  EXPECT_EQ(convert<uint64_t>(DType::kFloat64, std::vector<double>{1.8e19}, DType::kUInt64),
            (std::vector<uint64_t>{18000000000000000000ull}));
}

TEST(ConvertElements, FloatsToIntegersOutOfRange) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Truncated values that fit in int64 wrap like integers: numpy's x86-64 result for -1.0 and
  // 300.0 -> uint8 (255, 44), and for -129.0 -> uint16 (65407).
  EXPECT_EQ(convert<uint8_t>(DType::kFloat64, std::vector<double>{-1.0, 300.0, -1.5, 5000000007.0},
                             DType::kUInt8),
            (std::vector<uint8_t>{255, 44, 255, 7}));
  EXPECT_EQ(convert<uint16_t>(DType::kFloat32, std::vector<float>{-129.0f}, DType::kUInt16),
            (std::vector<uint16_t>{65407}));
  EXPECT_EQ(convert<uint64_t>(DType::kFloat64, std::vector<double>{-1.0}, DType::kUInt64),
            (std::vector<uint64_t>{UINT64_MAX}));
  // Beyond int64 (and uint64), and infinities, saturate; NaN gives 0.
  EXPECT_EQ(convert<int32_t>(DType::kFloat64, std::vector<double>{1e20, -1e20, inf, -inf, nan},
                             DType::kInt32),
            (std::vector<int32_t>{INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, 0}));
  EXPECT_EQ(convert<uint8_t>(DType::kFloat64, std::vector<double>{1e20, -1e20, nan}, DType::kUInt8),
            (std::vector<uint8_t>{255, 0, 0}));
  EXPECT_EQ(convert<int64_t>(DType::kFloat64, std::vector<double>{0x1p63, -0x1p63, -0x1p64},
                             DType::kInt64),
            (std::vector<int64_t>{INT64_MAX, INT64_MIN, INT64_MIN}));
  EXPECT_EQ(
      convert<uint64_t>(DType::kFloat64, std::vector<double>{0x1p64, -0x1p64, inf}, DType::kUInt64),
      (std::vector<uint64_t>{UINT64_MAX, 0, UINT64_MAX}));
}

TEST(ConvertElements, FloatToFloat) {
  const double inf = std::numeric_limits<double>::infinity();
  const auto f = convert<float>(
      DType::kFloat64, std::vector<double>{1e300, -1e300, 0.1, std::nan("")}, DType::kFloat32);
  EXPECT_EQ(f[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(f[1], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(f[2], 0.1f);
  EXPECT_TRUE(std::isnan(f[3]));
  EXPECT_EQ(convert<double>(DType::kFloat32, std::vector<float>{0.1f, static_cast<float>(-inf)},
                            DType::kFloat64),
            (std::vector<double>{static_cast<double>(0.1f), -inf}));
}

uint16_t to_half(double v) {
  return convert<uint16_t>(DType::kFloat64, std::vector<double>{v}, DType::kFloat16)[0];
}

TEST(ConvertElements, Float16FromWiderFloats) {
  // Bit patterns worked out by hand (and agreeing with numpy 2.4).
  EXPECT_EQ(to_half(1.0), 0x3C00);
  EXPECT_EQ(to_half(-2.0), 0xC000);
  EXPECT_EQ(to_half(0.0), 0x0000);
  EXPECT_EQ(to_half(-0.0), 0x8000);
  EXPECT_EQ(to_half(65504.0), 0x7BFF);  // the largest
  EXPECT_EQ(to_half(65519.0), 0x7BFF);  // below the half-way point 65520
  EXPECT_EQ(to_half(65520.0), 0x7C00);  // half-way: to even, which is inf
  EXPECT_EQ(to_half(1e10), 0x7C00);
  EXPECT_EQ(to_half(-1e10), 0xFC00);
  EXPECT_EQ(to_half(0x1p-14), 0x0400);  // the smallest normal
  // Subnormals, in units of 2^-24: 1e-7 = 1.68 units -> 2, 6e-8 = 1.007 -> 1, 2.9e-8 = 0.49 -> 0.
  EXPECT_EQ(to_half(1e-7), 0x0002);
  EXPECT_EQ(to_half(6e-8), 0x0001);
  EXPECT_EQ(to_half(2.9e-8), 0x0000);
  EXPECT_EQ(to_half(-6e-8), 0x8001);
  EXPECT_EQ(to_half(0x1p-25), 0x0000);           // 0.5 units: tie, to even (0)
  EXPECT_EQ(to_half(3 * 0x1p-25), 0x0002);       // 1.5 units: tie, to even (2)
  EXPECT_EQ(to_half(1023.5 * 0x1p-24), 0x0400);  // rounds up out of the subnormals
  // Normals: the last bit is 2^-10 at 1.0.
  EXPECT_EQ(to_half(1.0 + 0x1p-10), 0x3C01);
  EXPECT_EQ(to_half(1.0 + 0x1p-11), 0x3C00);      // tie, to even
  EXPECT_EQ(to_half(1.0 + 3 * 0x1p-11), 0x3C02);  // tie, to even
  // One rounding from float64, as numpy does: via float32 this would round twice, to 0x3C00.
  EXPECT_EQ(to_half(1.0 + 0x1p-11 + 0x1p-40), 0x3C01);
  EXPECT_EQ(to_half(std::numeric_limits<double>::quiet_NaN()), 0x7E00);
  EXPECT_EQ(to_half(-std::numeric_limits<double>::infinity()), 0xFC00);
  // From float32 (exactly representable in double first).
  EXPECT_EQ(convert<uint16_t>(DType::kFloat32, std::vector<float>{1e-7f, 65504.0f, 1.5f},
                              DType::kFloat16),
            (std::vector<uint16_t>{0x0002, 0x7BFF, 0x3E00}));
}

TEST(ConvertElements, Float16ToOtherTypes) {
  const std::vector<uint16_t> halves = {0x3C00, 0x0001, 0x03FF, 0x0400, 0x7BFF,
                                        0x7C00, 0xFC00, 0x8000, 0xC100};
  const auto d = convert<double>(DType::kFloat16, halves, DType::kFloat64);
  EXPECT_EQ(d[0], 1.0);
  EXPECT_EQ(d[1], 0x1p-24);         // smallest subnormal
  EXPECT_EQ(d[2], 1023 * 0x1p-24);  // largest subnormal
  EXPECT_EQ(d[3], 0x1p-14);
  EXPECT_EQ(d[4], 65504.0);
  EXPECT_EQ(d[5], std::numeric_limits<double>::infinity());
  EXPECT_EQ(d[6], -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(d[7] == 0.0 && std::signbit(d[7]));
  EXPECT_EQ(d[8], -2.5);
  // NaN keeps numpy's payload: 0x7C01 -> 0x7FF0040000000000.
  const auto nan =
      convert<double>(DType::kFloat16, std::vector<uint16_t>{0x7C01, 0xFE00}, DType::kFloat64);
  EXPECT_EQ(std::bit_cast<uint64_t>(nan[0]), 0x7FF0040000000000ull);
  EXPECT_EQ(std::bit_cast<uint64_t>(nan[1]), 0xFFF8000000000000ull);
  // Half -> integers by the float rules: -2.5 -> -2 (uint8 254), 65504 -> uint8 224 (modulo),
  // inf saturates, NaN -> 0.
  EXPECT_EQ(
      convert<int8_t>(DType::kFloat16, std::vector<uint16_t>{0xC100, 0x7BFF, 0x7E00}, DType::kInt8),
      (std::vector<int8_t>{-2, -32, 0}));
  EXPECT_EQ(convert<uint8_t>(DType::kFloat16, std::vector<uint16_t>{0xC100, 0x7BFF}, DType::kUInt8),
            (std::vector<uint8_t>{254, 224}));
  EXPECT_EQ(convert<int16_t>(DType::kFloat16, std::vector<uint16_t>{0x7C00, 0xFC00}, DType::kInt16),
            (std::vector<int16_t>{INT16_MAX, INT16_MIN}));
  // Integers -> half: 65520 and above are inf.
  EXPECT_EQ(convert<uint16_t>(DType::kInt32, std::vector<int32_t>{65504, 65520, -3, 255},
                              DType::kFloat16),
            (std::vector<uint16_t>{0x7BFF, 0x7C00, 0xC200, 0x5BF8}));
  EXPECT_EQ(convert<uint16_t>(DType::kUInt64, std::vector<uint64_t>{UINT64_MAX}, DType::kFloat16),
            (std::vector<uint16_t>{0x7C00}));
  EXPECT_EQ(convert<float>(DType::kFloat16, std::vector<uint16_t>{0x0001}, DType::kFloat32),
            (std::vector<float>{0x1p-24f}));
}

TEST(ConvertElements, EveryHalfSurvivesARoundTrip) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const double d = half_to_double(bits);
    if (std::isnan(d)) {
      EXPECT_TRUE(std::isnan(half_to_double(double_to_half(d))));
      continue;
    }
    ASSERT_EQ(double_to_half(d), bits) << h;
  }
}

TEST(ConvertElements, UnalignedBuffersAndCounts) {
  // Elements at odd addresses, as .npy data after an unpadded header may be.
  std::vector<uint8_t> src(1 + 3 * 4);
  const float in[3] = {1.5f, -2.0f, 3.25f};
  std::memcpy(src.data() + 1, in, sizeof in);
  std::vector<uint8_t> dst(1 + 3 * 8);
  convert_elements(DType::kFloat32, src.data() + 1, DType::kFloat64, dst.data() + 1, 3);
  double out[3];
  std::memcpy(out, dst.data() + 1, sizeof out);
  EXPECT_EQ(out[0], 1.5);
  EXPECT_EQ(out[1], -2.0);
  EXPECT_EQ(out[2], 3.25);
  convert_elements(DType::kFloat32, nullptr, DType::kInt8, nullptr, 0);  // nothing to do
  EXPECT_EQ(error_of([&] {
              convert_elements(DType::kFloat32, src.data(), DType::kInt8, dst.data(), -1);
            }).code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace stoker::fields
