// A Root whose node.json carries a deal (docs/TRAINING.md "Changing the number of clusters: the
// deal"): the samples of every step and the run's length, against ShardSampler's orders per epoch
// recomputed here, and a checkpoint of that run refused by a run with another deal; resumes from a
// checkpoint written before or under a deal change (TrainerCheckpoints::checkResumedPlan). A
// running cluster taking a new deal: DealChangeTest.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <unistd.h>

#include "core/Error.h"
#include "tests/trainer/InMemoryPipeline.h"
#include "tests/trainer/DealTestRuns.h"
#include "tests/trainer/TrainerTestPaths.h"
#include "trainer/ClusterSync.h"
#include "trainer/Dataset.h"
#include "trainer/DealChange.h"
#include "trainer/DealSampler.h"
#include "trainer/Sampler.h"
#include "trainer/TrainerCheckpoints.h"

namespace cairn {
namespace {

using testing::AdmissionRecorder;
using testing::dealRunOptions;
using testing::kGrown;
using testing::kStages;
using testing::Offer;
using testing::runWithOffer;

TEST(DealRun, TheRootSamplesEachEpochsShardOfTheDealAndThePlanFollowsIt) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const std::string node_data = testing::trainerModelsDir() + "/cnn_bn_dropout/node_data";
  const nlohmann::json deal = {{{"from_epoch", 0}, {"clusters", 1}},
                               {{"from_epoch", 1}, {"clusters", 2}}};
  TrainOptions used;
  DataOptions data;
  const testing::PipelineRun run =
      testing::runInMemoryPipeline(node_data, dealRunOptions, [&](int i, StageTrainerConfig& c) {
        c.data.chunks = 4;
        if (i == 0) {
          c.node.extra["deal"] = deal;
          used = c.options;
          data = c.data;
        }
      });
  // The reference: epoch 0 is one cluster's whole order, epochs 1 and 2 cluster 0's of two; every
  // epoch has the fewest whole batches of the clusters present.
  const int64_t n = loadDatasets(data, used.seed).train->size();
  const std::vector<int64_t> sizes = ShardSampler::equalChunks(n, 4, 1);
  const ShardSampler alone(sizes, 0, 1, {}, used.seed);
  const ShardSampler first(sizes, 0, 2, {}, used.seed), second(sizes, 1, 2, {}, used.seed);
  const int64_t b = used.batch_size;
  const int64_t grown_steps =
      std::min(int64_t(first.shard().size()), int64_t(second.shard().size())) / b;
  std::vector<std::vector<int64_t>> expected;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const std::vector<int64_t> order = epoch == 0 ? alone.epochOrder(0) : first.epochOrder(epoch);
    const int64_t steps = epoch == 0 ? n / b : grown_steps;
    for (int64_t k = 0; k < steps; ++k)
      expected.emplace_back(order.begin() + k * b, order.begin() + (k + 1) * b);
  }
  ASSERT_GT(grown_steps, 0);
  ASSERT_NE(grown_steps, n / b);  // the test must see the steps per epoch change
  EXPECT_EQ(run.batches, expected);
  for (const TrainerResult& r : run.results) EXPECT_EQ(r.steps, int64_t(expected.size()));
  EXPECT_EQ(run.losses.size(), expected.size());
}

// A cluster the deal adds from epoch 1 starts at the first step of epoch 1 (the step the first
// cluster is at then) and samples its own shard of the grown deal.
TEST(DealRun, AClusterAddedFromEpochOneStartsAtThatEpochsFirstStepOnItsOwnShard) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const std::string node_data = testing::trainerModelsDir() + "/cnn_bn_dropout/node_data";
  const nlohmann::json deal = {{{"from_epoch", 0}, {"clusters", 1}},
                               {{"from_epoch", 1}, {"clusters", 2}}};
  TrainOptions used;
  DataOptions data;
  const testing::PipelineRun run =
      testing::runInMemoryPipeline(node_data, dealRunOptions, [&](int i, StageTrainerConfig& c) {
        c.data.chunks = 4;
        c.node.cluster = 1;
        if (i == 0) {
          c.node.extra["deal"] = deal;
          used = c.options;
          data = c.data;
        }
      });
  const int64_t n = loadDatasets(data, used.seed).train->size();
  const std::vector<int64_t> sizes = ShardSampler::equalChunks(n, 4, 1);
  const ShardSampler first(sizes, 0, 2, {}, used.seed), second(sizes, 1, 2, {}, used.seed);
  const int64_t b = used.batch_size;
  const int64_t grown_steps =
      std::min(int64_t(first.shard().size()), int64_t(second.shard().size())) / b;
  std::vector<std::vector<int64_t>> expected;
  for (int64_t epoch = 1; epoch < 3; ++epoch) {
    const std::vector<int64_t> order = second.epochOrder(epoch);
    for (int64_t k = 0; k < grown_steps; ++k)
      expected.emplace_back(order.begin() + k * b, order.begin() + (k + 1) * b);
  }
  EXPECT_EQ(run.batches, expected);
  for (const TrainerResult& r : run.results) EXPECT_EQ(r.steps, n / b + 2 * grown_steps);
  EXPECT_EQ(run.losses.size(), expected.size());
}

