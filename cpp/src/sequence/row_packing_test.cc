#include "stoker/sequence/row_packing.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "stoker/core/error.h"

namespace stoker::sequence {
namespace {

std::vector<int64_t> plan(const std::vector<int64_t>& lengths, RowPacking options,
                          int64_t* rows = nullptr) {
  std::vector<int64_t> row_of(lengths.size(), -1);
  const int64_t n = pack_rows(lengths, options, row_of);
  if (rows) *rows = n;
  return row_of;
}

// Every piece in a row of its own window; no row over capacity or max_segments; rows numbered
// densely. Returns the rows.
int64_t expect_valid(const std::vector<int64_t>& lengths, const RowPacking& options) {
  int64_t rows = 0;
  const auto row_of = plan(lengths, options, &rows);
  std::map<int64_t, int64_t> used, segments, window_of;
  for (size_t i = 0; i < lengths.size(); ++i) {
    EXPECT_GE(row_of[i], 0);
    EXPECT_LT(row_of[i], rows);
    used[row_of[i]] += lengths[i];
    segments[row_of[i]] += 1;
    const int64_t window = static_cast<int64_t>(i) / options.window;
    auto it = window_of.emplace(row_of[i], window).first;
    EXPECT_EQ(it->second, window) << "row " << row_of[i] << " spans two windows";
  }
  EXPECT_EQ(static_cast<int64_t>(used.size()), rows);
  for (auto [row, tokens] : used) EXPECT_LE(tokens, options.capacity) << "row " << row;
  if (options.max_segments) {
    for (auto [row, n] : segments) EXPECT_LE(n, options.max_segments) << "row " << row;
  }
  return rows;
}

TEST(RowPacking, DecreasingLengthsFillRowsWhole) {
  // 6 opens row 0 (4 left), 5 row 1 (5 left); 4 fills row 0; 3 and 2 fill row 1.
  for (Fit fit : {Fit::kBest, Fit::kFirst}) {
    EXPECT_EQ(plan({6, 5, 4, 3, 2}, {10, 0, 100, fit}), (std::vector<int64_t>{0, 1, 0, 1, 1}));
  }
}

TEST(RowPacking, BestFitTakesTheTightestRowFirstFitTheFirst) {
  // Capacity 20, decreasing 17, 17, 16, 13, 12, 6, 4: rows 0..4 open with 17, 17, 16, 13, 12;
  // 6 joins 13 (row 3, 1 left), 4 joins 16 (row 2, 0 left). The last token, 1, has rows 0 (3
  // left), 1 (3 left), 3 (1 left) and 4 (8 left) to go to: best fit takes row 3, first fit row 0.
  const std::vector<int64_t> lengths{17, 4, 6, 17, 13, 12, 16, 1};
  EXPECT_EQ(plan(lengths, {20, 0, 100, Fit::kBest}),
            (std::vector<int64_t>{0, 2, 3, 1, 3, 4, 2, 3}));
  EXPECT_EQ(plan(lengths, {20, 0, 100, Fit::kFirst}),
            (std::vector<int64_t>{0, 2, 3, 1, 3, 4, 2, 0}));
}

TEST(RowPacking, SlotsNumberEachRowsPiecesInTheOrderTheyWentIn) {
  // Decreasing: 6 (row 0, slot 0), 5 (row 1, slot 0), 4 (row 0, slot 1), 3 and 2 (row 1).
  const std::vector<int64_t> lengths{2, 6, 3, 5, 4};
  std::vector<int64_t> row_of(5), slot_of(5);
  pack_rows(lengths, {10, 0, 100, Fit::kBest}, row_of, slot_of);
  EXPECT_EQ(row_of, (std::vector<int64_t>{1, 0, 1, 1, 0}));
  EXPECT_EQ(slot_of, (std::vector<int64_t>{2, 0, 1, 0, 1}));
}

TEST(RowPacking, MaxSegmentsClosesARow) {
  // Capacity 10, at most 2 pieces: 3 and 3 fill row 0's two places; the 2 and 1 open row 1.
  EXPECT_EQ(plan({3, 3, 2, 1}, {10, 2, 100, Fit::kBest}), (std::vector<int64_t>{0, 0, 1, 1}));
  EXPECT_EQ(plan({3, 3, 2, 1}, {10, 0, 100, Fit::kBest}), (std::vector<int64_t>{0, 0, 0, 0}));
}

TEST(RowPacking, RowsCloseAtTheEndOfTheirWindow) {
  // Windows of 2: each window's 5 and 1 share a row. One window of 4: the 5s fill row 0.
  EXPECT_EQ(plan({5, 1, 5, 1}, {10, 0, 2, Fit::kBest}), (std::vector<int64_t>{0, 0, 1, 1}));
  EXPECT_EQ(plan({5, 1, 5, 1}, {10, 0, 4, Fit::kBest}), (std::vector<int64_t>{0, 1, 0, 1}));
}

TEST(RowPacking, ManyRandomPiecesPackValidAndTight) {
  std::mt19937_64 rng(7);
  for (int64_t capacity : {64, 2048, 8192, 70000}) {
    std::vector<int64_t> lengths(30000);
    std::uniform_int_distribution<int64_t> length(1, std::max<int64_t>(1, capacity / 4));
    int64_t total = 0;
    for (auto& l : lengths) total += (l = length(rng));
    for (Fit fit : {Fit::kBest, Fit::kFirst}) {
      const int64_t rows = expect_valid(lengths, {capacity, 0, 10000, fit});
      EXPECT_GE(static_cast<double>(total) / (rows * capacity), 0.99)
          << "capacity " << capacity << (fit == Fit::kBest ? " best" : " first");
      expect_valid(lengths, {capacity, 3, 777, fit});
    }
  }
}

TEST(RowPacking, RefusesPiecesThatDoNotFit) {
  std::vector<int64_t> row_of(2);
  const std::vector<int64_t> too_long{3, 11}, empty{3, 0};
  EXPECT_THROW(pack_rows(too_long, {10, 0, 100, Fit::kBest}, row_of), Error);
  EXPECT_THROW(pack_rows(empty, {10, 0, 100, Fit::kFirst}, row_of), Error);
  EXPECT_THROW(pack_rows(too_long, {10, 0, 0, Fit::kBest}, row_of), Error);
  std::vector<int64_t> short_out(1);
  EXPECT_THROW(pack_rows(std::vector<int64_t>{1, 2}, {10, 0, 100, Fit::kBest}, short_out), Error);
}

}  // namespace
}  // namespace stoker::sequence
