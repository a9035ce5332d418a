#include "stoker/pipeline/loader.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <new>
#include <tuple>
#include <unordered_set>

#include "stoker/core/checked.h"
#include "stoker/core/clock.h"
#include "stoker/core/crc32c.h"
#include "stoker/core/error.h"
#include "stoker/core/fault.h"
#include "stoker/core/random.h"
#include "stoker/decode/image_decoder.h"

namespace stoker::pipeline {

namespace {

SamplerOptions sampler_options(const LoaderOptions& o) {
  SamplerOptions s;
  s.batch_size = o.batch_size;
  s.shuffle = o.shuffle;
  s.shuffle_window = o.shuffle_window;
  s.seed = o.seed;
  s.drop_last = o.drop_last;
  s.rank = o.rank;
  s.world_size = o.world_size;
  return s;
}

// Samples per shard, in pack order: a Dataset's samples are its shards' one after the other.
std::vector<int64_t> shard_sizes(const format::Dataset& dataset) {
  std::vector<int64_t> sizes;
  for (uint32_t s = 0; s < dataset.num_shards(); ++s)
    if (dataset.shard_samples(s) > 0)  // a shard without samples has no place in the order
      sizes.push_back(dataset.shard_samples(s));
  return sizes;
}

// The CPUs this process may run on (its affinity mask), which a container may set below the
// machine's count.
int available_cores() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

}  // namespace

Loader::Loader(std::shared_ptr<const format::Dataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)),
      shard_sizes_(shard_sizes(*dataset_)),
      options_(std::move(options)),
      sampler_(std::make_shared<const Sampler>(shard_sizes_, sampler_options(options_))),
      pass_sampler_(sampler_),
      fields_(options_.fields) {
  STOKER_CHECK(options_.prefetch >= 1, ErrorCode::kInvalidArgument, "prefetch must be >= 1");
  STOKER_CHECK(options_.threads >= 0 && options_.threads <= 1024, ErrorCode::kInvalidArgument,
               "threads must be 0-1024");
  if (options_.verify_crc)
    STOKER_CHECK(dataset_->has_crc(), ErrorCode::kInvalidArgument,
                 "verify_crc needs a stoker pack (foreign WebDataset shards carry no CRCs)");
  for (const fields::OutputSpec& o : fields_.outputs())
    layout_.sample_bytes.push_back(options_.load_samples ? o.sample_bytes : 0);
  layout_.num_blobs = fields_.num_blob_fields();
  if (options_.grouping) plan_group_outputs();
  // Member names to ids, per shard: a sample's member table holds ids.
  const int num_fields = static_cast<int>(fields_.specs().size());
  member_ids_.resize(static_cast<size_t>(num_fields));
  for (int f = 0; f < num_fields; ++f) {
    const fields::FieldSpec& spec = fields_.specs()[static_cast<size_t>(f)];
    label_from_index_.push_back(spec.kind == fields::FieldKind::kLabel &&
                                fields_.members(f) == std::vector<std::string>{"cls"});
    for (uint32_t shard = 0; shard < dataset_->num_shards(); ++shard) {
      std::vector<int> ids;
      for (const std::string& name : fields_.members(f))
        ids.push_back(dataset_->find_member(shard, name));
      member_ids_[static_cast<size_t>(f)].push_back(std::move(ids));
    }
  }
  STOKER_CHECK(options_.read_latency_us >= 0 && options_.read_latency_us <= 10'000'000,
               ErrorCode::kInvalidArgument, "read_latency_us must be 0-10,000,000");
  STOKER_CHECK(options_.max_error_fraction < 1.0, ErrorCode::kInvalidArgument,
               "max_error_fraction must be below 1");
  if (options_.grouping) planner_ = make_planner();
  window_ = options_.prefetch;
  ring_.resize(static_cast<size_t>(options_.autotune ? std::max(options_.prefetch, kMaxAutoPrefetch)
                                                     : options_.prefetch));
  pool_ = make_pool();
  // Set before the workers start: they read both under the lock from then on.
  active_threads_ = resolve_threads(options_.threads);
  if (options_.autotune) {
    tuner_.emplace(active_threads_, options_.prefetch, static_cast<int>(ring_.size()),
                   available_cores());
    active_threads_ = tuner_->setting().threads;
    window_ = tuner_->setting().prefetch;
  }
  start_workers();
}

std::shared_ptr<BatchPool> Loader::make_pool() const {
  // Free slots kept: the largest prefetch window plus one the consumer is likely to hand back.
  const size_t keep = options_.keep_slots ? BatchPool::kKeepAll : ring_.size() + 1;
  // With grouping every slot holds the largest group's batch: one size of slot for all groups,
  // so that a slot page-locked once serves every group after it.
  int64_t capacity = options_.batch_size;
  if (options_.grouping)
    capacity = *std::max_element(options_.grouping->batch_sizes.begin(),
                                 options_.grouping->batch_sizes.end());
  return BatchPool::create(capacity, layout_, keep);
}

void Loader::plan_group_outputs() {
  const GroupingOptions& g = *options_.grouping;
  check_grouping(g, dataset_->size());
  const size_t groups = g.batch_sizes.size(), outputs = layout_.sample_bytes.size();
  sized_output_.assign(outputs, Sized::kNo);
  if (!options_.group_image_sizes.empty()) {
    STOKER_CHECK(options_.group_image_sizes.size() == groups, ErrorCode::kInvalidArgument,
                 "group_image_sizes: one (height, width) per group");
    const int f = options_.sized_field;
    const bool valid = f >= 0 && f < static_cast<int>(fields_.specs().size());
    const fields::FieldKind sized_kind =
        valid ? fields_.specs()[static_cast<size_t>(f)].kind : fields::FieldKind::kImage;
    if (sized_kind == fields::FieldKind::kVideo) {
      STOKER_CHECK(options_.group_frames.size() == groups, ErrorCode::kInvalidArgument,
                   "group_frames: one frame count per group for the Video field sized");
      for (int t : options_.group_frames)
        STOKER_CHECK(t >= 1 && t <= 4096, ErrorCode::kInvalidArgument,
                     "a group's frame count must be 1-4096, not " + std::to_string(t));
      const int first = fields_.first_output(f);
      sized_output_[static_cast<size_t>(first)] = Sized::kClip;
      sized_output_[static_cast<size_t>(first) + 1] = Sized::kTimes;
    } else {
      STOKER_CHECK(valid && sized_kind == fields::FieldKind::kImage && fields_.follows(f) < 0 &&
                       options_.group_frames.empty(),
                   ErrorCode::kInvalidArgument,
                   "sized_field must be a Video, or an Image field that follows no other field "
                   "(and group_frames is for a Video)");
    }
    for (const auto& [h, w] : options_.group_image_sizes)
      STOKER_CHECK(h >= 1 && h <= 16384 && w >= 1 && w <= 16384, ErrorCode::kInvalidArgument,
                   "a group's image size must be 1-16384 on each side");
    // An Image's main output, and those of the Images and Masks whose geometry is its.
    for (int field = 0; sized_kind == fields::FieldKind::kImage &&
                        field < static_cast<int>(fields_.specs().size());
         ++field) {
      int root = field;
      while (fields_.follows(root) >= 0) root = fields_.follows(root);
      const fields::FieldKind kind = fields_.specs()[static_cast<size_t>(field)].kind;
      if (root == f && (kind == fields::FieldKind::kImage || kind == fields::FieldKind::kMask))
        sized_output_[static_cast<size_t>(fields_.first_output(field))] = Sized::kImage;
    }
  }
  group_bytes_.assign(groups, layout_.sample_bytes);
  layout_.output_bytes.assign(outputs, 0);
  for (size_t k = 0; k < groups; ++k) {
    for (size_t o = 0; o < outputs; ++o) {
      if (sized_output_[o] != Sized::kNo && options_.load_samples) {
        uint64_t bytes = dtype_size(fields_.outputs()[o].dtype);
        for (int64_t d : output_shape(o, static_cast<int>(k))) bytes *= static_cast<uint64_t>(d);
        group_bytes_[k][o] = bytes;
      }
      layout_.output_bytes[o] = std::max<size_t>(
          layout_.output_bytes[o],
          checked_mul(group_bytes_[k][o], static_cast<uint64_t>(g.batch_sizes[k]), "batch"));
    }
  }
}

