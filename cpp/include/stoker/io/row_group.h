// One row group of a Parquet file with its columns decoded, handed to a shard gate whole by the
// fetcher that read it (pyarrow, on a Python thread without the GIL): the engine's workers read
// its cells in place, as members of the row's sample. A cell is a byte range of its column's
// buffer: an encoded member (an image's bytes, a string), one number (a label), or a list of
// numbers (a raw 1-d array). Immutable once built; every length and offset the decoder gave is
// checked here, so that a bad one is an error naming the column, never a read out of bounds.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/core/dtype.h"

namespace stoker::io {

class RowGroup {
 public:
  enum class CellKind : uint8_t {
    kBytes,   // variable-length bytes (binary, string): an encoded member
    kNumber,  // one element of `dtype` per row
    kList,    // a list of `dtype` elements per row: a raw array of shape [n]
  };
  // One column as its decoder gave it: `data` the cells' bytes back to back, `offsets` rows + 1
  // byte offsets into it (kBytes, kList; empty for kNumber, whose cells are dtype-sized), and
  // `present` one byte per row (0: null, the sample has no such member; empty: all present).
  // Or, with `owner` set, the cells' bytes are the `external_size` bytes at `external`, in
  // memory `owner` keeps alive (the decoder's own buffer, not copied) and `data` is unused.
  struct Column {
    std::string name;
    CellKind kind = CellKind::kBytes;
    DType dtype = DType::kUInt8;  // kNumber, kList
    std::vector<uint8_t> data;
    std::vector<uint64_t> offsets;
    std::vector<uint8_t> present;
    const uint8_t* external = nullptr;
    uint64_t external_size = 0;
    std::shared_ptr<const void> owner;
  };
  // Throws Error(kCorruptData) naming `source` (file and row group) and the column when a
  // column's lengths or offsets do not describe its data.
  RowGroup(std::string source, int64_t rows, std::vector<Column> columns);
  // A row group that did not decode: every row of it fails with Error(kCorruptData, error).
  RowGroup(std::string source, int64_t rows, std::string error);
  RowGroup(const RowGroup&) = delete;
  RowGroup& operator=(const RowGroup&) = delete;

  const std::string& source() const { return source_; }
  int64_t rows() const { return rows_; }
  // Why the row group did not decode ("" when it did).
  const std::string& error() const { return error_; }
  size_t num_columns() const { return columns_.size(); }
  const std::string& column_name(size_t column) const { return columns_.at(column).name; }
  // The bytes held (every column's data, its own or its owner's, and offsets).
  uint64_t bytes() const { return bytes_; }

  struct Cell {
    const uint8_t* data = nullptr;
    uint64_t size = 0;
    const RawLayout* raw = nullptr;  // null for kBytes
  };
  // Row `row`'s cell of column `column`: false where it is null.
  bool cell(int64_t row, size_t column, Cell& out) const;

 private:
  struct Stored {
    std::string name;
    CellKind kind;
    std::vector<uint8_t> data;          // the cells' bytes when owned here
    std::shared_ptr<const void> owner;  // else what keeps them alive
    const uint8_t* bytes = nullptr;     // the cells' bytes, either way
    uint64_t size = 0;
    std::vector<uint64_t> offsets;
    std::vector<uint8_t> present;
    RawLayout scalar;               // kNumber: {dtype, {}}
    std::vector<RawLayout> shapes;  // kList: {dtype, {n}} per row
  };
  std::string source_;
  std::string error_;
  int64_t rows_ = 0;
  uint64_t bytes_ = 0;
  std::vector<Stored> columns_;
};

}  // namespace stoker::io
