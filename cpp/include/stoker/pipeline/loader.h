// The loader: a pool of C++ worker threads that turns a Dataset into batches of typed fields
// (fields/field.h: images, masks, boxes, labels, arrays, bytes). This header is the C++ API; the
// Python Loader and ImageLoader are thin wrappers over it.
//
// Threads: `threads` workers each take the next sample position of the pass, read the members its
// fields need (one pread each), decode them straight into the sample's place in the batch slot. The
// consumer calls next(), which waits (without the GIL, from Python) for the batches in order. At
// most `prefetch` batches are in production beyond those handed out. Output depends only on
// (dataset, options, seed, epoch), never on thread count or timing.
//
// fork(): a child process has none of the parent's threads. The first call a child makes on a
// loader it inherited abandons the parent's threads, locks and pass (without touching them) and
// starts its own workers, so a loader built before DataLoader forks its workers still works there.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "stoker/core/error.h"
#include "stoker/fields/field.h"
#include "stoker/format/dataset.h"
#include "stoker/pipeline/autotune.h"
#include "stoker/pipeline/batch_plan.h"
#include "stoker/pipeline/batch_pool.h"
#include "stoker/pipeline/sample_processor.h"
#include "stoker/pipeline/sampler.h"

namespace stoker::pipeline {

// kReplace: a failed sample's place in its batch is taken by a substitute drawn from the pack,
// keyed by (seed, epoch, the failed sample), the first of up to kMaxSubstitutes draws that loads:
// every batch keeps its size, whatever the threads, and a replay draws the same substitute.
enum class ErrorPolicy { kRaise, kSkip, kReplace };
inline constexpr int kMaxSubstitutes = 16;
// A sample without a member that a (non-optional) field asks for: an error (which on_error then
// raises or skips), or left out of its batch and counted (stats().missing).
enum class MissingPolicy { kError, kSkip };

struct LoaderOptions {
  int64_t batch_size = 256;
  // What each sample becomes: classification_fields() gives ImageLoader's image + label.
  std::vector<fields::FieldSpec> fields;
  MissingPolicy missing = MissingPolicy::kError;
  ShuffleMode shuffle = ShuffleMode::kGlobal;      // pipeline/sampler.h
  int64_t shuffle_window = kDefaultShuffleWindow;  // shards per window under ShuffleMode::kBlock
  uint64_t seed = 0;
  bool drop_last = false;
  int threads = 0;   // 0: one per hardware thread; with autotune, the most it may use
  int prefetch = 2;  // with autotune, the least it may use
  // Choose the number of working threads (1..threads) and the prefetch depth
  // (prefetch..kMaxAutoPrefetch) while running: pipeline/autotune.h.
  bool autotune = false;
  // Each read sleeps this long first: slow storage, simulated (to test what diagnoses it).
  int64_t read_latency_us = 0;
  // This process's share of each epoch: set_ranks() changes it for the passes begun after.
  int rank = 0;
  int world_size = 1;
  ErrorPolicy on_error = ErrorPolicy::kRaise;
  // Under kSkip: once more than max_errors samples of one pass have failed, or more than
  // max_error_fraction of the pass's samples, next() throws Error(kErrorBudget) naming the last
  // one. < 0: no limit.
  int64_t max_errors = -1;
  double max_error_fraction = -1;
  bool verify_crc = false;  // check each sample's CRC32C against the index when reading it
  // Never free a batch slot while the loader lives: each stays at one address, so the device
  // feed can page-lock it once (cudaHostRegister) and keep it locked. The slots then number the
  // most ever in use at once: the prefetch window plus the batches the consumer holds.
  bool keep_slots = false;
  // false: the workers read nothing and make only each batch's sample indices (and a batch has
  // no outputs): what a dataset held in GPU memory needs, which gathers the rest itself.
  bool load_samples = true;
  // Batches of one group each (aspect buckets, length bands: pipeline/batch_plan.h), each group
  // with its own batch size; batch_size and drop_last then do not apply. Null: batches of
  // batch_size in the epoch's order.
  std::shared_ptr<const GroupingOptions> grouping;
  // With grouping: each group's output size (height, width) for the field `sized_field` (an
  // index into `fields`): an Image that follows no other field (and so the Images and Masks
  // that follow it), or a Video, whose clips also take each group's `group_frames` frames (a
  // video bucket's). Empty: every field keeps its own size. A slot holds the largest group's
  // batch: the slots stay the same whatever group a batch is of.
  std::vector<std::pair<int, int>> group_image_sizes;
  std::vector<int> group_frames;  // a Video's: one per group; empty for an Image
  int sized_field = -1;
};

struct SkippedSample {
  int64_t index = 0;  // position in pack order
  ErrorCode code = ErrorCode::kInternal;
  std::string shard, key, member, reason;
  int64_t substitute = -1;  // under ErrorPolicy::kReplace: the sample in its place (pack order)
};

struct LoaderStats {
  int64_t samples = 0;  // delivered
  int64_t batches = 0;
  int64_t skipped = 0;       // failed samples, replaced ones included
  int64_t replaced = 0;      // of those, replaced by a substitute (ErrorPolicy::kReplace)
  int64_t missing = 0;       // left out under MissingPolicy::kSkip
  int64_t pass_skipped = 0;  // in the pass in progress (what max_errors counts)
  double read_s = 0, decode_s = 0, transform_s = 0, collate_s = 0;  // summed over workers
  double wait_s = 0;  // consumer time spent waiting in next()
  // Images the workers decoded at DCT scale 1/1, 1/2, 1/4, 1/8 (fields::FieldTimes::scales).
  std::array<int64_t, 4> scales{};
  // JPEGs without restart markers indexed for cut decoding (decode/scan_index.h), and the bytes
  // their indexes take.
  int64_t scan_indexed = 0, scan_index_bytes = 0;
  int threads = 0, prefetch = 0;               // working now (autotune changes them)
  std::vector<SkippedSample> skipped_samples;  // the first kMaxSkippedListed
  // With grouping, over the passes begun: samples their epochs carried into the next, dropped,
  // and repeated to give every rank as many batches (batch_plan.h's Leftovers).
  int64_t carried = 0, dropped = 0, padded = 0;
};

// Where an epoch stands: the ranks together have consumed the first `samples_consumed`
// positions of epoch `epoch`'s global order (Sampler::global_order). That count does not depend
// on the world size, so a state taken at one world size resumes at another. With grouping, the
// position is the step: `batches_done` steps of every rank (what load_state reads then), at the
// world size it was taken at; `samples_consumed` counts their samples (informative).
struct LoaderState {
  int64_t epoch = 0;
  int64_t samples_consumed = 0;
  // This rank's batches of the epoch handed out, counted at this world size (what len() counts):
  // informative without grouping, where load_state() reads only the two above.
  int64_t batches_done = 0;
};

// A lease on one batch. The memory stays valid while any copy of `slot` lives.
struct Batch {
  int64_t size = 0;
  int64_t batch_number = 0;  // within the epoch (as LoaderState::batches_done counts)
  int32_t group = -1;        // with grouping: the batch's group (its outputs' shapes)
  std::shared_ptr<BatchSlot> slot;
  uint8_t* output(size_t k) const { return slot->outputs[k]; }
  int64_t* indices() const { return slot->indices; }
  // Of classification_fields(): outputs 0 (images) and 1 (labels).
  uint8_t* images() const { return slot->outputs[0]; }
  int64_t* labels() const { return reinterpret_cast<int64_t*>(slot->outputs[1]); }
};

enum class NextStatus { kBatch, kEnd, kTimeout };

class Loader {
 public:
  static constexpr size_t kMaxSkippedListed = 10000;
  static constexpr int kMaxAutoPrefetch = 8;
  static constexpr int64_t kTuneIntervalNs = 250'000'000;

