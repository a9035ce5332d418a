#include "stoker/pipeline/sampler.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "stoker/core/error.h"
#include "stoker/core/random.h"

namespace stoker::pipeline {

namespace {

// The global shuffle keeps the stream of the sampler it replaced, so that states saved by it
// (version 1, which resumed only at the same world size) resume exactly.
constexpr uint64_t kPermutationStream = 0x5045524d;  // "PERM"
constexpr uint64_t kShardStream = 0x5348524d;        // "SHRM": the shards' permutation
constexpr uint64_t kWindowStream = 0x57494e44;       // "WIND": samples within a window

void fisher_yates(std::vector<int64_t>::iterator first, int64_t n, KeyedRandom& rng) {
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(first[i], first[static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1))]);
}

// The epoch's first window, laid out shard after shard (`sizes` samples each, in that order),
// shuffled so that its k-th shard's samples fall only in the window's last
// (shards - k) / shards, spread evenly there: each sample's key is uniform in [k/shards, 1), and
// the window is sorted by key. The first batches of an epoch then need its first shard or two,
// not all of them: a cold cache (a remote pack's first epoch) decodes the first shards while
// the next download. The price is mixing at the window's start (the first shard alone) and end
// (the last shard is a third of the last eighth, with 8 shards): docs/DISTRIBUTED.md.
// Keys are integers (32-bit fractions), so the order is the same on every machine.
void ramp(std::vector<int64_t>::iterator first, const std::vector<int64_t>& sizes,
          KeyedRandom& rng) {
  const auto shards = static_cast<int64_t>(sizes.size());
  std::vector<std::pair<uint64_t, int64_t>> keyed;
  auto next = first;
  for (int64_t k = 0; k < shards; ++k) {
    const uint64_t from = (static_cast<uint64_t>(k) << 32) / static_cast<uint64_t>(shards);
    const uint64_t span = (uint64_t{1} << 32) - from;
    const int64_t n = sizes[static_cast<size_t>(k)];
    for (int64_t i = 0; i < n; ++i, ++next) {
      keyed.emplace_back(from + ((span * (rng.next_u64() >> 32)) >> 32), *next);
    }
  }
  std::sort(keyed.begin(), keyed.end());
  for (const auto& [key, sample] : keyed) *first++ = sample;
}

}  // namespace

Sampler::Sampler(std::vector<int64_t> shard_sizes, SamplerOptions options)
    : shard_sizes_(std::move(shard_sizes)), options_(options) {
  for (int64_t n : shard_sizes_) {
    STOKER_CHECK(n > 0, ErrorCode::kInvalidArgument, "a shard has no samples");
    num_samples_ += n;
  }
  STOKER_CHECK(num_samples_ > 0, ErrorCode::kInvalidArgument, "the dataset has no samples");
  STOKER_CHECK(options.batch_size > 0, ErrorCode::kInvalidArgument, "batch_size must be > 0");
  STOKER_CHECK(options.shuffle_window > 0, ErrorCode::kInvalidArgument,
               "shuffle_window must be > 0 shards");
  STOKER_CHECK(options.world_size > 0 && options.rank >= 0 && options.rank < options.world_size,
               ErrorCode::kInvalidArgument,
               "need 0 <= rank < world_size (rank " + std::to_string(options.rank) +
                   ", world_size " + std::to_string(options.world_size) + ")");
  STOKER_CHECK(samples_per_rank(0) > 0, ErrorCode::kInvalidArgument,
               "fewer samples than ranks with drop_last");
}

Sampler::Sampler(int64_t num_samples, SamplerOptions options)
    : Sampler(std::vector<int64_t>{num_samples}, options) {}

int64_t Sampler::samples_per_rank(int64_t start) const {
  const int64_t remaining = num_samples_ - start;
  const int64_t w = options_.world_size;
  return options_.drop_last ? remaining / w : (remaining + w - 1) / w;
}

