// Fuzz target: a Parquet row group's decoded columns as a fetcher hands them to the engine
// (io/row_group.h; bindings/dataset.cc: row_group_column, ShardGate.ready_rows). The row count
// and every length, offset and validity byte come from a file the user does not control.
//
// Input, little-endian: the row count (int64), then columns until the input ends, each
//   name length (u8), name, kind (u8 % 3: bytes, number, list), dtype (u8 % 12, DType's order),
//   data length (u32), data, offset count (u32), offsets (u64 each),
//   validity length (u32), validity
// (a column cut short is dropped). The first column's name is also the reason given to a failed
// row group.
//
// Beyond "no crash": the constructor builds exactly when a model written here (overflow-checked)
// says every column describes its data, else refuses with CorruptData naming the source and the
// first bad column (a negative row count: InvalidArgument); every cell of a built row group is null
// exactly where its validity byte is 0, otherwise its bytes (each one read) are the column's own at
// its offsets, and its size is what its RawLayout says (number: dtype_size; list: shape[0] *
// dtype_size); a cell outside the row group is an Internal error; every cell of a failed row group
// is CorruptData with its reason.
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "stoker/core/dtype.h"
#include "stoker/core/error.h"
#include "stoker/io/row_group.h"

using namespace stoker;
using stoker::io::RowGroup;

namespace {

constexpr char kSource[] = "fuzz.parquet (row group 0)";
constexpr size_t kMaxColumns = 16;

class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), left_(size) {}
  bool take(size_t n, const uint8_t*& out) {
    if (n > left_) return false;
    out = p_;
    p_ += n;
    left_ -= n;
    return true;
  }
  template <typename T>
  bool value(T& out) {
    const uint8_t* p;
    if (!take(sizeof(T), p)) return false;
    std::memcpy(&out, p, sizeof(T));
    return true;
  }
  bool bytes(size_t n, std::vector<uint8_t>& out) {
    const uint8_t* p;
    if (!take(n, p)) return false;
    out.assign(p, p + n);
    return true;
  }

 private:
  const uint8_t* p_;
  size_t left_;
};

bool parse_column(Input& in, RowGroup::Column& c) {
  uint8_t name_size, kind, dtype;
  uint32_t size;
  std::vector<uint8_t> name;
  if (!in.value(name_size) || !in.bytes(name_size, name)) return false;
  c.name.assign(name.begin(), name.end());
  if (!in.value(kind) || !in.value(dtype)) return false;
  c.kind = static_cast<RowGroup::CellKind>(kind % 3);
  c.dtype = static_cast<DType>(dtype % (static_cast<int>(DType::kFloat64) + 1));
  if (!in.value(size) || !in.bytes(size, c.data)) return false;
  if (!in.value(size)) return false;
  for (uint32_t i = 0; i < size; ++i) {
    uint64_t o;
    if (!in.value(o)) return false;
    c.offsets.push_back(o);
  }
  return in.value(size) && in.bytes(size, c.present);
}

// Whether `c` describes its data for `n` rows, as row_group.h promises to check.
bool describes_its_data(const RowGroup::Column& c, uint64_t n) {
  if (!c.present.empty() && c.present.size() != n) return false;
  const uint64_t item = dtype_size(c.dtype);
  if (c.kind == RowGroup::CellKind::kNumber) {
    uint64_t bytes;
    return !__builtin_mul_overflow(n, item, &bytes) && bytes == c.data.size();
  }
  if (c.offsets.empty() || c.offsets.size() - 1 != n) return false;
  if (c.offsets.front() != 0 || c.offsets.back() != c.data.size()) return false;
  for (uint64_t r = 0; r < n; ++r) {
    if (c.offsets[r + 1] < c.offsets[r]) return false;
    if (c.kind == RowGroup::CellKind::kList && (c.offsets[r + 1] - c.offsets[r]) % item != 0)
      return false;
  }
  return true;
}

