// Fuzz target: the packing plan (sequence/row_packing.h) of document lengths read from a pack's
// untrusted document index. The input is a 6-byte header (capacity, max_segments, window, fit)
// then the lengths, 2 bytes each. Lengths outside [1, capacity] must be refused with an Error;
// otherwise every piece lands in a row of its own window, rows are numbered densely, no row holds
// more than capacity tokens or max_segments pieces, and best fit never needs more rows than one
// per piece; each piece has its own place in its row, 0 to the row's pieces - 1.
#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "fuzz_util.h"
#include "stoker/core/error.h"
#include "stoker/sequence/row_packing.h"

using namespace stoker;
using namespace stoker::sequence;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 6) return 0;
  RowPacking options;
  options.capacity = 1 + (data[0] | (data[1] << 8));  // 1 .. 65536
  options.max_segments = data[2] % 9;                 // 0 (no bound) .. 8
  options.window = 1 + (data[3] | ((data[4] & 0x7f) << 8));
  options.fit = (data[4] & 0x80) ? Fit::kFirst : Fit::kBest;
  std::vector<int64_t> lengths;
  for (size_t at = 6; at + 1 < size; at += 2) {
    int16_t v;
    std::memcpy(&v, data + at, 2);
    lengths.push_back(data[5] & 1 ? v : static_cast<uint16_t>(v) % options.capacity + 1);
  }
  std::vector<int64_t> row_of(lengths.size(), -1), slot_of(lengths.size(), -1);
  int64_t rows = 0;
  try {
    rows = pack_rows(lengths, options, row_of, slot_of);
  } catch (const Error&) {
    bool bad = false;
    for (int64_t l : lengths) bad |= l < 1 || l > options.capacity;
    FUZZ_CHECK(bad);  // refused only for a length that does not fit
    return 0;
  }
  FUZZ_CHECK(rows >= 0 && rows <= static_cast<int64_t>(lengths.size()));
  std::vector<int64_t> used(rows, 0), segments(rows, 0), window(rows, -1);
  std::vector<std::vector<int64_t>> slots(rows);
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t r = row_of[i];
    FUZZ_CHECK(r >= 0 && r < rows);
    FUZZ_CHECK(lengths[i] >= 1 && lengths[i] <= options.capacity);
    used[r] += lengths[i];
    segments[r] += 1;
    slots[r].push_back(slot_of[i]);
    const int64_t w = static_cast<int64_t>(i) / options.window;
    FUZZ_CHECK(window[r] == -1 || window[r] == w);
    window[r] = w;
  }
  for (int64_t r = 0; r < rows; ++r) {
    FUZZ_CHECK(segments[r] > 0);                  // dense: no empty row
    std::sort(slots[r].begin(), slots[r].end());  // the row's places: 0, 1, ..., each once
    for (size_t k = 0; k < slots[r].size(); ++k) FUZZ_CHECK(slots[r][k] == static_cast<int64_t>(k));
    FUZZ_CHECK(used[r] <= options.capacity);
    FUZZ_CHECK(options.max_segments == 0 || segments[r] <= options.max_segments);
  }
  return 0;
}