int64_t Sampler::num_batches(int64_t start) const {
  const int64_t n = samples_per_rank(start), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

int64_t Sampler::batch_end(int64_t b, int64_t start) const {
  return std::min(samples_per_rank(start), (b + 1) * options_.batch_size);
}

int64_t Sampler::consumed_after(int64_t start, int64_t batches) const {
  const int64_t per_rank = std::min(samples_per_rank(start), batches * options_.batch_size);
  return std::min(num_samples_, start + per_rank * options_.world_size);
}

std::vector<int64_t> Sampler::global_order(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(num_samples_));
  std::iota(order.begin(), order.end(), 0);
  const auto e = static_cast<uint64_t>(epoch);
  switch (options_.shuffle) {
    case ShuffleMode::kNone: break;
    case ShuffleMode::kGlobal: {
      KeyedRandom rng(options_.seed, kPermutationStream, e);
      fisher_yates(order.begin(), num_samples_, rng);
      break;
    }
    case ShuffleMode::kBlock: {
      std::vector<int64_t> first(shard_sizes_.size());  // each shard's first sample
      std::exclusive_scan(shard_sizes_.begin(), shard_sizes_.end(), first.begin(), int64_t{0});
      std::vector<int64_t> shards(shard_sizes_.size());
      std::iota(shards.begin(), shards.end(), 0);
      KeyedRandom shard_rng(options_.seed, kShardStream, e);
      fisher_yates(shards.begin(), num_shards(), shard_rng);
      // Each window's key is (seed, epoch, window): a window can be made without the others.
      size_t out = 0;
      for (int64_t w = 0; w * options_.shuffle_window < num_shards(); ++w) {
        const size_t window_first = out;
        const int64_t end = std::min(num_shards(), (w + 1) * options_.shuffle_window);
        for (int64_t k = w * options_.shuffle_window; k < end; ++k) {
          const auto s = static_cast<size_t>(shards[static_cast<size_t>(k)]);
          for (int64_t i = 0; i < shard_sizes_[s]; ++i) order[out++] = first[s] + i;
        }
        KeyedRandom rng(options_.seed, kWindowStream ^ mix64(e), static_cast<uint64_t>(w));
        if (w == 0) {
          std::vector<int64_t> sizes;
          for (int64_t k = 0; k < end; ++k)
            sizes.push_back(shard_sizes_[static_cast<size_t>(shards[static_cast<size_t>(k)])]);
          ramp(order.begin(), sizes, rng);
        } else {
          fisher_yates(order.begin() + static_cast<std::ptrdiff_t>(window_first),
                       static_cast<int64_t>(out - window_first), rng);
        }
      }
      break;
    }
  }
  return order;
}

std::vector<int64_t> Sampler::rank_order(int64_t epoch, int64_t start) const {
  return rank_order(global_order(epoch), start, -1);
}

std::vector<int64_t> Sampler::rank_order(const std::vector<int64_t>& global, int64_t start,
                                         int64_t max_samples) const {
  STOKER_CHECK(start >= 0 && start <= num_samples_, ErrorCode::kInvalidArgument,
               "start " + std::to_string(start) + " outside the epoch's " +
                   std::to_string(num_samples_) + " samples");
  STOKER_CHECK(static_cast<int64_t>(global.size()) == num_samples_, ErrorCode::kInvalidArgument,
               "a global order of " + std::to_string(global.size()) + " samples, not " +
                   std::to_string(num_samples_));
  int64_t per_rank = samples_per_rank(start);
  if (max_samples >= 0) per_rank = std::min(per_rank, max_samples);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank));
  // Padding wraps to the epoch's first positions, as DistributedSampler's does: a pass resumed
  // at the same world size then pads with the very samples the uninterrupted pass would have.
  for (int64_t k = 0; k < per_rank; ++k) {
    const int64_t position = start + k * options_.world_size + options_.rank;
    mine.push_back(global[static_cast<size_t>(position % num_samples_)]);
  }
  return mine;
}

}  // namespace stoker::pipeline
