#include "stoker/fields/box_source.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "stoker/core/dtype.h"
#include "stoker/core/error.h"

namespace stoker::fields {
namespace {

Error error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return Error(ErrorCode::kInternal, "no error thrown");
}

// ---- JSON -----------------------------------------------------------------------------------

RawBoxes json(const std::string& text, const BoxLimits& limits = {}) {
  return parse_json_boxes(reinterpret_cast<const uint8_t*>(text.data()), text.size(), limits);
}

Error json_error(const std::string& text, const BoxLimits& limits = {}) {
  return error_of([&] { json(text, limits); });
}

TEST(JsonBoxes, CocoList) {
  const RawBoxes b = json(R"([
    {"bbox": [1, 2, 3, 4], "category_id": 5, "area": 12.0, "iscrowd": 0,
     "segmentation": [[1, 2, 3, 4, 5, 6]], "id": 17, "image_id": 3},
    {"category_id": 0, "bbox": [0.5, 1e2, -3, 4.25], "extra": {"nested": [null, true, "x"]}}
  ])");
  ASSERT_EQ(b.count(), 2);
  EXPECT_EQ(b.coords, (std::vector<double>{1, 2, 3, 4, 0.5, 100, -3, 4.25}));
  EXPECT_EQ(b.classes, (std::vector<int64_t>{5, 0}));
}

