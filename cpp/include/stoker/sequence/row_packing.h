// Whole documents into rows: the packing plan of TokenLoader(packing="best_fit" | "first_fit").
//
// Pieces (documents, or the pieces of those longer than a row) arrive in the epoch's keyed
// order and are taken a window at a time. Within a window they go in decreasing length (ties in
// arrival order), each into an open row it fits:
//   - best fit: the row with the least room left that still holds it (best fit decreasing);
//   - first fit: the row opened first that holds it (first fit decreasing);
// or into a new row when none does. A row holding max_segments pieces, or full, takes no more.
// Every row of a window closes when the window ends, so a plan is made window by window, in
// O(n log capacity) for best fit and O(n log n) for first fit, and depends only on the pieces'
// lengths and order.
#pragma once

#include <cstdint>
#include <span>

namespace stoker::sequence {

enum class Fit : uint8_t { kBest, kFirst };

struct RowPacking {
  int64_t capacity = 0;      // tokens per row (seq_len), > 0
  int64_t max_segments = 0;  // pieces per row at most; 0: no bound
  int64_t window = 0;        // pieces per window, > 0
  Fit fit = Fit::kBest;
};

// Writes each piece's row to row_of (rows numbered from 0 in the order they open, window after
// window) and, when slot_of is not empty, its place in that row (0 for the first piece put
// there), and returns the number of rows. Every length must be in [1, capacity]; throws
// Error(kInvalidArgument) otherwise, or if the spans' sizes differ.
int64_t pack_rows(std::span<const int64_t> lengths, const RowPacking& options,
                  std::span<int64_t> row_of, std::span<int64_t> slot_of = {});

}  // namespace stoker::sequence
