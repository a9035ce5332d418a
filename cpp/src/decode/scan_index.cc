#include "stoker/decode/scan_index.h"

namespace stoker::decode {

std::shared_ptr<const ScanIndex> ScanIndexCache::find(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = indexes_.find(key);
  return it == indexes_.end() ? nullptr : it->second;
}

bool ScanIndexCache::has_room() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !full_ && bytes_ < max_bytes_;
}

void ScanIndexCache::insert(uint64_t key, std::shared_ptr<const ScanIndex> index) {
  const auto bytes = static_cast<int64_t>(index->bytes());
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, added] = indexes_.try_emplace(key);
  std::shared_ptr<const ScanIndex>& slot = it->second;
  const int64_t freed = added ? 0 : static_cast<int64_t>(slot->bytes());
  const bool other_file =
      !added && (slot->file_size != index->file_size || slot->fingerprint != index->fingerprint);
  const bool better =
      added || other_file ||
      (!slot->empty() && (index->rows > slot->rows ||
                          (index->rows == slot->rows && index->max_rows < slot->max_rows)));
  if (!better || bytes_ - freed + bytes > max_bytes_) {
    if (better) full_ = true;
    if (added) indexes_.erase(it);
    return;
  }
  indexed_ += (index->empty() ? 0 : 1) - (added || slot->empty() ? 0 : 1);
  bytes_ += bytes - freed;
  slot = std::move(index);
}

int64_t ScanIndexCache::indexed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return indexed_;
}

int64_t ScanIndexCache::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

int64_t ScanIndexCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(indexes_.size());
}

}  // namespace stoker::decode
