// The autotuner against models of a machine with known answers: where the best setting is, and
// how fast it is reached.
#include "stoker/pipeline/autotune.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace stoker::pipeline {
namespace {

// A loader on `cores` cores, each thread making `per_thread` samples/s until the cores run out,
// then losing `contention` per extra thread; a prefetch window of p batches lets at most
// p * `per_batch_window` samples/s through; the consumer takes at most `consumer` samples/s.
struct Machine {
  int cores = 8;
  double per_thread = 100;
  double contention = 0.0;
  double per_batch_window = 1e9;
  double consumer = 1e9;
  double noise = 0.02;
  unsigned seed = 1;

  double loader_rate(const TuneSetting& s) const {
    double r = per_thread * std::min(s.threads, cores);
    if (s.threads > cores) r *= std::pow(1 - contention, s.threads - cores);
    return std::min(r, s.prefetch * per_batch_window);
  }
  // One interval of 0.25 s at setting s.
  TuneObservation run(const TuneSetting& s) {
    seed = seed * 1103515245u + 12345u;
    const double jitter = 1 + noise * ((seed >> 16 & 0x7fff) / 16383.5 - 1);
    const double loader = loader_rate(s) * jitter;
    const double unlimited = loader_rate({s.threads, 1 << 20}) * jitter;
    const double delivered = std::min(loader, consumer);
    TuneObservation o;
    o.seconds = 0.25;
    o.samples = static_cast<int64_t>(delivered * o.seconds);
    o.wait_seconds = o.seconds * std::max(0.0, 1 - loader / consumer);
    // Each thread is busy for the share of its capacity that the delivered samples used.
    const double capacity = per_thread * std::min(s.threads, cores) / s.threads;
    o.busy_seconds = std::min(1.0, delivered / (capacity * s.threads)) * s.threads * o.seconds;
    // Held back by the window: the share of the capacity the window did not let through.
    o.window_seconds = (1 - loader / unlimited) * s.threads * o.seconds;
    return o;
  }
};

// Runs `intervals` intervals; returns the mean delivered rate over the last `tail` of them.
double run(Autotuner& tuner, Machine& m, int intervals, int tail) {
  double sum = 0;
  for (int i = 0; i < intervals; ++i) {
    const TuneObservation o = m.run(tuner.setting());
    if (i >= intervals - tail) sum += o.samples / o.seconds;
    tuner.observe(o);
  }
  return sum / tail;
}

// The mean delivered rate of a fixed setting over `intervals` intervals. `m` is a copy: it draws
// the same noise, interval by interval, as the machine it was copied from.
double run_fixed(Machine m, const TuneSetting& s, int intervals) {
  double sum = 0;
  for (int i = 0; i < intervals; ++i) {
    const TuneObservation o = m.run(s);
    sum += o.samples / o.seconds;
  }
  return sum / intervals;
}

TEST(Autotune, DataBoundStaysAtTheBudgetAndLosesLittleToProbing) {
  Machine m;  // 8 cores, a consumer that is never the limit
  Autotuner tuner(8, 2, 8, m.cores);
  const double rate = run(tuner, m, 200, 160);
  EXPECT_EQ(tuner.setting().threads, 8);
  // Within the cores there is nothing to probe: every interval runs at the peak.
  EXPECT_GE(rate, 0.97 * 800);
  for (const TuneStep& s : tuner.history()) EXPECT_EQ(s.during.threads, 8);
}

TEST(Autotune, OversubscribedBudgetComesDownToTheCores) {
  Machine m;
  m.contention = 0.04;  // past 8 threads, each one more costs 4%
  Autotuner tuner(16, 2, 8, m.cores);
  EXPECT_LT(m.loader_rate(tuner.setting()), 0.75 * 800);
  const double rate = run(tuner, m, 80, 40);  // 20 s
  EXPECT_LE(tuner.setting().threads, 10);
  EXPECT_GE(rate, 0.92 * 800);
}

TEST(Autotune, ConsumerBoundShedsThreadsItDoesNotNeed) {
  Machine m;
  m.consumer = 300;  // the training step takes 300 samples/s
  Autotuner tuner(8, 2, 8, m.cores);
  const double rate = run(tuner, m, 40, 20);  // 10 s
  // 3 threads would be 100% busy; 4 are 75% busy, under kShedBusy with one fewer they are not.
  EXPECT_EQ(tuner.setting().threads, 4);
  EXPECT_GE(rate, 0.97 * 300);  // and the consumer was never starved
  int shed = 0;
  for (const TuneStep& s : tuner.history()) shed += s.next.threads < s.during.threads;
  EXPECT_GE(shed, 4);
}

TEST(Autotune, PrefetchGrowsWhenTheWindowHoldsWorkersBack) {
  Machine m;
  m.per_batch_window = 150;  // 6 batches in flight are needed for 8 threads' 800 samples/s
  Autotuner tuner(8, 2, 8, m.cores);
  const double rate = run(tuner, m, 60, 30);
  EXPECT_GE(tuner.setting().prefetch, 6);
  EXPECT_GE(rate, 0.95 * 800);
}

TEST(Autotune, ThreadsComeBackWhenTheConsumerSpeedsUp) {
  Machine m;
  m.consumer = 200;
  Autotuner tuner(8, 2, 8, m.cores);
  run(tuner, m, 40, 1);
  EXPECT_LE(tuner.setting().threads, 3);
  m.consumer = 1e9;  // e.g. evaluation ends and training resumes at full speed
  const double rate = run(tuner, m, 60, 20);
  EXPECT_GE(tuner.setting().threads, 7);
  EXPECT_GE(rate, 0.9 * 800);
}

// tests/python's end-to-end version of this (auto within 90% of the best of 1-3 fixed threads,
// on 2 cores) failed once on a machine that other jobs shared: their load makes every interval's
// rate jump, for the tuner and for the fixed counts alike. Here the same load (each interval's
// rate anywhere within +-40%) falls on the tuner and on each fixed count, interval by interval.
TEST(Autotune, ABusyMachineDoesNotCostADataBoundLoaderItsThreads) {
  Machine m;
  m.cores = 2;
  m.contention = 0.05;  // a third thread on 2 cores costs 5%
  m.noise = 0.4;
  double best_fixed = 0;
  for (int threads = 1; threads <= 3; ++threads)
    best_fixed = std::max(best_fixed, run_fixed(m, {threads, 2}, 80));
  Autotuner tuner(3, 2, 8, m.cores);
  const double rate = run(tuner, m, 80, 80);  // 20 s, probing included
  // The consumer waits in every interval: one thread fewer is tried only above the cores.
  for (const TuneStep& s : tuner.history()) {
    EXPECT_GE(s.during.threads, 2);
    EXPECT_GE(s.next.threads, 2);
  }
  EXPECT_GE(rate, 0.9 * best_fixed);
}

TEST(Autotune, StaysWithinItsBounds) {
  Machine m;
  m.per_thread = 10;
  Autotuner tuner(3, 2, 4, m.cores);
  for (int i = 0; i < 200; ++i) {
    const TuneSetting& s = tuner.observe(m.run(tuner.setting()));
    ASSERT_GE(s.threads, 1);
    ASSERT_LE(s.threads, 3);
    ASSERT_GE(s.prefetch, 2);
    ASSERT_LE(s.prefetch, 4);
  }
  EXPECT_LE(tuner.history().size(), Autotuner::kMaxHistory);
}

}  // namespace
}  // namespace stoker::pipeline
