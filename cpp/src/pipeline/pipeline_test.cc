// The loader's contracts, through the C++ API alone (no Python): every sample once per epoch,
// the same bytes whatever the thread count, exact resume, disjoint ranks, error policies, and
// batches that stay intact while held.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "stoker/core/error.h"
#include "stoker/core/fault.h"
#include "stoker/core/random.h"
#include "stoker/decode/image_decoder.h"
#include "stoker/format/shard_writer.h"
#include "stoker/pipeline/loader.h"
#include "stoker/pipeline/sampler.h"

// Every getenv in this process goes through here (an executable's definition comes before
// libc's for the libraries it loads): while `watching`, calls from threads other than the one
// watching are counted. See Loader.WorkersReadNoEnvironmentOnceBuilt.
namespace getenv_watch {
std::atomic<bool> watching{false};
std::atomic<int> from_other_threads{0};
std::atomic<std::thread::id> watcher{};
}  // namespace getenv_watch

extern "C" char* getenv(const char* name) noexcept {
  using Getenv = char* (*)(const char*);
  static const auto real = reinterpret_cast<Getenv>(dlsym(RTLD_NEXT, "getenv"));
  if (getenv_watch::watching && std::this_thread::get_id() != getenv_watch::watcher.load())
    ++getenv_watch::from_other_threads;
  return real(name);
}

namespace stoker::pipeline {
namespace {

namespace fs = std::filesystem;

// A pack of `n` small JPEGs of varied sizes in `shards` shards (two by default); the samples in
// `corrupt` are garbage behind a JPEG signature.
class TestPack {
 public:
  explicit TestPack(int n, int corrupt_at = -1)
      : TestPack(n, corrupt_at < 0 ? std::set<int>{} : std::set<int>{corrupt_at}) {}
  TestPack(int n, const std::set<int>& corrupt, int shards = 2) {
    dir_ = fs::temp_directory_path() /
           ("stoker_pipeline_test_" + std::to_string(::getpid()) + "_" + std::to_string(count_++));
    fs::create_directories(dir_);
    std::string shards_json;
    const int per_shard = (n + shards - 1) / shards;
    for (int s = 0, i = 0; i < n; ++s) {
      const std::string tar = "shard-" + std::to_string(s) + ".tar";
      const std::string idx = "shard-" + std::to_string(s) + ".idx";
      format::ShardWriter w((dir_ / tar).string(), (dir_ / idx).string());
      int in_shard = 0;
      for (; i < n && in_shard < per_shard; ++i, ++in_shard) {
        std::vector<uint8_t> bytes;
        if (corrupt.count(i)) {
          bytes = {0xFF, 0xD8, 0xFF, 0xDB, 0x00, 0x01, 0x02};
        } else {
          const int w_px = 80 + 37 * (i % 7), h_px = 60 + 23 * (i % 5);
          std::vector<uint8_t> px(static_cast<size_t>(w_px) * h_px * 3);
          for (int y = 0; y < h_px; ++y)
            for (int x = 0; x < w_px; ++x)
              for (int c = 0; c < 3; ++c)
                px[(y * w_px + x) * 3 + c] =
                    static_cast<uint8_t>((x * (c + 1) + y * 3 + i * 17) & 255);
          bytes = decode::encode_jpeg(px.data(), w_px, h_px, w_px * 3, 90);
        }
        char key[16];
        std::snprintf(key, sizeof key, "%08d", i);
        w.add(key, ImageFormat::kJpeg, bytes.data(), bytes.size(), i % 3);
      }
      w.finish();
      if (!shards_json.empty()) shards_json += ",";
      shards_json += R"({"tar": ")" + tar + R"(", "index": ")" + idx + R"(", "num_samples": )" +
                     std::to_string(in_shard) + "}";
    }
    std::ofstream(dir_ / "manifest.json")
        << R"({"format": "stoker-pack", "version": 1, "classes": ["a", "b", "c"], "num_samples": )"
        << n << R"(, "shards": [)" << shards_json << "]}";
    dataset_ = format::Dataset::open(dir_.string());
  }
  ~TestPack() { fs::remove_all(dir_); }
  std::shared_ptr<const format::Dataset> dataset() const { return dataset_; }
  fs::path shard_path(int s) const { return dir_ / ("shard-" + std::to_string(s) + ".tar"); }