  Loader(std::shared_ptr<const format::Dataset> dataset, LoaderOptions options);
  ~Loader();  // stops and joins the workers
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Of a whole epoch at the ranks the next pass runs at; a pass resumed mid-epoch has fewer.
  int64_t num_batches() const;
  int64_t samples_per_rank() const;
  // Batches the pass in progress has yet to hand out (at most: a batch whose every sample is
  // skipped is never handed out); 0 between passes. Lets a consumer that pulls ahead stop short
  // of the next() that ends the pass, and with it the epoch.
  int64_t batches_left() const;
  // The order of the passes begun from now on (the ranks set_ranks() last gave).
  std::shared_ptr<const Sampler> sampler() const;
  LoaderOptions options() const;  // as given, with the ranks set_ranks() last gave
  const fields::FieldSet& fields() const { return fields_; }
  int threads() const;  // working now: under autotune, what the tuner chose
  int max_threads() const { return static_cast<int>(workers_.size()); }
  bool load_samples() const { return options_.load_samples; }  // fixed at construction
  size_t slot_bytes() const { return pool_->slot_bytes(); }  // one slot's block (BatchSlot::bytes)
  size_t slots_allocated() const;
  bool grouped() const { return options_.grouping != nullptr; }  // fixed at construction
  // Output k's per-sample shape in a batch of `group` (-1, or without group sizes: the field's
  // own, FieldSet::outputs()).
  std::vector<int64_t> output_shape(size_t k, int group) const;
  // With grouping: the plan of epoch `epoch` at world size `world_size` (null without grouping).
  std::shared_ptr<const EpochBatches> epoch_plan(int64_t epoch, int world_size) const;