std::vector<int64_t> Loader::output_shape(size_t k, int group) const {
  std::vector<int64_t> shape = fields_.outputs().at(k).shape;
  if (group < 0 || options_.group_image_sizes.empty()) return shape;
  const auto g = static_cast<size_t>(group);
  const auto [h, w] = options_.group_image_sizes.at(g);
  switch (sized_output_.at(k)) {
    case Sized::kNo: break;
    case Sized::kImage: shape[0] = h, shape[1] = w; break;
    case Sized::kClip: shape = {options_.group_frames.at(g), h, w, shape[3]}; break;
    case Sized::kTimes: shape[0] = options_.group_frames.at(g); break;
  }
  return shape;
}

std::shared_ptr<const BatchPlanner> Loader::make_planner() const {
  return std::make_shared<const BatchPlanner>(sampler_, options_.grouping);
}

std::shared_ptr<const EpochBatches> Loader::epoch_plan(int64_t epoch, int world_size) const {
  std::shared_ptr<const BatchPlanner> planner;
  {
    adopt_after_fork_if_forked();
    std::lock_guard<std::mutex> lock(mutex_);
    if (!options_.grouping) return nullptr;
    planner = planner_;
    if (planner->sampler().options().world_size != world_size) {
      LoaderOptions options = options_;
      options.rank = 0;
      options.world_size = world_size;
      planner = std::make_shared<const BatchPlanner>(
          std::make_shared<const Sampler>(shard_sizes_, sampler_options(options)),
          options_.grouping);
    }
  }
  return planner->plan(epoch);  // outside the lock: O(samples), more under kCarry
}

size_t Loader::slots_allocated() const {
  adopt_after_fork_if_forked();
  std::lock_guard<std::mutex> lock(mutex_);
  return pool_->allocated();
}

void Loader::start_workers() {
  owner_pid_ = static_cast<int>(::getpid());
  const int n = resolve_threads(options_.threads);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    workers_prepared_ = 0;
  }
  workers_.reserve(static_cast<size_t>(n));
  try {
    for (int i = 0; i < n; ++i) {
      if (fault::due("thread"))
        throw Error(ErrorCode::kResourceLimit,
                    fault::describe("thread", "stoker-worker" + std::to_string(i)));
      workers_.emplace_back([this, i] { worker_main(i); });
    }
  } catch (...) {
    // A thread refused (std::system_error: the process's limit): the ones started end and are
    // joined here, since a constructor that throws runs no destructor, and a joinable thread
    // destroyed with its vector would abort the process.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
    throw;
  }
  // Each worker reads the environment once, as it creates its decoders and makes its first
  // decode (decode::prepare_thread_for_decoding): done before this returns, so while the caller
  // (Python, holding the GIL) is still here, and never while Python code changes os.environ.
  std::unique_lock<std::mutex> lock(mutex_);
  ready_cv_.wait(lock, [&] { return workers_prepared_ == n; });
}

void Loader::adopt_after_fork() {
  // Only the thread that called fork() exists here. The parent's workers are gone, and any lock
  // they held at that moment stays held forever, so none of it may be touched: the thread
  // handles are leaked (destroying a joinable std::thread aborts), the locks are constructed
  // afresh in place, and the pass in progress is dropped. The slots it held go back to a pool
  // that, in a process other than its creator's, frees them without locking (batch_pool.cc).
  static_cast<void>(new std::vector<std::thread>(std::move(workers_)));
  workers_.clear();
  new (&mutex_) std::mutex;
  new (&work_cv_) std::condition_variable;
  new (&ready_cv_) std::condition_variable;
  for (auto& p : ring_) p = Pending{};
  pool_ = make_pool();
  ++generation_;
  active_ = false;
  resume_pending_ = false;
  fatal_.reset();
  consumed_ = 0;
  if (!stop_) start_workers();
  owner_pid_ = static_cast<int>(::getpid());
}

void Loader::adopt_after_fork_if_forked() const {
  // const so that state() and stats() can call it; a child's first call of any kind adopts.
  if (static_cast<int>(::getpid()) != owner_pid_) const_cast<Loader*>(this)->adopt_after_fork();
}

Loader::~Loader() { close(); }

void Loader::close() {
  if (static_cast<int>(::getpid()) != owner_pid_) {
    stop_ = true;  // a child closing an inherited loader: adopt it without starting workers
    adopt_after_fork();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    active_ = false;
  }
  work_cv_.notify_all();
  ready_cv_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& p : ring_) p = Pending{};
}

void Loader::set_epoch(int64_t epoch) {
  adopt_after_fork_if_forked();
  std::lock_guard<std::mutex> lock(mutex_);
  STOKER_CHECK(epoch >= 0, ErrorCode::kInvalidArgument, "epoch must be >= 0");
  if (epoch != epoch_) {
    epoch_ = epoch;
    resume_pending_ = false;
  }
}

