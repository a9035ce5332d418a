// Autotune: the loader's thread count and prefetch depth, chosen while it runs.
//
// The tuner is pure logic: it sees one Observation per interval (what the loader's counters did
// in that time) and answers with the Setting for the next one. Loader::next() feeds it; tests
// feed it a model of a machine.
//
// The rule, in order of precedence:
// - A trial (one thread more, or one fewer) is judged after one interval. One more is kept if
//   throughput rose by at least kMinGain; one fewer if it did not fall (kKeepFewer).
//   Otherwise it is undone, and that direction waits a cooldown before it is tried again. The
//   cooldown doubles with each failure, up to kMaxCooldown intervals, so a tuned loader rarely
//   pays for probing.
// - The consumer waited (wait > kWaitFraction of the interval): the loader is the bottleneck.
//   Workers that spent over kWindowBlocked of their time idle with work left, because the
//   prefetch window was full, were held back by the window, not the CPU: one more batch of
//   prefetch. Otherwise try one more thread within the budget, or, at the budget and only
//   while the threads outnumber the cores, one fewer (past the cores more threads can only
//   contend; within them, one fewer can only lose).
// - The consumer did not wait, and the threads that would remain after giving one back would
//   stay under kShedBusy busy: give it back, to leave room for the training process.
// Starting from the budget, a loader that is the bottleneck is at its best at once. One that is
// not sheds a thread per interval until the rest are busy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stoker::pipeline {

struct TuneSetting {
  int threads = 1;
  int prefetch = 2;
};

struct TuneObservation {
  double seconds = 0;         // wall time of the interval
  double wait_seconds = 0;    // the consumer's time waiting in next()
  double busy_seconds = 0;    // worker time spent reading, decoding, transforming
  double window_seconds = 0;  // worker time idle with samples left, the prefetch window full
  int64_t samples = 0;        // delivered in the interval
};

struct TuneStep {         // one interval and what was decided after it
  double at_seconds = 0;  // since the tuner started
  TuneSetting during;
  double samples_per_second = 0, wait_fraction = 0, busy_fraction = 0;
  TuneSetting next;
};

class Autotuner {
 public:
  static constexpr double kMinGain = 1.04;        // one thread more must add 4% throughput
  static constexpr double kKeepFewer = 1.00;      // one thread fewer must not cost throughput
  static constexpr double kWaitFraction = 0.02;   // the consumer is waiting
  static constexpr double kShedBusy = 0.80;       // busy share of the threads that would remain
  static constexpr double kWindowBlocked = 0.03;  // share of worker time the window blocked
  static constexpr int kCooldown = 8;             // intervals, after a first failed trial
  static constexpr int kMaxCooldown = 64;
  static constexpr size_t kMaxHistory = 1000;

  // threads within [1, max_threads]; prefetch within [min_prefetch, max_prefetch]. Starts at
  // max_threads and min_prefetch. `cores`: the CPUs this process may run on.
  Autotuner(int max_threads, int min_prefetch, int max_prefetch, int cores);

  const TuneSetting& setting() const { return setting_; }
  // The setting for the next interval.
  const TuneSetting& observe(const TuneObservation& o);
  const std::vector<TuneStep>& history() const { return history_; }

 private:
  const int max_threads_, min_prefetch_, max_prefetch_, cores_;
  TuneSetting setting_;
  int trial_ = 0;  // +1 / -1: this interval runs one thread more / fewer than the last
  double trial_baseline_ = 0;
  int cooldown_[2] = {0, 0};  // intervals before trying [0] one more, [1] one fewer thread
  int backoff_[2] = {kCooldown, kCooldown};
  double elapsed_ = 0;
  std::vector<TuneStep> history_;
};

}  // namespace stoker::pipeline
