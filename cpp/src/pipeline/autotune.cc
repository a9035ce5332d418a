#include "stoker/pipeline/autotune.h"

#include <algorithm>

namespace stoker::pipeline {

Autotuner::Autotuner(int max_threads, int min_prefetch, int max_prefetch, int cores)
    : max_threads_(std::max(1, max_threads)),
      min_prefetch_(std::max(1, min_prefetch)),
      max_prefetch_(std::max(std::max(1, min_prefetch), max_prefetch)),
      cores_(std::max(1, cores)) {
  setting_ = {max_threads_, min_prefetch_};
}

const TuneSetting& Autotuner::observe(const TuneObservation& o) {
  const double seconds = std::max(o.seconds, 1e-9);
  const double rate = static_cast<double>(o.samples) / seconds;
  const double wait = o.wait_seconds / seconds;
  const double busy = o.busy_seconds / (seconds * setting_.threads);
  const double window_blocked = o.window_seconds / (seconds * setting_.threads);
  elapsed_ += o.seconds;
  for (int& c : cooldown_) c = c > 0 ? c - 1 : 0;

  TuneSetting next = setting_;
  if (trial_ != 0) {
    const int direction = trial_, slot = direction > 0 ? 0 : 1;
    trial_ = 0;
    const bool keep =
        direction > 0 ? rate >= trial_baseline_ * kMinGain : rate >= trial_baseline_ * kKeepFewer;
    if (keep) {
      backoff_[slot] = kCooldown;
    } else {
      next.threads -= direction;
      cooldown_[slot] = backoff_[slot];
      backoff_[slot] = std::min(2 * backoff_[slot], kMaxCooldown);
    }
  } else if (wait > kWaitFraction) {
    if (window_blocked > kWindowBlocked && setting_.prefetch < max_prefetch_) {
      next.prefetch += 1;
    } else if (setting_.threads < max_threads_ && cooldown_[0] == 0) {
      next.threads += 1;
      trial_ = +1;
    } else if (setting_.threads > cores_ && cooldown_[1] == 0) {
      next.threads -= 1;
      trial_ = -1;
    }
    trial_baseline_ = rate;
  } else if (setting_.threads > 1) {
    // Would the threads that remain still have room to spare? Then give one back.
    const double remaining_busy = busy * setting_.threads / (setting_.threads - 1);
    if (remaining_busy < kShedBusy) next.threads -= 1;
  }

  if (history_.size() < kMaxHistory)
    history_.push_back({elapsed_, setting_, rate, wait, std::min(busy, 1.0), next});
  setting_ = next;
  return setting_;
}

}  // namespace stoker::pipeline