  // Chooses the epoch of the next pass (its permutation and augmentation draws); a pass in
  // progress keeps its own.
  void set_epoch(int64_t epoch);
  // Chooses this process's share of the passes begun from now on (0 <= rank < world_size); a
  // pass in progress keeps its own. A loaded state, or the position between passes, is kept: it
  // counts the samples all ranks consumed, whatever their number. What lets a loader built
  // before the process group exists take its ranks when each pass starts.
  void set_ranks(int rank, int world_size);
  LoaderState state() const;
  // The next begin() resumes epoch state.epoch after its first state.samples_consumed positions,
  // whatever the world size the state was taken at: the rest is split across this loader's ranks.
  void load_state(const LoaderState& state);

  // The sample indices (pack order) that batch `step` of a pass over `epoch` from its start hands
  // rank `rank` of `world_size`, in the batch's order, before any is skipped: the pass's own
  // order, read off the sampler without reading a sample (replay; O(samples), whatever the
  // step). Empty past the pass's last batch. Throws Error(kInvalidArgument) for a bad rank.
  std::vector<int64_t> step_samples(int64_t epoch, int64_t step, int rank, int world_size) const;

  // The distinct shards the pass in progress reads from its oldest batch not yet handed out on,
  // soonest first: every shard of the batches in flight (handed to workers, not yet out), then
  // at most `max` more (what a remote pack fetches ahead, and what a Parquet source keeps
  // decoded: a block shuffle spreads a row group's rows over several batches, and the workers
  // run up to the prefetch window ahead of the consumer); empty between passes.
  std::vector<uint32_t> upcoming_shards(size_t max) const;

  // Starts a pass: from a loaded state if there is one, else from the start of the current epoch.
  // Abandons a pass in progress. `max_batches` >= 0 ends the pass after that many batches (the
  // workers make none beyond them): a remote worker's share of a pass, a few steps from a
  // loaded state. The epoch's order is made once and kept for the passes that follow.
  void begin(int64_t max_batches = -1);
  // Waits for the next batch of the pass, up to timeout_ms (< 0: forever). At the end of the pass
  // returns kEnd and advances the epoch. Under ErrorPolicy::kRaise a failed sample throws its Error
  // (naming shard and key); under kSkip it is left out of its batch and listed in stats().
  NextStatus next(Batch& out, int64_t timeout_ms = -1);

  // decode="gpu"/"auto": the share (0 to 1) of each batch begun from now on whose samples may go
  // to the device decoder (SampleContext::device_allowed: its first round(share x size)
  // positions). 1 until set.
  void set_device_share(double share);
  double device_share() const { return device_share_.load(std::memory_order_relaxed); }

  // decode="gpu": decodes sample `sample` of a pass over `epoch` again, here, into a fresh
  // one-sample batch `out` (the device decoder failed on it; its geometry is keyed, so the pixels
  // are the host path's). If the host fails too, the failure is the host path's: under kRaise it
  // throws the Error (naming shard, key and member); otherwise it is counted as a worker's failure
  // is (stats(), the skipped list, max_errors: past it Error(kErrorBudget)) and, under kReplace,
  // a substitute drawn as the workers draw one is decoded into `out` instead (its index is
  // out.indices()[0]); under kSkip out.size is 0. `position`: the sample's place in its batch.
  void decode_on_host(int64_t sample, int64_t epoch, int64_t position, Batch& out);

  // `listed`: with skipped_samples (up to kMaxSkippedListed copied); false for the counts alone.
  LoaderStats stats(bool listed = true) const;

  // load_samples=false, whose samples are loaded elsewhere (stoker's remote workers, each running
  // a loader of its own): the batch this loader handed out last was loaded there, and there
  // `failures` failed (in batch order) and `missing` samples were left out. Counted as this
  // loader's own workers' would have been: stats(), the skipped list, and max_errors (past it,
  // Error(kErrorBudget) naming the failure that went over, as next() throws it).
  void account_elsewhere(const std::vector<SkippedSample>& failures, int64_t missing);
  // What autotune observed and decided, interval by interval (empty without autotune).
  std::vector<TuneStep> tuning() const;
  // Skipped samples listed after the first `first` (the list keeps the first kMaxSkippedListed).
  std::vector<SkippedSample> skipped_since(size_t first) const;
  void close();  // stops the workers; next() then returns kEnd

