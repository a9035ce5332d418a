#include "stoker/fields/box_source.h"

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "stoker/core/error.h"
#include "stoker/fields/npy.h"

namespace stoker::fields {

namespace {

void check_limits(size_t size, const BoxLimits& limits, const char* what) {
  STOKER_CHECK(limits.max_boxes >= 0, ErrorCode::kInvalidArgument,
               "boxes: max_boxes must not be negative");
  if (size > limits.max_member_bytes)
    throw Error(ErrorCode::kResourceLimit,
                std::string(what) + " boxes: a member of " + std::to_string(size) +
                    " bytes is over the limit of " + std::to_string(limits.max_member_bytes));
}

// A streaming reader (nlohmann's SAX interface): it keeps the boxes and nothing else, so a member
// of 64 MiB of other data costs no more than its boxes, and it stops at max_boxes + 1.
//
// The state is where the parser is in the accepted shape; a value it does not care about (under
// another key) is skipped by counting brackets. Any event the shape does not allow throws.
class BoxReader final : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit BoxReader(int64_t max_boxes) : max_boxes_(max_boxes) {}

  RawBoxes take() { return std::move(out_); }
  bool done() const { return where_ == Where::kDone; }

  bool null() override { return scalar(Scalar::kOther); }
  bool boolean(bool) override { return scalar(Scalar::kOther); }
  bool number_integer(number_integer_t v) override {
    number_ = static_cast<double>(v);
    integer_ = v;
    integer_ok_ = true;
    return scalar(Scalar::kNumber);
  }
  bool number_unsigned(number_unsigned_t v) override {
    number_ = static_cast<double>(v);
    integer_ok_ = v <= static_cast<uint64_t>(INT64_MAX);
    integer_ = integer_ok_ ? static_cast<int64_t>(v) : 0;
    return scalar(Scalar::kNumber);
  }
  bool number_float(number_float_t v, const string_t&) override {
    number_ = v;
    integer_ok_ = false;
    return scalar(Scalar::kNumber);
  }
  bool string(string_t&) override { return scalar(Scalar::kOther); }
  bool binary(binary_t&) override { return scalar(Scalar::kOther); }

  bool start_object(std::size_t) override { return open(/*array=*/false); }
  bool start_array(std::size_t) override { return open(/*array=*/true); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }

  bool key(string_t& k) override {
    if (skip_depth_ > 0) return true;
    if (where_ == Where::kRoot) {
      if (k == "annotations" || k == "boxes") {
        if (found_list_) fail("the object has more than one 'annotations' or 'boxes' list");
        found_list_ = true;
        expect_ = Expect::kList;
        list_key_ = k;
      } else {
        expect_ = Expect::kSkip;
      }
    } else if (where_ == Where::kBox) {
      if (k == "bbox") {
        if (seen_bbox_) fail(box_name() + ": bbox given twice");
        seen_bbox_ = true;
        expect_ = Expect::kBbox;
      } else if (k == "category_id") {
        if (seen_class_) fail(box_name() + ": category_id given twice");
        seen_class_ = true;
        expect_ = Expect::kClass;
      } else {
        expect_ = Expect::kSkip;
      }
    }
    return true;
  }

  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::json::exception& e) override {
    throw Error(ErrorCode::kCorruptData, "boxes: not valid JSON near byte " +
                                             std::to_string(position) + " (" + e.what() + ")");
  }

 private:
  enum class Where { kTop, kRoot, kList, kBox, kBbox, kPlain, kDone };
  enum class Expect { kNone, kList, kBbox, kClass, kSkip };
  enum class Scalar { kNumber, kOther };

  [[noreturn]] void fail(const std::string& why) const {
    throw Error(ErrorCode::kCorruptData, "boxes: " + why);
  }
  std::string box_name() const { return "box " + std::to_string(out_.count()); }

  void begin_box() {
    if (out_.count() >= max_boxes_)
      throw Error(ErrorCode::kResourceLimit,
                  "boxes: more than the limit of " + std::to_string(max_boxes_) + " boxes");
    coords_found_ = 0;
    klass_ = -1;
    seen_bbox_ = seen_class_ = false;
  }
  void commit_box() {
    out_.coords.insert(out_.coords.end(), coords_, coords_ + 4);
    out_.classes.push_back(klass_);
  }

