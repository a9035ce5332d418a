// Shards that arrive while a pass reads them (a pack in object storage, fetched into a local
// cache). The loader's threads wait here for a shard until a fetcher has made it a local file, or
// has given up on it; the fetcher is told which shards readers are waiting for, and drops a shard
// from the gate before it deletes the file, so that the space is freed once current reads end.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "stoker/core/error.h"
#include "stoker/io/row_group.h"
#include "stoker/io/shard_file.h"

namespace stoker::io {

// A shard the fetcher gave up on (its retries are spent, or it was refused). Not a per-sample
// error: a pass cannot go on without the shard, whatever the loader's error policy says.
class ShardUnavailableError : public Error {
 public:
  using Error::Error;
};

class ShardGate {
 public:
  // One entry per shard, in the dataset's order: its file name (for messages) and the size its
  // index describes; a file of any other size is refused.
  ShardGate(std::vector<std::string> names, std::vector<uint64_t> sizes);
  ShardGate(const ShardGate&) = delete;
  ShardGate& operator=(const ShardGate&) = delete;

  size_t num_shards() const { return names_.size(); }

  // --- fetcher side -----------------------------------------------------------------------------
  // The shard is the file at `path` now: opened here, so a later delete or rename of the path
  // does not affect readers. Throws Error(kIO) if it cannot be opened or its size is not the
  // index's (the shard is left unavailable).
  void ready(uint32_t shard, const std::string& path);
  // The shard is this row group, decoded (a Parquet row group: its entry's size is unused).
  void ready_rows(uint32_t shard, std::shared_ptr<const RowGroup> rows);
  // Readers of the shard throw ShardUnavailableError(kIO, reason) from now on.
  void failed(uint32_t shard, const std::string& reason);
  // Forget the shard's open file (it is closed when the reads in progress end); readers wait again.
  void evict(uint32_t shard);
  // Shards that readers wait for now, oldest wait first. Blocks up to `timeout_ms` until there
  // is at least one, or until close().
  std::vector<uint32_t> wait_for_requests(int64_t timeout_ms);
  // Wakes every waiter for good: they throw Error(kIO, "closed").
  void close();

  // --- reader side ------------------------------------------------------------------------------
  // The shard's open file. Waits while it is not ready and `keep_waiting()` says to (checked
  // every 50 ms, so a closed loader or an abandoned pass does not keep a thread here).
  // Throws ShardUnavailableError if the fetcher gave up on it, Error(kIO) if the gate is closed,
  // and Error(kInternal, "abandoned") when keep_waiting() turned false.
  std::shared_ptr<const ShardFile> acquire(uint32_t shard,
                                           const std::function<bool()>& keep_waiting);
  // The same for a shard handed over as a row group (ready_rows).
  std::shared_ptr<const RowGroup> acquire_rows(uint32_t shard,
                                               const std::function<bool()>& keep_waiting);
  // The open file if the shard is ready now, else null (never waits).
  std::shared_ptr<const ShardFile> peek(uint32_t shard) const;
  // Whether the shard is ready now (a file or a row group).
  bool is_ready(uint32_t shard) const;

  struct Stats {
    int64_t waits = 0;    // acquires that found their shard not ready
    int64_t wait_ns = 0;  // summed over threads
    int64_t ready = 0;    // shards made ready (a shard evicted and fetched again counts twice)
    int64_t evicted = 0;
  };
  Stats stats() const;

 private:
  enum class State { kAbsent, kReady, kFailed };
  struct Slot {
    State state = State::kAbsent;
    std::shared_ptr<const ShardFile> file;
    std::shared_ptr<const RowGroup> rows;  // instead of a file (ready_rows)
    std::string reason;
    int waiters = 0;
    uint64_t first_wait = 0;  // order of the oldest waiting reader (for wait_for_requests)
  };

  // Waits until the shard is ready (acquire's contract) and returns its slot, the lock held.
  Slot& wait_ready(uint32_t shard, const std::function<bool()>& keep_waiting,
                   std::unique_lock<std::mutex>& lock);
  void make_ready(uint32_t shard, std::shared_ptr<const ShardFile> file,
                  std::shared_ptr<const RowGroup> rows);

  std::vector<std::string> names_;
  std::vector<uint64_t> sizes_;
  mutable std::mutex mutex_;
  std::condition_variable ready_cv_;    // readers
  std::condition_variable request_cv_;  // the fetcher
  std::vector<Slot> slots_;
  bool closed_ = false;
  uint64_t wait_counter_ = 0;
  Stats stats_;
};

}  // namespace stoker::io