void Loader::set_ranks(int rank, int world_size) {
  STOKER_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, ErrorCode::kInvalidArgument,
               "rank must be in [0, world_size) and world_size >= 1, not rank " +
                   std::to_string(rank) + " of " + std::to_string(world_size));
  adopt_after_fork_if_forked();
  std::lock_guard<std::mutex> lock(mutex_);
  if (rank == options_.rank && world_size == options_.world_size) return;
  options_.rank = rank;
  options_.world_size = world_size;
  sampler_ = std::make_shared<const Sampler>(shard_sizes_, sampler_options(options_));
  if (options_.grouping) planner_ = make_planner();
}

std::vector<int64_t> Loader::step_samples(int64_t epoch, int64_t step, int rank,
                                          int world_size) const {
  STOKER_CHECK(world_size >= 1 && rank >= 0 && rank < world_size && epoch >= 0,
               ErrorCode::kInvalidArgument,
               "step_samples: rank must be in [0, world_size) and the epoch >= 0");
  if (grouped()) {
    const auto plan = epoch_plan(epoch, world_size);
    if (step < 0 || step >= plan->steps()) return {};
    const int64_t b = step * world_size + rank;
    return {plan->samples.begin() + plan->starts[static_cast<size_t>(b)],
            plan->samples.begin() + plan->starts[static_cast<size_t>(b) + 1]};
  }
  LoaderOptions options = this->options();
  options.rank = rank;
  options.world_size = world_size;
  const Sampler sampler(shard_sizes_, sampler_options(options));
  if (step < 0 || step >= sampler.num_batches()) return {};
  const std::vector<int64_t> order = sampler.rank_order(epoch, 0);
  return {order.begin() + sampler.batch_begin(step), order.begin() + sampler.batch_end(step)};
}

int64_t Loader::num_batches() const {
  adopt_after_fork_if_forked();
  std::shared_ptr<const BatchPlanner> planner;
  int64_t epoch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!planner_) return sampler_->num_batches();
    planner = planner_;
    epoch = epoch_;
  }
  return planner->plan(epoch)->steps();  // the next pass's epoch: under kCarry, its own count
}

int64_t Loader::samples_per_rank() const {
  adopt_after_fork_if_forked();
  std::shared_ptr<const BatchPlanner> planner;
  int64_t epoch;
  int rank;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!planner_) return sampler_->samples_per_rank();
    planner = planner_;
    epoch = epoch_;
    rank = options_.rank;
  }
  const auto plan = planner->plan(epoch);
  int64_t n = 0;
  for (int64_t step = 0; step < plan->steps(); ++step)
    n += plan->batch_size(step * plan->world_size + rank);
  return n;
}

std::shared_ptr<const Sampler> Loader::sampler() const {
  adopt_after_fork_if_forked();
  std::lock_guard<std::mutex> lock(mutex_);
  return sampler_;
}

LoaderOptions Loader::options() const {
  adopt_after_fork_if_forked();
  std::lock_guard<std::mutex> lock(mutex_);
  return options_;
}

int64_t Loader::first_batch_number(int64_t start) const {
  // Exact when the state was taken at this world size and batch size (start is then a whole
  // number of global batches); otherwise the global batches already consumed, rounded down.
  return start / (sampler_->options().batch_size * sampler_->options().world_size);
}

int64_t Loader::batches_left() const {
  adopt_after_fork_if_forked();
  std::lock_guard<std::mutex> lock(mutex_);
  return active_ ? std::max<int64_t>(pass_batches_ - consumed_, 0) : 0;
}

LoaderState Loader::state() const {
  adopt_after_fork_if_forked();
  std::shared_ptr<const BatchPlanner> planner;
  LoaderState pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pass_plan_ && active_) {  // grouped: the position is the step
      const int64_t steps = pass_first_batch_ + consumed_;
      return {pass_epoch_, pass_plan_->samples_before(steps), steps};
    }
    if (active_)
      return {pass_epoch_, pass_sampler_->consumed_after(pass_start_, consumed_),
              pass_first_batch_ + consumed_};
    if (!planner_) {
      if (resume_pending_) return {epoch_, resume_start_, first_batch_number(resume_start_)};
      return {epoch_, 0, 0};
    }
    if (!resume_pending_ || resume_start_ == 0) return {epoch_, 0, 0};
    planner = planner_;
    pending = {epoch_, 0, resume_start_};
  }
  pending.samples_consumed = planner->plan(pending.epoch)->samples_before(pending.batches_done);
  return pending;
}

void Loader::load_state(const LoaderState& state) {
  adopt_after_fork_if_forked();
  std::lock_guard<std::mutex> lock(mutex_);
  if (planner_) {  // grouped: the step every rank has reached
    STOKER_CHECK(state.epoch >= 0 && state.batches_done >= 0, ErrorCode::kInvalidArgument,
                 "state out of range: epoch " + std::to_string(state.epoch) + ", step " +
                     std::to_string(state.batches_done));
  } else {
    STOKER_CHECK(state.epoch >= 0 && state.samples_consumed >= 0 &&
                     state.samples_consumed <= sampler_->num_samples(),
                 ErrorCode::kInvalidArgument,
                 "state out of range: samples_consumed " + std::to_string(state.samples_consumed) +
                     " of " + std::to_string(sampler_->num_samples()));
  }
  ++generation_;  // abandon a pass in progress
  active_ = false;
  for (auto& p : ring_) p = Pending{};
  epoch_ = state.epoch;
  resume_start_ = planner_ ? state.batches_done : state.samples_consumed;
  resume_pending_ = true;
}

std::shared_ptr<const std::vector<int64_t>> Loader::pass_order(
    const std::shared_ptr<const Sampler>& sampler, int64_t epoch, int64_t start,
    int64_t max_samples) {
  std::shared_ptr<const std::vector<int64_t>> global;
  {
    std::lock_guard<std::mutex> lock(global_mutex_);
    // The epoch order depends on the sampler's options but the ranks: another rank's sampler of
    // the same data and order shares it.
    const auto same = [&](const Sampler& a, const Sampler& b) {
      const SamplerOptions &x = a.options(), &y = b.options();
      return x.shuffle == y.shuffle && x.shuffle_window == y.shuffle_window && x.seed == y.seed;
    };
    if (global_ && global_epoch_ == epoch && global_sampler_ && same(*global_sampler_, *sampler)) {
      global = global_;
    } else {
      global = std::make_shared<const std::vector<int64_t>>(sampler->global_order(epoch));
      global_ = global;
      global_sampler_ = sampler;
      global_epoch_ = epoch;
    }
  }
  return std::make_shared<const std::vector<int64_t>>(
      sampler->rank_order(*global, start, max_samples));
}

