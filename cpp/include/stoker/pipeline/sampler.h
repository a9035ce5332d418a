// Which samples an epoch visits, in which order, on which rank. A pure function of
// (num_samples, seed, epoch, options): never of thread count or timing.
#pragma once

#include <cstdint>
#include <vector>

namespace stoker::pipeline {

struct SamplerOptions {
  int64_t batch_size = 1;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  int rank = 0;
  int world_size = 1;
};

// torch's DistributedSampler semantics: the permutation is padded (by repeating its start) to a
// multiple of world_size, or cut to one when drop_last; rank r takes positions r, r + W, r + 2W,
// ... Every rank gets the same number of samples and so the same number of batches.
class Sampler {
 public:
  Sampler(int64_t num_samples, SamplerOptions options);

  int64_t samples_per_rank() const { return per_rank_; }
  int64_t num_batches() const;
  // Samples of batch b (b < num_batches()) is [batch_begin(b), batch_end(b)) of epoch_order().
  int64_t batch_begin(int64_t b) const { return b * options_.batch_size; }
  int64_t batch_end(int64_t b) const;
  // This rank's sample indices for `epoch`, in visiting order.
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  const SamplerOptions& options() const { return options_; }

 private:
  int64_t num_samples_;
  SamplerOptions options_;
  int64_t per_rank_;
};

}  // namespace stoker::pipeline
