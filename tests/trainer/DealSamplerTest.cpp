// DealSampler: the per-epoch deal of listed chunks over a changing number of clusters.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/Error.h"
#include "trainer/DealSampler.h"
#include "trainer/RunPlan.h"
#include "trainer/TrainOptions.h"
#include "trainer/Sampler.h"

namespace cairn {
namespace {

TEST(DealSampler, OneEntryGivesExactlyShardSamplersOrder) {
  const std::vector<int64_t> sizes = ShardSampler::equalChunks(997, 6, 3);
  for (const std::vector<int64_t>& ids : {std::vector<int64_t>{}, std::vector<int64_t>{5, 0, 3}})
    for (int clusters = 1; clusters <= 3; ++clusters)
      for (int c = 0; c < clusters; ++c) {
        const ShardSampler today(sizes, c, clusters, ids, 1234);
        const DealSampler dealt(sizes, c, {{0, clusters}}, ids, 1234);
        EXPECT_EQ(dealt.shard(0), today.shard());
        for (int64_t e = 0; e < 5; ++e) EXPECT_EQ(dealt.epochOrder(e), today.epochOrder(e));
      }
}

TEST(DealSampler, EveryEpochTheClustersShardsAreDisjointAndCoverTheListedChunks) {
  const std::vector<int64_t> sizes = ShardSampler::equalChunks(600, 6, 1);
  const std::vector<int64_t> listed = {0, 2, 3, 5};
  std::set<int64_t> expected;
  for (int64_t c : listed)
    for (int64_t id = c * 100; id < (c + 1) * 100; ++id) expected.insert(id);
  const std::vector<DealEntry> deal = {{0, 1}, {2, 2}, {4, 3}};
  for (int64_t epoch = 0; epoch < 6; ++epoch) {
    const int clusters = epoch < 2 ? 1 : epoch < 4 ? 2 : 3;
    std::multiset<int64_t> seen;
    for (int c = 0; c < 3; ++c) {
      const DealSampler s(sizes, c, deal, listed, 7);
      EXPECT_EQ(s.entryAt(epoch).clusters, clusters);
      const std::vector<int64_t> order = s.epochOrder(epoch);
      if (c >= clusters) {
        EXPECT_TRUE(order.empty()) << "cluster " << c << " epoch " << epoch;
      }
      // Same ids as the shard, in a shuffled order.
      std::vector<int64_t> sorted = order;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(sorted, s.shard(epoch));
      seen.insert(order.begin(), order.end());
    }
    EXPECT_EQ(seen.size(), expected.size()) << "epoch " << epoch;  // disjoint
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()), expected) << "epoch " << epoch;
  }
  // Cluster 0 after the change trains on a strict subset of what it trained before.
  const DealSampler c0(sizes, 0, deal, listed, 7);
  EXPECT_EQ(c0.shard(0).size(), 400u);
  EXPECT_EQ(c0.shard(2).size(), 200u);
}