void check_cells(const RowGroup& group, const std::vector<RowGroup::Column>& columns) {
  const int64_t rows = group.rows();
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t k = 0; k < columns.size(); ++k) {
      const RowGroup::Column& c = columns[k];
      RowGroup::Cell cell;
      const bool present = group.cell(r, k, cell);
      FUZZ_CHECK(present == (c.present.empty() || c.present[r] != 0));
      if (!present) continue;
      fuzz::touch(cell.data, cell.size);  // ASan reports a cell outside its column here
      const uint64_t item = dtype_size(c.dtype);
      uint64_t begin = static_cast<uint64_t>(r) * item, size = item;
      switch (c.kind) {
        case RowGroup::CellKind::kBytes:
          FUZZ_CHECK(cell.raw == nullptr);
          begin = c.offsets[r];
          size = c.offsets[r + 1] - begin;
          break;
        case RowGroup::CellKind::kNumber:
          FUZZ_CHECK(cell.raw != nullptr && cell.raw->dtype == c.dtype && cell.raw->shape.empty());
          FUZZ_CHECK(cell.size == dtype_size(cell.raw->dtype));
          break;
        case RowGroup::CellKind::kList:
          FUZZ_CHECK(cell.raw != nullptr && cell.raw->dtype == c.dtype);
          FUZZ_CHECK(cell.raw->shape.size() == 1 && cell.raw->shape[0] >= 0);
          FUZZ_CHECK(cell.size ==
                     static_cast<uint64_t>(cell.raw->shape[0]) * dtype_size(cell.raw->dtype));
          begin = c.offsets[r];
          size = c.offsets[r + 1] - begin;
          break;
      }
      FUZZ_CHECK(cell.size == size);
      FUZZ_CHECK(size == 0 || std::memcmp(cell.data, c.data.data() + begin, size) == 0);
    }
  }
  // Outside the row group: an Internal error (a bug of the caller), never a read.
  auto outside = [&](int64_t row, size_t column) {
    RowGroup::Cell cell;
    try {
      group.cell(row, column, cell);
    } catch (const Error& e) {
      FUZZ_CHECK(e.code() == ErrorCode::kInternal);
      return;
    }
    FUZZ_CHECK(!"a cell outside the row group was read");
  };
  outside(-1, 0);
  outside(rows, 0);
  outside(0, columns.size());
}

void check_failed_row_group(int64_t rows, const std::string& error) {
  try {
    const RowGroup group(kSource, rows, error);
    FUZZ_CHECK(!error.empty());
    FUZZ_CHECK(group.error() == error && group.rows() == rows && group.num_columns() == 0);
    for (const int64_t r : {int64_t{0}, rows}) {
      RowGroup::Cell cell;
      try {
        group.cell(r, 0, cell);
        FUZZ_CHECK(!"a cell of a failed row group was read");
      } catch (const Error& e) {
        FUZZ_CHECK(e.code() == ErrorCode::kCorruptData);
        FUZZ_CHECK(e.reason() == error && e.shard() == kSource);
      }
    }
  } catch (const Error& e) {
    FUZZ_CHECK(error.empty() && e.code() == ErrorCode::kInvalidArgument);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  int64_t rows;
  if (!in.value(rows)) return 0;
  std::vector<RowGroup::Column> columns;
  RowGroup::Column c;
  while (columns.size() < kMaxColumns && parse_column(in, c)) {
    columns.push_back(std::move(c));
    c = RowGroup::Column{};
  }
  check_failed_row_group(rows, columns.empty() ? std::string() : columns[0].name);

  // The first column that does not describe its data; columns.size() when all do.
  size_t bad = 0;
  while (rows >= 0 && bad < columns.size() &&
         describes_its_data(columns[bad], static_cast<uint64_t>(rows)))
    ++bad;
  const bool every_column_describes_its_data = rows >= 0 && bad == columns.size();
  uint64_t held = 0;
  for (const RowGroup::Column& col : columns) held += col.data.size() + col.offsets.size() * 8;
  try {
    const RowGroup group(kSource, rows, columns);  // a copy: the model reads the columns below
    FUZZ_CHECK(every_column_describes_its_data);
    FUZZ_CHECK(group.rows() == rows && group.error().empty());
    FUZZ_CHECK(group.num_columns() == columns.size());
    for (size_t k = 0; k < columns.size(); ++k) FUZZ_CHECK(group.column_name(k) == columns[k].name);
    FUZZ_CHECK(group.bytes() >= held);
    if (!columns.empty()) check_cells(group, columns);  // no columns: any row count builds
  } catch (const Error& e) {
    if (rows < 0) {
      FUZZ_CHECK(e.code() == ErrorCode::kInvalidArgument);
      return 0;
    }
    FUZZ_CHECK(e.code() == ErrorCode::kCorruptData);
    FUZZ_CHECK(!every_column_describes_its_data);
    FUZZ_CHECK(e.shard() == kSource && e.member() == columns[bad].name);
  }
  return 0;
}