 private:
  fs::path dir_;
  std::shared_ptr<const format::Dataset> dataset_;
  static inline int count_ = 0;
};

LoaderOptions small_options(int threads, int64_t batch_size = 8) {
  LoaderOptions o;
  o.batch_size = batch_size;
  TransformOptions transform;
  transform.size = 32;
  o.fields = classification_fields(transform, {});
  o.threads = threads;
  o.seed = 1234;
  return o;
}

struct Collected {
  std::vector<std::vector<uint8_t>> images;  // one per batch
  std::vector<int64_t> indices, labels;
};

Collected run_pass(Loader& loader, int64_t max_batches = -1) {
  Collected c;
  loader.begin();
  Batch b;
  const size_t per_image = 32 * 32 * 3;
  while ((max_batches < 0 || static_cast<int64_t>(c.images.size()) < max_batches) &&
         loader.next(b) == NextStatus::kBatch) {
    c.images.emplace_back(b.images(), b.images() + b.size * per_image);
    c.indices.insert(c.indices.end(), b.indices(), b.indices() + b.size);
    c.labels.insert(c.labels.end(), b.labels(), b.labels() + b.size);
  }
  return c;
}

constexpr ShuffleMode kModes[] = {ShuffleMode::kNone, ShuffleMode::kGlobal, ShuffleMode::kBlock};

// Shard sizes that divide no world size 2-8 evenly, in total or one by one: 13 shards, 201 samples.
const std::vector<int64_t> kShardSizes = {17, 9, 23, 11, 16, 19, 7, 21, 13, 18, 15, 12, 20};

TEST(Sampler, EverySampleOncePerEpochAndEpochsDiffer) {
  for (ShuffleMode mode : {ShuffleMode::kGlobal, ShuffleMode::kBlock}) {
    Sampler s(kShardSizes, {.batch_size = 10, .shuffle = mode, .shuffle_window = 3, .seed = 5});
    const auto e0 = s.rank_order(0), e1 = s.rank_order(1);
    EXPECT_EQ(std::set<int64_t>(e0.begin(), e0.end()).size(), 201u);
    EXPECT_NE(e0, e1);
    EXPECT_EQ(e0, s.rank_order(0));
    EXPECT_EQ(e0, s.global_order(0));  // one rank: G itself
    EXPECT_EQ(s.num_batches(), 21);
    EXPECT_EQ(s.batch_end(20), 201);
  }
  Sampler dropping(103, {.batch_size = 10, .drop_last = true});
  EXPECT_EQ(dropping.num_batches(), 10);
  Sampler ordered(5, {.batch_size = 2, .shuffle = ShuffleMode::kNone});
  EXPECT_EQ(ordered.rank_order(3), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

// States saved before the global order existed (version 1) resume exactly only if "global" is
// still the permutation that sampler made, dealt to ranks the way it dealt them.
TEST(Sampler, GlobalShuffleIsTheSamplerItReplaced) {
  const int64_t n = 101;
  for (int world : {1, 3, 4}) {
    for (int r = 0; r < world; ++r) {
      Sampler s(n, {.batch_size = 8,
                    .shuffle = ShuffleMode::kGlobal,
                    .seed = 9,
                    .rank = r,
                    .world_size = world});
      std::vector<int64_t> perm(n);
      std::iota(perm.begin(), perm.end(), 0);
      KeyedRandom rng(9, 0x5045524d, 2);
      for (int64_t i = n - 1; i > 0; --i)
        std::swap(perm[i], perm[rng.below(static_cast<uint64_t>(i) + 1)]);
      std::vector<int64_t> old;
      for (int64_t k = 0; k < (n + world - 1) / world; ++k)
        old.push_back(perm[(k * world + r) % n]);
      EXPECT_EQ(s.rank_order(2), old) << "world " << world << " rank " << r;
    }
  }
}

TEST(Sampler, GlobalOrderDoesNotDependOnWorldSizeOrRank) {
  for (ShuffleMode mode : kModes) {
    const Sampler one(kShardSizes, {.shuffle = mode, .shuffle_window = 4, .seed = 3});
    const auto g = one.global_order(7);
    for (int world = 2; world <= 8; ++world)
      for (int r = 0; r < world; ++r) {
        const Sampler s(kShardSizes, {.batch_size = 5,
                                      .shuffle = mode,
                                      .shuffle_window = 4,
                                      .seed = 3,
                                      .drop_last = (r % 2) == 1,
                                      .rank = r,
                                      .world_size = world});
        EXPECT_EQ(s.global_order(7), g);
      }
    // ...but it does depend on the seed, and under kBlock on the window.
    const Sampler other_seed(kShardSizes, {.shuffle = mode, .shuffle_window = 4, .seed = 4});
    const Sampler other_window(kShardSizes, {.shuffle = mode, .shuffle_window = 5, .seed = 3});
    if (mode != ShuffleMode::kNone) {
      EXPECT_NE(other_seed.global_order(7), g);
    }
    if (mode == ShuffleMode::kBlock) {
      EXPECT_NE(other_window.global_order(7), g);
    }
  }
}

// Every rank the same number of batches; the ranks together take exactly G[start..N), plus
// (without drop_last) the padding, which wraps to G's first positions; with
// drop_last exactly G[start, start + per_rank * W). Batches interleave: after b batches each,
// the ranks have taken exactly G[start, consumed_after(start, b)).
TEST(Sampler, RanksTakeTheRestOfTheOrderInEqualShares) {
  for (ShuffleMode mode : kModes)
    for (bool drop_last : {false, true})
      for (int world = 1; world <= 8; ++world)
        for (int64_t start : {int64_t{0}, int64_t{37}, int64_t{190}}) {
          const SCOPED_TRACE(std::string("mode ") + std::to_string(static_cast<int>(mode)) +
                             " drop_last " + std::to_string(drop_last) + " world " +
                             std::to_string(world) + " start " + std::to_string(start));
          std::vector<Sampler> ranks;
          for (int r = 0; r < world; ++r)
            ranks.emplace_back(kShardSizes, SamplerOptions{.batch_size = 4,
                                                           .shuffle = mode,
                                                           .shuffle_window = 3,
                                                           .seed = 1,
                                                           .drop_last = drop_last,
                                                           .rank = r,
                                                           .world_size = world});
          const auto g = ranks[0].global_order(5);
          const int64_t remaining = 201 - start, per_rank = ranks[0].samples_per_rank(start);
          const int64_t batches = ranks[0].num_batches(start);
          std::vector<std::vector<int64_t>> orders;
          for (const Sampler& s : ranks) {
            orders.push_back(s.rank_order(5, start));
            EXPECT_EQ(static_cast<int64_t>(orders.back().size()), per_rank);
            EXPECT_EQ(s.num_batches(start), batches);
          }
          std::multiset<int64_t> got, want;
          for (const auto& o : orders) got.insert(o.begin(), o.end());
          const int64_t taken = drop_last ? per_rank * world : remaining;
          want.insert(g.begin() + start, g.begin() + start + taken);
          for (int64_t k = 0; k < per_rank * world - taken; ++k) want.insert(g[k % 201]);  // pad
          EXPECT_EQ(got, want);
          EXPECT_LT(drop_last ? remaining - taken : per_rank * world - remaining, world);
          for (int64_t b = 0; b <= batches; ++b) {
            const int64_t end = start + std::min<int64_t>(per_rank, b * 4) * world;
            EXPECT_EQ(ranks[0].consumed_after(start, b), std::min<int64_t>(end, 201));
            std::multiset<int64_t> first_b, prefix;
            for (const auto& o : orders)
              first_b.insert(o.begin(), o.begin() + std::min<int64_t>(per_rank, b * 4));
            for (int64_t p = start; p < end; ++p) prefix.insert(g[p % 201]);
            EXPECT_EQ(first_b, prefix) << "after " << b << " batches";
          }
        }
  EXPECT_THROW(Sampler(10, {.rank = 2, .world_size = 2}), Error);
  EXPECT_THROW(Sampler(3, {.drop_last = true, .world_size = 4}), Error);
  EXPECT_THROW(Sampler(10, {.shuffle = ShuffleMode::kBlock, .shuffle_window = 0}), Error);
}

// A state taken at one world size, resumed at another: every sample of the epoch is handed out
// exactly once, the padding apart.
TEST(Sampler, ElasticResumeNeitherLosesNorRepeatsASample) {
  for (ShuffleMode mode : {ShuffleMode::kGlobal, ShuffleMode::kBlock})
    for (int before : {4, 3})
      for (int after : {1, 2, 3, 4, 8})
        for (int64_t done : {0, 1, 3, 6}) {
          const SCOPED_TRACE("world " + std::to_string(before) + " -> " + std::to_string(after) +
                             " after " + std::to_string(done) + " batches");
          auto options = [&](int r, int world) {
            return SamplerOptions{.batch_size = 8,
                                  .shuffle = mode,
                                  .shuffle_window = 2,
                                  .seed = 11,
                                  .rank = r,
                                  .world_size = world};
          };
          std::multiset<int64_t> seen;
          for (int r = 0; r < before; ++r) {
            const auto o = Sampler(kShardSizes, options(r, before)).rank_order(4);
            seen.insert(o.begin(), o.begin() + std::min<int64_t>(o.size(), done * 8));
          }
          const int64_t consumed = Sampler(kShardSizes, options(0, before)).consumed_after(0, done);
          EXPECT_EQ(static_cast<int64_t>(seen.size()), consumed);
          // Rank r's k-th sample is position consumed + k * after + r; past the epoch's end it
          // is padding (counted apart: it repeats the epoch's first positions).
          const auto g = Sampler(kShardSizes, options(0, 1)).global_order(4);
          std::multiset<int64_t> rest;
          int64_t padded = 0;
          for (int r = 0; r < after; ++r) {
            const auto o = Sampler(kShardSizes, options(r, after)).rank_order(4, consumed);
            for (int64_t k = 0; k < static_cast<int64_t>(o.size()); ++k) {
              const int64_t position = consumed + k * after + r;
              if (position < 201) {
                rest.insert(o[k]);
              } else {
                EXPECT_EQ(o[k], g[position - 201]);
                ++padded;
              }
            }
          }
          EXPECT_LT(padded, after);
          EXPECT_EQ(static_cast<int64_t>(rest.size()), 201 - consumed);
          for (int64_t i : rest) EXPECT_EQ(seen.count(i), 0u) << "sample " << i << " twice";
          rest.insert(seen.begin(), seen.end());
          EXPECT_EQ(std::set<int64_t>(rest.begin(), rest.end()).size(), 201u);  // none lost
          EXPECT_EQ(rest.size(), 201u);                                         // none repeated
        }
}

// Block shuffle: each window is whole shards, shuffled within; a run of positions inside one
// window comes from at most shuffle_window shards, any run no longer than the shortest window from
// at most two windows' shards; and shards and samples really are permuted.
TEST(Sampler, BlockShuffleRampsUpTheEpochsFirstWindowOnly) {
  // 16 shards of 100 samples, windows of 8: the first window's first positions come from its
  // first shards (a cold cache decodes them while the others download); the second window's
  // from all of its shards at once.
  const std::vector<int64_t> sizes(16, 100);
  for (uint64_t seed : {0, 1, 2, 3}) {
    const Sampler s(sizes, {.shuffle = ShuffleMode::kBlock, .shuffle_window = 8, .seed = seed});
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      const auto g = s.global_order(epoch);
      std::set<int64_t> ramped, mixed;
      for (int64_t i = 0; i < 40; ++i) ramped.insert(g[i] / 100);
      for (int64_t i = 800; i < 840; ++i) mixed.insert(g[i] / 100);
      EXPECT_LE(ramped.size(), 3u) << "seed " << seed << " epoch " << epoch;
      EXPECT_GE(mixed.size(), 6u) << "seed " << seed << " epoch " << epoch;
      // The shards enter one after another: the mean position of a shard's samples (400 in a
      // uniform shuffle) grows with the order in which the shards first appear.
      std::vector<int64_t> entered;
      std::map<int64_t, double> mean;
      for (int64_t i = 0; i < 800; ++i) {
        const int64_t shard = g[i] / 100;
        if (!mean.count(shard)) entered.push_back(shard);
        mean[shard] += static_cast<double>(i) / 100;
      }
      ASSERT_EQ(entered.size(), 8u);
      for (size_t k = 2; k < entered.size(); ++k)
        EXPECT_LT(mean[entered[k - 2]], mean[entered[k]]) << "shard " << k;
      EXPECT_LT(mean[entered[0]], 300) << "the first shard is most of the window's start";
      EXPECT_GT(mean[entered[7]], 600) << "the last shard comes near the window's end";
    }
  }
}

TEST(Sampler, BlockShuffleReadsFewShardsAtATime) {
  std::vector<int64_t> shard_of;
  for (size_t s = 0; s < kShardSizes.size(); ++s)
    shard_of.insert(shard_of.end(), kShardSizes[s], s);
  for (int64_t window : {1, 3, 4, 13, 20}) {
    const Sampler s(kShardSizes,
                    {.shuffle = ShuffleMode::kBlock, .shuffle_window = window, .seed = 2});
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      const auto g = s.global_order(epoch);
      int64_t at = 0, shortest = 201;
      while (at < 201) {
        std::set<int64_t> in_window;
        int64_t size = 0;
        // A window ends where its shards' samples are all taken.
        while (at < 201 && (static_cast<int64_t>(in_window.size()) < window ||
                            in_window.count(shard_of[g[at]]))) {
          in_window.insert(shard_of[g[at]]);
          ++at, ++size;
          int64_t need = 0;
          for (int64_t sh : in_window) need += kShardSizes[sh];
          if (need == size && static_cast<int64_t>(in_window.size()) == window) break;
        }
        int64_t need = 0;
        for (int64_t sh : in_window) need += kShardSizes[sh];
        EXPECT_EQ(need, size) << "a window holds whole shards";
        EXPECT_LE(static_cast<int64_t>(in_window.size()), window);
        shortest = std::min(shortest, size);
      }
      for (int64_t first = 0; first + shortest <= 201; ++first) {
        std::set<int64_t> run;
        for (int64_t i = first; i < first + shortest; ++i) run.insert(shard_of[g[i]]);
        EXPECT_LE(static_cast<int64_t>(run.size()), 2 * window);
      }
      if (window > 1 && window < 13) {  // the second window (the first ramps: below)
        std::set<int64_t> first_window;
        int64_t second = 0;  // where the second window starts
        for (int64_t i = 0; static_cast<int64_t>(first_window.size()) < window; ++i) {
          if (first_window.insert(shard_of[g[i]]).second) second += kShardSizes[shard_of[g[i]]];
        }
        std::set<int64_t> first_shards;  // shards of the second window's first positions
        for (int64_t i = second; i < second + 10; ++i) first_shards.insert(shard_of[g[i]]);
        EXPECT_GT(first_shards.size(), 1u) << "samples mixed across the window's shards";
      }
      EXPECT_NE(g, s.global_order(epoch + 1));
    }
    std::vector<int64_t> shard_order;  // the epoch-0 order of shards' first appearances
    for (int64_t i : s.global_order(0))
      if (std::find(shard_order.begin(), shard_order.end(), shard_of[i]) == shard_order.end())
        shard_order.push_back(shard_of[i]);
    if (window < 13) {
      EXPECT_FALSE(std::is_sorted(shard_order.begin(), shard_order.end()));
    }
  }
}

TEST(Loader, EverySampleExactlyOnceWithLabels) {
  TestPack pack(45);
  Loader loader(pack.dataset(), small_options(2));
  EXPECT_EQ(loader.num_batches(), 6);
  const Collected c = run_pass(loader);
  ASSERT_EQ(c.indices.size(), 45u);
  EXPECT_EQ(std::set<int64_t>(c.indices.begin(), c.indices.end()).size(), 45u);
  for (size_t i = 0; i < c.indices.size(); ++i) EXPECT_EQ(c.labels[i], c.indices[i] % 3);
  EXPECT_EQ(loader.state().epoch, 1);  // a finished pass advances the epoch
  const LoaderStats st = loader.stats();
  EXPECT_EQ(st.samples, 45);
  EXPECT_GT(st.decode_s, 0);
}

// What a consumer pulling ahead reads to stop short of the next() that ends the pass (and the
// epoch with it): the batches left, counted down to 0 by each batch, the pass's end and a resume.
TEST(Loader, BatchesLeftCountsDownToTheEndOfThePass) {
  TestPack pack(45);
  Loader loader(pack.dataset(), small_options(2));
  EXPECT_EQ(loader.batches_left(), 0);  // no pass yet
  loader.begin();
  Batch b;
  for (int64_t left = 6; left > 0; --left) {
    EXPECT_EQ(loader.batches_left(), left);
    ASSERT_EQ(loader.next(b), NextStatus::kBatch);
  }
  EXPECT_EQ(loader.batches_left(), 0);
  EXPECT_EQ(loader.state().epoch, 0);  // the last batch taken, the pass not yet ended
  EXPECT_EQ(loader.next(b), NextStatus::kEnd);
  EXPECT_EQ(loader.state().epoch, 1);
  loader.load_state({.epoch = 1, .samples_consumed = 16, .batches_done = 2});
  loader.begin();
  EXPECT_EQ(loader.batches_left(), 4);  // a resumed pass has the rest of the epoch
}

TEST(Loader, SameBytesWithOneOrManyThreads) {
  TestPack pack(40);
  Loader one(pack.dataset(), small_options(1));
  Loader many(pack.dataset(), small_options(4));
  const Collected a = run_pass(one), b = run_pass(many);
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_EQ(a.images, b.images);
  // Training augmentation really varies per epoch.
  const Collected a2 = run_pass(one);
  EXPECT_NE(a.indices, a2.indices);
}

TEST(Loader, ResumeMidEpochGivesExactlyTheRest) {
  TestPack pack(50);
  Loader full(pack.dataset(), small_options(2));
  full.set_epoch(3);
  const Collected whole = run_pass(full);

  Loader first(pack.dataset(), small_options(3));
  first.set_epoch(3);
  const Collected head = run_pass(first, 2);
  const LoaderState saved = first.state();
  EXPECT_EQ(saved.epoch, 3);
  EXPECT_EQ(saved.batches_done, 2);

  Loader second(pack.dataset(), small_options(1));
  second.load_state(saved);
  const Collected tail = run_pass(second);
  std::vector<int64_t> joined = head.indices;
  joined.insert(joined.end(), tail.indices.begin(), tail.indices.end());
  EXPECT_EQ(joined, whole.indices);
  std::vector<std::vector<uint8_t>> images = head.images;
  images.insert(images.end(), tail.images.begin(), tail.images.end());
  EXPECT_EQ(images, whole.images);
}

// Through the loader: a state taken on rank 0 of 4 resumes on 2, 4 and 8 ranks (each rank its own
// Loader, as each process of a job has) with every sample of the epoch once, the padding apart.
TEST(Loader, ElasticResumeAcrossWorldSizes) {
  TestPack pack(61, {}, 7);  // 7 shards of 9 (the last 7): neither count divides 2, 4 or 8
  auto options = [](int rank, int world) {
    LoaderOptions o = small_options(2, 4);
    o.shuffle = ShuffleMode::kBlock;
    o.shuffle_window = 2;
    o.rank = rank;
    o.world_size = world;
    return o;
  };
  for (int after : {2, 4, 8}) {
    SCOPED_TRACE("4 -> " + std::to_string(after) + " ranks");
    std::multiset<int64_t> seen;
    LoaderState saved;
    for (int r = 0; r < 4; ++r) {
      Loader rank(pack.dataset(), options(r, 4));
      rank.set_epoch(2);
      const Collected head = run_pass(rank, 2);
      seen.insert(head.indices.begin(), head.indices.end());
      if (r == 0) saved = rank.state();
    }
    EXPECT_EQ(saved.epoch, 2);
    EXPECT_EQ(saved.samples_consumed, 2 * 4 * 4);
    EXPECT_EQ(saved.batches_done, 2);
    std::multiset<int64_t> rest;
    int64_t batches = -1;
    for (int r = 0; r < after; ++r) {
      Loader rank(pack.dataset(), options(r, after));
      rank.load_state(saved);
      const Collected tail = run_pass(rank);
      if (batches >= 0) {
        EXPECT_EQ(static_cast<int64_t>(tail.images.size()), batches);
      }
      batches = static_cast<int64_t>(tail.images.size());
      for (size_t k = 0; k < tail.indices.size(); ++k)  // padding: past the epoch's end
        if (32 + static_cast<int64_t>(k) * after + r < 61) rest.insert(tail.indices[k]);
      EXPECT_EQ(rank.state().epoch, 3);  // the resumed pass finished the epoch
    }
    EXPECT_EQ(rest.size(), 61u - 32u);
    for (int64_t i : rest) EXPECT_EQ(seen.count(i), 0u) << "sample " << i << " repeated";
    rest.insert(seen.begin(), seen.end());
    EXPECT_EQ(std::set<int64_t>(rest.begin(), rest.end()).size(), 61u);  // none lost
    EXPECT_EQ(rest.size(), 61u);                                         // none repeated
  }
}

// A loader built before the process group exists (Lightning's DDP launch builds it at the top of
// the script) takes its ranks when a pass starts: after set_ranks, each rank's passes are those
// of a loader built with its ranks, a pass in progress keeps the ranks it began with, and a
// loaded state resumes at the new world size.
TEST(Loader, RanksSetBeforeAPassGiveThatRanksShare) {
  TestPack pack(61, {}, 7);
  auto options = [](int rank, int world) {
    LoaderOptions o = small_options(2, 4);
    o.rank = rank;
    o.world_size = world;
    return o;
  };
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + " of 3");
    Loader built(pack.dataset(), options(r, 3));
    built.set_epoch(1);
    const Collected expected = run_pass(built);

