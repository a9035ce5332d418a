// Grouped batches (pipeline/batch_plan.h) and the loader that makes them: one group per batch,
// every sample accounted for, equal counts per rank, the same group at every rank's step with
// same_shape_across_ranks, leftovers carried, dropped or padded, and the loader's batches in
// their group's shape, the same with any thread count and after a resume.
#include "stoker/pipeline/batch_plan.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "stoker/core/error.h"
#include "stoker/decode/image_decoder.h"
#include "stoker/format/shard_writer.h"
#include "stoker/pipeline/loader.h"
#include "stoker/pipeline/sample_processor.h"

namespace stoker::pipeline {
namespace {

namespace fs = std::filesystem;

// 211 samples in groups of very different sizes: group 3 has 5 samples, group 4 has 2.
GroupingOptions grouping_of(std::vector<int64_t> batch_sizes, Leftovers leftovers,
                            bool same_shape) {
  GroupingOptions g;
  for (int i = 0; i < 211; ++i) g.group_of.push_back(i % 53 == 0 ? 4 : i % 41 == 0 ? 3 : i % 3);
  g.batch_sizes = std::move(batch_sizes);
  g.leftovers = leftovers;
  g.same_shape_across_ranks = same_shape;
  return g;
}

std::vector<int64_t> order_of(int64_t n, uint64_t seed, int64_t epoch) {
  SamplerOptions o;
  o.seed = seed;
  return Sampler(n, o).global_order(epoch);
}

// Checks what every plan guarantees; returns how often each sample appears in its batches.
std::map<int64_t, int> check_plan(const EpochBatches& p, const GroupingOptions& g, int world) {
  EXPECT_EQ(p.batches() % world, 0) << "every rank as many batches";
  std::map<int64_t, int> seen;
  for (int64_t b = 0; b < p.batches(); ++b) {
    const int32_t group = p.groups[static_cast<size_t>(b)];
    EXPECT_GT(p.batch_size(b), 0);
    EXPECT_LE(p.batch_size(b), g.batch_sizes[static_cast<size_t>(group)]);
    if (g.leftovers != Leftovers::kPartial) {
      EXPECT_EQ(p.batch_size(b), g.batch_sizes[static_cast<size_t>(group)]) << b;
    }
    for (int64_t k = p.starts[static_cast<size_t>(b)]; k < p.starts[static_cast<size_t>(b) + 1];
         ++k) {
      const int64_t s = p.samples[static_cast<size_t>(k)];
      EXPECT_EQ(g.group_of[static_cast<size_t>(s)], group) << "batch " << b << " mixes groups";
      ++seen[s];
    }
  }
  for (int64_t step = 0; g.same_shape_across_ranks && step < p.steps(); ++step) {
    for (int r = 1; r < world; ++r) {
      EXPECT_EQ(p.groups[static_cast<size_t>(step * world + r)],
                p.groups[static_cast<size_t>(step * world)])
          << "step " << step;
    }
  }
  return seen;
}

TEST(BatchPlan, OneGroupPerBatchEverySampleOnceEqualCountsPerRank) {
  for (int world : {1, 2, 4}) {
    for (bool same_shape : {false, true}) {
      for (Leftovers l : {Leftovers::kCarry, Leftovers::kDrop}) {
        const GroupingOptions g = grouping_of({4, 3, 5, 2, 8}, l, same_shape);
        const EpochBatches p = plan_epoch(order_of(211, 7, 0), {}, g, world);
        const std::map<int64_t, int> seen = check_plan(p, g, world);
        // Each sample once: in a batch, or left over (carried or dropped), never both.
        std::set<int64_t> left(p.carry.begin(), p.carry.end());
        EXPECT_EQ(left.size(), p.carry.size());
        for (const auto& [s, n] : seen) {
          EXPECT_EQ(n, 1) << s;
          EXPECT_FALSE(left.count(s)) << s;
        }
        const auto in_batches = static_cast<int64_t>(seen.size());
        EXPECT_EQ(in_batches + p.carried + p.dropped, 211) << world << same_shape;
        EXPECT_EQ(l == Leftovers::kCarry ? p.dropped : p.carried, 0);
        // Group 4 (2 samples, batches of 8) never fills: all of it is left over.
        EXPECT_EQ(std::count(p.groups.begin(), p.groups.end(), 4), 0);
      }
    }
  }
}

TEST(BatchPlan, PartialLeftoversMakeSmallerBatchesPaddedToEqualCounts) {
  for (int world : {1, 2, 4}) {
    for (bool same_shape : {false, true}) {
      const GroupingOptions g = grouping_of({4, 3, 5, 2, 8}, Leftovers::kPartial, same_shape);
      const EpochBatches p = plan_epoch(order_of(211, 7, 0), {}, g, world);
      const std::map<int64_t, int> seen = check_plan(p, g, world);
      EXPECT_EQ(seen.size(), 211u) << "every sample of the epoch is seen";
      int64_t places = 0;
      for (const auto& [s, n] : seen) places += n;
      EXPECT_EQ(places, 211 + p.padded);
      EXPECT_EQ(p.carried + p.dropped, 0);
      // With same_shape_across_ranks a step has one size on every rank, the batch's included.
      for (int64_t step = 0; same_shape && step < p.steps(); ++step) {
        for (int r = 1; r < world; ++r) {
          EXPECT_EQ(p.batch_size(step * world + r), p.batch_size(step * world));
        }
      }
    }
  }
}

TEST(BatchPlan, SamplesOfNoGroupAreLeftOutOfEveryEpoch) {
  for (Leftovers l : {Leftovers::kCarry, Leftovers::kDrop, Leftovers::kPartial}) {
    GroupingOptions g = grouping_of({4, 3, 5, 2, 8}, l, true);
    for (size_t s = 0; s < g.group_of.size(); s += 7) g.group_of[s] = -1;
    check_grouping(g, 211);
    const EpochBatches p = plan_epoch(order_of(211, 7, 0), {}, g, 2);
    const std::map<int64_t, int> seen = check_plan(p, g, 2);
    for (const auto& [s, n] : seen) EXPECT_NE(s % 7, 0) << s;
    for (int64_t s : p.carry) EXPECT_NE(s % 7, 0) << s;
    const int64_t excluded = (211 + 6) / 7;
    if (l == Leftovers::kPartial) {
      EXPECT_EQ(static_cast<int64_t>(seen.size()), 211 - excluded);
    } else {
      EXPECT_EQ(static_cast<int64_t>(seen.size()) + p.carried + p.dropped, 211 - excluded);
    }
  }
  GroupingOptions g = grouping_of({4, 3, 5, 2, 8}, Leftovers::kDrop, false);
  g.group_of[5] = -2;
  EXPECT_THROW(check_grouping(g, 211), Error);
}

TEST(BatchPlan, CarriedSamplesOpenTheNextEpochsBatchesAndNeverPileUp) {
  SamplerOptions so;
  so.seed = 3;
  so.world_size = 2;
  auto sampler = std::make_shared<const Sampler>(211, so);
  auto g = std::make_shared<const GroupingOptions>(
      grouping_of({4, 3, 5, 2, 8}, Leftovers::kCarry, true));
  BatchPlanner planner(sampler, g);
  std::map<int64_t, int> total;  // over epochs 0..E: each sample E + 1 times, less what is carried
  for (int64_t e = 0; e < 40; ++e) {
    const auto p = planner.plan(e);
    for (const auto& [s, n] : check_plan(*p, *g, 2)) total[s] += n;
    if (e > 0) {
      EXPECT_EQ(p->carried_in, planner.plan(e - 1)->carried);
    }
    // What is carried stays below two batches' samples per group (both ranks' batches here),
    // group 4's 2 samples included: a group too small to fill a batch gets one once its carry
    // does.
    EXPECT_LT(p->carried, 2 * 2 * (4 + 3 + 5 + 2 + 8));
    std::map<int64_t, int> owed;
    for (int64_t s : p->carry) ++owed[s];
    for (int64_t s = 0; s < 211; ++s) EXPECT_EQ(total[s] + owed[s], e + 1) << s << " at " << e;
  }
  // A plan made afresh at a later epoch (a resumed job) is the one made epoch by epoch.
  BatchPlanner fresh(sampler, g);
  const auto late = fresh.plan(39), early = planner.plan(39);
  EXPECT_EQ(late->samples, early->samples);
  EXPECT_EQ(late->groups, early->groups);
}

TEST(BatchPlan, ACarriedSampleWaitsRatherThanAppearTwiceInABatch) {
  GroupingOptions g;
  g.group_of.assign(40, 0);
  g.batch_sizes = {6};
  // In pack order, 1, 3 and 5 come again while their carried copies fill the first batch.
  const std::vector<int64_t> carried = {1, 3, 5};
  std::vector<int64_t> order(40);
  std::iota(order.begin(), order.end(), 0);
  const EpochBatches p = plan_epoch(order, carried, g, 1);
  for (int64_t b = 0; b < p.batches(); ++b) {
    std::set<int64_t> in(p.samples.begin() + p.starts[static_cast<size_t>(b)],
                         p.samples.begin() + p.starts[static_cast<size_t>(b) + 1]);
    EXPECT_EQ(static_cast<int64_t>(in.size()), p.batch_size(b)) << "batch " << b;
  }
  EXPECT_EQ(p.batches() * 6 + p.carried, 43);
}

TEST(BatchPlan, RefusesAGroupingThatDoesNotFit) {
  GroupingOptions g = grouping_of({4, 3, 5, 2, 8}, Leftovers::kCarry, false);
  EXPECT_THROW(check_grouping(g, 210), Error);
  g.group_of[7] = 5;
  EXPECT_THROW(check_grouping(g, 211), Error);
  g.group_of[7] = 0;
  g.batch_sizes[2] = 0;
  EXPECT_THROW(check_grouping(g, 211), Error);
}

// ---- the loader's grouped batches, on JPEGs of three aspects --------------------------------

class AspectPack {
 public:
  AspectPack() {
    dir_ = fs::temp_directory_path() / ("stoker_batch_plan_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::string shards;
    for (int s = 0, i = 0; s < 2; ++s) {
      const std::string name = "shard-00000" + std::to_string(s);
      format::ShardWriter w((dir_ / (name + ".tar")).string(), (dir_ / (name + ".idx")).string());
      for (int k = 0; k < 30; ++k, ++i) {
        const int w_px = i % 3 == 0 ? 96 : i % 3 == 1 ? 48 : 64;  // wide, tall, square
        const int h_px = i % 3 == 0 ? 48 : i % 3 == 1 ? 96 : 64;
        std::vector<uint8_t> px(static_cast<size_t>(w_px) * h_px * 3);
        for (size_t p = 0; p < px.size(); ++p) px[p] = static_cast<uint8_t>(p * 7 + i * 13);
        const auto jpg = decode::encode_jpeg(px.data(), w_px, h_px, w_px * 3, 90);
        char key[16];
        std::snprintf(key, sizeof key, "%08d", i);
        w.add(key, ImageFormat::kJpeg, jpg.data(), jpg.size(), i % 3);
      }
      w.finish();
      shards += std::string(s ? "," : "") + R"({"tar": ")" + name + R"(.tar", "index": ")" + name +
                R"(.idx", "num_samples": 30})";
    }
    std::ofstream(dir_ / "manifest.json")
        << R"({"format": "stoker-pack", "version": 2, "num_samples": 60, "shards": [)" << shards
        << "]}";
    dataset_ = format::Dataset::open(dir_.string());
  }
  ~AspectPack() { fs::remove_all(dir_); }
  std::shared_ptr<const format::Dataset> dataset() const { return dataset_; }