Loader::PassOrder Loader::grouped_pass(const std::shared_ptr<const BatchPlanner>& planner,
                                       int64_t epoch, int64_t start_step, int64_t max_batches) {
  PassOrder pass;
  pass.plan = planner->plan(epoch);
  const EpochBatches& plan = *pass.plan;
  const int world = plan.world_size, rank = planner->sampler().options().rank;
  pass.first_batch = std::min(start_step, plan.steps());
  int64_t steps = plan.steps() - pass.first_batch;
  if (max_batches >= 0) steps = std::min(steps, max_batches);
  auto order = std::make_shared<std::vector<int64_t>>();
  pass.starts.push_back(0);
  for (int64_t k = 0; k < steps; ++k) {
    const auto b = static_cast<size_t>((pass.first_batch + k) * world + rank);
    order->insert(order->end(), plan.samples.begin() + plan.starts[b],
                  plan.samples.begin() + plan.starts[b + 1]);
    pass.starts.push_back(static_cast<int64_t>(order->size()));
    pass.groups.push_back(plan.groups[b]);
  }
  pass.order = std::move(order);
  return pass;
}

Loader::PassOrder Loader::plain_pass(const std::shared_ptr<const Sampler>& sampler, int64_t epoch,
                                     int64_t start, int64_t max_batches) {
  PassOrder pass;
  const int64_t max_samples = max_batches < 0 ? -1 : max_batches * options_.batch_size;
  pass.order = pass_order(sampler, epoch, start, max_samples);
  int64_t batches = sampler->num_batches(start);
  if (max_batches >= 0) batches = std::min(batches, max_batches);
  pass.starts.push_back(0);
  for (int64_t b = 0; b < batches; ++b) pass.starts.push_back(sampler->batch_end(b, start));
  return pass;
}

void Loader::begin(int64_t max_batches) {
  adopt_after_fork_if_forked();
  // The permutation is computed outside the lock: O(dataset) work.
  int64_t epoch, start;
  std::shared_ptr<const Sampler> sampler;
  std::shared_ptr<const BatchPlanner> planner;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    STOKER_CHECK(!stop_, ErrorCode::kInvalidArgument, "the loader is closed");
    epoch = epoch_;
    start = resume_pending_ ? resume_start_ : 0;
    sampler = sampler_;
    planner = planner_;
  }
  fault::hold_point("begin");  // open when checked; a close() may come before the pass starts
  // A shard truncated or rewritten in place since it was opened would be read through a stale
  // index: refuse to start the pass (one fstat per shard).
  dataset_->check_unchanged();
  auto make = [&](int64_t e, int64_t from) {
    return planner_ ? grouped_pass(planner_, e, from, max_batches)
                    : plain_pass(sampler_, e, from, max_batches);
  };
  PassOrder pass = planner ? grouped_pass(planner, epoch, start, max_batches)
                           : plain_pass(sampler, epoch, start, max_batches);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Closed meanwhile: a pass started on a closed loader would never end (its next() would loop
    // on stop_, holding the lock, and the thread in it would never return).
    STOKER_CHECK(!stop_, ErrorCode::kInvalidArgument, "the loader is closed");
    ++generation_;
    for (auto& p : ring_) p = Pending{};
    const int64_t now_start = resume_pending_ ? resume_start_ : 0;
    resume_pending_ = false;
    // set_epoch, set_ranks or load_state raced with begin
    if (epoch != epoch_ || start != now_start || sampler != sampler_)
      pass = make(epoch_, now_start);
    order_ = std::move(pass.order);
    starts_ = std::move(pass.starts);
    groups_ = std::move(pass.groups);
    pass_plan_ = std::move(pass.plan);
    pass_sampler_ = sampler_;
    error_budget_ = options_.max_errors;
    if (options_.max_error_fraction >= 0) {
      const int64_t samples =
          pass_plan_ ? static_cast<int64_t>(order_->size()) : pass_sampler_->samples_per_rank();
      const auto from_fraction =
          static_cast<int64_t>(options_.max_error_fraction * static_cast<double>(samples));
      error_budget_ = error_budget_ < 0 ? from_fraction : std::min(error_budget_, from_fraction);
    }
    pass_epoch_ = epoch_;
    pass_skipped_ = 0;
    fatal_.reset();  // of a pass abandoned before the consumer reached it
    first_of_pass_ = true;
    consumed_ = 0;
    pass_start_ = now_start;
    pass_batches_ = static_cast<int64_t>(starts_.size()) - 1;
    pass_first_batch_ = pass_plan_ ? pass.first_batch : first_batch_number(now_start);
    if (pass_plan_ && max_batches < 0) {  // an epoch's leftovers, once per pass over it
      carried_ += pass_plan_->carried;
      dropped_ += pass_plan_->dropped;
      padded_ += pass_plan_->padded;
    }
    next_position_ = 0;
    claim_batch_ = 0;
    end_position_ = starts_.back();
    active_ = true;
  }
  work_cv_.notify_all();
}

std::vector<uint32_t> Loader::upcoming_shards(size_t max) const {
  adopt_after_fork_if_forked();
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<uint32_t> out;
  if (!active_ || !order_) return out;
  // A block shuffle's window can hold many samples of few shards: look at most this far ahead.
  constexpr int64_t kMaxScan = int64_t{1} << 20;
  const int64_t first = starts_[static_cast<size_t>(std::min(consumed_, pass_batches_))];
  const int64_t front = std::max(first, next_position_);  // the workers' next position
  const int64_t end = std::min(end_position_, first + kMaxScan);
  std::unordered_set<uint32_t> seen;
  size_t beyond = 0;  // shards first met at or past the front
  for (int64_t p = first; p < end; ++p) {
    if (p >= front && beyond >= max) break;
    const uint32_t shard = dataset_->shard_of((*order_)[static_cast<size_t>(p)]);
    if (!seen.insert(shard).second) continue;
    out.push_back(shard);
    if (p >= front) ++beyond;
  }
  return out;
}

int Loader::threads() const {
  adopt_after_fork_if_forked();
  std::lock_guard<std::mutex> lock(mutex_);
  return active_threads_;
}

struct Loader::WorkerState {
  std::vector<std::unique_ptr<fields::FieldDecoder>> decoders;  // per field
  std::vector<fields::Geometry> geometries;                     // per field, this sample's
  std::vector<uint8_t> bytes;
  std::vector<uint8_t*> out;
  std::vector<size_t> empty_bytes;  // an absent optional member's outputs, the batch's sizes
  format::MemberRef member;
  io::RowGroup::Cell cell;  // a row group's member
};

Loader::WorkerState Loader::make_worker_state() const {
  WorkerState state;
  for (int f = 0; f < static_cast<int>(fields_.specs().size()); ++f)
    state.decoders.push_back(fields_.make_decoder(f));
  state.geometries.resize(fields_.specs().size());
  return state;
}

