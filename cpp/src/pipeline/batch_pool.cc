#include "stoker/pipeline/batch_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <new>

#include "stoker/core/checked.h"
#include "stoker/core/error.h"
#include "stoker/core/fault.h"

namespace stoker::pipeline {

namespace {
constexpr size_t kPage = 4096;

constexpr size_t kHugePage = size_t{2} << 20;

void* allocate_pages(size_t bytes) {
  // A batch of several megabytes on transparent huge pages where the kernel offers them on
  // request (madvise mode): a slot's first fill then takes a fault every 2 MiB, not every
  // 4 KiB (a 224 px batch of 256: about 19 faults instead of 9,400).
  const bool huge = bytes >= kHugePage;
  const size_t align = huge ? kHugePage : kPage;
  const size_t rounded = (bytes + align - 1) / align * align;
  if (fault::due("batch_alloc"))
    throw Error(ErrorCode::kResourceLimit,
                fault::describe("batch_alloc", std::to_string(bytes) + " bytes"));
  void* p = std::aligned_alloc(align, rounded == 0 ? align : rounded);
  if (!p)
    throw Error(ErrorCode::kResourceLimit,
                "cannot allocate a batch of " + std::to_string(bytes) + " bytes");
  if (huge) madvise(p, rounded, MADV_HUGEPAGE);  // advice: refused or ignored, it changes nothing
  return p;
}
}  // namespace

namespace {
constexpr size_t kOutputAlign = 64;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Offsets of the outputs in the block; the last entry is the indices'.
std::vector<size_t> slot_offsets(int64_t batch_size, const BatchLayout& layout) {
  std::vector<size_t> offsets;
  uint64_t at = 0;
  for (size_t k = 0; k < layout.sample_bytes.size(); ++k) {
    offsets.push_back(at);
    const uint64_t room =
        layout.output_bytes.empty()
            ? checked_mul(static_cast<uint64_t>(batch_size), layout.sample_bytes[k], "batch")
            : layout.output_bytes[k];
    at = checked_add(at, room, "batch");
    at = round_up(at, kOutputAlign);
  }
  offsets.push_back(at);
  return offsets;
}

size_t slot_block_bytes(int64_t batch_size, const BatchLayout& layout) {
  const uint64_t indices = checked_mul(static_cast<uint64_t>(batch_size), sizeof(int64_t), "batch");
  return round_up(checked_add(slot_offsets(batch_size, layout).back(), indices, "batch"), kPage);
}
}  // namespace

BatchSlot::BatchSlot(int64_t batch_size, const BatchLayout& layout) : capacity(batch_size) {
  const std::vector<size_t> offsets = slot_offsets(batch_size, layout);
  bytes = slot_block_bytes(batch_size, layout);
  block = static_cast<uint8_t*>(allocate_pages(bytes));
  for (size_t k = 0; k + 1 < offsets.size(); ++k) outputs.push_back(block + offsets[k]);
  indices = reinterpret_cast<int64_t*>(block + offsets.back());
  blobs.resize(static_cast<size_t>(layout.num_blobs));
  for (auto& b : blobs) b.resize(static_cast<size_t>(batch_size));
}

BatchSlot::~BatchSlot() { std::free(block); }

std::shared_ptr<BatchPool> BatchPool::create(int64_t batch_size, BatchLayout layout,
                                             size_t max_free) {
  return std::shared_ptr<BatchPool>(new BatchPool(batch_size, std::move(layout), max_free));
}

BatchPool::BatchPool(int64_t batch_size, BatchLayout layout, size_t max_free)
    : batch_size_(batch_size),
      layout_(std::move(layout)),
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
    slot = std::make_unique<BatchSlot>(batch_size_, layout_);
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

size_t BatchPool::slot_bytes() const { return slot_block_bytes(batch_size_, layout_); }

size_t BatchPool::allocated() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocated_;
}

}  // namespace stoker::pipeline