// What the Root refuses before it trains (BatchFeeder calls both with "node.json of <node>:
// extra.deal").
TEST(DealRun, ADealThatCannotRunHereIsRefusedNamingTheKey) {
  auto refusal = [](const nlohmann::json& json, int cluster) {
    try {
      checkDealForCluster(dealFromJson(json, "extra.deal"), cluster, "extra.deal");
    } catch (const BadInput& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refusal(nlohmann::json::object(), 0).find("extra.deal is not a JSON array"),
            std::string::npos);
  EXPECT_NE(refusal({{{"from_epoch", 1}, {"clusters", 1}}}, 0).find("extra.deal[0].from_epoch"),
            std::string::npos);
  EXPECT_NE(refusal({{{"from_epoch", 0}, {"clusters", "2"}}}, 0).find("extra.deal[0].clusters"),
            std::string::npos);
  EXPECT_NE(refusal({{{"from_epoch", 0}, {"clusters", 2}}, {{"from_epoch", 1}, {"clusters", 1}}}, 0)
                .find("extra.deal[1].clusters is 1, fewer than the 2 before it"),
            std::string::npos);
  EXPECT_NE(refusal({{{"from_epoch", 0}, {"clusters", 1}}, {{"from_epoch", 1}, {"clusters", 2}}}, 2)
                .find("never has more than 2 cluster(s) but this node is of cluster 2"),
            std::string::npos);
  EXPECT_EQ(refusal({{{"from_epoch", 0}, {"clusters", 1}}, {{"from_epoch", 1}, {"clusters", 2}}}, 0),
            "accepted");
}

// A cluster that paused right after taking a deal resumes from a checkpoint written before it
// (TrainerCheckpoints::checkResumedPlan): the checkpoint holds the fixed steps per epoch, the
// node.json the update wrote has the grown deal, which changes only epochs after the
// checkpoint's, so the run goes on under it and samples exactly what the run with the deal from
// the start samples. A deal that renumbers the checkpoint's own epoch is refused naming it.
TEST(DealRun, AResumeFromACheckpointBeforeADealChangeGoesOnUnderTheDeal) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const std::string node_data = testing::trainerModelsDir() + "/cnn_bn_dropout/node_data";
  char tmpl[] = "/tmp/cairn_deal_resume_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto nodeDir = [&](int i) { return dir + "/node_" + std::to_string(i); };
  auto stopAfterPolls = [](int nth) {
    auto calls = std::make_shared<int>(0);
    return std::function<bool()>([calls, nth] { return ++*calls >= nth; });
  };
  const testing::PipelineRun stopped =
      testing::runInMemoryPipeline(node_data, dealRunOptions, [&](int i, StageTrainerConfig& c) {
        c.data.chunks = 4;
        c.options.checkpoint_every = 2;
        c.checkpoint_dir = nodeDir(i);
        if (i == 0) c.stop_requested = stopAfterPolls(5);
      });
  ASSERT_TRUE(stopped.results[0].stopped);
  const int64_t at = stopped.results[0].steps;
  ASSERT_GT(at, 0);
  auto resume = [&](const nlohmann::json& deal) {
    return testing::runInMemoryPipeline(node_data, dealRunOptions, [&, deal](int i, StageTrainerConfig& c) {
      c.data.chunks = 4;
      c.options.checkpoint_every = 2;
      c.checkpoint_dir = nodeDir(i);
      c.resume_step = at;
      c.node.extra["deal"] = deal;  // the update wrote it into every node.json
    });
  };
  // First (it writes no checkpoint): a deal that changes epoch 0, the checkpoint's, is refused
  // naming the checkpoint.
  const nlohmann::json renumbers = {{{"from_epoch", 0}, {"clusters", 2}}};
  try {
    resume(renumbers);
    ADD_FAILURE() << "a deal that renumbers the checkpoint's epoch was taken";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find(".ckpt: written for a run"), std::string::npos) << e.what();
  }
  const testing::PipelineRun resumed = resume(kGrown);
  const testing::PipelineRun reference =
      testing::runInMemoryPipeline(node_data, dealRunOptions, [&](int i, StageTrainerConfig& c) {
        c.data.chunks = 4;
        if (i == 0) c.node.extra["deal"] = kGrown;
      });
  std::vector<std::vector<int64_t>> both = stopped.batches;
  both.insert(both.end(), resumed.batches.begin(), resumed.batches.end());
  EXPECT_EQ(both, reference.batches);
  for (const TrainerResult& r : resumed.results) EXPECT_EQ(r.steps, reference.results[0].steps);
  std::filesystem::remove_all(dir);
}

