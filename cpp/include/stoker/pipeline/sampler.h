// Which samples an epoch visits, in which order, on which rank.
//
// Two layers. The epoch's global order G is a pure function of (shard sizes, seed, epoch,
// shuffle, shuffle_window): never of world size, rank, thread count or timing. A rank's share is
// then read off G: rank r of W takes G[start + r], G[start + r + W], G[start + r + 2W], ..., so
// after every rank has taken b batches of B, the ranks together have consumed exactly the first
// start + b*B*W positions of G. That, and G not depending on W, is what lets a job resume an
// epoch at another world size: the positions not yet consumed are split across the new ranks.
#pragma once

#include <cstdint>
#include <vector>

namespace stoker::pipeline {

enum class ShuffleMode {
  kNone,    // pack order
  kGlobal,  // one permutation of all samples (torch's DistributedSampler)
  // The shards permuted, grouped into windows of shuffle_window shards, the samples permuted
  // within each window; G is the windows one after the other. Any run of positions inside one
  // window comes from at most shuffle_window shards, so all ranks together read from at most
  // shuffle_window shards at a time (2 x shuffle_window across a window's boundary). The
  // epoch's first window ramps up (sampler.cc, ramp): its first positions come from its first
  // shards, so that a cold cache decodes those while the others download.
  kBlock,
};

// Shards per window under ShuffleMode::kBlock when none is given: docs/DISTRIBUTED.md measures
// the mixing it buys against a global shuffle.
inline constexpr int64_t kDefaultShuffleWindow = 8;

struct SamplerOptions {
  int64_t batch_size = 1;
  ShuffleMode shuffle = ShuffleMode::kGlobal;
  int64_t shuffle_window = kDefaultShuffleWindow;  // shards, under kBlock
  uint64_t seed = 0;
  bool drop_last = false;
  int rank = 0;
  int world_size = 1;
};

// Per pass: every rank gets the same number of samples and so the same number of batches. The
// positions G[start..N) are padded to a multiple of world_size by wrapping to G's beginning
// (position p > N is G[p mod N], as DistributedSampler pads), or cut to one with drop_last (and
// then a rank's incomplete last batch is dropped too). start is 0 for a fresh epoch. Immutable;
// safe to share between threads.
class Sampler {
 public:
  // shard_sizes: samples per shard in pack order (shard s holds the samples after those of the
  // shards before it). Each must be > 0.
  Sampler(std::vector<int64_t> shard_sizes, SamplerOptions options);
  // One shard of num_samples samples.
  Sampler(int64_t num_samples, SamplerOptions options);

  int64_t num_samples() const { return num_samples_; }
  int64_t num_shards() const { return static_cast<int64_t>(shard_sizes_.size()); }
  const SamplerOptions& options() const { return options_; }

  // The epoch's global order: every sample once.
  std::vector<int64_t> global_order(int64_t epoch) const;

  // This rank's samples and batches in a pass that starts `start` positions into G
  // (0 <= start <= num_samples()).
  int64_t samples_per_rank(int64_t start = 0) const;
  int64_t num_batches(int64_t start = 0) const;
  // Batch b of the pass is [batch_begin(b), batch_end(b, start)) of rank_order(epoch, start).
  int64_t batch_begin(int64_t b) const { return b * options_.batch_size; }
  int64_t batch_end(int64_t b, int64_t start = 0) const;
  // This rank's sample indices for a pass of `epoch` from `start`, in visiting order.
  std::vector<int64_t> rank_order(int64_t epoch, int64_t start = 0) const;
  // The same read off `global` (global_order(epoch), made once for many passes), at most its
  // first `max_samples` (< 0: all): a pass limited to a few batches costs only those.
  std::vector<int64_t> rank_order(const std::vector<int64_t>& global, int64_t start,
                                  int64_t max_samples) const;
  // Positions of G the ranks together have consumed once each has taken `batches` batches of a
  // pass from `start`, capped at num_samples() (padding consumes nothing).
  int64_t consumed_after(int64_t start, int64_t batches) const;

 private:
  std::vector<int64_t> shard_sizes_;
  int64_t num_samples_ = 0;
  SamplerOptions options_;
};

}  // namespace stoker::pipeline
