// The hand-over kind of the in-band clean stop (trainer/StopCoordinator.h, docs/TRAINING.md
// "Stopping"): a node asking with stop_hands_over stops the whole in-memory 3-stage pipeline at the
// same step as a plain stop does (the independent reference: the step and checkpoints a plain stop
// gives, CheckpointResumeTest), every node learns it was a hand-over and only the node that asked
// says it asked; a plain stop asked beside it wins; a malformed kind from upstream is refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>

#include "core/Error.h"
#include "tests/trainer/InMemoryPipeline.h"
#include "tests/trainer/TrainerTestPaths.h"
#include "trainer/Checkpoint.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;

std::string handOverNodeData() { return testing::trainerModelsDir() + "/cnn_bn_dropout/node_data"; }

void handOverOptions(TrainOptions& t) {
  t.optimizer.kind = OptimizerKind::kAdamW;
  t.optimizer.lr = 1e-2;
  t.microbatches = 4;
  t.max_steps = 20;
  t.checkpoint_every = 2;
}

// Says yes from its `nth` poll on.
std::function<bool()> yesFromPoll(int nth) {
  auto calls = std::make_shared<int>(0);
  return [calls, nth] { return ++*calls >= nth; };
}

// The 3-stage run with `ask(i, config)` setting who asks for what; checkpoints in `dir`/node_<i>.
testing::PipelineRun stoppedRun(const std::string& dir,
                                const std::function<void(int, StageTrainerConfig&)>& ask) {
  fs::remove_all(dir);
  return testing::runInMemoryPipeline(handOverNodeData(), handOverOptions,
                                      [&](int i, StageTrainerConfig& c) {
                                        c.checkpoint_dir = dir + "/node_" + std::to_string(i);
                                        ask(i, c);
                                      });
}

TEST(HandOver, OnlyTheAskingNodeSaysItAskedAndEveryNodeStopsAtThePlainStopsStep) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const std::string dir = (fs::temp_directory_path() / ("cairn_handover_" + std::to_string(::getpid()))).string();
  const testing::PipelineRun plain = stoppedRun(dir + "_plain", [](int i, StageTrainerConfig& c) {
    if (i == 1) c.stop_requested = yesFromPoll(4);
  });
  const testing::PipelineRun handed = stoppedRun(dir, [](int i, StageTrainerConfig& c) {
    if (i == 1) c.stop_requested = yesFromPoll(4);
    c.stop_hands_over = true;  // as provider --join sets it on every node
  });
  ASSERT_EQ(handed.results.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const TrainerResult& r = handed.results[size_t(i)];
    EXPECT_TRUE(r.stopped) << "node " << i;
    EXPECT_EQ(r.steps, plain.results[size_t(i)].steps) << "node " << i;
    EXPECT_TRUE(r.hand_over) << "node " << i;
    EXPECT_EQ(r.stop_asked_here, i == 1) << "node " << i;
    EXPECT_FALSE(plain.results[size_t(i)].hand_over) << "node " << i;
    // The step every node stopped at is checkpointed everywhere: the replacement resumes there.
    const auto steps = validCheckpointSteps(dir + "/node_" + std::to_string(i));
    ASSERT_FALSE(steps.empty());
    EXPECT_EQ(steps.back(), r.steps) << "node " << i;
  }
  fs::remove_all(dir);
  fs::remove_all(dir + "_plain");
}

TEST(HandOver, APlainStopAskedBesideAHandOverStopsTheWholeCluster) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const std::string dir = (fs::temp_directory_path() / ("cairn_handover_mixed_" + std::to_string(::getpid()))).string();
  const testing::PipelineRun run = stoppedRun(dir, [](int i, StageTrainerConfig& c) {
    if (i == 1) {
      c.stop_requested = yesFromPoll(4);
      c.stop_hands_over = true;
    }
    if (i == 2) c.stop_requested = yesFromPoll(4);  // a plain stop
  });
  for (const TrainerResult& r : run.results) {
    EXPECT_TRUE(r.stopped);
    EXPECT_FALSE(r.hand_over);
  }
  fs::remove_all(dir);
}

TEST(HandOver, AStopKindThatIsNotOneOrTwoIsRefused) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const JobSpec job = readJobSpec(jobSpecPath(handOverNodeData()));
  StageTrainerConfig c;
  c.node = readNodeSpec(nodeSpecPath(handOverNodeData(), "node_1"));
  c.options = parseTrainOptions(job.training, jobSpecPath(handOverNodeData()));
  c.data = parseDataOptions(job.data, jobSpecPath(handOverNodeData()));
  c.show_progress = false;
  testing::InMemoryHub hub(3);
  testing::InMemoryLink link(hub, 1);
  StagePacket plan;
  plan.tag = "plan";
  plan.text = R"({"total_steps": 4, "steps_per_epoch": 16, "eval_batches": 0})";
  hub.push(1, 0, plan);
  StagePacket activation;
  activation.kind = PacketKind::kActivation;
  activation.tensors = {{"a", torch::randn({8, 4, 4, 4})},
                        {"__targets", torch::zeros({8}, torch::kLong)},
                        {"__ids", torch::arange(8)},
                        {"__denominator", torch::tensor(32.0, torch::kDouble)},
                        {"__stop_at", torch::tensor(int64_t(3))},
                        {"__stop_kind", torch::tensor(int64_t(3))}};
  hub.push(1, 0, activation);
  StageTrainer trainer(c, torch::jit::load(nodeDirectory(handOverNodeData(), "node_1") + "/stage.pt"), link);
  try {
    trainer.run();
    ADD_FAILURE() << "ran with __stop_kind 3";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("__stop_kind must be one int64, 1 (stop) or 2 (hand-over); got 3"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace cairn