TEST(JsonBoxes, ListUnderAnnotationsOrBoxes) {
  // A whole COCO file for one image: the other keys, of any shape, are skipped.
  const RawBoxes a = json(R"({"images": [{"id": 1, "file_name": "a.jpg", "size": [3, 4]}],
    "annotations": [{"bbox": [10, 20, 30, 40], "category_id": 2}],
    "categories": [{"id": 2, "name": "cat", "supercategory": {"a": [[[]]]}}], "info": null})");
  EXPECT_EQ(a.coords, (std::vector<double>{10, 20, 30, 40}));
  EXPECT_EQ(a.classes, (std::vector<int64_t>{2}));

  const RawBoxes b = json(R"({"width": 640, "boxes": [[1, 2, 3, 4], {"bbox": [5, 6, 7, 8]}]})");
  EXPECT_EQ(b.coords, (std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(b.classes, (std::vector<int64_t>{-1, -1}));
}

TEST(JsonBoxes, PlainListsAndEmpty) {
  const RawBoxes b = json("[[0, 0, 1.5, 2.5], [-1, -2, 3e-3, 4E2]]");
  EXPECT_EQ(b.coords, (std::vector<double>{0, 0, 1.5, 2.5, -1, -2, 3e-3, 400}));
  EXPECT_EQ(b.classes, (std::vector<int64_t>{-1, -1}));
  EXPECT_EQ(json("[]").count(), 0);
  EXPECT_EQ(json(" {\"annotations\": []}\n").count(), 0);
  EXPECT_EQ(json("\xEF\xBB\xBF[]").count(), 0);  // a UTF-8 byte order mark
  // Large integers are numbers too (as doubles); category_id up to 2^63 - 1.
  const RawBoxes big =
      json(R"([{"bbox": [18446744073709551615, 0, 0, 0], "category_id": 9223372036854775807}])");
  EXPECT_EQ(big.coords[0], 0x1p64);
  EXPECT_EQ(big.classes[0], INT64_MAX);
}

TEST(JsonBoxes, RefusesWhatIsNotBoxes) {
  struct Case {
    const char* json;
    const char* reason;  // a part of Error::reason()
  };
  const Case cases[] = {
      {"", "not valid JSON"},
      {"[", "not valid JSON"},
      {"[] x", "not valid JSON"},
      {"[[1, 2, 3, NaN]]", "not valid JSON"},
      {"[[1, 2, 3, 1e400]]", "not valid JSON"},                           // too large for a double
      {"[{\"bbox\": [1, 2, 3, 4], \"x\": \"\xFF\"}]", "not valid JSON"},  // not UTF-8
      {"3", "expected a list of boxes"},
      {"\"boxes\"", "expected a list of boxes"},
      {"{\"images\": []}", "no 'annotations' or 'boxes'"},
      {"{\"annotations\": {\"bbox\": [1, 2, 3, 4]}}", "'annotations' must be a list"},
      {"{\"boxes\": 3}", "'boxes' must be a list"},
      {"{\"annotations\": [], \"boxes\": []}", "more than one"},
      {"{\"annotations\": [], \"annotations\": []}", "more than one"},
      {"[[1, 2, 3, 4], 5]", "box 1: expected an object"},
      {"[null]", "box 0: expected an object"},
      {"[[1, 2, 3, 4], [1, 2, 3]]", "box 1: must be a list of 4 numbers"},
      {"[[1, 2, 3, 4, 5]]", "box 0: must be a list of 4 numbers"},
      {"[[1, 2, \"3\", 4]]", "box 0: must be a list of 4 numbers"},
      {"[[1, 2, [3], 4]]", "box 0: must be a list of 4 numbers"},
      {"[{\"bbox\": [1, 2, 3, 4]}, {\"bbox\": [1, 2, 3]}]", "box 1: bbox must be 4 numbers"},
      {"[{\"bbox\": [1, 2, 3, 4, 5]}]", "box 0: bbox must be 4 numbers"},
      {"[{\"bbox\": [1, 2, null, 4]}]", "box 0: bbox must be 4 numbers"},
      {"[{\"bbox\": [1, 2, true, 4]}]", "box 0: bbox must be 4 numbers"},
      {"[{\"bbox\": {\"x\": 1}}]", "box 0: bbox must be 4 numbers"},
      {"[{\"bbox\": \"1 2 3 4\"}]", "box 0: bbox must be 4 numbers"},
      {"[{\"bbox\": [[1, 2, 3, 4]]}]", "box 0: bbox must be 4 numbers"},
      {"[{\"category_id\": 1}]", "box 0: no bbox"},
      {"[{\"bbox\": [1, 2, 3, 4], \"category_id\": 3.0}]", "box 0: category_id must be"},
      {"[{\"bbox\": [1, 2, 3, 4], \"category_id\": \"3\"}]", "box 0: category_id must be"},
      {"[{\"bbox\": [1, 2, 3, 4], \"category_id\": -1}]", "box 0: category_id must be"},
      {"[{\"bbox\": [1, 2, 3, 4], \"category_id\": null}]", "box 0: category_id must be"},
      {"[{\"bbox\": [1, 2, 3, 4], \"category_id\": [1]}]", "box 0: category_id must be"},
      {"[{\"bbox\": [1, 2, 3, 4], \"category_id\": 9223372036854775808}]",
       "box 0: category_id must be"},
      {"[{\"bbox\": [1, 2, 3, 4], \"bbox\": [1, 2, 3, 4]}]", "box 0: bbox given twice"},
      {"[{\"bbox\": [1, 2, 3, 4], \"category_id\": 1, \"category_id\": 2}]",
       "box 0: category_id given twice"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json);
    const Error e = json_error(c.json);
    EXPECT_EQ(e.code(), ErrorCode::kCorruptData) << e.reason();
    EXPECT_NE(e.reason().find(c.reason), std::string::npos) << e.reason();
  }
}

TEST(JsonBoxes, Limits) {
  const std::string three = "[[0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 1, 1]]";
  EXPECT_EQ(json(three, {.max_boxes = 3}).count(), 3);
  EXPECT_EQ(json_error(three, {.max_boxes = 2}).code(), ErrorCode::kResourceLimit);
  EXPECT_EQ(json("[]", {.max_boxes = 0}).count(), 0);
  EXPECT_EQ(json_error("[{\"bbox\": [0, 0, 1, 1]}]", {.max_boxes = 0}).code(),
            ErrorCode::kResourceLimit);
  EXPECT_EQ(json_error(three, {.max_boxes = 10, .max_member_bytes = three.size() - 1}).code(),
            ErrorCode::kResourceLimit);
  EXPECT_EQ(json(three, {.max_boxes = 10, .max_member_bytes = three.size()}).count(), 3);
  EXPECT_EQ(json_error("[]", {.max_boxes = -1}).code(), ErrorCode::kInvalidArgument);
}

TEST(JsonBoxes, OtherDataCostsNothing) {
  // 100000 numbers and 20000 levels of nesting beside one box: skipped, not stored.
  std::string text = "{\"segmentation\": [";
  for (int i = 0; i < 100000; ++i) text += "1,";
  text += "1], \"deep\": " + std::string(20000, '[') + std::string(20000, ']') +
          ", \"boxes\": [[1, 2, 3, 4]]}";
  const RawBoxes b = json(text, {.max_boxes = 1});
  EXPECT_EQ(b.coords, (std::vector<double>{1, 2, 3, 4}));
}

// ---- .npy -----------------------------------------------------------------------------------

std::vector<uint8_t> npy_file(const std::string& descr, const std::string& shape,
                              const std::vector<uint8_t>& payload) {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string prefix = "\x93NUMPY\x01";
  prefix += '\0';
  prefix += static_cast<char>(header.size());
  prefix += static_cast<char>(header.size() >> 8);
  std::vector<uint8_t> out(prefix.begin(), prefix.end());
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

RawBoxes npy(const std::vector<uint8_t>& file, const BoxLimits& limits = {}) {
  return parse_npy_boxes(file.data(), file.size(), limits);
}

Error npy_error(const std::vector<uint8_t>& file, const BoxLimits& limits = {}) {
  return error_of([&] { npy(file, limits); });
}

// Written by numpy 2.4: np.save(f, np.array([[1, 2, 3, 4, 7], [5, 6, 7, 8, -1]], dtype='<i2'))
const uint8_t kNumpyInt16Boxes[] = {
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

TEST(NpyBoxes, FileNumpyWrote) {
  const RawBoxes b = parse_npy_boxes(kNumpyInt16Boxes, sizeof kNumpyInt16Boxes);
  EXPECT_EQ(b.coords, (std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(b.classes, (std::vector<int64_t>{7, -1}));  // -1: this box has no class
}

TEST(NpyBoxes, Shapes) {
  const RawBoxes four =
      npy(npy_file("<f4", "(2, 4)", bytes_of(std::vector<float>{0, 1, 2, 3, 4.5f, 5, 6, 7})));
  EXPECT_EQ(four.coords, (std::vector<double>{0, 1, 2, 3, 4.5, 5, 6, 7}));
  EXPECT_EQ(four.classes, (std::vector<int64_t>{-1, -1}));
  // [N, 6]: column 4 the class, column 5 ignored (even a NaN score).
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const RawBoxes six = npy(npy_file(
      "<f8", "(2, 6)", bytes_of(std::vector<double>{1, 2, 3, 4, 3, 0.9, -1, -2, 5, 6, 0, nan})));
  EXPECT_EQ(six.coords, (std::vector<double>{1, 2, 3, 4, -1, -2, 5, 6}));
  EXPECT_EQ(six.classes, (std::vector<int64_t>{3, 0}));
  for (const char* empty : {"(0,)", "(0, 4)", "(0, 5)", "(0, 6)"}) {
    SCOPED_TRACE(empty);
    EXPECT_EQ(npy(npy_file("<f4", empty, {})).count(), 0);
  }
}

TEST(NpyBoxes, EveryNumericDtype) {
  const char* descrs[] = {"|u1", "|i1", "<u2", "<i2", "<u4", "<i4",
                          "<u8", "<i8", "<f2", "<f4", "<f8"};
  const DType dtypes[] = {DType::kUInt8,   DType::kInt8,    DType::kUInt16, DType::kInt16,
                          DType::kUInt32,  DType::kInt32,   DType::kUInt64, DType::kInt64,
                          DType::kFloat16, DType::kFloat32, DType::kFloat64};
  for (size_t t = 0; t < std::size(descrs); ++t) {
    SCOPED_TRACE(descrs[t]);
    // One box [1, 2, 3, 4] of class 9, in the dtype.
    const std::vector<double> values = {1, 2, 3, 4, 9};
    std::vector<uint8_t> payload(5 * dtype_size(dtypes[t]));
    for (size_t i = 0; i < 5; ++i) {
      const double v = values[i];
      uint8_t* p = payload.data() + i * dtype_size(dtypes[t]);
      switch (dtypes[t]) {
        case DType::kFloat16: {
          const uint16_t halves[] = {0x3C00, 0x4000, 0x4200, 0x4400, 0x4880};  // 1 2 3 4 9
          std::memcpy(p, &halves[i], 2);
          break;
        }
        case DType::kFloat32: {
          const auto f = static_cast<float>(v);
          std::memcpy(p, &f, 4);
          break;
        }
        case DType::kFloat64: std::memcpy(p, &v, 8); break;
        default: {
          const auto n = static_cast<uint64_t>(v);  // little-endian: the low bytes come first
          std::memcpy(p, &n, dtype_size(dtypes[t]));
        }
      }
    }
    const RawBoxes b = npy(npy_file(descrs[t], "(1, 5)", payload));
    EXPECT_EQ(b.coords, (std::vector<double>{1, 2, 3, 4}));
    EXPECT_EQ(b.classes, (std::vector<int64_t>{9}));
  }
}

TEST(NpyBoxes, Refusals) {
  const auto f32 = [](const std::string& shape, std::vector<float> v) {
    return npy_file("<f4", shape, bytes_of(v));
  };
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::vector<uint8_t> file;
    ErrorCode code;
    const char* reason;
  };
  const Case cases[] = {
      {f32("(4,)", {1, 2, 3, 4}), ErrorCode::kCorruptData, "shape (4,)"},
      {f32("(1, 3)", {1, 2, 3}), ErrorCode::kCorruptData, "shape (1, 3)"},
      {f32("(1, 7)", {1, 2, 3, 4, 5, 6, 7}), ErrorCode::kCorruptData, "shape (1, 7)"},
      {f32("(1, 1, 4)", {1, 2, 3, 4}), ErrorCode::kCorruptData, "shape (1, 1, 4)"},
      {f32("()", {1}), ErrorCode::kCorruptData, "shape ()"},
      {f32("(2, 4)", {1, 2, 3, 4, 5, nan, 7, 8}), ErrorCode::kCorruptData,
       "box 1: coordinate 1 is not finite"},
      {f32("(1, 4)", {-inf, 2, 3, 4}), ErrorCode::kCorruptData, "box 0: coordinate 0"},
      {f32("(1, 5)", {1, 2, 3, 4, 1.5f}), ErrorCode::kCorruptData, "box 0: the class"},
      {f32("(1, 5)", {1, 2, 3, 4, -2}), ErrorCode::kCorruptData, "box 0: the class"},
      {f32("(1, 5)", {1, 2, 3, 4, nan}), ErrorCode::kCorruptData, "box 0: the class"},
      {f32("(1, 5)", {1, 2, 3, 4, 1e19f}), ErrorCode::kCorruptData, "box 0: the class"},
      {npy_file("<i4", "(1, 5)", bytes_of(std::vector<int32_t>{1, 2, 3, 4, -5})),
       ErrorCode::kCorruptData, "box 0: the class"},
      {npy_file("<u8", "(1, 5)", bytes_of(std::vector<uint64_t>{1, 2, 3, 4, 1ull << 63})),
       ErrorCode::kCorruptData, "box 0: the class"},
      {npy_file("|b1", "(1, 4)", {1, 0, 1, 0}), ErrorCode::kUnsupported, "bool"},
      {npy_file(">f4", "(1, 4)", std::vector<uint8_t>(16)), ErrorCode::kUnsupported, "big-endian"},
      {npy_file("|O", "(1, 4)", std::vector<uint8_t>(16)), ErrorCode::kUnsupported, "object"},
      {f32("(2, 4)", {1, 2, 3, 4}), ErrorCode::kCorruptData, "truncated"},
      {{0x93, 'N', 'U'}, ErrorCode::kCorruptData, "magic"},
  };
  for (const Case& c : cases) {
    const Error e = npy_error(c.file);
    EXPECT_EQ(e.code(), c.code) << e.reason();
    EXPECT_NE(e.reason().find(c.reason), std::string::npos) << e.reason();
  }
  // A -1 class is "none", as in RawBoxes.
  EXPECT_EQ(npy(f32("(1, 5)", {1, 2, 3, 4, -1})).classes, (std::vector<int64_t>{-1}));
}

TEST(NpyBoxes, Limits) {
  const auto boxes = [](int n, int columns) {
    return npy_file("<f4", "(" + std::to_string(n) + ", " + std::to_string(columns) + ")",
                    std::vector<uint8_t>(static_cast<size_t>(n * columns) * 4));
  };
  EXPECT_EQ(npy(boxes(3, 4), {.max_boxes = 3}).count(), 3);
  EXPECT_EQ(npy_error(boxes(4, 4), {.max_boxes = 3}).code(), ErrorCode::kResourceLimit);
  EXPECT_EQ(npy_error(boxes(4, 6), {.max_boxes = 3}).code(), ErrorCode::kResourceLimit);
  EXPECT_EQ(npy_error(boxes(1, 4), {.max_boxes = 0}).code(), ErrorCode::kResourceLimit);
  const auto file = boxes(2, 4);
  EXPECT_EQ(npy_error(file, {.max_boxes = 10, .max_member_bytes = file.size() - 1}).code(),
            ErrorCode::kResourceLimit);
  EXPECT_EQ(npy_error(file, {.max_boxes = -1}).code(), ErrorCode::kInvalidArgument);
  // A shape far beyond the limit, over a small file: refused before anything else.
  EXPECT_EQ(npy_error(npy_file("<f4", "(100000000000, 4)", {})).code(), ErrorCode::kResourceLimit);
}

}  // namespace
}  // namespace stoker::fields
