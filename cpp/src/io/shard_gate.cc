#include "stoker/io/shard_gate.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace stoker::io {

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

ShardGate::ShardGate(std::vector<std::string> names, std::vector<uint64_t> sizes)
    : names_(std::move(names)), sizes_(std::move(sizes)), slots_(names_.size()) {
  STOKER_CHECK(names_.size() == sizes_.size(), ErrorCode::kInvalidArgument,
               "one size per shard name");
}

void ShardGate::ready(uint32_t shard, const std::string& path) {
  STOKER_CHECK(shard < slots_.size(), ErrorCode::kInvalidArgument, "no such shard");
  auto file = std::make_shared<const ShardFile>(path);  // outside the lock: it is a syscall
  if (file->size() != sizes_[shard])
    throw Error(ErrorCode::kIO,
                "the fetched file has " + std::to_string(file->size()) +
                    " bytes, the index describes " + std::to_string(sizes_[shard]),
                names_[shard]);
  make_ready(shard, std::move(file), nullptr);
}

void ShardGate::ready_rows(uint32_t shard, std::shared_ptr<const RowGroup> rows) {
  STOKER_CHECK(shard < slots_.size() && rows != nullptr, ErrorCode::kInvalidArgument,
               "no such shard, or no row group");
  make_ready(shard, nullptr, std::move(rows));
}

void ShardGate::make_ready(uint32_t shard, std::shared_ptr<const ShardFile> file,
                           std::shared_ptr<const RowGroup> rows) {
  std::shared_ptr<const RowGroup> dropped;  // freed outside the lock if this was the last user
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Slot& s = slots_[shard];
    s.state = State::kReady;
    s.file = std::move(file);
    dropped = std::exchange(s.rows, std::move(rows));
    s.reason.clear();
    ++stats_.ready;
  }
  ready_cv_.notify_all();
}

void ShardGate::failed(uint32_t shard, const std::string& reason) {
  STOKER_CHECK(shard < slots_.size(), ErrorCode::kInvalidArgument, "no such shard");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Slot& s = slots_[shard];
    s.state = State::kFailed;
    s.file.reset();
    s.rows.reset();
    s.reason = reason;
  }
  ready_cv_.notify_all();
}

void ShardGate::evict(uint32_t shard) {
  STOKER_CHECK(shard < slots_.size(), ErrorCode::kInvalidArgument, "no such shard");
  // Closed or freed outside the lock if this was the last user.
  std::shared_ptr<const ShardFile> dropped;
  std::shared_ptr<const RowGroup> dropped_rows;
  std::lock_guard<std::mutex> lock(mutex_);
  Slot& s = slots_[shard];
  if (s.state != State::kReady) return;
  s.state = State::kAbsent;
  dropped = std::move(s.file);
  dropped_rows = std::move(s.rows);
  ++stats_.evicted;
}

std::vector<uint32_t> ShardGate::wait_for_requests(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto requested = [&] {
    return std::any_of(slots_.begin(), slots_.end(),
                       [](const Slot& s) { return s.waiters > 0 && s.state == State::kAbsent; });
  };
  request_cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)),
                       [&] { return closed_ || requested(); });
  std::vector<std::pair<uint64_t, uint32_t>> waiting;
  for (uint32_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].waiters > 0 && slots_[i].state == State::kAbsent)
      waiting.emplace_back(slots_[i].first_wait, i);
  std::sort(waiting.begin(), waiting.end());
  std::vector<uint32_t> out;
  out.reserve(waiting.size());
  for (const auto& w : waiting) out.push_back(w.second);
  return out;
}

void ShardGate::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  ready_cv_.notify_all();
  request_cv_.notify_all();
}

std::shared_ptr<const ShardFile> ShardGate::peek(uint32_t shard) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Slot& s = slots_.at(shard);
  return s.state == State::kReady ? s.file : nullptr;
}

bool ShardGate::is_ready(uint32_t shard) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return slots_.at(shard).state == State::kReady;
}

std::shared_ptr<const ShardFile> ShardGate::acquire(uint32_t shard,
                                                    const std::function<bool()>& keep_waiting) {
  std::unique_lock<std::mutex> lock(mutex_);
  const Slot& s = wait_ready(shard, keep_waiting, lock);
  if (s.file == nullptr)
    throw Error(ErrorCode::kInternal, "the shard is a row group, not a file", names_[shard]);
  return s.file;
}

std::shared_ptr<const RowGroup> ShardGate::acquire_rows(uint32_t shard,
                                                        const std::function<bool()>& keep_waiting) {
  std::unique_lock<std::mutex> lock(mutex_);
  const Slot& s = wait_ready(shard, keep_waiting, lock);
  if (s.rows == nullptr)
    throw Error(ErrorCode::kInternal, "the shard is a file, not a row group", names_[shard]);
  return s.rows;
}

ShardGate::Slot& ShardGate::wait_ready(uint32_t shard, const std::function<bool()>& keep_waiting,
                                       std::unique_lock<std::mutex>& lock) {
  STOKER_CHECK(shard < slots_.size(), ErrorCode::kInvalidArgument, "no such shard");
  Slot& s = slots_[shard];
  if (s.state == State::kReady) return s;
  const int64_t t0 = now_ns();
  ++stats_.waits;
  if (s.waiters++ == 0) s.first_wait = ++wait_counter_;
  lock.unlock();
  request_cv_.notify_all();
  lock.lock();
  auto finish = [&] {
    --s.waiters;
    stats_.wait_ns += now_ns() - t0;
  };
  while (true) {
    if (closed_) {
      finish();
      throw Error(ErrorCode::kIO, "the remote pack was closed while a shard was awaited",
                  names_[shard]);
    }
    if (s.state == State::kReady) {
      finish();
      return s;
    }
    if (s.state == State::kFailed) {
      finish();
      throw ShardUnavailableError(ErrorCode::kIO, s.reason, names_[shard]);
    }
    ready_cv_.wait_for(lock, std::chrono::milliseconds(50));
    if (s.state == State::kAbsent && !closed_) {
      lock.unlock();  // keep_waiting may take the caller's own lock
      const bool go_on = keep_waiting();
      lock.lock();
      if (!go_on) {
        finish();
        throw Error(ErrorCode::kInternal, "abandoned", names_[shard]);
      }
    }
  }
}

ShardGate::Stats ShardGate::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace stoker::io