  bool open(bool array) {
    if (skip_depth_ > 0) {
      ++skip_depth_;
      return true;
    }
    switch (where_) {
      case Where::kTop: where_ = array ? Where::kList : Where::kRoot; return true;
      case Where::kRoot:
        if (expect_ == Expect::kSkip) {
          skip_depth_ = 1;
        } else if (!array) {
          fail("'" + list_key_ + "' must be a list");
        } else {
          where_ = Where::kList;
          list_in_root_ = true;
        }
        expect_ = Expect::kNone;
        return true;
      case Where::kList:
        begin_box();
        where_ = array ? Where::kPlain : Where::kBox;
        return true;
      case Where::kBox:
        if (expect_ == Expect::kSkip) {
          skip_depth_ = 1;
        } else if (expect_ == Expect::kBbox && array) {
          where_ = Where::kBbox;
        } else if (expect_ == Expect::kClass) {
          bad_class();
        } else {
          bad_value();
        }
        expect_ = Expect::kNone;
        return true;
      case Where::kBbox:
      case Where::kPlain: bad_value();
      case Where::kDone: break;
    }
    fail("unexpected JSON after the boxes");
  }

  bool close() {
    if (skip_depth_ > 0) {
      --skip_depth_;
      return true;
    }
    switch (where_) {
      case Where::kRoot:
        if (!found_list_) fail("the object has no 'annotations' or 'boxes' list");
        where_ = Where::kDone;
        return true;
      case Where::kList: where_ = list_in_root_ ? Where::kRoot : Where::kDone; return true;
      case Where::kBox:
        if (!seen_bbox_) fail(box_name() + ": no bbox");
        commit_box();
        where_ = Where::kList;
        return true;
      case Where::kBbox:
      case Where::kPlain:
        if (coords_found_ != 4) bad_value();
        if (where_ == Where::kPlain) {
          commit_box();
          where_ = Where::kList;
        } else {
          where_ = Where::kBox;
        }
        return true;
      case Where::kTop:
      case Where::kDone: break;
    }
    fail("unbalanced JSON");  // the parser never gets here
  }

  bool scalar(Scalar kind) {
    if (skip_depth_ > 0) return true;
    switch (where_) {
      case Where::kTop:
        fail("expected a list of boxes, or an object with an 'annotations' or 'boxes' list");
      case Where::kRoot:
        if (expect_ != Expect::kSkip) fail("'" + list_key_ + "' must be a list");
        expect_ = Expect::kNone;
        return true;
      case Where::kList:
        fail(box_name() + ": expected an object with a bbox or a list of 4 numbers");
      case Where::kBox:
        if (expect_ == Expect::kClass) {
          if (kind != Scalar::kNumber || !integer_ok_ || integer_ < 0) bad_class();
          klass_ = integer_;
        } else if (expect_ == Expect::kBbox) {
          bad_value();
        }
        expect_ = Expect::kNone;
        return true;
      case Where::kBbox:
      case Where::kPlain:
        if (kind != Scalar::kNumber || coords_found_ == 4) bad_value();
        if (!std::isfinite(number_)) fail(box_name() + ": a coordinate is not finite");
        coords_[coords_found_++] = number_;
        return true;
      case Where::kDone: break;
    }
    fail("unexpected JSON after the boxes");
  }

  [[noreturn]] void bad_class() const {
    fail(box_name() + ": category_id must be a JSON integer >= 0 (and < 2^63)");
  }
  // Whatever is wrong with the 4 numbers of the box being read.
  [[noreturn]] void bad_value() const {
    fail(box_name() +
         (where_ == Where::kPlain ? ": must be a list of 4 numbers" : ": bbox must be 4 numbers"));
  }

  const int64_t max_boxes_;
  RawBoxes out_;
  Where where_ = Where::kTop;
  Expect expect_ = Expect::kNone;
  int64_t skip_depth_ = 0;  // > 0: inside a value that is skipped
  bool list_in_root_ = false;
  bool found_list_ = false;
  std::string list_key_;
  // The box being read.
  double coords_[4] = {};
  int coords_found_ = 0;
  int64_t klass_ = -1;
  bool seen_bbox_ = false;
  bool seen_class_ = false;
  // The last number seen.
  double number_ = 0;
  int64_t integer_ = 0;
  bool integer_ok_ = false;
};

}  // namespace