    Loader late(pack.dataset(), options(0, 1));
    EXPECT_EQ(late.num_batches(), 16);  // 61 samples in batches of 4
    late.set_ranks(r, 3);
    EXPECT_EQ(late.num_batches(), built.num_batches());
    EXPECT_EQ(late.samples_per_rank(), 21);
    EXPECT_EQ(late.options().rank, r);
    late.set_epoch(1);
    const Collected got = run_pass(late);
    EXPECT_EQ(got.indices, expected.indices);
    EXPECT_EQ(got.images, expected.images);
  }
  // Mid-pass: the pass goes on at its own ranks; the state it gives resumes at the new ones.
  Loader whole(pack.dataset(), options(0, 1));
  const Collected all = run_pass(whole);
  Loader moving(pack.dataset(), options(0, 1));
  moving.begin();
  Batch b;
  ASSERT_EQ(moving.next(b), NextStatus::kBatch);
  moving.set_ranks(1, 2);
  ASSERT_EQ(moving.next(b), NextStatus::kBatch);
  EXPECT_EQ(std::vector<int64_t>(b.indices(), b.indices() + b.size),
            std::vector<int64_t>(all.indices.begin() + 4, all.indices.begin() + 8));
  const LoaderState saved = moving.state();
  EXPECT_EQ(saved.samples_consumed, 8);
  moving.load_state(saved);
  const Collected rest = run_pass(moving);
  // Rank 1 of 2 takes positions 9, 11, 13, ... of the epoch's order, padded to 27 samples.
  ASSERT_EQ(rest.indices.size(), 27u);
  for (size_t k = 0; k < 26; ++k) EXPECT_EQ(rest.indices[k], all.indices[8 + 1 + 2 * k]);
  EXPECT_THROW(moving.set_ranks(2, 2), Error);
  EXPECT_THROW(moving.set_ranks(0, 0), Error);
}