 private:
  struct Pending {
    int64_t batch = -1;
    int64_t count = 0, done = 0;
    std::shared_ptr<BatchSlot> slot;
    struct Failure {
      int64_t position;  // in the batch
      int64_t sample;    // in pack order
      Error error;
      int64_t substitute = -1;  // kReplace: what took its place (it stays in the batch)
    };
    std::vector<Failure> errors;
    std::vector<int64_t> missing;  // positions left out under MissingPolicy::kSkip
    int64_t device_quota = 0;      // positions [0, device_quota) may go to the device decoder
    int32_t group = -1;
  };
  struct WorkerState;
  void worker_main(int index);
  // With mutex_ held: the pass fails at `batch` (the earliest such batch wins).
  void fail_at(Error error, int64_t batch);
  // ErrorPolicy::kReplace: loads a substitute for sample `failed` into `position`; the
  // substitute's index, or -1 when none of kMaxSubstitutes draws loads.
  // Substitutes are decoded on the host.
  int64_t load_substitute(WorkerState& w, int64_t failed, int64_t epoch, BatchSlot& slot,
                          int64_t position, StageTimes& times, int group = -1);
  // Reads and decodes sample `sample` into position `position` of `slot`. Returns false when a
  // member is missing and MissingPolicy::kSkip leaves the sample out. Throws Error.
  bool load_sample(WorkerState& state, int64_t sample, int64_t epoch, BatchSlot& slot,
                   int64_t position, StageTimes& times, bool device_allowed, int group = -1);
  WorkerState make_worker_state() const;
  // Under mutex_: past the pass's error budget, Error(kErrorBudget) naming the failure of
  // `failures` (in batch order) that went over it.
  void check_error_budget(const std::vector<Pending::Failure>& failures) const;
  // This rank's order of a pass of `epoch` over `sampler` from `start`, at most `max_samples`
  // (< 0: all), from the epoch order kept in global_ (made again for another epoch or sampler).
  std::shared_ptr<const std::vector<int64_t>> pass_order(
      const std::shared_ptr<const Sampler>& sampler, int64_t epoch, int64_t start,
      int64_t max_samples);
  // A pass's order: this rank's samples from its first batch on, and where each batch starts
  // (and, grouped, each batch's group and the epoch's plan).
  struct PassOrder {
    std::shared_ptr<const std::vector<int64_t>> order;
    std::vector<int64_t> starts;
    std::vector<int32_t> groups;
    std::shared_ptr<const EpochBatches> plan;
    int64_t first_batch = 0;  // grouped: the step the pass starts at
  };
  PassOrder plain_pass(const std::shared_ptr<const Sampler>& sampler, int64_t epoch, int64_t start,
                       int64_t max_batches);
  PassOrder grouped_pass(const std::shared_ptr<const BatchPlanner>& planner, int64_t epoch,
                         int64_t start_step, int64_t max_batches);
  void plan_group_outputs();         // the constructor's, with grouping
  void tune_if_due(int64_t now_ns);  // under mutex_
  void start_workers();
  void finish_batch(Pending& pending, Batch& out);
  void count_skipped(const Pending& pending);
  // In a child process after fork(): drop the parent's threads and pass, start afresh.
  void adopt_after_fork();
  void adopt_after_fork_if_forked() const;
  std::shared_ptr<BatchPool> make_pool() const;
  int64_t first_batch_number(int64_t start) const;  // of a pass from `start`
  // Under mutex_: the planner of the next passes' sampler (set_ranks makes another).
  std::shared_ptr<const BatchPlanner> make_planner() const;
  // Bytes of one sample of output k in a batch of `group`.
  size_t sample_bytes(size_t k, int group) const {
    return group >= 0 && !group_bytes_.empty() ? group_bytes_[static_cast<size_t>(group)][k]
                                               : layout_.sample_bytes[k];
  }

