// Where a baseline JPEG's entropy-coded data can be entered mid-scan. A JPEG without restart
// markers is one Huffman bit stream: to decode a crop, libjpeg must decode every MCU above it and
// to its left, and that is most of the work of a RandomResizedCrop. The first time the loader
// decodes such a file it records, at every `step`-th MCU of each MCU row it decodes (down to the
// crop's last), the bit position and the DC predictors there; a later decode of that sample
// whose crop lies in the recorded rows starts each of its MCU rows at its recorded point and
// stops at its right edge, as the restart-interval cut does for files with markers
// (restart_roi.h), without rewriting the file; one that reaches further down first records the
// rows below, from the last recorded one. Exact: the same coefficients, so the same pixels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace stoker::decode {

struct ScanIndex {
  // Which file it is for (the sample's key could point at other bytes): its size, a CRC32C of its
  // headers (tables and dimensions) and of its last 64 bytes.
  uint64_t file_size = 0;
  uint32_t fingerprint = 0;
  int mcus_per_row = 0, mcu_rows = 0;
  int rows = 0;  // MCU rows recorded, from the first: [0, rows) have their points
  // Rows it may be recorded down to: mcu_rows, or `rows` once recording further failed (damaged
  // data below), so that it is not tried again.
  int max_rows = 0;
  int step = 0;        // MCUs between recorded points in a row; a row's first MCU always has one
  int components = 0;  // in the scan: DC predictors per point
  // Per point (row-major, points_per_row() a row, `rows` rows): the bit offset of its MCU from the
  // start of the entropy-coded data, counting the file's bytes (stuffed zeros included) times 8.
  std::vector<uint32_t> bits;
  std::vector<int16_t> dc;  // per point and component: the DC predictor before its MCU

  int points_per_row() const { return (mcus_per_row + step - 1) / step; }
  bool empty() const { return bits.empty(); }  // the file could not be indexed
  size_t bytes() const {
    return sizeof(ScanIndex) + bits.size() * sizeof(uint32_t) + dc.size() * sizeof(int16_t);
  }
};

// The indexes of a loader's samples, by sample key, shared by its decoding threads. Bounded:
// once it holds `max_bytes`, later samples are decoded without one (they are not evicted: an
// epoch visits every sample, so evicting one for another would only trade them).
class ScanIndexCache {
 public:
  explicit ScanIndexCache(int64_t max_bytes) : max_bytes_(max_bytes) {}

  std::shared_ptr<const ScanIndex> find(uint64_t key) const;
  bool has_room() const;
  // Keeps the index in place of the one for `key` unless the cache would be full (it then
  // records no more), or the one there is for the same file and has as many rows and no more
  // max_rows (or is empty: the file cannot be indexed).
  void insert(uint64_t key, std::shared_ptr<const ScanIndex> index);
  int64_t bytes() const;
  int64_t size() const;     // files it has an answer for, indexed or not
  int64_t indexed() const;  // of those, files with an index

 private:
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, std::shared_ptr<const ScanIndex>> indexes_;
  int64_t bytes_ = 0, indexed_ = 0;
  int64_t max_bytes_;
  bool full_ = false;  // an index did not fit
};

}  // namespace stoker::decode