 private:
  fs::path dir_;
  std::shared_ptr<const format::Dataset> dataset_;
};

// Buckets by the index's sizes: wide (16 x 32), tall (32 x 16), square (24 x 24).
const std::vector<std::pair<int, int>> kBuckets = {{16, 32}, {32, 16}, {24, 24}};

LoaderOptions bucketed(const format::Dataset& ds, int threads, Leftovers leftovers,
                       bool same_shape = false) {
  LoaderOptions o;
  TransformOptions t;
  t.size = 24;
  o.fields = classification_fields(t, {});
  o.fields[0].image.geometry.kind = fields::GeometryKind::kCoverCrop;
  o.threads = threads;
  o.seed = 99;
  auto g = std::make_shared<GroupingOptions>();
  for (uint32_t s = 0; s < ds.num_shards(); ++s)
    for (const ImageSize& size : ds.image_sizes(s, {"jpg"}))
      g->group_of.push_back(size.width > size.height ? 0 : size.width < size.height ? 1 : 2);
  g->batch_sizes = {4, 3, 5};
  g->leftovers = leftovers;
  g->same_shape_across_ranks = same_shape;
  o.grouping = g;
  o.group_image_sizes = kBuckets;
  o.sized_field = 0;
  return o;
}

struct Pass {
  std::vector<std::vector<uint8_t>> images;
  std::vector<int32_t> groups;
  std::vector<int64_t> indices;
};

