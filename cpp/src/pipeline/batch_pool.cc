#include "stoker/pipeline/batch_pool.h"

#include <unistd.h>

#include <cstdlib>
#include <new>

#include "stoker/core/checked.h"
#include "stoker/core/error.h"

namespace stoker::pipeline {

namespace {
constexpr size_t kPage = 4096;

void* allocate_pages(size_t bytes) {
  const size_t rounded = (bytes + kPage - 1) / kPage * kPage;
  void* p = std::aligned_alloc(kPage, rounded == 0 ? kPage : rounded);
  if (!p)
    throw Error(ErrorCode::kResourceLimit,
                "cannot allocate a batch of " + std::to_string(bytes) + " bytes");
  return p;
}
}  // namespace

namespace {
size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t slot_block_bytes(int64_t batch_size, size_t bytes_per_image) {
  const uint64_t images = checked_mul(static_cast<uint64_t>(batch_size), bytes_per_image, "batch");
  const uint64_t vectors =
      checked_mul(static_cast<uint64_t>(batch_size), 2 * sizeof(int64_t), "batch");
  return round_up(checked_add(round_up(images, alignof(int64_t)), vectors, "batch"), kPage);
}
}  // namespace

BatchSlot::BatchSlot(int64_t batch_size, size_t bytes_per_image) : capacity(batch_size) {
  image_bytes = static_cast<size_t>(batch_size) * bytes_per_image;
  bytes = slot_block_bytes(batch_size, bytes_per_image);
  images = static_cast<uint8_t*>(allocate_pages(bytes));
  labels = reinterpret_cast<int64_t*>(images + round_up(image_bytes, alignof(int64_t)));
  indices = labels + batch_size;
}

BatchSlot::~BatchSlot() { std::free(images); }

std::shared_ptr<BatchPool> BatchPool::create(int64_t batch_size, size_t bytes_per_image,
                                             size_t max_free) {
  return std::shared_ptr<BatchPool>(new BatchPool(batch_size, bytes_per_image, max_free));
}

BatchPool::BatchPool(int64_t batch_size, size_t bytes_per_image, size_t max_free)
    : batch_size_(batch_size),
      bytes_per_image_(bytes_per_image),
      max_free_(max_free),
      owner_pid_(static_cast<int>(::getpid())) {}

std::shared_ptr<BatchSlot> BatchPool::acquire() {
  std::unique_ptr<BatchSlot> slot;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      slot = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (!slot) {
    slot = std::make_unique<BatchSlot>(batch_size_, bytes_per_image_);
    std::lock_guard<std::mutex> lock(mutex_);
    ++allocated_;
  }
  // The deleter keeps the pool alive for as long as any lease is out.
  std::shared_ptr<BatchPool> self = shared_from_this();
  return std::shared_ptr<BatchSlot>(slot.release(), [self](BatchSlot* s) { self->release(s); });
}

void BatchPool::release(BatchSlot* slot) {
  std::unique_ptr<BatchSlot> owned(slot);
  // In a forked child the lock may have been held by a parent thread that does not exist here.
  if (static_cast<int>(::getpid()) != owner_pid_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_.size() < max_free_) {
    free_.push_back(std::move(owned));
  } else {
    --allocated_;
  }
}

size_t BatchPool::slot_bytes() const { return slot_block_bytes(batch_size_, bytes_per_image_); }

size_t BatchPool::allocated() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocated_;
}

}  // namespace stoker::pipeline
