#include "stoker/sequence/row_packing.h"

#include <algorithm>
#include <bit>
#include <numeric>
#include <string>
#include <vector>

#include "stoker/core/error.h"

namespace stoker::sequence {

namespace {

struct Row {
  int64_t room;
  int64_t segments;
};

// Open rows by the room they have left: room r's rows in a stack, and a two-level bitset of the
// rooms that have any, so that the least room >= n is found in a few word scans.
class RoomIndex {
 public:
  explicit RoomIndex(int64_t capacity)
      : stacks_(capacity + 1), words_((capacity + 64) / 64), summary_((words_.size() + 63) / 64) {}

  void push(int64_t room, int64_t row) {
    if (stacks_[room].empty()) set(room);
    stacks_[room].push_back(row);
  }

  // The most recently pushed row of the least room >= n, removed; -1 if none.
  int64_t pop_at_least(int64_t n) {
    const int64_t room = next_set(n);
    if (room < 0) return -1;
    auto& stack = stacks_[room];
    const int64_t row = stack.back();
    stack.pop_back();
    if (stack.empty()) clear(room);
    return row;
  }

  void clear_all() {
    for (size_t s = 0; s < summary_.size(); ++s) {
      for (uint64_t bits = summary_[s]; bits; bits &= bits - 1) {
        const size_t w = s * 64 + std::countr_zero(bits);
        for (uint64_t b = words_[w]; b; b &= b - 1) stacks_[w * 64 + std::countr_zero(b)].clear();
        words_[w] = 0;
      }
      summary_[s] = 0;
    }
  }

 private:
  void set(int64_t i) {
    words_[i / 64] |= uint64_t{1} << (i % 64);
    summary_[i / 4096] |= uint64_t{1} << ((i / 64) % 64);
  }
  void clear(int64_t i) {
    words_[i / 64] &= ~(uint64_t{1} << (i % 64));
    if (!words_[i / 64]) summary_[i / 4096] &= ~(uint64_t{1} << ((i / 64) % 64));
  }
  int64_t next_set(int64_t i) const {
    size_t w = static_cast<size_t>(i) / 64;
    if (w >= words_.size()) return -1;
    const uint64_t here = words_[w] & (~uint64_t{0} << (i % 64));
    if (here) return static_cast<int64_t>(w * 64 + std::countr_zero(here));
    ++w;  // the next non-empty word, from the summary
    for (size_t s = w / 64; s < summary_.size(); ++s) {
      uint64_t bits = summary_[s];
      if (s == w / 64) bits &= (w % 64) ? (~uint64_t{0} << (w % 64)) : ~uint64_t{0};
      if (bits) {
        const size_t word = s * 64 + std::countr_zero(bits);
        return static_cast<int64_t>(word * 64 + std::countr_zero(words_[word]));
      }
    }
    return -1;
  }

  std::vector<std::vector<int64_t>> stacks_;
  std::vector<uint64_t> words_;
  std::vector<uint64_t> summary_;
};

// Open rows in opening order under a max-tree of their room: the first row with room >= n is a
// walk down from the root. A row that takes no more has room -1.
class FirstRoom {
 public:
  explicit FirstRoom(int64_t max_rows) {
    while (leaves_ < static_cast<size_t>(max_rows)) leaves_ *= 2;
    tree_.assign(2 * leaves_, -1);
  }

  void set(int64_t row, int64_t room) {
    size_t i = leaves_ + row;
    tree_[i] = room;
    for (i /= 2; i >= 1; i /= 2) tree_[i] = std::max(tree_[2 * i], tree_[2 * i + 1]);
  }

  // The first row with room >= n; -1 if none.
  int64_t first_at_least(int64_t n) const {
    if (tree_[1] < n) return -1;
    size_t i = 1;
    while (i < leaves_) i = tree_[2 * i] >= n ? 2 * i : 2 * i + 1;
    return static_cast<int64_t>(i - leaves_);
  }

  void reset(int64_t rows) {
    for (int64_t r = 0; r < rows; ++r) set(r, -1);
  }

 private:
  size_t leaves_ = 1;
  std::vector<int64_t> tree_;
};

}  // namespace

int64_t pack_rows(std::span<const int64_t> lengths, const RowPacking& options,
                  std::span<int64_t> row_of, std::span<int64_t> slot_of) {
  const int64_t capacity = options.capacity;
  STOKER_CHECK(capacity > 0, ErrorCode::kInvalidArgument, "a row's capacity must be positive");
  STOKER_CHECK(options.window > 0, ErrorCode::kInvalidArgument, "the window must be positive");
  STOKER_CHECK(options.max_segments >= 0, ErrorCode::kInvalidArgument, "max_segments must be >= 0");
  STOKER_CHECK(lengths.size() == row_of.size(), ErrorCode::kInvalidArgument,
               "one row per piece: the spans' sizes differ");
  STOKER_CHECK(slot_of.empty() || slot_of.size() == lengths.size(), ErrorCode::kInvalidArgument,
               "one slot per piece: the spans' sizes differ");
  for (size_t i = 0; i < lengths.size(); ++i)
    STOKER_CHECK(lengths[i] >= 1 && lengths[i] <= capacity, ErrorCode::kInvalidArgument,
                 "piece " + std::to_string(i) + " has " + std::to_string(lengths[i]) +
                     " tokens, not 1 to " + std::to_string(capacity));
  const int64_t max_segments = options.max_segments ? options.max_segments : capacity;
  const int64_t n = static_cast<int64_t>(lengths.size());
  const int64_t window = std::min(options.window, std::max<int64_t>(n, 1));

  RoomIndex rooms(options.fit == Fit::kBest ? capacity : 0);
  FirstRoom first(options.fit == Fit::kFirst ? window : 1);
  std::vector<Row> rows;
  std::vector<int64_t> order;
  int64_t base = 0;  // the first row of this window
  for (int64_t start = 0; start < n; start += window) {
    const int64_t end = std::min(n, start + window);
    order.resize(end - start);
    std::iota(order.begin(), order.end(), start);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
    rows.clear();
    for (const int64_t piece : order) {
      const int64_t length = lengths[piece];
      int64_t row =
          options.fit == Fit::kBest ? rooms.pop_at_least(length) : first.first_at_least(length);
      if (row < 0) {
        row = static_cast<int64_t>(rows.size());
        rows.push_back({capacity, 0});
      }
      Row& r = rows[row];
      if (!slot_of.empty()) slot_of[piece] = r.segments;
      r.room -= length;
      r.segments += 1;
      const bool open = r.room > 0 && r.segments < max_segments;
      if (options.fit == Fit::kBest) {
        if (open) rooms.push(r.room, row);
      } else {
        first.set(row, open ? r.room : -1);
      }
      row_of[piece] = base + row;
    }
    if (options.fit == Fit::kBest)
      rooms.clear_all();
    else
      first.reset(static_cast<int64_t>(rows.size()));
    base += static_cast<int64_t>(rows.size());
  }
  return base;
}

}  // namespace stoker::sequence