TEST(DealSampler, BadDealsAreRefusedNamingTheEntry) {
  auto message = [](const std::vector<DealEntry>& deal) {
    try {
      validateDeal(deal, "deal");
    } catch (const BadInput& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({}).find("at least one entry"), std::string::npos);
  EXPECT_NE(message({{1, 1}}).find("deal[0].from_epoch"), std::string::npos);
  EXPECT_NE(message({{0, 1}, {0, 2}}).find("deal[1].from_epoch"), std::string::npos);
  EXPECT_NE(message({{0, 1}, {3, 0}}).find("deal[1].clusters"), std::string::npos);
  EXPECT_EQ(message({{0, 1}, {3, 2}}), "");
  // More clusters than listed chunks: ShardSampler's own refusal.
  EXPECT_THROW(DealSampler(ShardSampler::equalChunks(10, 2, 1), 0, {{0, 1}, {1, 3}}, {}, 1),
               BadInput);
}

// The schedule against a brute force: every epoch's shards summed chunk by chunk from the deal's
// round robin (listed chunk i to cluster i % n), the fewest whole batches of them, steps counted
// one by one.
TEST(DealSchedule, StepsFollowTheFewestBatchesOfThePresentClustersEpochByEpoch) {
  const std::vector<int64_t> sizes = {100, 90, 130, 70, 110, 95, 120};
  for (const std::vector<int64_t>& listed :
       {std::vector<int64_t>{}, std::vector<int64_t>{6, 1, 2, 4, 0}})
    for (const std::vector<DealEntry>& deal :
         {std::vector<DealEntry>{{0, 1}}, std::vector<DealEntry>{{0, 1}, {2, 2}},
          std::vector<DealEntry>{{0, 2}, {1, 3}, {4, 4}}})
      for (int64_t batch : {16, 25}) {
        const DealSchedule schedule(sizes, deal, listed, 9, batch);
        std::vector<int64_t> chunks = listed;
        if (chunks.empty())
          for (int64_t k = 0; k < int64_t(sizes.size()); ++k) chunks.push_back(k);
        std::vector<int64_t> epoch_of_step;
        for (int64_t epoch = 0; epoch < 7; ++epoch) {
          int n = deal[0].clusters;
          for (const DealEntry& e : deal)
            if (e.from_epoch <= epoch) n = e.clusters;
          std::vector<int64_t> shard(size_t(n), 0);
          for (size_t i = 0; i < chunks.size(); ++i) shard[i % size_t(n)] += sizes[size_t(chunks[i])];
          const int64_t steps = *std::min_element(shard.begin(), shard.end()) / batch;
          EXPECT_EQ(schedule.stepsIn(epoch), steps) << "epoch " << epoch;
          EXPECT_EQ(schedule.firstStepOf(epoch), int64_t(epoch_of_step.size())) << "epoch " << epoch;
          for (int64_t k = 0; k < steps; ++k) epoch_of_step.push_back(epoch);
        }
        for (size_t step = 0; step < epoch_of_step.size(); ++step)
          ASSERT_EQ(schedule.epochOf(int64_t(step)), epoch_of_step[step]) << "step " << step;
        EXPECT_EQ(schedule.totalSteps(7, 0), int64_t(epoch_of_step.size()));
        EXPECT_EQ(schedule.totalSteps(7, 5), 5);
        EXPECT_EQ(schedule.totalSteps(0, 11), 11);
      }
}

TEST(DealSchedule, OneEntryWithEqualShardsIsTheFixedPlan) {
  const std::vector<int64_t> sizes = ShardSampler::equalChunks(1200, 4, 2);
  TrainOptions opt;
  opt.batch_size = 32;
  opt.epochs = 3;
  const DealSchedule schedule(sizes, {{0, 2}}, {}, 1, opt.batch_size);
  const ShardSampler sampler(sizes, 0, 2, {}, 1);
  const RunPlan plan = RunPlan::forShard(opt, int64_t(sampler.shard().size()), 0);
  EXPECT_EQ(schedule.stepsIn(0), plan.steps_per_epoch);
  EXPECT_EQ(schedule.stepsIn(5), plan.steps_per_epoch);
  EXPECT_EQ(schedule.totalSteps(opt.epochs, opt.max_steps), plan.total_steps);
}

TEST(DealSchedule, AShardBelowOneBatchIsRefusedNamingTheEntryAndTheCluster) {
  try {
    DealSchedule(ShardSampler::equalChunks(100, 4, 1), {{0, 1}, {3, 4}}, {}, 1, 30);
    FAIL() << "accepted a shard of 25 samples for a batch of 30";
  } catch (const BadInput& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("deal[1] (from epoch 3, 4 clusters): cluster 0's shard holds 25"),
              std::string::npos) << what;
  }
}