TEST(Loader, BlockShuffleGivesTheSameBytesWithOneOrManyThreads) {
  TestPack pack(40, {}, 5);
  LoaderOptions o1 = small_options(1), o3 = small_options(3);
  o1.shuffle = o3.shuffle = ShuffleMode::kBlock;
  o1.shuffle_window = o3.shuffle_window = 2;
  Loader one(pack.dataset(), o1), many(pack.dataset(), o3);
  const Collected a = run_pass(one), b = run_pass(many);
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_EQ(a.images, b.images);
  EXPECT_EQ(a.indices, one.sampler()->global_order(0));
}

TEST(Loader, HeldBatchStaysIntactWhileTheLoaderMovesOn) {
  TestPack pack(64);
  LoaderOptions o = small_options(2);
  o.prefetch = 1;
  Loader loader(pack.dataset(), o);
  loader.begin();
  Batch held;
  ASSERT_EQ(loader.next(held), NextStatus::kBatch);
  const std::vector<uint8_t> copy(held.images(), held.images() + held.size * 32 * 32 * 3);
  Batch b;
  int n = 0;
  while (loader.next(b) == NextStatus::kBatch) ++n;
  EXPECT_EQ(n, 7);
  EXPECT_EQ(std::vector<uint8_t>(held.images(), held.images() + held.size * 32 * 32 * 3), copy);
}