  std::shared_ptr<const format::Dataset> dataset_;
  std::vector<int64_t> shard_sizes_;  // samples per shard with samples, in pack order
  LoaderOptions options_;             // rank and world_size under mutex_
  // The next passes' order (set_ranks replaces it) and the pass in progress's: under mutex_.
  std::shared_ptr<const Sampler> sampler_, pass_sampler_;
  fields::FieldSet fields_;
  BatchLayout layout_;
  // With group sizes: [group][output] bytes of one sample; which outputs a group sizes.
  std::vector<std::vector<size_t>> group_bytes_;
  // How a group sizes each output: not at all, an image's [H, W, C], a clip's [T, H, W, C], or
  // a clip's timestamps [T].
  enum class Sized : uint8_t { kNo, kImage, kClip, kTimes };
  std::vector<Sized> sized_output_;
  // With grouping: the next passes' planner (made with sampler_) and the pass in progress's
  // plan; the pass's batches are [starts_[b], starts_[b + 1]) of order_, of group groups_[b].
  std::shared_ptr<const BatchPlanner> planner_;
  std::shared_ptr<const EpochBatches> pass_plan_;
  // member_ids_[field][shard]: the ids of the field's member alternatives in that shard's index
  // (-1: the shard has no such member), in order of preference.
  std::vector<std::vector<std::vector<int>>> member_ids_;
  std::vector<bool> label_from_index_;  // Label fields of .cls: the index has it parsed
  std::shared_ptr<BatchPool> pool_;

  mutable std::mutex mutex_;
  std::condition_variable work_cv_, ready_cv_;
  bool stop_ = false;
  bool active_ = false;
  bool resume_pending_ = false;
  // A failure no policy can skip (no memory for a batch, a shard given up on), and the batch of
  // the pass it belongs to: raised when the consumer reaches that batch (fail_at).
  std::optional<Error> fatal_;
  int64_t fatal_batch_ = 0;
  uint64_t generation_ = 0;
  int64_t epoch_ = 0;         // of the next pass (set_epoch)
  int64_t pass_epoch_ = 0;    // of the pass in progress
  int64_t consumed_ = 0;      // batches handed out in this pass
  int64_t resume_start_ = 0;  // with resume_pending_: where in the epoch's order the pass starts
  int64_t pass_start_ = 0;    // positions of the global order consumed before this pass
  int64_t pass_batches_ = 0;  // this pass's batches on this rank
  int64_t pass_first_batch_ = 0;                  // batch_number of the pass's first batch
  int64_t next_position_ = 0, end_position_ = 0;  // in order_
  int64_t claim_batch_ = 0;                       // the batch of next_position_
  std::shared_ptr<const std::vector<int64_t>> order_;
  std::vector<int64_t> starts_;  // the pass's batch b is positions [starts_[b], starts_[b + 1])
  std::vector<int32_t> groups_;  // with grouping: batch b's group
  // The last epoch order begin() made (global_order), with its sampler and epoch: passes of a few
  // batches each (remote workers) make it once an epoch.
  std::mutex global_mutex_;  // guards the three below (begin() makes the order outside mutex_)
  std::shared_ptr<const std::vector<int64_t>> global_;
  std::shared_ptr<const Sampler> global_sampler_;
  int64_t global_epoch_ = -1;
  std::vector<Pending> ring_;  // batch b lives in ring_[b % ring_.size()]
  int window_ = 0;             // batches in production beyond those handed out (<= ring size)
  int active_threads_ = 0;     // workers with a lower index take work; the others park
  std::optional<Autotuner> tuner_;
  int64_t window_wait_ns_ = 0;  // workers idle with samples left because the window was full
  int64_t tune_wait_ns_ = 0;    // wait_ns_ less each pass's first batch
  bool first_of_pass_ = false;
  int64_t interval_start_ns_ = 0, interval_wait_ns_ = 0, interval_busy_ns_ = 0;
  int64_t interval_window_ns_ = 0;
  int64_t interval_samples_ = 0;

  // Stats (guarded by mutex_ except the atomics).
  std::atomic<int64_t> read_ns_{0}, decode_ns_{0}, transform_ns_{0}, collate_ns_{0};
  std::array<std::atomic<int64_t>, 4> scales_{};  // LoaderStats::scales
  std::atomic<double> device_share_{1.0};
  int64_t wait_ns_ = 0, delivered_ = 0, batches_ = 0, skipped_ = 0, pass_skipped_ = 0;
  int64_t missing_ = 0, replaced_ = 0;
  int64_t carried_ = 0, dropped_ = 0, padded_ = 0;
  std::vector<SkippedSample> skipped_list_;

  std::vector<std::thread> workers_;
  int workers_prepared_ = 0;  // workers past their first reads of the environment (mutex_)
  // Of the pass in progress, from max_errors and max_error_fraction of its rank's samples; < 0:
  // none.
  int64_t error_budget_ = -1;
  int owner_pid_ = 0;  // the process whose threads these are
};

}  // namespace stoker::pipeline
