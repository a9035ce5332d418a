#include "stoker/io/row_group.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>

#include "stoker/core/error.h"
#include "stoker/io/shard_gate.h"

namespace stoker::io {
namespace {

RowGroup::Column bytes_column(std::string name, std::string data, std::vector<uint64_t> offsets,
                              std::vector<uint8_t> present = {}) {
  RowGroup::Column c;
  c.name = std::move(name);
  c.data.assign(data.begin(), data.end());
  c.offsets = std::move(offsets);
  c.present = std::move(present);
  return c;
}

std::string text(const RowGroup::Cell& cell) {
  return {reinterpret_cast<const char*>(cell.data), static_cast<size_t>(cell.size)};
}

TEST(RowGroup, CellsAreTheirColumnsBytesNullsAbsent) {
  RowGroup::Column label;
  label.name = "label";
  label.kind = RowGroup::CellKind::kNumber;
  label.dtype = DType::kInt64;
  const int64_t values[] = {7, -1, 3};
  label.data.assign(reinterpret_cast<const uint8_t*>(values),
                    reinterpret_cast<const uint8_t*>(values) + sizeof(values));
  RowGroup::Column list;
  list.name = "ids";
  list.kind = RowGroup::CellKind::kList;
  list.dtype = DType::kInt32;
  list.data.resize(5 * 4);
  list.offsets = {0, 8, 8, 20};
  std::vector<RowGroup::Column> columns;
  columns.push_back(bytes_column("image", "abcdef", {0, 2, 2, 6}, {1, 0, 1}));
  columns.push_back(std::move(label));
  columns.push_back(std::move(list));
  const RowGroup rows("a.parquet (row group 0)", 3, std::move(columns));
  RowGroup::Cell cell;
  ASSERT_TRUE(rows.cell(0, 0, cell));
  EXPECT_EQ(text(cell), "ab");
  EXPECT_EQ(cell.raw, nullptr);
  EXPECT_FALSE(rows.cell(1, 0, cell));  // null: the sample has no such member
  ASSERT_TRUE(rows.cell(2, 0, cell));
  EXPECT_EQ(text(cell), "cdef");
  ASSERT_TRUE(rows.cell(2, 1, cell));
  EXPECT_EQ(*reinterpret_cast<const int64_t*>(cell.data), 3);
  ASSERT_NE(cell.raw, nullptr);
  EXPECT_EQ(cell.raw->dtype, DType::kInt64);
  EXPECT_TRUE(cell.raw->shape.empty());
  ASSERT_TRUE(rows.cell(2, 2, cell));
  EXPECT_EQ(cell.raw->shape, std::vector<int64_t>{3});
  ASSERT_TRUE(rows.cell(1, 2, cell));
  EXPECT_EQ(cell.raw->shape, std::vector<int64_t>{0});
  EXPECT_THROW(rows.cell(3, 0, cell), Error);
  EXPECT_THROW(rows.cell(0, 3, cell), Error);
}

void expect_corrupt(std::vector<RowGroup::Column> columns, int64_t rows, const std::string& why) {
  try {
    RowGroup group("b.parquet (row group 2)", rows, std::move(columns));
    FAIL() << "accepted: " << why;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptData) << e.what();
    EXPECT_EQ(e.shard(), "b.parquet (row group 2)");
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

TEST(RowGroup, OffsetsAndLengthsThatDoNotDescribeTheDataAreRefused) {
  auto one = [](RowGroup::Column c) {
    std::vector<RowGroup::Column> v;
    v.push_back(std::move(c));
    return v;
  };
  expect_corrupt(one(bytes_column("image", "abcd", {0, 2, 5})), 2, "column 'image'");
  expect_corrupt(one(bytes_column("image", "abcd", {0, 3, 2, 4})), 3, "decrease");
  expect_corrupt(one(bytes_column("image", "abcd", {0, 4})), 2, "offsets for 2 rows");
  expect_corrupt(one(bytes_column("image", "abcd", {1, 4})), 1, "span");
  expect_corrupt(one(bytes_column("image", "abcd", {0, 4}, {1, 1})), 1, "validity");
  RowGroup::Column number;
  number.name = "label";
  number.kind = RowGroup::CellKind::kNumber;
  number.dtype = DType::kInt64;
  number.data.resize(12);
  expect_corrupt(one(std::move(number)), 2, "12 bytes for 2 values");
  RowGroup::Column list = bytes_column("ids", std::string(6, '\0'), {0, 6});
  list.kind = RowGroup::CellKind::kList;
  list.dtype = DType::kInt32;
  expect_corrupt(one(std::move(list)), 1, "not whole int32");
}

TEST(RowGroup, OneThatDidNotDecodeFailsEachRowWithItsReason) {
  const RowGroup rows("c.parquet (row group 1)", 4, std::string("snappy: corrupt input"));
  EXPECT_EQ(rows.error(), "snappy: corrupt input");
  RowGroup::Cell cell;
  try {
    rows.cell(3, 0, cell);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptData);
    EXPECT_EQ(e.shard(), "c.parquet (row group 1)");
  }
}

TEST(ShardGate, ARowGroupReachesItsReaders) {
  ShardGate gate({"a.parquet (row group 0)"}, {0});
  std::shared_ptr<const RowGroup> got;
  std::thread reader([&] { got = gate.acquire_rows(0, [] { return true; }); });
  ASSERT_EQ(gate.wait_for_requests(5000), std::vector<uint32_t>{0});
  std::vector<RowGroup::Column> columns;
  columns.push_back(bytes_column("text", "hi", {0, 2}));
  gate.ready_rows(
      0, std::make_shared<const RowGroup>("a.parquet (row group 0)", 1, std::move(columns)));
  reader.join();
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->rows(), 1);
  EXPECT_TRUE(gate.is_ready(0));
  EXPECT_EQ(gate.peek(0), nullptr);  // no file
  EXPECT_THROW(gate.acquire(0, [] { return true; }), Error);
  gate.evict(0);
  EXPECT_FALSE(gate.is_ready(0));
  EXPECT_EQ(got->rows(), 1);  // a reader's row group outlives its eviction
}

}  // namespace
}  // namespace stoker::io