RawBoxes parse_json_boxes(const uint8_t* data, size_t size, const BoxLimits& limits) {
  check_limits(size, limits, "JSON");
  BoxReader reader(limits.max_boxes);
  const bool ok = nlohmann::json::sax_parse(data, data + size, &reader);
  // parse_error throws, so a false return is not expected; kept as a guard.
  if (!ok || !reader.done()) throw Error(ErrorCode::kCorruptData, "boxes: not valid JSON");
  return reader.take();
}

RawBoxes parse_npy_boxes(const uint8_t* data, size_t size, const BoxLimits& limits) {
  check_limits(size, limits, ".npy");
  NpyLimits npy_limits;
  // Enough for max_boxes rows of 6, so that more rows are refused below with a clear reason;
  // max_boxes is validated non-negative above.
  npy_limits.max_elements = limits.max_boxes > INT64_MAX / 6 ? INT64_MAX : limits.max_boxes * 6;
  const NpyArray a = parse_npy(data, size, npy_limits);
  if (a.dtype == DType::kBool)
    throw Error(ErrorCode::kUnsupported, "boxes: a .npy of bool cannot hold boxes");
  const auto shape_text = [&] {
    std::string s = "(";
    for (size_t i = 0; i < a.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(a.shape[i]);
    return s + (a.shape.size() == 1 ? ",)" : ")");
  };
  RawBoxes out;
  if (a.shape.size() == 1 && a.shape[0] == 0) return out;
  if (a.shape.size() != 2 || a.shape[1] < 4 || a.shape[1] > 6)
    throw Error(ErrorCode::kCorruptData, "boxes: a .npy of shape " + shape_text() +
                                             "; boxes are [N, 4], [N, 5] or [N, 6] (or [0])");
  const int64_t n = a.shape[0];
  const int64_t columns = a.shape[1];
  if (n > limits.max_boxes)
    throw Error(ErrorCode::kResourceLimit, "boxes: " + std::to_string(n) +
                                               " boxes, over the limit of " +
                                               std::to_string(limits.max_boxes));
  const bool is_float =
      a.dtype == DType::kFloat16 || a.dtype == DType::kFloat32 || a.dtype == DType::kFloat64;
  const size_t item = dtype_size(a.dtype);
  out.coords.resize(static_cast<size_t>(n) * 4);
  out.classes.assign(static_cast<size_t>(n), -1);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* row = a.data + static_cast<size_t>(i * columns) * item;
    double* coords = out.coords.data() + i * 4;
    convert_elements(a.dtype, row, DType::kFloat64, reinterpret_cast<uint8_t*>(coords), 4);
    for (int j = 0; j < 4; ++j)
      if (!std::isfinite(coords[j]))
        throw Error(ErrorCode::kCorruptData, "boxes: box " + std::to_string(i) + ": coordinate " +
                                                 std::to_string(j) + " is not finite");
    if (columns < 5) continue;
    const uint8_t* cls = row + 4 * item;
    int64_t klass;
    bool ok;
    if (is_float) {
      double v;
      convert_elements(a.dtype, cls, DType::kFloat64, reinterpret_cast<uint8_t*>(&v), 1);
      ok = std::isfinite(v) && v == std::trunc(v) && v >= -1 && v < 0x1p63;
      klass = ok ? static_cast<int64_t>(v) : 0;
    } else if (a.dtype == DType::kUInt64) {
      uint64_t v;
      std::memcpy(&v, cls, sizeof v);
      ok = v <= static_cast<uint64_t>(INT64_MAX);
      klass = static_cast<int64_t>(v);
    } else {
      convert_elements(a.dtype, cls, DType::kInt64, reinterpret_cast<uint8_t*>(&klass), 1);
      ok = klass >= -1;
    }
    if (!ok)
      throw Error(ErrorCode::kCorruptData, "boxes: box " + std::to_string(i) +
                                               ": the class (column 4) must be an integer >= -1");
    out.classes[static_cast<size_t>(i)] = klass;
  }
  return out;
}

}  // namespace stoker::fields