Pass run(Loader& loader) {
  Pass p;
  loader.begin();
  Batch b;
  while (loader.next(b) == NextStatus::kBatch) {
    const auto [h, w] = kBuckets.at(static_cast<size_t>(b.group));
    EXPECT_EQ(loader.output_shape(0, b.group), (std::vector<int64_t>{h, w, 3}));
    p.images.emplace_back(b.images(), b.images() + b.size * h * w * 3);
    p.groups.push_back(b.group);
    p.indices.insert(p.indices.end(), b.indices(), b.indices() + b.size);
  }
  return p;
}

TEST(Loader, GroupedBatchesHaveTheirGroupsShapeAndTheSameBytesWithAnyThreads) {
  AspectPack pack;
  Loader one(pack.dataset(), bucketed(*pack.dataset(), 1, Leftovers::kPartial));
  Loader four(pack.dataset(), bucketed(*pack.dataset(), 4, Leftovers::kPartial));
  const Pass a = run(one), b = run(four);
  EXPECT_EQ(a.groups, b.groups);
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_EQ(a.images, b.images);
  std::vector<int64_t> all = a.indices;
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(60);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(all, expected);  // partial leftovers: every sample once, one rank
  // Every batch holds its bucket's images only: i % 3 is the image's aspect.
  size_t at = 0;
  for (size_t k = 0; k < a.groups.size(); ++k) {
    const int64_t n = static_cast<int64_t>(a.images[k].size()) /
                      (kBuckets[static_cast<size_t>(a.groups[k])].first *
                       kBuckets[static_cast<size_t>(a.groups[k])].second * 3);
    for (int64_t j = 0; j < n; ++j, ++at) EXPECT_EQ(a.indices[at] % 3, a.groups[k]);
  }
  // The slot is the largest bucket's batch: 5 x 24 x 24 x 3 against 4 x 16 x 32 x 3.
  EXPECT_GE(one.slot_bytes(), size_t{5 * 24 * 24 * 3});
}