// The in-memory pipeline with checkpoints every 2 steps in nodeDir(i), `offer` made to its Root,
// and its Root stopped at its `stop_at`-th poll of the stop flag (each step polls it).
testing::PipelineRun runStoppedWithOffer(Offer& offer, std::vector<AdmissionRecorder>& syncs,
                                         const std::function<std::string(int)>& nodeDir, int stop_at) {
  const std::string node_data = testing::trainerModelsDir() + "/cnn_bn_dropout/node_data";
  auto polls = std::make_shared<int>(0);
  return testing::runInMemoryPipeline(node_data, dealRunOptions, [&](int i, StageTrainerConfig& c) {
    c.data.chunks = 4;
    c.cluster_sync = &syncs[size_t(i)];
    c.options.checkpoint_every = 2;
    c.checkpoint_dir = nodeDir(i);
    if (i != 0) return;
    c.stop_requested = [polls, stop_at] { return ++*polls >= stop_at; };
    c.offered_deal = [&offer]() -> std::optional<nlohmann::json> {
      if (offer.calls++ < offer.from_step) return std::nullopt;
      return kGrown;
    };
  });
}

// A Root that took an offered deal, checkpointed under it, and resumes with a configuration that
// does not hold the deal in force: node.json still only offers it (extra.offered_deal: the
// coordinator's peers update written after the Root took it, or a spare's assignment), or the
// configuration predates the take (a pause inside one provider run, which reads node.json once).
// Planning with the old deal, it refused its own checkpoint and the cluster gave its nodes up (the
// 24-volunteer soak). adoptDealOfCheckpoint (TrainerCheckpoints.h, which NodeRunner calls before a
// resumed attempt) plans with the checkpoint's deal: in both cases the stopped and resumed halves
// sample exactly what the uninterrupted run with the offer samples.
TEST(DealRun, AResumeUnderADealTakenButNotInItsConfigurationPlansWithIt) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  char tmpl[] = "/tmp/cairn_deal_offered_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto nodeDir = [&](int i) { return dir + "/node_" + std::to_string(i); };
  std::vector<AdmissionRecorder> syncs(kStages), resumed_syncs(kStages), reference_syncs(kStages);
  Offer offer;
  offer.from_step = 3;  // taken at step 3 of epoch 0
  const std::string node_data = testing::trainerModelsDir() + "/cnn_bn_dropout/node_data";
  const testing::PipelineRun stopped = runStoppedWithOffer(offer, syncs, nodeDir, 9);
  ASSERT_TRUE(stopped.results[0].stopped);
  const int64_t at = stopped.results[0].steps;
  ASSERT_GT(at, offer.from_step);  // the checkpoint comes after the deal was taken
  const std::string kept = dir + "_kept";
  std::filesystem::copy(dir, kept, std::filesystem::copy_options::recursive);
  // Each resume starts from the stopped run's checkpoints (a resumed run writes its own).
  auto resume = [&](bool adopt, bool offered) {
    std::filesystem::remove_all(dir);
    std::filesystem::copy(kept, dir, std::filesystem::copy_options::recursive);
    return testing::runInMemoryPipeline(node_data, dealRunOptions, [&, adopt, offered](int i, StageTrainerConfig& c) {
      c.data.chunks = 4;
      c.cluster_sync = &resumed_syncs[size_t(i)];
      c.options.checkpoint_every = 2;
      c.checkpoint_dir = nodeDir(i);
      c.resume_step = at;
      if (offered) c.node.extra["offered_deal"] = kGrown;  // what the coordinator's update said
      if (adopt) adoptDealOfCheckpoint(&c);
      if (i == 0 && adopt) {
        EXPECT_EQ(c.node.extra.value("deal", nlohmann::json()), kGrown);
        EXPECT_FALSE(c.node.extra.contains("offered_deal"));
      }
    });
  };
  // Without it: the Root refuses its own checkpoint.
  try {
    resume(false, true);
    ADD_FAILURE() << "a Root planning without the deal it took accepted its checkpoint";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find(".ckpt: written for a run of"), std::string::npos) << e.what();
  }
  Offer again;
  again.from_step = 3;
  const testing::PipelineRun reference = runWithOffer(again, reference_syncs, nullptr, nullptr);
  for (const bool offered : {true, false}) {
    SCOPED_TRACE(offered ? "node.json offers the deal" : "the configuration predates the take");
    const testing::PipelineRun resumed = resume(true, offered);
    std::vector<std::vector<int64_t>> both = stopped.batches;
    both.insert(both.end(), resumed.batches.begin(), resumed.batches.end());
    EXPECT_EQ(both, reference.batches);
    for (const TrainerResult& r : resumed.results) EXPECT_EQ(r.steps, reference.results[0].steps);
  }
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(kept);
}

