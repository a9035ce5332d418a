#include "stoker/pipeline/batch_plan.h"

#include <algorithm>
#include <deque>
#include <string>

#include "stoker/core/error.h"

namespace stoker::pipeline {

void check_grouping(const GroupingOptions& g, int64_t num_samples) {
  STOKER_CHECK(static_cast<int64_t>(g.group_of.size()) == num_samples, ErrorCode::kInvalidArgument,
               "grouping: " + std::to_string(g.group_of.size()) + " groups given for " +
                   std::to_string(num_samples) + " samples");
  STOKER_CHECK(!g.batch_sizes.empty(), ErrorCode::kInvalidArgument, "grouping: no groups");
  for (int64_t b : g.batch_sizes)
    STOKER_CHECK(b > 0 && b <= (int64_t{1} << 24), ErrorCode::kInvalidArgument,
                 "grouping: a group's batch size must be 1 to 2^24, not " + std::to_string(b));
  const auto groups = static_cast<int32_t>(g.batch_sizes.size());
  for (int32_t k : g.group_of)
    STOKER_CHECK(k >= -1 && k < groups, ErrorCode::kInvalidArgument,
                 "grouping: group " + std::to_string(k) + " of " + std::to_string(groups));
}

int64_t EpochBatches::samples_before(int64_t steps) const {
  const int64_t b = std::clamp<int64_t>(steps * world_size, 0, batches());
  return starts[static_cast<size_t>(b)];
}

namespace {

class Walk {
 public:
  Walk(const GroupingOptions& g, int world_size, size_t num_samples, EpochBatches& out)
      : g_(g),
        w_(world_size),
        out_(out),
        open_(g.batch_sizes.size()),
        waiting_(g.batch_sizes.size()),
        in_open_(num_samples, 0) {}

  void add(int64_t sample) {
    const int32_t g = g_.group_of[static_cast<size_t>(sample)];
    if (g < 0) return;  // left out
    const auto group = static_cast<size_t>(g);
    // A copy is in this batch already: wait for the next one, unless those waiting would fill
    // a batch by themselves (a group of fewer samples than a batch, carried epoch after epoch:
    // then it takes the copy, so that what is carried stays below two batches per group).
    if (in_open_[static_cast<size_t>(sample)] &&
        static_cast<int64_t>(waiting_[group].size()) + 1 < capacity(group)) {
      waiting_[group].push_back(sample);
      return;
    }
    place(group, sample);
  }

  // What is left when the order ends, by group, in the order it arrived.
  std::vector<std::vector<int64_t>> take_open() {
    std::vector<std::vector<int64_t>> left(open_.size());
    for (size_t k = 0; k < open_.size(); ++k) {
      left[k] = std::move(open_[k]);
      left[k].insert(left[k].end(), waiting_[k].begin(), waiting_[k].end());
    }
    return left;
  }

  // A group's samples as its batch (or, same_shape_across_ranks, its W batches, rank r taking
  // positions r, r + W, ...; `per_rank` of them, wrapping round `items` where it has fewer).
  void emit(size_t group, const std::vector<int64_t>& items, int64_t per_rank) {
    const int ranks = g_.same_shape_across_ranks ? w_ : 1;
    const auto n = static_cast<int64_t>(items.size());
    for (int r = 0; r < ranks; ++r) {
      for (int64_t j = 0; j < per_rank; ++j)
        out_.samples.push_back(items[static_cast<size_t>((r + j * ranks) % n)]);
      out_.starts.push_back(static_cast<int64_t>(out_.samples.size()));
      out_.groups.push_back(static_cast<int32_t>(group));
    }
  }

 private:
  int64_t capacity(size_t group) const {
    return g_.batch_sizes[group] * (g_.same_shape_across_ranks ? w_ : 1);
  }

  void place(size_t group, int64_t sample) {
    std::vector<int64_t>& open = open_[group];
    open.push_back(sample);
    in_open_[static_cast<size_t>(sample)] = 1;
    if (static_cast<int64_t>(open.size()) < capacity(group)) return;
    emit(group, open, g_.batch_sizes[group]);
    for (int64_t s : open) in_open_[static_cast<size_t>(s)] = 0;
    open.clear();
    // Those that waited for this batch to go: the next one's first (each is there once).
    std::deque<int64_t> waiting;
    waiting.swap(waiting_[group]);
    for (int64_t s : waiting) add(s);
  }

