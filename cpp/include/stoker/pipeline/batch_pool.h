// Batch memory, allocated once and reused: a slot holds one batch's outputs (one buffer per
// output of every field), the samples' indices, and the bytes of Bytes fields. A slot goes back
// to the pool when its last lease (a Batch, a tensor's deleter) is dropped.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace stoker::pipeline {

// What one slot holds: per output, the bytes of one sample; and how many Bytes fields. Where
// batches differ in shape (aspect buckets), `output_bytes` gives each output's room in a slot,
// the largest batch's (empty: batch_size x sample_bytes).
struct BatchLayout {
  std::vector<size_t> sample_bytes;
  int num_blobs = 0;
  std::vector<size_t> output_bytes;
};

// One page-aligned allocation: the outputs in order (each 64-byte aligned), then the indices. A
// single block lets the device feed page-lock a slot with one cudaHostRegister
// (python/stoker/device.py).
struct BatchSlot {
  std::vector<uint8_t*> outputs;  // output k: batch_size x sample_bytes[k] (or output_bytes[k])
  int64_t* indices = nullptr;     // position in pack order of each sample
  std::vector<std::vector<std::string>> blobs;  // [Bytes field][sample]
  uint8_t* block = nullptr;
  size_t bytes = 0;      // the whole block, a multiple of the page size
  int64_t capacity = 0;  // samples

  BatchSlot(int64_t batch_size, const BatchLayout& layout);
  ~BatchSlot();
  BatchSlot(const BatchSlot&) = delete;
  BatchSlot& operator=(const BatchSlot&) = delete;
};

// Thread-safe. Keeps at most `max_free` idle slots; a lease returned beyond that frees its memory
// (only when the user holds many batches at once). With max_free = kKeepAll no slot is freed
// before the pool: its memory stays valid, so it may stay registered with a GPU driver.
class BatchPool : public std::enable_shared_from_this<BatchPool> {
 public:
  static constexpr size_t kKeepAll = static_cast<size_t>(-1);

  static std::shared_ptr<BatchPool> create(int64_t batch_size, BatchLayout layout, size_t max_free);

  // A free slot, or a new one. The returned pointer's deleter gives the slot back.
  std::shared_ptr<BatchSlot> acquire();
  size_t allocated() const;   // slots alive (free or leased)
  size_t slot_bytes() const;  // BatchSlot::bytes of every slot

 private:
  BatchPool(int64_t batch_size, BatchLayout layout, size_t max_free);
  void release(BatchSlot* slot);

  const int64_t batch_size_;
  const BatchLayout layout_;
  const size_t max_free_;
  const int owner_pid_;  // after fork(), a child frees the slots it drops instead of pooling them
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<BatchSlot>> free_;
  size_t allocated_ = 0;
};

}  // namespace stoker::pipeline
