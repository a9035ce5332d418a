#include "stoker/decode/scan_index.h"

namespace stoker::decode {

std::shared_ptr<const ScanIndex> ScanIndexCache::find(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = indexes_.find(key);
  return it == indexes_.end() ? nullptr : it->second;
}

bool ScanIndexCache::has_room() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_ < max_bytes_;
}

void ScanIndexCache::insert(uint64_t key, std::shared_ptr<const ScanIndex> index) {
  const auto bytes = static_cast<int64_t>(index->bytes());
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes_ + bytes > max_bytes_) return;
  const bool indexed = !index->empty();
  if (indexes_.emplace(key, std::move(index)).second) {
    bytes_ += bytes;
    indexed_ += indexed;
  }
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