// keep_slots is what the device feed relies on to page-lock each slot once: a slot is never
// freed while the loader lives, so its address stays valid, and the slots number only the most
// batches ever in use at once. Without it, slots beyond the prefetch window are freed.
TEST(Loader, KeptSlotsStayAtTheirAddressesAndAreBounded) {
  TestPack pack(96);
  for (const bool keep : {false, true}) {
    LoaderOptions o = small_options(2);
    o.prefetch = 2;
    o.keep_slots = keep;
    Loader loader(pack.dataset(), o);
    EXPECT_EQ(loader.slot_bytes() % 4096, 0u);
    EXPECT_GE(loader.slot_bytes(), 8u * (32 * 32 * 3 + 2 * sizeof(int64_t)));
    std::set<const uint8_t*> seen;
    for (int epoch = 0; epoch < 3; ++epoch) {
      loader.begin();
      // Hold up to three batches at once, as the device feed does while copies are in flight.
      std::vector<Batch> held(3);
      int64_t n = 0;
      Batch b;
      while (loader.next(b) == NextStatus::kBatch) {
        seen.insert(b.images());
        // Labels and indices live in the same block, after the images.
        EXPECT_GE(reinterpret_cast<const uint8_t*>(b.labels()), b.images() + b.size * 32 * 32 * 3);
        EXPECT_LE(reinterpret_cast<const uint8_t*>(b.indices() + b.size),
                  b.images() + loader.slot_bytes());
        held[static_cast<size_t>(n++ % 3)] = std::move(b);
      }
    }
    // The window (2), the three held and the one being handed over.
    EXPECT_LE(loader.slots_allocated(), 6u);
    if (keep) {
      EXPECT_EQ(seen.size(), loader.slots_allocated()) << "a kept slot was freed and remade";
    } else {
      EXPECT_LE(loader.slots_allocated(), 3u) << "idle slots beyond prefetch + 1 were kept";
    }
  }
}

// What `stoker.diagnose` reports as page-cache residency: a shard just read whole is resident.
TEST(Dataset, PageCacheCountsAShardJustRead) {
  TestPack pack(20);
  const auto shards = pack.dataset()->page_cache();
  ASSERT_EQ(shards.size(), 2u);
  for (const auto& s : shards) {
    std::ifstream in(s.path, std::ios::binary);
    std::vector<char> all(s.bytes);
    in.read(all.data(), static_cast<std::streamsize>(all.size()));
    ASSERT_EQ(static_cast<uint64_t>(in.gcount()), s.bytes);
  }
  for (const auto& s : pack.dataset()->page_cache()) {
    EXPECT_GT(s.bytes, 0u);
    EXPECT_EQ(s.resident, s.bytes) << s.path;
  }
}