bool Loader::load_sample(WorkerState& w, int64_t sample, int64_t epoch, BatchSlot& slot,
                         int64_t position, StageTimes& times, bool device_allowed, int group) {
  const uint32_t shard = dataset_->shard_of(sample);
  fields::SampleContext context;
  context.device_allowed = device_allowed;
  context.seed = options_.seed;
  context.epoch = epoch;
  context.sample = sample;
  context.label = dataset_->label(sample);
  auto keep_waiting = [this] {
    std::lock_guard<std::mutex> lock(mutex_);
    return !stop_;
  };
  // A Parquet row group's sample: its members are the cells of its row, read in place.
  std::shared_ptr<const io::RowGroup> rows;
  int64_t row = 0;
  if (dataset_->layout(shard) == format::ShardLayout::kRowGroup) {
    const int64_t t0 = monotonic_ns();
    rows = dataset_->acquire_rows(sample, keep_waiting);
    row = sample - dataset_->shard_first(shard);
    times.read_ns += monotonic_ns() - t0;
    if (!rows->error().empty()) throw Error(ErrorCode::kCorruptData, rows->error());
  }
  for (int f : fields_.order()) {
    const fields::FieldSpec& spec = fields_.specs()[static_cast<size_t>(f)];
    const int first = fields_.first_output(f);
    const int count = fields_.num_outputs(f);
    w.out.resize(static_cast<size_t>(count));
    for (int k = 0; k < count; ++k)
      w.out[static_cast<size_t>(k)] =
          slot.outputs[static_cast<size_t>(first + k)] +
          position * static_cast<int64_t>(sample_bytes(static_cast<size_t>(first + k), group));
    // The batch's group sets the size of the sized field's output (and its followers').
    context.out_width = context.out_height = context.out_frames = 0;
    if (f == options_.sized_field && group >= 0 && !options_.group_image_sizes.empty()) {
      context.out_height = options_.group_image_sizes[static_cast<size_t>(group)].first;
      context.out_width = options_.group_image_sizes[static_cast<size_t>(group)].second;
      if (!options_.group_frames.empty())
        context.out_frames = options_.group_frames[static_cast<size_t>(group)];
    }
    const int follow = fields_.follows(f);
    fields::Geometry& geometry = w.geometries[static_cast<size_t>(follow >= 0 ? follow : f)];
    const int blob = fields_.blob_index(f);
    std::string* blob_out = blob >= 0 ? &slot.blobs[static_cast<size_t>(blob)][position] : nullptr;
    fields::FieldTimes field_times;
    // The member: the first of the field's alternatives that the sample has.
    format::MemberRef& member = w.member;
    bool found = false;
    if (!(label_from_index_[static_cast<size_t>(f)] && context.label >= 0)) {
      for (int id : member_ids_[static_cast<size_t>(f)][shard]) {  // in order of preference
        if (id >= 0 && rows) {
          found = rows->cell(row, static_cast<size_t>(id), w.cell);
          if (found)
            member = {static_cast<uint32_t>(id),
                      0,
                      w.cell.size,
                      0,
                      false,
                      w.cell.raw,
                      rows->column_name(static_cast<size_t>(id)),
                      {}};
        } else {
          found = id >= 0 && dataset_->member(sample, id, member);
        }
        if (found) break;
      }
      if (!found) {
        if (spec.optional) {
          w.empty_bytes.resize(static_cast<size_t>(count));
          for (int k = 0; k < count; ++k)
            w.empty_bytes[static_cast<size_t>(k)] =
                sample_bytes(static_cast<size_t>(first + k), group);
          fields_.write_empty(f, w.out.data(), w.empty_bytes.data());
          if (blob_out) blob_out->clear();
          if (follow >= 0 || spec.kind != fields::FieldKind::kImage) continue;
          geometry = fields::Geometry{};  // an absent image: its followers see no image either
          continue;
        }
        if (options_.missing == MissingPolicy::kSkip) return false;
        throw Error(ErrorCode::kCorruptData,
                    "no member '" + spec.member + "' (field '" + spec.name + "')", {}, {},
                    spec.member);
      }
    }
    try {
      const uint8_t* data = nullptr;
      size_t size = 0;
      context.raw = nullptr;
      if (found) {
        context.member = member.name;
        context.raw = member.raw;
        if (member.size > static_cast<uint64_t>(spec.max_member_bytes))
          throw Error(ErrorCode::kResourceLimit, std::to_string(member.size) +
                                                     " bytes, more than max_member_bytes (" +
                                                     std::to_string(spec.max_member_bytes) + ")");
        const int64_t t0 = monotonic_ns();
        size = static_cast<size_t>(member.size);
        if (rows) {
          data = w.cell.data;  // in the row group, held by `rows` until the sample is done
        } else {
          // A fetched pack's file may not be here yet: wait for it, unless the loader closes.
          const auto file = dataset_->acquire_file(sample, member.file, keep_waiting);
          data = file->view(member.offset, member.size);  // a file held in memory: in place
          if (data == nullptr) {
            file->read(member.offset, member.size, w.bytes);
            data = w.bytes.data();
          }
        }
        if (options_.verify_crc && member.has_crc && crc32c(data, size) != member.crc32c)
          throw_error(ErrorCode::kCorruptData, "CRC32C mismatch: the shard changed after packing");
        times.read_ns += monotonic_ns() - t0;
      } else {
        context.member = "cls";
      }
      if (follow >= 0 && geometry.out_width == 0)
        throw Error(ErrorCode::kCorruptData,
                    "follows field '" + spec.follow + "', which this sample does not have");
      try {
        w.decoders[static_cast<size_t>(f)]->decode(data, size, context, geometry, w.out.data(),
                                                   blob_out, field_times);
      } catch (const fields::SkipSample&) {
        return false;  // left out and counted, as a sample without the member under kSkip
      }
      if (follow >= 0 && spec.kind == fields::FieldKind::kImage)
        w.geometries[static_cast<size_t>(f)] = geometry;
    } catch (const Error& e) {
      throw e.with_member(found ? std::string(member.name) : spec.member);
    }
    times.decode_ns += field_times.decode_ns;
    times.transform_ns += field_times.transform_ns;
    for (size_t k = 0; k < times.scales.size(); ++k) times.scales[k] += field_times.scales[k];
  }
  return true;
}

