// Batches grouped by a key (an image's aspect bucket, a sequence's length band): which samples
// each rank's step-N batch holds, when a batch must hold samples of one group only.
//
// The epoch's global order G is the Sampler's (pipeline/sampler.h): a pure function of (shard
// sizes, seed, epoch, shuffle). It is walked once, each sample appended to its group's open
// batch; a batch full is emitted, so the epoch's batches come in the order G fills them. Emitted
// batches are dealt to the ranks in turn: batch s * W + r is rank r's step s. With
// same_shape_across_ranks a group's open batch holds W batches' samples and is split across the
// ranks when full (each rank r takes its positions r, r + W, ...): every rank's step s then has
// the same group, so the same shape. What is left when G ends (open batches, and without
// same_shape_across_ranks the last fewer than W batches) is carried into the next epoch (its
// groups' open batches start with them), dropped, or (Leftovers::kPartial) emitted as smaller
// batches and padded so that every rank gets as many; never mixed into another group's batch.
// Everything is a pure function of (G, the groups, the batch sizes, W and, carrying, the epochs
// before), so a step's batch depends only on (seed, epoch, rank, step).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "stoker/pipeline/sampler.h"

namespace stoker::pipeline {

enum class Leftovers : uint8_t {
  kCarry,    // into the next epoch's open batches of their groups (training)
  kDrop,     // not seen this epoch
  kPartial,  // smaller batches at the epoch's end, padded to equal counts (evaluation)
};

struct GroupingOptions {
  // Per sample, in pack order: its group, 0 .. groups - 1, or -1: left out of every epoch (a
  // video that fills no bucket, or one a bucket's keep probability drops).
  std::vector<int32_t> group_of;
  std::vector<int64_t> batch_sizes;  // per group: the samples of one rank's batch (> 0)
  bool same_shape_across_ranks = false;
  Leftovers leftovers = Leftovers::kCarry;
};

// Throws Error(kInvalidArgument) unless `grouping` holds one group per sample of `num_samples`,
// each -1 or below the number of batch sizes, and every batch size is positive.
void check_grouping(const GroupingOptions& grouping, int64_t num_samples);

// One epoch's batches, every rank's: batch b is samples[starts[b], starts[b + 1]), of group
// groups[b]; step s of rank r is batch s * world_size + r.
struct EpochBatches {
  std::vector<int64_t> samples;
  std::vector<int64_t> starts{0};
  std::vector<int32_t> groups;
  int world_size = 1;
  int64_t carried_in = 0;  // samples the epoch before carried into this one
  int64_t carried = 0;     // samples this epoch carries into the next (listed in `carry`)
  int64_t dropped = 0;     // samples this epoch leaves out (Leftovers::kDrop)
  int64_t padded = 0;      // places filled by repeating samples (Leftovers::kPartial)
  std::vector<int64_t> carry;

  int64_t batches() const { return static_cast<int64_t>(groups.size()); }
  int64_t steps() const { return batches() / world_size; }
  int64_t batch_size(int64_t b) const {
    return starts[static_cast<size_t>(b) + 1] - starts[static_cast<size_t>(b)];
  }
  // Samples of the first `steps` steps, every rank's.
  int64_t samples_before(int64_t steps) const;
};

// The plan of one epoch: `global` is its global order, `carried_in` what the epoch before
// carried (empty for the first epoch, and unless Leftovers::kCarry). A sample that arrives while
// an earlier copy of it waits in its group's open batch (a carried one) waits for the next batch
// of its group, so that no batch holds one sample twice (padding apart).
EpochBatches plan_epoch(const std::vector<int64_t>& global, const std::vector<int64_t>& carried_in,
                        const GroupingOptions& grouping, int world_size);

// Every epoch's plan for one sampler (its world size and order) and one grouping. Under
// Leftovers::kCarry an epoch's plan needs the epoch before's carry, so the carries are kept
// (per epoch: fewer samples than the groups' open batches hold) and an epoch far ahead costs
// one walk of G per epoch not yet planned. Thread-safe.
class BatchPlanner {
 public:
  BatchPlanner(std::shared_ptr<const Sampler> sampler,
               std::shared_ptr<const GroupingOptions> grouping);
  std::shared_ptr<const EpochBatches> plan(int64_t epoch) const;
  const Sampler& sampler() const { return *sampler_; }
  const GroupingOptions& grouping() const { return *grouping_; }

 private:
  std::shared_ptr<const Sampler> sampler_;
  std::shared_ptr<const GroupingOptions> grouping_;
  mutable std::mutex mutex_;
  mutable std::map<int64_t, std::vector<int64_t>> carry_;  // epoch -> what it carries out
  mutable std::shared_ptr<const EpochBatches> last_;
  mutable int64_t last_epoch_ = -1;
};

}  // namespace stoker::pipeline
