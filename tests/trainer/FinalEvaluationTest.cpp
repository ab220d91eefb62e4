// The evaluation after the last step (trainer/StepRecorder.h finalEvaluation): the in-memory
// 3-stage Fashion-MNIST slice (tests/trainer/InMemoryPipeline.h) with the Stem's evaluation result
// lost on its way to the Root — as when the Stem finished and exited while the Root's link was cut
// (seen in tools/soak.py: the Root then paused for max_wait_s and failed). Reference: the same run
// with nothing lost (the same steps, weights and evaluation figures).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "tests/trainer/InMemoryPipeline.h"
#include "tests/trainer/TrainerTestPaths.h"

namespace cairn {
namespace {

using namespace std::chrono_literals;

void fewSteps(TrainOptions& t) {
  t.epochs = 1;
  t.max_steps = 3;
  t.eval_every = 0;  // only the final evaluation
}

void smallTestSet(int, StageTrainerConfig& c) { c.data.test_samples = 256; }

TEST(FinalEvaluation, FashionMnistSliceNeighbourGoneDuringItEndsTheRunWithoutItsFigures) {
  const std::string dir = testing::fashionSliceDir();
  ASSERT_FALSE(dir.empty()) << "neither CAIRN_FASHION_NODE_DATA nor CAIRN_TEST_MODELS is set";
  const testing::PipelineRun reference = testing::runInMemoryPipeline(dir, fewSteps, smallTestSet);
  ASSERT_EQ(reference.results.size(), 3u);
  for (const TrainerResult& r : reference.results) ASSERT_TRUE(r.final_eval.has_value());

  // Every node returns (before: the Root's PeerLost ended its run, and a provider paused for the
  // Stem until max_wait_s); the Root without figures, the others with the reference's.
  const testing::PipelineRun cut = testing::runInMemoryPipeline(
      dir, fewSteps, smallTestSet, {}, [](testing::InMemoryHub& hub) {
        hub.patience = 2s;
        hub.drop = [](int from, const StagePacket& p) { return from == 1 && p.tag == "eval_result"; };
      });
  ASSERT_EQ(cut.results.size(), 3u);
  EXPECT_FALSE(cut.results[0].final_eval.has_value());
  for (size_t i = 1; i < 3; ++i) {
    ASSERT_TRUE(cut.results[i].final_eval.has_value()) << "node " << i;
    EXPECT_EQ(cut.results[i].final_eval->samples, reference.results[i].final_eval->samples);
    EXPECT_EQ(cut.results[i].final_eval->loss, reference.results[i].final_eval->loss);
    EXPECT_EQ(cut.results[i].final_eval->accuracy, reference.results[i].final_eval->accuracy);
  }
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(cut.results[i].steps, 3);
  ASSERT_EQ(cut.parameters.size(), reference.parameters.size());
  for (const auto& [name, p] : reference.parameters)
    EXPECT_TRUE(torch::equal(cut.parameters.at(name), p)) << name;
}

// With checkpoints the rule needs one of the last step: a lost neighbour's replacement resumes
// from it, nothing is left to train, and the coordinator makes a volunteer lost after it done.
// Without one (3 steps, checkpoints every 2) the replacement would resume from step 2 and need
// this node to train step 3 again: the Root's PeerLost still pauses the run, as before.
TEST(FinalEvaluation, FashionMnistSliceNeighbourGoneDuringItEndsTheRunOnlyAfterAFinalCheckpoint) {
  const std::string dir = testing::fashionSliceDir();
  ASSERT_FALSE(dir.empty()) << "neither CAIRN_FASHION_NODE_DATA nor CAIRN_TEST_MODELS is set";
  const std::string base = (std::filesystem::temp_directory_path() /
                            ("cairn_final_eval_" + std::to_string(::getpid()))).string();
  auto lossy = [](testing::InMemoryHub& hub) {
    hub.patience = 2s;
    hub.drop = [](int from, const StagePacket& p) { return from == 1 && p.tag == "eval_result"; };
  };
  for (int every : {3, 2}) {
    std::filesystem::remove_all(base);
    auto run = [&] {
      return testing::runInMemoryPipeline(
          dir,
          [every](TrainOptions& t) {
            fewSteps(t);
            t.checkpoint_every = every;
          },
          [&](int i, StageTrainerConfig& c) {
            smallTestSet(i, c);
            c.checkpoint_dir = base + "/node_" + std::to_string(i);
          },
          {}, lossy);
    };
    if (every == 3) {
      const testing::PipelineRun cut = run();
      EXPECT_FALSE(cut.results[0].final_eval.has_value());
      EXPECT_TRUE(cut.results[2].final_eval.has_value());
    } else {
      EXPECT_THROW(run(), PeerLost) << "no checkpoint of step 3: the Root must pause";
    }
  }
  std::filesystem::remove_all(base);
}

// Not for a neighbour that is merely slow to answer within a step: only a loss while evaluating
// after the last step ends the run early. A silent neighbour mid-run still fails it (PeerLost).
TEST(FinalEvaluation, FashionMnistSliceNeighbourGoneMidRunStillFailsTheRun) {
  const std::string dir = testing::fashionSliceDir();
  ASSERT_FALSE(dir.empty()) << "neither CAIRN_FASHION_NODE_DATA nor CAIRN_TEST_MODELS is set";
  EXPECT_THROW(testing::runInMemoryPipeline(dir, fewSteps, smallTestSet, {},
                                            [](testing::InMemoryHub& hub) {
                                              hub.patience = 2s;
                                              hub.drop = [](int from, const StagePacket& p) {
                                                return from == 2 && p.kind == PacketKind::kGradient &&
                                                       p.step == 1;
                                              };
                                            }),
               PeerLost);
}

}  // namespace
}  // namespace cairn