int64_t Loader::load_substitute(WorkerState& w, int64_t failed, int64_t epoch, BatchSlot& slot,
                                int64_t position, StageTimes& times, int group) {
  // Keyed by the failed sample: the same substitute whatever the thread or the pass's start.
  constexpr uint64_t kSubstituteStream = 0x5eb571707e5ull;
  KeyedRandom rng(options_.seed, kSubstituteStream ^ static_cast<uint64_t>(epoch), failed);
  // From the failed sample's own shard, which the pass is reading (a remote pack's is here
  // already); the whole pack when that shard holds nothing else.
  const uint32_t shard = dataset_->shard_of(failed);
  int64_t first = dataset_->shard_first(shard), n_here = dataset_->shard_samples(shard);
  if (n_here < 2) first = 0, n_here = dataset_->size();
  const auto n = static_cast<uint64_t>(n_here);
  for (int attempt = 0; attempt < kMaxSubstitutes && n > 1; ++attempt) {
    const int64_t substitute = first + static_cast<int64_t>(rng.below(n));
    if (substitute == failed) continue;
    // A grouped batch takes one of its group (a bucket's shape; never a sample left out).
    if (group >= 0 && options_.grouping &&
        options_.grouping->group_of[static_cast<size_t>(substitute)] != group)
      continue;
    try {
      if (load_sample(w, substitute, epoch, slot, position, times, false, group)) {
        slot.indices[position] = substitute;
        return substitute;
      }
    } catch (const std::exception&) {
      // that one fails too (or its shard is not here): the next draw
    }
  }
  return -1;  // none loaded: the sample is skipped
}

void Loader::fail_at(Error error, int64_t batch) {
  // The batches before it are made and handed out as usual, and the pass's position (state())
  // stays the consumer's until it reaches `batch`; none is made from that batch on.
  if (fatal_ && fatal_batch_ <= batch) return;
  fatal_ = std::move(error);
  fatal_batch_ = batch;
  end_position_ = std::min(end_position_, batch * options_.batch_size);
  ready_cv_.notify_all();
}

void Loader::worker_main(int index) {
#if defined(__linux__)
  // What top -H, py-spy and perf show for the thread: "stoker-worker3" (Linux allows 15 chars).
  const std::string name = "stoker-worker" + std::to_string(index % 100);
  pthread_setname_np(pthread_self(), name.c_str());
#endif
  WorkerState state = make_worker_state();
  try {
    decode::prepare_thread_for_decoding();
  } catch (const std::exception&) {
    // Only an early getenv is at stake: the thread decodes as well without it.
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++workers_prepared_;
  }
  ready_cv_.notify_all();
  const auto ring_size = static_cast<int64_t>(ring_.size());
  // Positions claimed at once: 1 at first, then as many as take about kRunNs (at most kMaxRun).
  constexpr double kRunNs = 40'000;
  constexpr int64_t kMaxRun = 16;
  int64_t run_length = 1;
  double sample_ns = 0;
  std::vector<std::pair<int64_t, int64_t>> claimed;  // (place in the batch, sample)
  struct Result {
    int64_t slot_index, sample;
    std::optional<Error> error;
    bool missing;
    int64_t substitute;
  };
  std::vector<Result> results;
  std::unique_lock<std::mutex> lock(mutex_);
  auto has_work = [&] {
    return index < active_threads_ && active_ && next_position_ < end_position_;
  };
  auto in_window = [&] { return claim_batch_ < consumed_ + window_; };
  while (true) {
    if (!stop_ && has_work() && !in_window()) {  // held back by the prefetch window: timed
      const int64_t t0 = monotonic_ns();
      work_cv_.wait(lock, [&] { return stop_ || !has_work() || in_window(); });
      window_wait_ns_ += monotonic_ns() - t0;
    }
    work_cv_.wait(lock, [&] { return stop_ || (has_work() && in_window()); });
    if (stop_) return;
    const int64_t position = next_position_;
    const int64_t batch = claim_batch_;
    const int64_t first_index = position - starts_[static_cast<size_t>(batch)];
    Pending& pending = ring_[static_cast<size_t>(batch % ring_size)];
    if (first_index == 0) {  // first sample of the batch: positions are handed out in order
      pending = Pending{};
      pending.batch = batch;
      pending.count = starts_[static_cast<size_t>(batch) + 1] - position;
      pending.group = groups_.empty() ? -1 : groups_[static_cast<size_t>(batch)];
      pending.device_quota = std::llround(device_share_.load(std::memory_order_relaxed) *
                                          static_cast<double>(pending.count));
      try {
        pending.slot = pool_->acquire();  // cheap after warm-up: slots are reused
      } catch (const std::exception& e) {
        fail_at(Error(ErrorCode::kResourceLimit, std::string("no memory for a batch: ") + e.what()),
                batch);
        continue;
      }
    }
    // A run of the batch's positions at once when samples are quick (an array pack's rows): one
    // lock for several, read in the order of their place in the pack (locality).
    const int64_t run = std::min<int64_t>(run_length, pending.count - first_index);
    next_position_ += run;
    if (next_position_ == starts_[static_cast<size_t>(batch) + 1]) ++claim_batch_;
    const uint64_t generation = generation_;
    const std::shared_ptr<BatchSlot> slot = pending.slot;
    const std::shared_ptr<const std::vector<int64_t>> order = order_;
    const int64_t epoch = pass_epoch_;
    const int64_t device_quota = pending.device_quota;
    const int group = pending.group;
    lock.unlock();

    claimed.clear();
    for (int64_t k = 0; k < run; ++k)
      claimed.push_back({first_index + k, (*order)[static_cast<size_t>(position + k)]});
    if (run > 1)
      std::sort(claimed.begin(), claimed.end(),
                [](const auto& a, const auto& b) { return a.second < b.second; });
    results.clear();
    StageTimes times;
    const int64_t t_run = monotonic_ns();
    bool unavailable = false;
    for (const auto& [slot_index, sample] : claimed) {
      std::optional<Error> error;
      bool missing = false;
      try {
        if (options_.read_latency_us > 0) {
          const int64_t t0 = monotonic_ns();
          std::this_thread::sleep_for(std::chrono::microseconds(options_.read_latency_us));
          times.read_ns += monotonic_ns() - t0;
        }
        if (options_.load_samples)
          missing = !load_sample(state, sample, epoch, *slot, slot_index, times,
                                 slot_index < device_quota, group);
        slot->indices[slot_index] = sample;
      } catch (const io::ShardUnavailableError& e) {  // no policy skips a whole missing shard
        lock.lock();
        if (generation == generation_)
          fail_at(e.with_location(dataset_->shard_name(sample), dataset_->key(sample)), batch);
        lock.unlock();
        unavailable = true;
        break;
      } catch (const Error& e) {
        error = e.with_location(dataset_->shard_name(sample), dataset_->key(sample));
      } catch (const std::bad_alloc&) {
        error = Error(ErrorCode::kResourceLimit, "out of memory", dataset_->shard_name(sample),
                      dataset_->key(sample));
      } catch (const std::exception& e) {
        error = Error(ErrorCode::kInternal, e.what(), dataset_->shard_name(sample),
                      dataset_->key(sample));
      }
      int64_t substitute = -1;
      if (error && options_.on_error == ErrorPolicy::kReplace)
        substitute = load_substitute(state, sample, epoch, *slot, slot_index, times, group);
      results.push_back({slot_index, sample, std::move(error), missing, substitute});
    }
    read_ns_ += times.read_ns;
    decode_ns_ += times.decode_ns;
    transform_ns_ += times.transform_ns;
    for (size_t k = 0; k < times.scales.size(); ++k) scales_[k] += times.scales[k];
    // The next run's length: about kRunNs of work, from this thread's recent time per sample.
    if (!results.empty()) {
      const double per_sample =
          static_cast<double>(monotonic_ns() - t_run) / static_cast<double>(results.size());
      sample_ns = sample_ns <= 0 ? per_sample : 0.8 * sample_ns + 0.2 * per_sample;
      run_length =
          std::clamp<int64_t>(static_cast<int64_t>(kRunNs / std::max(1.0, sample_ns)), 1, kMaxRun);
    }

    lock.lock();
    if (unavailable || generation != generation_ || pending.batch != batch) continue;  // abandoned
    for (auto& r : results) {
      if (r.error)
        pending.errors.push_back({r.slot_index, r.sample, std::move(*r.error), r.substitute});
      if (r.missing) pending.missing.push_back(r.slot_index);
    }
    pending.done += run;
    if (pending.done == pending.count) ready_cv_.notify_all();
  }
}