TEST(Loader, GroupedResumeMidEpochGivesExactlyTheRest) {
  AspectPack pack;
  Loader whole(pack.dataset(), bucketed(*pack.dataset(), 2, Leftovers::kCarry));
  whole.set_epoch(3);
  const Pass all = run(whole);
  ASSERT_GT(all.groups.size(), 6u);
  Loader first(pack.dataset(), bucketed(*pack.dataset(), 2, Leftovers::kCarry));
  first.set_epoch(3);
  first.begin();
  Batch b;
  for (int k = 0; k < 5; ++k) ASSERT_EQ(first.next(b), NextStatus::kBatch);
  const LoaderState state = first.state();
  EXPECT_EQ(state.batches_done, 5);
  Loader second(pack.dataset(), bucketed(*pack.dataset(), 3, Leftovers::kCarry));
  second.load_state(state);
  const Pass rest = run(second);
  EXPECT_EQ(rest.groups, std::vector<int32_t>(all.groups.begin() + 5, all.groups.end()));
  EXPECT_EQ(rest.images,
            std::vector<std::vector<uint8_t>>(all.images.begin() + 5, all.images.end()));
}

TEST(Loader, GroupedRanksGetEqualCountsAndWithSameShapeTheSameGroupEachStep) {
  AspectPack pack;
  for (int world : {2, 4}) {
    for (bool same_shape : {false, true}) {
      std::vector<Pass> ranks;
      for (int r = 0; r < world; ++r) {
        LoaderOptions o = bucketed(*pack.dataset(), 2, Leftovers::kCarry, same_shape);
        o.rank = r;
        o.world_size = world;
        Loader loader(pack.dataset(), o);
        const int64_t steps = loader.num_batches();
        EXPECT_EQ(steps, loader.epoch_plan(0, world)->steps());
        ranks.push_back(run(loader));
        EXPECT_EQ(static_cast<int64_t>(ranks.back().groups.size()), steps);
      }
      std::set<int64_t> seen;
      for (const Pass& p : ranks) {
        EXPECT_EQ(p.groups.size(), ranks[0].groups.size()) << world;
        if (same_shape) {
          EXPECT_EQ(p.groups, ranks[0].groups) << world;
        }
        for (int64_t i : p.indices) EXPECT_TRUE(seen.insert(i).second) << "sample twice: " << i;
      }
    }
  }
}

}  // namespace
}  // namespace stoker::pipeline
