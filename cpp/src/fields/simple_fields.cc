// Label, Array and Bytes: members copied (or converted) into the batch as they are.
#include <cstring>

#include "fields/detail/decoders.h"
#include "stoker/core/clock.h"
#include "stoker/core/error.h"
#include "stoker/core/label.h"
#include "stoker/fields/npy.h"

namespace stoker::fields::detail {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += shape[i] == -1 ? "N" : std::to_string(shape[i]);
  }
  return s + (shape.size() == 1 ? ",)" : ")");
}

class LabelField final : public FieldDecoder {
 public:
  void decode(const uint8_t* data, size_t size, const SampleContext& c, Geometry&,
              uint8_t* const* out, std::string*, FieldTimes&) override {
    int64_t label = c.label;
    if (data != nullptr) label = parse_label(data, size).value_or(-1);
    std::memcpy(out[0], &label, sizeof label);
  }
};

class ArrayField final : public FieldDecoder {
 public:
  explicit ArrayField(const FieldSpec& spec) : options_(spec.array) {
    variable_ = !options_.shape.empty() && options_.shape[0] == -1;
    row_elements_ = 1;
    for (size_t d = variable_ ? 1 : 0; d < options_.shape.size(); ++d)
      row_elements_ *= options_.shape[d];
  }

  void decode(const uint8_t* data, size_t size, const SampleContext&, Geometry&,
              uint8_t* const* out, std::string*, FieldTimes& times) override {
    const int64_t t0 = monotonic_ns();
    NpyLimits limits;
    limits.max_elements = options_.max_elements;
    const NpyArray a = parse_npy(data, size, limits);
    const std::vector<int64_t>& want = options_.shape;
    bool fits = a.shape.size() == want.size();
    for (size_t d = 0; fits && d < want.size(); ++d)
      fits = (d == 0 && variable_) ? a.shape[0] <= options_.max_length : a.shape[d] == want[d];
    if (!fits)
      throw Error(ErrorCode::kCorruptData,
                  "array of shape " + shape_text(a.shape) + " where the field expects " +
                      shape_text(want) +
                      (variable_ ? " with N <= " + std::to_string(options_.max_length) : ""));
    const int64_t rows = variable_ ? a.shape[0] : 1;
    const int64_t count = rows * row_elements_;
    convert_elements(a.dtype, a.data, options_.dtype, out[0], count);
    if (variable_) {
      const size_t item = dtype_size(options_.dtype);
      std::memset(out[0] + static_cast<size_t>(count) * item, 0,
                  static_cast<size_t>((options_.max_length - rows) * row_elements_) * item);
      std::memcpy(out[1], &rows, sizeof rows);
    }
    times.decode_ns += monotonic_ns() - t0;
  }

 private:
  ArrayOptions options_;
  bool variable_ = false;
  int64_t row_elements_ = 1;
};

class BytesField final : public FieldDecoder {
 public:
  void decode(const uint8_t* data, size_t size, const SampleContext&, Geometry&, uint8_t* const*,
              std::string* blob, FieldTimes&) override {
    blob->assign(reinterpret_cast<const char*>(data), size);
  }
};

}  // namespace

std::unique_ptr<FieldDecoder> make_label_decoder() { return std::make_unique<LabelField>(); }
std::unique_ptr<FieldDecoder> make_array_decoder(const FieldSpec& spec) {
  return std::make_unique<ArrayField>(spec);
}
std::unique_ptr<FieldDecoder> make_bytes_decoder() { return std::make_unique<BytesField>(); }

}  // namespace stoker::fields::detail