NextStatus Loader::next(Batch& out, int64_t timeout_ms) {
  adopt_after_fork_if_forked();
  const int64_t t0 = monotonic_ns();
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    if (fatal_ && active_ && consumed_ >= fatal_batch_) {
      Error e = *fatal_;
      fatal_.reset();
      active_ = false;  // the pass ends here
      throw e;
    }
    if (stop_ || !active_) return NextStatus::kEnd;  // closed: the end, whatever the pass
    if (consumed_ >= pass_batches_) {
      active_ = false;
      if (epoch_ == pass_epoch_) epoch_ = pass_epoch_ + 1;  // unless set_epoch chose one
      consumed_ = 0;
      return NextStatus::kEnd;
    }
    Pending& pending = ring_[static_cast<size_t>(consumed_ % static_cast<int64_t>(ring_.size()))];
    auto ready = [&] {
      return stop_ || !active_ || (fatal_ && consumed_ >= fatal_batch_) ||
             (pending.batch == consumed_ && pending.done == pending.count);
    };
    if (timeout_ms < 0) {
      ready_cv_.wait(lock, ready);
    } else if (!ready_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready)) {
      wait_ns_ += monotonic_ns() - t0;
      return NextStatus::kTimeout;
    }
    if (stop_ || !active_ || (fatal_ && consumed_ >= fatal_batch_)) continue;  // at the top
    wait_ns_ += monotonic_ns() - t0;
    // The tuner leaves out the wait for a pass's first batch: the pipeline refilling after
    // begin(), which neither more threads nor a deeper window would shorten.
    if (!first_of_pass_) tune_wait_ns_ += monotonic_ns() - t0;
    first_of_pass_ = false;
    Pending taken = std::move(pending);
    pending = Pending{};
    ++consumed_;
    const int64_t first_batch = pass_first_batch_;
    lock.unlock();
    work_cv_.notify_all();  // the window moved
    // In batch order: the error raised, the skip list and the sample that trips max_errors are
    // then the same whatever the thread timing.
    std::sort(taken.errors.begin(), taken.errors.end(),
              [](const auto& a, const auto& b) { return a.position < b.position; });
    if (!taken.errors.empty() && options_.on_error == ErrorPolicy::kRaise)
      throw taken.errors.front().error;
    finish_batch(taken, out);
    out.batch_number += first_batch;
    lock.lock();
    ++batches_;
    delivered_ += out.size;
    count_skipped(taken);
    if (tuner_) tune_if_due(monotonic_ns());
    try {
      check_error_budget(taken.errors);
    } catch (const Error&) {
      out = Batch{};
      throw;
    }
    if (out.size > 0) return NextStatus::kBatch;
    // Every sample of this batch failed and was skipped: go on to the next one.
  }
}

void Loader::finish_batch(Pending& pending, Batch& out) {
  // Close the gaps left by failed (kSkip) and missing samples so the batch is contiguous.
  const int64_t t0 = monotonic_ns();
  BatchSlot& slot = *pending.slot;
  int64_t size = pending.count;
  if (!pending.errors.empty() || !pending.missing.empty()) {
    std::vector<bool> left_out(static_cast<size_t>(pending.count), false);
    for (const auto& f : pending.errors)
      if (f.substitute < 0) left_out[static_cast<size_t>(f.position)] = true;
    for (int64_t p : pending.missing) left_out[static_cast<size_t>(p)] = true;
    int64_t write = 0;
    for (int64_t read = 0; read < pending.count; ++read) {
      if (left_out[static_cast<size_t>(read)]) continue;
      if (write != read) {
        for (size_t k = 0; k < slot.outputs.size(); ++k) {
          const size_t bytes = sample_bytes(k, pending.group);
          std::memmove(slot.outputs[k] + write * bytes, slot.outputs[k] + read * bytes, bytes);
        }
        for (auto& blobs : slot.blobs)
          std::swap(blobs[static_cast<size_t>(write)], blobs[static_cast<size_t>(read)]);
        slot.indices[write] = slot.indices[read];
      }
      ++write;
    }
    size = write;
  }
  out.size = size;
  out.group = pending.group;
  out.batch_number = pending.batch;  // in the pass; next() adds the pass's first
  out.slot = std::move(pending.slot);
  collate_ns_ += monotonic_ns() - t0;
}

void Loader::check_error_budget(const std::vector<Pending::Failure>& failures) const {
  if (error_budget_ < 0 || pass_skipped_ <= error_budget_) return;
  // Name the failure that went over the budget: the (budget + 1)-th of the pass.
  const int64_t before = pass_skipped_ - static_cast<int64_t>(failures.size());
  const Error& over =
      failures[static_cast<size_t>(std::max<int64_t>(0, error_budget_ - before))].error;
  throw Error(ErrorCode::kErrorBudget,
              std::to_string(pass_skipped_) + " samples of this pass failed, more than the " +
                  std::to_string(error_budget_) + " max_errors allows; the first over: " +
                  error_code_name(over.code()) + ": " + over.reason(),
              over.shard(), over.key());
}