  const GroupingOptions& g_;
  const int w_;
  EpochBatches& out_;
  std::vector<std::vector<int64_t>> open_;
  std::vector<std::deque<int64_t>> waiting_;
  std::vector<uint8_t> in_open_;
};

}  // namespace

EpochBatches plan_epoch(const std::vector<int64_t>& global, const std::vector<int64_t>& carried_in,
                        const GroupingOptions& grouping, int world_size) {
  STOKER_CHECK(world_size >= 1, ErrorCode::kInvalidArgument, "world_size must be >= 1");
  EpochBatches out;
  out.world_size = world_size;
  out.carried_in = static_cast<int64_t>(carried_in.size());
  out.samples.reserve(global.size() + carried_in.size());
  Walk walk(grouping, world_size, grouping.group_of.size(), out);
  for (int64_t s : carried_in) walk.add(s);
  for (int64_t s : global) walk.add(s);
  std::vector<std::vector<int64_t>> left = walk.take_open();
  const bool same_shape = grouping.same_shape_across_ranks;
  if (grouping.leftovers == Leftovers::kPartial) {
    for (size_t k = 0; k < left.size(); ++k) {
      if (left[k].empty()) continue;
      const auto n = static_cast<int64_t>(left[k].size());
      const int64_t per_rank = same_shape ? (n + world_size - 1) / world_size : n;
      walk.emit(k, left[k], per_rank);
      if (same_shape) out.padded += per_rank * world_size - n;
    }
    // Every rank as many batches: the first ones again, as DistributedSampler pads.
    const int64_t real = out.batches();
    for (int64_t b = 0; out.batches() % world_size != 0; ++b) {
      const int64_t from = b % real;
      const auto begin = out.samples.begin() + out.starts[static_cast<size_t>(from)];
      const int64_t n = out.batch_size(from);
      std::vector<int64_t> copy(begin, begin + n);
      out.samples.insert(out.samples.end(), copy.begin(), copy.end());
      out.starts.push_back(static_cast<int64_t>(out.samples.size()));
      out.groups.push_back(out.groups[static_cast<size_t>(from)]);
      out.padded += n;
    }
    return out;
  }
  // The last batches that would leave some ranks one short go with the open ones.
  std::vector<int64_t> rest;
  const int64_t keep = out.batches() - out.batches() % world_size;
  rest.assign(out.samples.begin() + out.starts[static_cast<size_t>(keep)], out.samples.end());
  out.samples.resize(static_cast<size_t>(out.starts[static_cast<size_t>(keep)]));
  out.starts.resize(static_cast<size_t>(keep) + 1);
  out.groups.resize(static_cast<size_t>(keep));
  for (const auto& items : left) rest.insert(rest.end(), items.begin(), items.end());
  if (grouping.leftovers == Leftovers::kCarry) {
    out.carried = static_cast<int64_t>(rest.size());
    out.carry = std::move(rest);
  } else {
    out.dropped = static_cast<int64_t>(rest.size());
  }
  return out;
}

BatchPlanner::BatchPlanner(std::shared_ptr<const Sampler> sampler,
                           std::shared_ptr<const GroupingOptions> grouping)
    : sampler_(std::move(sampler)), grouping_(std::move(grouping)) {
  check_grouping(*grouping_, sampler_->num_samples());
}

std::shared_ptr<const EpochBatches> BatchPlanner::plan(int64_t epoch) const {
  STOKER_CHECK(epoch >= 0, ErrorCode::kInvalidArgument, "epoch must be >= 0");
  std::lock_guard<std::mutex> lock(mutex_);
  if (last_ && last_epoch_ == epoch) return last_;
  const int world = sampler_->options().world_size;
  const bool carry = grouping_->leftovers == Leftovers::kCarry;
  // Under kCarry, the epochs before this one not yet planned are planned first, in order, from
  // the last one whose carry is known (or the first epoch, which nothing carries into).
  int64_t from = 0;
  if (carry && epoch > 0) {
    auto it = carry_.lower_bound(epoch);  // the first epoch >= this one
    from = it == carry_.begin() ? 0 : std::prev(it)->first + 1;
  }
  static const std::vector<int64_t> kNone;
  std::shared_ptr<EpochBatches> plan;
  for (int64_t e = carry ? from : epoch; e <= epoch; ++e) {
    const std::vector<int64_t>& in = carry && e > 0 ? carry_.at(e - 1) : kNone;
    plan = std::make_shared<EpochBatches>(
        plan_epoch(sampler_->global_order(e), in, *grouping_, world));
    if (carry) carry_[e] = plan->carry;
  }
  last_ = plan;
  last_epoch_ = epoch;
  return plan;
}

}  // namespace stoker::pipeline