// A loader with simulated read latency spends it in the read stage (what `diagnose` calls I/O).
// The stage times are wall time: a sleep is a lower bound, and 320 ms of reads against the decode
// and transform of 16 images under 300 px (2 ms; 16 ms under TSan) leaves room for a busy
// machine to stretch those twentyfold; latency counted in the decode stage puts 320 ms there.
TEST(Loader, SimulatedReadLatencyIsCountedAsRead) {
  TestPack pack(16);
  LoaderOptions o = small_options(2);
  o.read_latency_us = 20000;
  Loader loader(pack.dataset(), o);
  run_pass(loader);
  const LoaderStats s = loader.stats();
  EXPECT_GE(s.read_s, 16 * 0.020 * 0.9);
  EXPECT_GT(s.read_s, s.decode_s + s.transform_s);
}

// Under autotune the workers that are parked take no work, and the batches are the same as with
// a fixed thread count: the tuner changes speed, never output.
TEST(Loader, AutotunedLoaderGivesTheSameBatches) {
  TestPack pack(64);
  LoaderOptions fixed = small_options(2);
  LoaderOptions tuned = small_options(4);
  tuned.autotune = true;
  Loader a(pack.dataset(), fixed), b(pack.dataset(), tuned);
  EXPECT_EQ(b.max_threads(), 4);
  EXPECT_EQ(b.threads(), 4);  // the tuner starts at its budget
  const Collected ca = run_pass(a), cb = run_pass(b);
  EXPECT_EQ(ca.images, cb.images);
  EXPECT_EQ(ca.indices, cb.indices);
  EXPECT_EQ(b.stats().prefetch, 2);
}

// A slow consumer: the tuner sheds threads while passes run (the path TSan watches), and the
// batches stay those of a fixed thread count. The tuner decides once an interval (0.25 s), from
// whether the consumer waited: on a busy machine, or under TSan, workers kept from a core can
// make it wait in every interval of the first passes. So passes run on, past the first four,
// until a thread has been shed (one interval, on a quiet machine), for as long as a hang would
// take to tell; a loader that never applies the tuner's answer runs into that bound.
TEST(Loader, AutotuneShedsThreadsForASlowConsumerWithoutChangingBatches) {
  TestPack pack(48);
  LoaderOptions tuned = small_options(4);
  tuned.autotune = true;
  Loader fixed(pack.dataset(), small_options(1)), loader(pack.dataset(), tuned);
  const Collected expected = run_pass(fixed);
  const auto hang = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int pass = 0; pass < 4 || loader.threads() == 4; ++pass) {
    ASSERT_TRUE(std::chrono::steady_clock::now() < hang)
        << "no thread shed in " << pass << " passes";
    loader.set_epoch(0);
    loader.begin();
    Batch b;
    Collected got;
    while (loader.next(b) == NextStatus::kBatch) {
      got.indices.insert(got.indices.end(), b.indices(), b.indices() + b.size);
      got.images.emplace_back(b.images(), b.images() + b.size * 32 * 32 * 3);
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
    }
    EXPECT_EQ(got.indices, expected.indices);
    EXPECT_EQ(got.images, expected.images);
  }
  const auto steps = loader.tuning();
  ASSERT_FALSE(steps.empty());
  EXPECT_LT(loader.threads(), 4);
  EXPECT_EQ(loader.threads(), steps.back().next.threads);  // the tuner's last answer is applied
  EXPECT_EQ(loader.max_threads(), 4);
  for (const TuneStep& t : steps) EXPECT_LE(t.next.threads, 4);
}

TEST(Loader, RaiseNamesShardAndKeyAndSkipCounts) {
  TestPack pack(20, /*corrupt_at=*/13);
  LoaderOptions o = small_options(2, 5);
  o.shuffle = ShuffleMode::kNone;
  {
    Loader loader(pack.dataset(), o);
    loader.begin();
    Batch b;
    int ok = 0;
    try {
      while (loader.next(b) == NextStatus::kBatch) ++ok;
      FAIL() << "the corrupt sample must raise";
    } catch (const Error& e) {
      EXPECT_EQ(ok, 2);  // batches 0 and 1 come first, then batch 2 holds sample 13
      EXPECT_EQ(e.key(), "00000013");
      EXPECT_EQ(e.shard(), "shard-1.tar");
      EXPECT_EQ(e.code(), ErrorCode::kCorruptData);
    }
  }
  o.on_error = ErrorPolicy::kSkip;
  Loader loader(pack.dataset(), o);
  const Collected c = run_pass(loader);
  EXPECT_EQ(c.indices.size(), 19u);
  EXPECT_EQ(std::count(c.indices.begin(), c.indices.end(), 13), 0);
  const LoaderStats st = loader.stats();
  EXPECT_EQ(st.skipped, 1);
  ASSERT_EQ(st.skipped_samples.size(), 1u);
  EXPECT_EQ(st.skipped_samples[0].index, 13);
  EXPECT_EQ(st.skipped_samples[0].key, "00000013");
}

TEST(Loader, AbandonedPassAndCloseDoNotHang) {
  TestPack pack(64);
  Loader loader(pack.dataset(), small_options(2));
  loader.begin();
  Batch b;
  ASSERT_EQ(loader.next(b), NextStatus::kBatch);
  loader.begin();  // restart mid-pass
  const Collected c = run_pass(loader);
  EXPECT_EQ(c.indices.size(), 64u);
  loader.begin();
  ASSERT_EQ(loader.next(b), NextStatus::kBatch);
  loader.close();
  EXPECT_EQ(loader.next(b), NextStatus::kEnd);
}

size_t tasks_of_this_process() {
  return static_cast<size_t>(
      std::distance(fs::directory_iterator("/proc/self/task"), fs::directory_iterator{}));
}

// Each worker thread made to fail in turn as it starts: the constructor throws that error with
// the threads it started already joined (a joinable std::thread destroyed would abort), and a
// loader built afterwards works.
TEST(Loader, AThreadRefusedEndsThoseStartedAndTheConstructorThrows) {
  TestPack pack(40);
  // A thread started and joined first: TSan starts a thread of its own with the process's first
  // one, which the count must not take for a worker left behind.
  std::thread([] {}).join();
  const size_t before = tasks_of_this_process();
  for (int nth = 1; nth <= 3; ++nth) {
    fault::arm("thread", nth);
    try {
      Loader loader(pack.dataset(), small_options(3));
      ADD_FAILURE() << "thread " << nth << " refused, yet the loader was built";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("injected fault: thread #" + std::to_string(nth)),
                std::string::npos)
          << e.what();
    }
    fault::disarm();
    EXPECT_TRUE(fault::fired());
    EXPECT_EQ(tasks_of_this_process(), before);
  }
  Loader loader(pack.dataset(), small_options(3));
  EXPECT_EQ(run_pass(loader).indices.size(), 40u);
}