TEST(RunPlan, WithoutATableEpochsAreFixedAsBefore) {
  RunPlan plan;
  plan.total_steps = 25;
  plan.steps_per_epoch = 10;
  for (int64_t step = 0; step < 25; ++step) {
    EXPECT_EQ(plan.epochOf(step), step / 10);
    EXPECT_EQ(plan.positionOf(step), step % 10);
  }
  EXPECT_EQ(plan.firstStepOf(2), 20);
  EXPECT_EQ(plan.epochs(), 3);
  // The text is the one earlier versions sent (no epoch_steps key) and reads back the same.
  EXPECT_EQ(plan.toText(), R"({"eval_batches":0,"steps_per_epoch":10,"total_steps":25})");
  const RunPlan back = RunPlan::fromText(plan.toText());
  EXPECT_EQ(back.total_steps, 25);
  EXPECT_EQ(back.steps_per_epoch, 10);
  EXPECT_TRUE(back.epoch_steps.empty());
}

TEST(RunPlan, AGrownRunsTableGivesEachStepsEpochAndPlaceAndTravelsDownstream) {
  const DealSchedule schedule(ShardSampler::equalChunks(1600, 8, 1), {{0, 1}, {2, 2}}, {}, 3, 50);
  RunPlan plan;
  plan.epoch_steps = schedule.table();
  plan.steps_per_epoch = plan.epoch_steps.front().steps;
  plan.total_steps = schedule.totalSteps(4, 0);
  EXPECT_EQ(plan.epoch_steps, (std::vector<EpochSteps>{{0, 32}, {2, 16}}));
  EXPECT_EQ(plan.total_steps, 32 + 32 + 16 + 16);
  EXPECT_EQ(plan.epochs(), 4);
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < 4; ++epoch)
    for (int64_t k = 0; k < (epoch < 2 ? 32 : 16); ++k, ++step) {
      ASSERT_EQ(plan.epochOf(step), epoch) << step;
      ASSERT_EQ(plan.positionOf(step), k) << step;
    }
  EXPECT_EQ(plan.firstStepOf(2), 64);
  plan.first_step = 64;  // a cluster the deal adds from epoch 2
  const RunPlan back = RunPlan::fromText(plan.toText());
  EXPECT_EQ(back.first_step, 64);
  EXPECT_EQ(back.epoch_steps, plan.epoch_steps);
  EXPECT_EQ(back.total_steps, plan.total_steps);
}

TEST(RunPlan, MalformedPlansAreRefusedNamingTheField) {
  auto refused = [](const std::string& text, const std::string& words) {
    try {
      RunPlan::fromText(text);
      ADD_FAILURE() << "accepted " << text;
    } catch (const BadInput& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused("nope", "malformed run plan");
  refused(R"({"total_steps":"9","steps_per_epoch":3,"eval_batches":0})", "total_steps");
  refused(R"({"total_steps":9,"steps_per_epoch":0,"eval_batches":0})", "steps_per_epoch");
  refused(R"({"total_steps":9,"steps_per_epoch":3})", "eval_batches");
  refused(R"({"total_steps":9,"steps_per_epoch":3,"eval_batches":0,"epoch_steps":5})",
          "epoch_steps must be an array");
  refused(R"({"total_steps":9,"steps_per_epoch":3,"eval_batches":0,"epoch_steps":[[0]]})",
          "epoch_steps[0] must be");
  refused(R"({"total_steps":9,"steps_per_epoch":3,"eval_batches":0,"epoch_steps":[[0,3],[0,2]]})",
          "epoch_steps[1].from_epoch");
  refused(R"({"total_steps":9,"steps_per_epoch":3,"eval_batches":0,"epoch_steps":[[0,3],[2,0]]})",
          "epoch_steps[1].steps");
  refused(R"({"total_steps":9,"steps_per_epoch":4,"eval_batches":0,"epoch_steps":[[0,3]]})",
          "is not epoch_steps[0].steps");
  refused(R"({"total_steps":9,"steps_per_epoch":3,"eval_batches":0,"epoch_steps":[[0,3]],"first_step":-1})",
          "first_step");
  refused(R"({"total_steps":9,"steps_per_epoch":3,"eval_batches":0,"epoch_steps":[[0,3]],"first_step":10})",
          "first_step 10 is past total_steps 9");
}

}  // namespace
}  // namespace cairn