// A Root that took an offered deal (at step 5) and paused before its next checkpoint: its cluster
// resumes from the checkpoint of step 4, written under the old deal, and the configuration its
// provider run began with holds the old deal too. node.json says the deal taken is in force (the
// Root wrote it there when it took it), and takeDealInForce (which NodeRunner calls before a
// resumed attempt) plans with it: the stopped run's first four steps and the resumed run sample
// exactly what the uninterrupted run with the offer samples. Without it the resumed Root retrained
// under the old deal (the 24-volunteer soak: step 124 of one cluster on two clusters' samples).
TEST(DealRun, AResumeFromBeforeATakeWithinOneRunPlansWithTheDealInForce) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  char tmpl[] = "/tmp/cairn_deal_in_force_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto nodeDir = [&](int i) { return dir + "/node_" + std::to_string(i); };
  std::vector<AdmissionRecorder> syncs(kStages), resumed_syncs(kStages), reference_syncs(kStages);
  Offer offer;
  offer.from_step = 5;  // taken before step 5; checkpoints at 2, 4, 6
  const std::string node_data = testing::trainerModelsDir() + "/cnn_bn_dropout/node_data";
  const testing::PipelineRun stopped = runStoppedWithOffer(offer, syncs, nodeDir, 7);
  ASSERT_TRUE(stopped.results[0].stopped);
  ASSERT_GT(stopped.results[0].steps, offer.from_step);  // steps after the take were trained
  constexpr int64_t kFrom = 4;                             // the checkpoint before the take
  ASSERT_GE(stopped.batches.size(), size_t(kFrom));
  auto resume = [&](bool in_force) {
    return testing::runInMemoryPipeline(node_data, dealRunOptions, [&, in_force](int i, StageTrainerConfig& c) {
      c.data.chunks = 4;
      c.cluster_sync = &resumed_syncs[size_t(i)];
      c.checkpoint_dir = nodeDir(i);
      c.resume_step = kFrom;
      if (i == 0 && in_force) takeDealInForce(&c, kGrown);
      if (i == 0) adoptDealOfCheckpoint(&c);  // the checkpoint predates the take: nothing to adopt
    });
  };
  Offer again;
  again.from_step = offer.from_step;
  const testing::PipelineRun reference = runWithOffer(again, reference_syncs, nullptr, nullptr);
  std::vector<std::vector<int64_t>> both(stopped.batches.begin(), stopped.batches.begin() + kFrom);
  const testing::PipelineRun resumed = resume(true);
  both.insert(both.end(), resumed.batches.begin(), resumed.batches.end());
  EXPECT_EQ(both, reference.batches);
  for (const TrainerResult& r : resumed.results) EXPECT_EQ(r.steps, reference.results[0].steps);
  // Control: planning with the configuration the run began with samples other batches.
  const testing::PipelineRun old = resume(false);
  std::vector<std::vector<int64_t>> old_both(stopped.batches.begin(), stopped.batches.begin() + kFrom);
  old_both.insert(old_both.end(), old.batches.begin(), old.batches.end());
  EXPECT_NE(old_both, reference.batches);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cairn