// A batch buffer refused while the workers run ahead of the consumer fails the pass at that
// batch: the batches before it are handed out and the pass's position is the consumer's until
// then (a checkpoint taken meanwhile resumes there, not at the epoch's start); a new pass is
// whole, the failure of the one abandoned forgotten.
TEST(Loader, ABatchBufferRefusedAheadFailsThePassAtItsOwnBatch) {
  TestPack pack(48);
  Loader plain(pack.dataset(), small_options(2));
  const Collected whole = run_pass(plain);
  Loader loader(pack.dataset(), small_options(2));
  fault::arm("batch_alloc", 2);  // batch 1's: batch 0 holds the first until it is consumed
  loader.begin();
  for (int i = 0; i < 5000 && !fault::fired(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  fault::disarm();
  ASSERT_TRUE(fault::fired());
  Batch b;
  ASSERT_EQ(loader.next(b), NextStatus::kBatch);
  EXPECT_EQ(std::vector<int64_t>(b.indices(), b.indices() + b.size),
            std::vector<int64_t>(whole.indices.begin(), whole.indices.begin() + 8));
  EXPECT_EQ(loader.state().batches_done, 1);
  EXPECT_EQ(loader.state().samples_consumed, 8);
  try {
    loader.next(b);
    ADD_FAILURE() << "batch 1 had no buffer, yet it was handed out";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected fault: batch_alloc #2"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(loader.next(b), NextStatus::kEnd);  // the pass ended there
  EXPECT_EQ(run_pass(loader).indices, whole.indices);
  // Refused ahead of a pass the consumer abandons: the next pass does not inherit the failure.
  Loader fresh(pack.dataset(), small_options(2));
  fault::arm("batch_alloc", 2);
  fresh.begin();
  for (int i = 0; i < 5000 && !fault::fired(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  fault::disarm();
  ASSERT_TRUE(fault::fired());
  EXPECT_EQ(run_pass(fresh).indices, whole.indices);
}

TEST(Loader, ErrorBudgetTripsAtTheSameSampleWhateverTheThreads) {
  // Samples 3, 9, 14 and 15 fail; a budget of 2 is exceeded by the third, 14, in batch order.
  for (int threads : {1, 3}) {
    TestPack pack(24, std::set<int>{3, 9, 14, 15});
    LoaderOptions o = small_options(threads, 4);
    o.shuffle = ShuffleMode::kNone;
    o.on_error = ErrorPolicy::kSkip;
    o.max_errors = 2;
    Loader loader(pack.dataset(), o);
    loader.begin();
    Batch b;
    int batches = 0;
    try {
      while (loader.next(b) == NextStatus::kBatch) ++batches;
      FAIL() << "the third failure must exceed max_errors=2";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kErrorBudget);
      EXPECT_EQ(e.key(), "00000014");
      EXPECT_NE(e.reason().find("4 samples of this pass failed"), std::string::npos) << e.reason();
      EXPECT_EQ(batches, 3);  // batches 0-2 (samples 0-11); batch 3 holds 14
    }
    EXPECT_EQ(loader.stats().pass_skipped, 4);  // 14 and 15 share the batch that tripped it

    // A budget of 4 lets the whole pass through; a new pass starts from zero again.
    o.max_errors = 4;
    Loader within(pack.dataset(), o);
    for (int pass = 0; pass < 2; ++pass) {
      EXPECT_EQ(run_pass(within).indices.size(), 20u);
      EXPECT_EQ(within.stats().pass_skipped, 4);
    }
    EXPECT_EQ(within.stats().skipped, 8);
  }
}

// A remote worker's share of a pass: a few batches from a loaded state (begin(max_batches)).
// Chunks of 2 batches, each from its own state, put together give the whole pass bit for bit,
// at any world size, order and drop_last, and a chunk's pass ends after its batches.
TEST(Loader, PassesOfAFewBatchesFromLoadedStatesMakeTheWholePass) {
  TestPack pack(43, std::set<int>{}, 5);
  for (ShuffleMode mode : kModes) {
    for (bool drop_last : {false, true}) {
      for (int world : {1, 3}) {
        LoaderOptions o = small_options(2, 4);
        o.shuffle = mode;
        o.shuffle_window = 2;
        o.drop_last = drop_last;
        o.world_size = world;
        o.rank = world - 1;
        Loader full(pack.dataset(), o);
        full.set_epoch(5);
        const Collected whole = run_pass(full);
        const int64_t steps = full.num_batches();
        Loader chunks(pack.dataset(), o);
        Collected joined;
        const int64_t per_step = o.batch_size * world;
        for (int64_t first = 0; first < steps; first += 2) {
          chunks.load_state({5, std::min<int64_t>(first * per_step, 43), 0});
          chunks.begin(2);
          Batch b;
          int64_t got = 0;
          while (chunks.next(b) == NextStatus::kBatch) {
            EXPECT_EQ(b.batch_number, first + got);
            joined.images.emplace_back(b.images(), b.images() + b.size * 32 * 32 * 3);
            joined.indices.insert(joined.indices.end(), b.indices(), b.indices() + b.size);
            ++got;
          }
          EXPECT_EQ(got, std::min<int64_t>(2, steps - first));
        }
        EXPECT_EQ(joined.indices, whole.indices) << "world " << world;
        EXPECT_EQ(joined.images, whole.images) << "world " << world;
      }
    }
  }
}

// The trainer's side of remote workers: a loader that loads nothing (load_samples=false) and is
// told what failed elsewhere counts it as the loader that loaded the samples does, and trips
// max_errors at the same batch, naming the same sample.
TEST(Loader, FailuresAccountedElsewhereCountAndTripTheBudgetAsTheLoadersOwn) {
  TestPack pack(24, std::set<int>{3, 9, 14, 15});
  LoaderOptions o = small_options(2, 4);
  o.shuffle = ShuffleMode::kNone;
  o.on_error = ErrorPolicy::kSkip;
  o.max_errors = 2;
  Loader local(pack.dataset(), o);
  local.begin();
  Batch b;
  int local_batches = 0;
  std::string local_reason, local_key;
  try {
    while (local.next(b) == NextStatus::kBatch) ++local_batches;
  } catch (const Error& e) {
    local_reason = e.reason();
    local_key = e.key();
  }
  ASSERT_FALSE(local_key.empty());

  LoaderOptions worker_options = o;
  worker_options.max_errors = -1;  // a worker has no budget: the trainer keeps it
  Loader worker(pack.dataset(), worker_options);
  worker.begin();
  std::vector<std::vector<SkippedSample>> failed(6);  // per batch
  size_t seen = 0;
  while (worker.next(b) == NextStatus::kBatch) {
    const auto more = worker.skipped_since(seen);
    seen += more.size();
    failed[static_cast<size_t>(b.batch_number)] = more;
  }

  LoaderOptions index_options = o;
  index_options.load_samples = false;
  Loader trainer(pack.dataset(), index_options);
  trainer.begin();
  int trainer_batches = 0;
  try {
    while (trainer.next(b) == NextStatus::kBatch) {
      trainer.account_elsewhere(failed[static_cast<size_t>(b.batch_number)], 0);
      ++trainer_batches;
    }
    FAIL() << "the failures told must exceed max_errors=2";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kErrorBudget);
    EXPECT_EQ(e.key(), local_key);
    EXPECT_EQ(e.reason(), local_reason);
  }
  EXPECT_EQ(trainer_batches, local_batches);
  const LoaderStats mine = trainer.stats(), theirs = local.stats();
  EXPECT_EQ(mine.samples, theirs.samples);
  EXPECT_EQ(mine.skipped, theirs.skipped);
  EXPECT_EQ(mine.pass_skipped, theirs.pass_skipped);
  ASSERT_EQ(mine.skipped_samples.size(), theirs.skipped_samples.size());
  for (size_t k = 0; k < mine.skipped_samples.size(); ++k) {
    EXPECT_EQ(mine.skipped_samples[k].index, theirs.skipped_samples[k].index);
    EXPECT_EQ(mine.skipped_samples[k].reason, theirs.skipped_samples[k].reason);
  }
  EXPECT_TRUE(trainer.stats(false).skipped_samples.empty());  // the counts alone
  EXPECT_THROW(local.account_elsewhere({}, 0), Error);        // it loads its own samples
}

TEST(Loader, ErrorBudgetAsAFractionOfThePass) {
  TestPack pack(40, std::set<int>{1, 2, 3, 4});
  LoaderOptions o = small_options(2, 8);
  o.on_error = ErrorPolicy::kSkip;
  o.max_error_fraction = 0.1;  // 4 of 40 allowed
  Loader ok(pack.dataset(), o);
  EXPECT_EQ(run_pass(ok).indices.size(), 36u);
  o.max_error_fraction = 0.09;  // 3 allowed
  Loader over(pack.dataset(), o);
  EXPECT_THROW(run_pass(over), Error);
  o.max_error_fraction = 1.0;
  EXPECT_THROW(Loader(pack.dataset(), o), Error);
}

TEST(Loader, ShardTruncatedAfterOpeningIsNamedNotACrash) {
  TestPack pack(20);
  LoaderOptions o = small_options(2, 4);
  o.shuffle = ShuffleMode::kNone;
  Loader loader(pack.dataset(), o);
  EXPECT_EQ(run_pass(loader).indices.size(), 20u);
  const fs::path shard = pack.shard_path(1);
  fs::resize_file(shard, fs::file_size(shard) / 2);
  try {
    loader.begin();
    FAIL() << "a truncated shard must refuse the next pass";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIO);
    EXPECT_NE(e.shard().find("shard-1.tar"), std::string::npos) << e.what();
    EXPECT_NE(e.reason().find("truncated after it was opened"), std::string::npos) << e.what();
  }
  // Reading a sample past the new end names the shard too (the check at begin() is per pass; a
  // shard cut mid-pass is found by the read itself).
  const auto& file = pack.dataset()->file(19, 0);
  std::vector<uint8_t> bytes;
  std::vector<format::MemberRef> members;
  pack.dataset()->members(19, members);
  const auto& member = members.front();
  try {
    file->read(member.offset, member.size, bytes);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIO);
    EXPECT_NE(std::string(e.what()).find("shard-1.tar"), std::string::npos) << e.what();
  }
}

TEST(Loader, ForkedChildGetsItsOwnWorkersAndTheSameBatches) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "TSan does not support starting threads after a multi-threaded fork";
#endif
  TestPack pack(30);
  LoaderOptions o = small_options(2, 4);
  Loader loader(pack.dataset(), o);
  // Leave the parent mid-pass, its workers busy, when the child is forked.
  loader.begin();
  Batch held;
  ASSERT_EQ(loader.next(held), NextStatus::kBatch);
  const Collected reference = [&] {
    Loader fresh(pack.dataset(), o);
    fresh.set_epoch(1);
    return run_pass(fresh);
  }();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: no gtest assertions here (they would report from the wrong process).
    int status = 0;
    try {
      held = Batch{};  // drops a slot of the parent's pool without its lock
      loader.set_epoch(1);
      const Collected c = run_pass(loader);
      status = (c.indices == reference.indices && c.images == reference.images) ? 0 : 1;
      loader.close();
    } catch (...) {
      status = 2;
    }
    ::_exit(status);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child crashed or hung";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: batches differ, 2: an exception";
  // The parent's pass is untouched by the child.
  Batch b;
  int more = 0;
  while (loader.next(b) == NextStatus::kBatch) ++more;
  EXPECT_EQ(more, 7);
}

// A getenv on a worker thread races with Python code that changes os.environ (putenv may free
// the array getenv reads): accelerate clears and restores the environment while Trainer starts,
// and processes died of SIGSEGV there. libjpeg reads the environment when a decompress object
// is created and on a thread's first decode: the workers do both before the constructor
// returns (to Python, which holds the GIL), and reuse one object per decoder, so none happens
// while they decode.
TEST(Loader, WorkersReadNoEnvironmentOnceBuilt) {
  TestPack pack(40);
  getenv_watch::from_other_threads = 0;
  getenv_watch::watcher = std::this_thread::get_id();
  getenv_watch::watching = true;
  {
    Loader loader(pack.dataset(), small_options(3));
    const int while_building = getenv_watch::from_other_threads.exchange(0);
    EXPECT_GT(while_building, 0);  // the watch sees libjpeg's reads: they happen, but here
    for (int epoch = 0; epoch < 2; ++epoch) {
      loader.set_epoch(epoch);
      EXPECT_EQ(run_pass(loader).indices.size(), 40u);
    }
    EXPECT_EQ(getenv_watch::from_other_threads.load(), 0);
  }
  getenv_watch::watching = false;
}

}  // namespace
}  // namespace stoker::pipeline
