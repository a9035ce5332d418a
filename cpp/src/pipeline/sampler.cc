#include "stoker/pipeline/sampler.h"

#include <numeric>

#include "stoker/core/error.h"
#include "stoker/core/random.h"

namespace stoker::pipeline {

namespace {
constexpr uint64_t kPermutationStream = 0x5045524d;  // "PERM"
}

Sampler::Sampler(int64_t num_samples, SamplerOptions options)
    : num_samples_(num_samples), options_(options) {
  STOKER_CHECK(num_samples > 0, ErrorCode::kInvalidArgument, "the dataset has no samples");
  STOKER_CHECK(options.batch_size > 0, ErrorCode::kInvalidArgument, "batch_size must be > 0");
  STOKER_CHECK(options.world_size > 0 && options.rank >= 0 && options.rank < options.world_size,
               ErrorCode::kInvalidArgument,
               "need 0 <= rank < world_size (rank " + std::to_string(options.rank) +
                   ", world_size " + std::to_string(options.world_size) + ")");
  const int64_t w = options.world_size;
  per_rank_ = options.drop_last ? num_samples / w : (num_samples + w - 1) / w;
  STOKER_CHECK(per_rank_ > 0, ErrorCode::kInvalidArgument,
               "fewer samples than ranks with drop_last");
}

int64_t Sampler::num_batches() const {
  const int64_t b = options_.batch_size;
  return options_.drop_last ? per_rank_ / b : (per_rank_ + b - 1) / b;
}

int64_t Sampler::batch_end(int64_t b) const {
  return std::min(per_rank_, (b + 1) * options_.batch_size);
}

std::vector<int64_t> Sampler::epoch_order(int64_t epoch) const {
  std::vector<int64_t> perm(static_cast<size_t>(num_samples_));
  std::iota(perm.begin(), perm.end(), 0);
  if (options_.shuffle) {
    KeyedRandom rng(options_.seed, kPermutationStream, static_cast<uint64_t>(epoch));
    for (int64_t i = num_samples_ - 1; i > 0; --i)  // Fisher-Yates
      std::swap(perm[i], perm[rng.below(static_cast<uint64_t>(i) + 1)]);
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank_));
  for (int64_t k = 0; k < per_rank_; ++k) {
    const int64_t pos = k * options_.world_size + options_.rank;
    mine.push_back(perm[static_cast<size_t>(pos % num_samples_)]);  // wraps only to pad
  }
  return mine;
}

}  // namespace stoker::pipeline
