#include "stoker/io/row_group.h"

#include <utility>

#include "stoker/core/error.h"

namespace stoker::io {

RowGroup::RowGroup(std::string source, int64_t rows, std::vector<Column> columns)
    : source_(std::move(source)), rows_(rows) {
  STOKER_CHECK(rows >= 0, ErrorCode::kInvalidArgument,
               "a row group of " + std::to_string(rows) + " rows");
  const auto n = static_cast<uint64_t>(rows);
  for (Column& c : columns) {
    const std::string name = c.name;  // c's members are moved from below
    auto corrupt = [&](const std::string& why) {
      return Error(ErrorCode::kCorruptData, "column '" + name + "': " + why, source_, {}, name);
    };
    if (!c.present.empty() && c.present.size() != n)
      throw corrupt(std::to_string(c.present.size()) + " validity entries for " +
                    std::to_string(rows) + " rows");
    Stored s;
    s.name = std::move(c.name);
    s.kind = c.kind;
    if (c.owner) {
      s.owner = std::move(c.owner);
      s.bytes = c.external;
      s.size = c.external_size;
      if (s.bytes == nullptr && s.size > 0) throw corrupt("no data buffer");
    } else {
      s.data = std::move(c.data);
      s.bytes = s.data.data();
      s.size = s.data.size();
    }
    s.offsets = std::move(c.offsets);
    s.present = std::move(c.present);
    s.scalar = RawLayout{c.dtype, {}};
    const uint64_t item = dtype_size(c.dtype);
    if (s.kind == CellKind::kNumber) {
      if (n > s.size / item || s.size != n * item)  // n * item may wrap
        throw corrupt(std::to_string(s.size) + " bytes for " + std::to_string(rows) +
                      " values of " + std::string(dtype_name(c.dtype)));
    } else {
      if (s.offsets.size() != n + 1)
        throw corrupt(std::to_string(s.offsets.size()) + " offsets for " + std::to_string(rows) +
                      " rows");
      if (s.offsets.front() != 0 || s.offsets.back() != s.size)
        throw corrupt("the offsets span [" + std::to_string(s.offsets.front()) + ", " +
                      std::to_string(s.offsets.back()) + "), the data is " +
                      std::to_string(s.size) + " bytes");
      for (uint64_t r = 0; r < n; ++r) {
        const uint64_t size = s.offsets[r + 1] - s.offsets[r];
        if (s.offsets[r + 1] < s.offsets[r])
          throw corrupt("offsets decrease at row " + std::to_string(r));
        if (s.kind == CellKind::kList && size % item != 0)
          throw corrupt("row " + std::to_string(r) + "'s list is " + std::to_string(size) +
                        " bytes, not whole " + std::string(dtype_name(c.dtype)) + " elements");
      }
      if (s.kind == CellKind::kList) {
        s.shapes.reserve(n);
        for (uint64_t r = 0; r < n; ++r)
          s.shapes.push_back(
              RawLayout{c.dtype, {static_cast<int64_t>((s.offsets[r + 1] - s.offsets[r]) / item)}});
      }
    }
    bytes_ += s.size + s.offsets.size() * sizeof(uint64_t) + s.present.size();
    columns_.push_back(std::move(s));
  }
}

RowGroup::RowGroup(std::string source, int64_t rows, std::string error)
    : source_(std::move(source)), error_(std::move(error)), rows_(rows) {
  STOKER_CHECK(!error_.empty(), ErrorCode::kInvalidArgument, "a failed row group without a reason");
}

bool RowGroup::cell(int64_t row, size_t column, Cell& out) const {
  if (!error_.empty()) throw Error(ErrorCode::kCorruptData, error_, source_);
  STOKER_CHECK(
      row >= 0 && row < rows_ && column < columns_.size(), ErrorCode::kInternal,
      "no cell (" + std::to_string(row) + ", " + std::to_string(column) + ") in " + source_);
  const Stored& s = columns_[column];
  const auto r = static_cast<size_t>(row);
  if (!s.present.empty() && s.present[r] == 0) return false;
  switch (s.kind) {
    case CellKind::kNumber: {
      const uint64_t item = dtype_size(s.scalar.dtype);
      out = Cell{s.bytes + r * item, item, &s.scalar};
      return true;
    }
    case CellKind::kList:
      out = Cell{s.bytes + s.offsets[r], s.offsets[r + 1] - s.offsets[r], &s.shapes[r]};
      return true;
    case CellKind::kBytes:
      out = Cell{s.bytes + s.offsets[r], s.offsets[r + 1] - s.offsets[r], nullptr};
      return true;
  }
  return false;
}

}  // namespace stoker::io
