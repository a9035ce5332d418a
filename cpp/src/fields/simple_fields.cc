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
    if (data != nullptr && c.raw != nullptr) {  // an array pack's label column: one integer
      const DType t = c.raw->dtype;
      if (t == DType::kFloat16 || t == DType::kFloat32 || t == DType::kFloat64 ||
          t == DType::kBool || !(c.raw->shape.empty() || c.raw->shape == std::vector<int64_t>{1}))
        throw Error(ErrorCode::kUnsupported, "a Label field reads one integer per sample, not " +
                                                 std::string(dtype_name(t)) + " of shape " +
                                                 shape_text(c.raw->shape));
      convert_elements(t, data, DType::kInt64, reinterpret_cast<uint8_t*>(&label), 1);
    } else if (data != nullptr) {
      label = parse_label(data, size).value_or(-1);
    }
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

  void decode(const uint8_t* data, size_t size, const SampleContext& c, Geometry&,
              uint8_t* const* out, std::string*, FieldTimes& times) override {
    const int64_t t0 = monotonic_ns();
    NpyArray a;
    if (c.raw) {  // an array pack's row: its layout is the column's (checked at open)
      a.dtype = c.raw->dtype;
      a.shape = c.raw->shape;
      a.data = data;
      a.bytes = size;
    } else {
      NpyLimits limits;
      limits.max_elements = options_.max_elements;
      a = parse_npy(data, size, limits);
    }
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

// A window of seq_len + 1 tokens (a token dataset's sample): inputs x = tokens [0, seq_len),
// targets y = tokens [1, seq_len + 1), both int64; with positions, the documents of x.
class TokensField final : public FieldDecoder {
 public:
  explicit TokensField(const FieldSpec& spec) : options_(spec.tokens) {}

  void decode(const uint8_t* data, size_t size, const SampleContext& c, Geometry&,
              uint8_t* const* out, std::string*, FieldTimes& times) override {
    const int64_t t0 = monotonic_ns();
    const int64_t n = options_.seq_len + 1;
    if (c.raw == nullptr || c.raw->shape != std::vector<int64_t>{n} ||
        size != static_cast<size_t>(n) * dtype_size(c.raw->dtype))
      throw Error(ErrorCode::kInvalidArgument,
                  "a Tokens field reads windows of seq_len + 1 = " + std::to_string(n) +
                      " tokens from token data (stoker.TokenLoader)");
    window_.resize(static_cast<size_t>(n));
    convert_elements(c.raw->dtype, data, DType::kInt64, reinterpret_cast<uint8_t*>(window_.data()),
                     n);
    const size_t row = static_cast<size_t>(options_.seq_len) * sizeof(int64_t);
    std::memcpy(out[0], window_.data(), row);
    std::memcpy(out[1], window_.data() + 1, row);
    if (options_.positions) {
      auto* positions = reinterpret_cast<int64_t*>(out[2]);
      auto* cu = reinterpret_cast<int32_t*>(out[3]);
      int64_t documents = 0, start = 0;
      cu[0] = 0;
      for (int64_t i = 0; i < options_.seq_len; ++i) {
        positions[i] = i - start;
        if (window_[static_cast<size_t>(i)] == options_.eos_id && i + 1 < options_.seq_len) {
          start = i + 1;
          cu[++documents] = static_cast<int32_t>(start);
        }
      }
      cu[++documents] = static_cast<int32_t>(options_.seq_len);
      for (int64_t k = documents + 1; k <= options_.seq_len; ++k)
        cu[k] = static_cast<int32_t>(options_.seq_len);
      std::memcpy(out[4], &documents, sizeof documents);
    }
    times.decode_ns += monotonic_ns() - t0;
  }

 private:
  TokensOptions options_;
  std::vector<int64_t> window_;
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
std::unique_ptr<FieldDecoder> make_tokens_decoder(const FieldSpec& spec) {
  return std::make_unique<TokensField>(spec);
}

}  // namespace stoker::fields::detail