void Loader::set_device_share(double share) {
  STOKER_CHECK(share >= 0.0 && share <= 1.0, ErrorCode::kInvalidArgument,
               "the device share must be in [0, 1], not " + std::to_string(share));
  device_share_.store(share, std::memory_order_relaxed);
}

void Loader::decode_on_host(int64_t sample, int64_t epoch, int64_t position, Batch& out) {
  adopt_after_fork_if_forked();
  out = Batch{};
  std::shared_ptr<BatchSlot> slot = pool_->acquire();
  WorkerState state = make_worker_state();
  StageTimes times;
  std::optional<Error> error;
  try {
    if (load_sample(state, sample, epoch, *slot, 0, times, false)) {
      slot->indices[0] = sample;
      out.size = 1;
      out.slot = std::move(slot);
      return;
    }
    error = Error(ErrorCode::kCorruptData, "a member went missing since the workers read it");
  } catch (const Error& e) {
    error = e;
  } catch (const std::bad_alloc&) {
    error = Error(ErrorCode::kResourceLimit, "out of memory");
  }
  error = error->with_location(dataset_->shard_name(sample), dataset_->key(sample));
  if (options_.on_error == ErrorPolicy::kRaise) throw *error;
  Pending failed;
  failed.errors.push_back({position, sample, *error, -1});
  if (options_.on_error == ErrorPolicy::kReplace) {
    const int64_t substitute = load_substitute(state, sample, epoch, *slot, 0, times);
    failed.errors.back().substitute = substitute;
    if (substitute >= 0) {
      out.size = 1;
      out.slot = std::move(slot);
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  count_skipped(failed);
  check_error_budget(failed.errors);
}

void Loader::count_skipped(const Pending& pending) {
  missing_ += static_cast<int64_t>(pending.missing.size());
  skipped_ += static_cast<int64_t>(pending.errors.size());
  for (const auto& f : pending.errors) replaced_ += f.substitute >= 0 ? 1 : 0;
  pass_skipped_ += static_cast<int64_t>(pending.errors.size());
  for (const auto& f : pending.errors) {
    if (skipped_list_.size() >= kMaxSkippedListed) break;
    skipped_list_.push_back({f.sample, f.error.code(), f.error.shard(), f.error.key(),
                             f.error.member(), f.error.reason(), f.substitute});
  }
}

std::vector<SkippedSample> Loader::skipped_since(size_t first) const {
  adopt_after_fork_if_forked();
  std::lock_guard<std::mutex> lock(mutex_);
  if (first >= skipped_list_.size()) return {};
  return {skipped_list_.begin() + static_cast<ptrdiff_t>(first), skipped_list_.end()};
}

void Loader::tune_if_due(int64_t now_ns) {
  const int64_t busy = read_ns_ + decode_ns_ + transform_ns_ + collate_ns_;
  if (interval_start_ns_ == 0 || now_ns - interval_start_ns_ >= kTuneIntervalNs) {
    // Intervals run across passes: a short pass still gets tuned, and the wait at a pass's
    // start is a wait the training loop really has. The first batch only starts the first one.
    if (interval_start_ns_ != 0) {
      TuneObservation o;
      o.seconds = (now_ns - interval_start_ns_) * 1e-9;
      o.wait_seconds = (tune_wait_ns_ - interval_wait_ns_) * 1e-9;
      o.busy_seconds = (busy - interval_busy_ns_) * 1e-9;
      o.window_seconds = (window_wait_ns_ - interval_window_ns_) * 1e-9;
      o.samples = delivered_ - interval_samples_;
      const TuneSetting& next = tuner_->observe(o);
      const bool more = next.threads > active_threads_ || next.prefetch > window_;
      active_threads_ = next.threads;
      window_ = next.prefetch;
      if (more) work_cv_.notify_all();
    }
    interval_start_ns_ = now_ns;
    interval_wait_ns_ = tune_wait_ns_;
    interval_busy_ns_ = busy;
    interval_window_ns_ = window_wait_ns_;
    interval_samples_ = delivered_;
  }
}

std::vector<TuneStep> Loader::tuning() const {
  adopt_after_fork_if_forked();
  std::lock_guard<std::mutex> lock(mutex_);
  return tuner_ ? tuner_->history() : std::vector<TuneStep>{};
}

LoaderStats Loader::stats(bool listed) const {
  adopt_after_fork_if_forked();
  std::lock_guard<std::mutex> lock(mutex_);
  LoaderStats s;
  s.samples = delivered_;
  s.batches = batches_;
  s.skipped = skipped_;
  s.replaced = replaced_;
  s.missing = missing_;
  s.pass_skipped = pass_skipped_;
  s.read_s = read_ns_ * 1e-9;
  s.decode_s = decode_ns_ * 1e-9;
  s.transform_s = transform_ns_ * 1e-9;
  s.collate_s = collate_ns_ * 1e-9;
  s.wait_s = wait_ns_ * 1e-9;
  for (size_t k = 0; k < s.scales.size(); ++k) s.scales[k] = scales_[k];
  std::tie(s.scan_indexed, s.scan_index_bytes) = fields_.scan_indexes();
  s.threads = active_threads_;
  s.prefetch = window_;
  s.carried = carried_;
  s.dropped = dropped_;
  s.padded = padded_;
  if (listed) s.skipped_samples = skipped_list_;
  return s;
}

void Loader::account_elsewhere(const std::vector<SkippedSample>& failures, int64_t missing) {
  adopt_after_fork_if_forked();
  STOKER_CHECK(!options_.load_samples, ErrorCode::kInvalidArgument,
               "account_elsewhere is for a loader whose samples are loaded elsewhere "
               "(load_samples=false)");
  STOKER_CHECK(missing >= 0, ErrorCode::kInvalidArgument, "missing must be >= 0");
  Pending pending;  // what this loader's workers would have left in it
  pending.errors.reserve(failures.size());
  int64_t left_out = missing;
  for (size_t k = 0; k < failures.size(); ++k) {
    const SkippedSample& f = failures[k];
    pending.errors.push_back({static_cast<int64_t>(k), f.index,
                              Error(f.code, f.reason, f.shard, f.key, f.member), f.substitute});
    if (f.substitute < 0) ++left_out;
  }
  pending.missing.assign(static_cast<size_t>(missing), 0);
  std::lock_guard<std::mutex> lock(mutex_);
  delivered_ = std::max<int64_t>(0, delivered_ - left_out);
  count_skipped(pending);
  check_error_budget(pending.errors);
}

}  // namespace stoker::pipeline
