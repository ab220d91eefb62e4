// Checkpoint, clean stop and resume of the in-memory 3-stage pipeline (BatchNorm in stages 0 and 1,
// dropout in the Leaf, AdamW), against the independent reference of an uninterrupted run with the
// same seed: a run stopped through stop_requested on a NON-root node and resumed by new trainers
// from its checkpoint must give bit-identical per-step losses, parameters and buffers.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include "core/Error.h"
#include "tests/trainer/InMemoryPipeline.h"
#include "tests/trainer/ResumeTestHelpers.h"
#include "tests/trainer/TrainerTestPaths.h"
#include "trainer/Checkpoint.h"
#include "trainer/ClusterSync.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using namespace testing::resume;

TEST(CheckpointResume, SyncStopOnANonRootNodeThenResumeIsBitIdentical) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const std::string dir = scratch("sync");
  const testing::PipelineRun reference = testing::runInMemoryPipeline(nodeData(), syncOptions);

  // Stopped: node 1 is asked from its 4th poll (the start of step 3); its gradients of step 3 carry
  // the request to the Root, which stops the cluster after step 4 (5 steps done).
  const testing::PipelineRun stopped = testing::runInMemoryPipeline(
      nodeData(), syncCheckpointEvery2, [&](int i, StageTrainerConfig& c) {
        c.checkpoint_dir = nodeDir(dir, i);
        if (i == 2) c.metrics_path = dir + "/metrics_node_2.jsonl";
        if (i == 1) c.stop_requested = stopFromPoll(4);
      });
  for (const auto& r : stopped.results) {
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.steps, 5);
  }
  ASSERT_EQ(stopped.results[0].steps, 5);
  for (int i = 0; i < 3; ++i)  // every 2 steps and at the stop; keep_checkpoints 3 (default)
    EXPECT_EQ(validCheckpointSteps(nodeDir(dir, i)), (std::vector<int64_t>{2, 4, 5}));

  const testing::PipelineRun resumed = testing::runInMemoryPipeline(
      nodeData(), syncCheckpointEvery2, [&](int i, StageTrainerConfig& c) {
        c.checkpoint_dir = nodeDir(dir, i);
        c.resume_step = 5;
        if (i == 2) c.metrics_path = dir + "/metrics_node_2.jsonl";
      });
  for (const auto& r : resumed.results) {
    EXPECT_FALSE(r.stopped);
    EXPECT_EQ(r.steps, kSteps);
  }
  expectSameLosses(reference.losses, stopped.losses, 5, resumed.losses);
  expectSameState(reference, resumed);
  EXPECT_EQ(stopped.batches.size() + resumed.batches.size(), reference.batches.size());
  for (size_t i = 0; i < resumed.batches.size(); ++i)
    EXPECT_EQ(resumed.batches[i], reference.batches[5 + i]) << "step " << 5 + i;

  // metrics.jsonl was appended to: steps 1..5, {"resumed_from": 5}, steps 6..20.
  std::ifstream in(dir + "/metrics_node_2.jsonl");
  std::vector<int64_t> steps;
  int resumed_records = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("resumed_from")) {
      EXPECT_EQ(j["resumed_from"], 5);
      EXPECT_EQ(steps.size(), 5u);
      ++resumed_records;
    }
    if (j.contains("step") && j.contains("loss")) steps.push_back(j["step"].get<int64_t>());
  }
  EXPECT_EQ(resumed_records, 1);
  ASSERT_EQ(int64_t(steps.size()), kSteps);
  for (int64_t i = 0; i < kSteps; ++i) EXPECT_EQ(steps[size_t(i)], i + 1);
  fs::remove_all(dir);
}

// A run resumed from an older step than a node's newest checkpoint (its cluster agreed on that
// step after a loss) drops the newer checkpoints when it loads, not at its next write: they are of
// the abandoned run, and until then a volunteer would neither upload the step it resumed from nor
// could a resume agreement tell them from the new run's (issue [Q]: a spare was given such a step
// and its neighbours, which had deleted it, could not resume with it).
TEST(CheckpointResume, ResumingFromAnOlderStepDropsTheNewerCheckpointsWhenLoading) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const std::string dir = scratch("older");
  const testing::PipelineRun reference = testing::runInMemoryPipeline(nodeData(), syncOptions);
  const testing::PipelineRun stopped = testing::runInMemoryPipeline(
      nodeData(), syncCheckpointEvery2, [&](int i, StageTrainerConfig& c) {
        c.checkpoint_dir = nodeDir(dir, i);
        if (i == 1) c.stop_requested = stopFromPoll(4);
      });
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(validCheckpointSteps(nodeDir(dir, i)), (std::vector<int64_t>{2, 4, 5}));
  // Node i's trainer loads its checkpoint when it is made, before node i + 1's config is made.
  std::vector<std::vector<int64_t>> held_after_loading;
  const testing::PipelineRun resumed = testing::runInMemoryPipeline(
      nodeData(), syncCheckpointEvery2, [&](int i, StageTrainerConfig& c) {
        if (i > 0) held_after_loading.push_back(validCheckpointSteps(nodeDir(dir, i - 1)));
        c.checkpoint_dir = nodeDir(dir, i);
        c.resume_step = 4;
      });
  ASSERT_EQ(held_after_loading.size(), 2u);
  for (const auto& held : held_after_loading) EXPECT_EQ(held, (std::vector<int64_t>{2, 4}));
  expectSameLosses(reference.losses, stopped.losses, 4, resumed.losses);
  expectSameState(reference, resumed);
  fs::remove_all(dir);
}

TEST(CheckpointResume, AsyncStopDrainsAndResumeIsBitIdentical) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const std::string dir = scratch("async");
  // Stopped (checkpoints only at the stop): node 1 asks after its 3rd completed step.
  const testing::PipelineRun stopped = testing::runInMemoryPipeline(
      nodeData(), asyncOptions, [&](int i, StageTrainerConfig& c) {
        c.checkpoint_dir = nodeDir(dir + "/stopped", i);
        if (i == 1) c.stop_requested = stopFromPoll(4);
      });
  const int64_t S = stopped.results[0].steps;
  for (const auto& r : stopped.results) {
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.steps, S);
  }
  ASSERT_GT(S, 3);
  ASSERT_LT(S, kSteps);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(validCheckpointSteps(nodeDir(dir + "/stopped", i)), std::vector<int64_t>{S});

  // The async schedule drains the pipeline at every checkpoint, which changes which weights the
  // forwards in flight see; the reference therefore checkpoints every S steps (it drains at S,
  // 2S, ... as the stopped + resumed pair does), uninterrupted.
  auto everyS = [S](TrainOptions& t) {
    asyncOptions(t);
    t.checkpoint_every = S;
    t.keep_checkpoints = kSteps;  // the reference's step S is compared below
  };
  const testing::PipelineRun reference =
      testing::runInMemoryPipeline(nodeData(), everyS, [&](int i, StageTrainerConfig& c) {
        c.checkpoint_dir = nodeDir(dir + "/reference", i);
      });
  const testing::PipelineRun resumed =
      testing::runInMemoryPipeline(nodeData(), everyS, [&](int i, StageTrainerConfig& c) {
        c.checkpoint_dir = nodeDir(dir + "/stopped", i);
        c.resume_step = S;
      });
  for (const auto& r : resumed.results) EXPECT_EQ(r.steps, kSteps);
  expectSameLosses(reference.losses, stopped.losses, S, resumed.losses);
  expectSameState(reference, resumed);
  // The reference's own checkpoint of step S holds the same parameters as the stopped run's.
  const CheckpointData a = readCheckpoint(nodeDir(dir + "/reference", 1), S);
  const CheckpointData b = readCheckpoint(nodeDir(dir + "/stopped", 1), S);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    if (a.tensors[i].first != "rng.cpu") {  // node 1 never draws; its snapshot is of a shared one
      EXPECT_TRUE(torch::equal(a.tensors[i].second, b.tensors[i].second)) << a.tensors[i].first;
    }
  }
  fs::remove_all(dir);
}

TEST(CheckpointResume, CorruptNewestCheckpointFallsBackToThePreviousValidOne) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const std::string dir = scratch("fallback");
  const testing::PipelineRun stopped = testing::runInMemoryPipeline(
      nodeData(), syncCheckpointEvery2, [&](int i, StageTrainerConfig& c) {
        c.checkpoint_dir = nodeDir(dir, i);
        if (i == 1) c.stop_requested = stopFromPoll(4);
      });
  ASSERT_EQ(stopped.results[0].steps, 5);
  // A flipped bit in node 1's newest checkpoint.
  const std::string newest = checkpointPath(nodeDir(dir, 1), 5);
  {
    std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-7, std::ios::end);
    const char c = char(f.get());
    f.seekp(-7, std::ios::end);
    f.put(char(c ^ 0x01));
  }
  // The cluster resumes from the newest step every node holds a valid checkpoint of.
  std::vector<int64_t> common = validCheckpointSteps(nodeDir(dir, 0));
  for (int i = 1; i < 3; ++i) {
    const std::vector<int64_t> mine = validCheckpointSteps(nodeDir(dir, i));
    std::vector<int64_t> both;
    std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(),
                          std::back_inserter(both));
    common = both;
  }
  EXPECT_EQ(validCheckpointSteps(nodeDir(dir, 1)), (std::vector<int64_t>{2, 4}));
  ASSERT_EQ(common, (std::vector<int64_t>{2, 4}));
  const int64_t from = common.back();
  const testing::PipelineRun resumed = testing::runInMemoryPipeline(
      nodeData(), syncCheckpointEvery2, [&](int i, StageTrainerConfig& c) {
        c.checkpoint_dir = nodeDir(dir, i);
        c.resume_step = from;
      });
  const testing::PipelineRun reference = testing::runInMemoryPipeline(nodeData(), syncOptions);
  expectSameLosses(reference.losses, stopped.losses, from, resumed.losses);
  expectSameState(reference, resumed);
  // Loading the corrupt file itself is refused, naming it.
  try {
    readCheckpoint(nodeDir(dir, 1), 5);
    ADD_FAILURE() << "a corrupt checkpoint was read";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find(newest), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(CheckpointResume, CheckpointOfAnotherNodeOrJobIsRefused) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const std::string dir = scratch("refuse");
  testing::runInMemoryPipeline(
      nodeData(),
      [](TrainOptions& t) {
        syncOptions(t);
        t.max_steps = 2;
        t.checkpoint_every = 2;
      },
      [&](int i, StageTrainerConfig& c) { c.checkpoint_dir = nodeDir(dir, i); });
  ASSERT_EQ(validCheckpointSteps(nodeDir(dir, 0)), std::vector<int64_t>{2});

  const JobSpec job = readJobSpec(jobSpecPath(nodeData()));
  auto configFor = [&](int node) {
    StageTrainerConfig c;
    c.node = readNodeSpec(nodeSpecPath(nodeData(), "node_" + std::to_string(node)));
    c.options = parseTrainOptions(job.training, jobSpecPath(nodeData()));
    c.data = parseDataOptions(job.data, jobSpecPath(nodeData()));
    c.show_progress = false;
    c.resume_step = 2;
    return c;
  };
  auto resumeError = [&](StageTrainerConfig c) -> std::string {
    testing::InMemoryHub hub(3);
    testing::InMemoryLink link(hub, c.node.stage);
    try {
      StageTrainer trainer(
          c, torch::jit::load(nodeDirectory(nodeData(), c.node.name) + "/stage.pt"), link);
    } catch (const BadInput& e) {
      return e.what();
    }
    return "";
  };
  // node_1 pointed at node_0's checkpoints.
  StageTrainerConfig other_node = configFor(1);
  other_node.checkpoint_dir = nodeDir(dir, 0);
  const std::string e1 = resumeError(other_node);
  EXPECT_NE(e1.find(checkpointPath(nodeDir(dir, 0), 2)), std::string::npos) << e1;
  EXPECT_NE(e1.find("\"node_0\""), std::string::npos) << e1;
  EXPECT_NE(e1.find("refusing"), std::string::npos) << e1;

  // node_1's own checkpoint rewritten (validly) as if of another job.
  CheckpointData d = readCheckpoint(nodeDir(dir, 1), 2);
  d.meta["job_id"] = "some_other_job";
  writeCheckpoint(dir + "/other_job", d, 3);
  StageTrainerConfig other_job = configFor(1);
  other_job.checkpoint_dir = dir + "/other_job";
  const std::string e2 = resumeError(other_job);
  EXPECT_NE(e2.find("some_other_job"), std::string::npos) << e2;
  EXPECT_NE(e2.find("job_id"), std::string::npos) << e2;

  // Its own checkpoint loads (the refusals above are about identity, not the file).
  StageTrainerConfig own = configFor(1);
  own.checkpoint_dir = nodeDir(dir, 1);
  EXPECT_EQ(resumeError(own), "");
  // And a missing one is a BadInput naming the file.
  own.resume_step = 7;
  EXPECT_NE(resumeError(own).find(checkpointPath(nodeDir(dir, 1), 7)), std::string::npos);
  fs::remove_all(dir);
}

// Real data: the Fashion-MNIST slice (ctest fixture trainer.make_fashion_slice) with random flips
// (the augmentation cursor is part of the checkpoint), stopped from the Leaf and resumed: losses,
// parameters, buffers and the final test loss equal the uninterrupted run's.
TEST(CheckpointResume, FashionMnistSliceStopAndResumeWithAugmentation) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const std::string data = testing::trainerModelsDir() + "/fashion_slice";
  const std::string dir = scratch("fashion");
  auto options = [](TrainOptions& t) {
    t.epochs = 0;
    t.max_steps = kSteps;
    t.eval_every = 0;
  };
  auto flips = [](StageTrainerConfig& c) { c.data.random_flip = true; };
  const testing::PipelineRun reference = testing::runInMemoryPipeline(
      data, options, [&](int, StageTrainerConfig& c) { flips(c); });
  const testing::PipelineRun stopped =
      testing::runInMemoryPipeline(data, options, [&](int i, StageTrainerConfig& c) {
        flips(c);
        c.checkpoint_dir = nodeDir(dir, i);
        if (i == 2) c.stop_requested = stopFromPoll(7);  // start of step 6: 8 steps done
      });
  const int64_t S = stopped.results[0].steps;
  EXPECT_EQ(S, 8);
  for (const auto& r : stopped.results) EXPECT_TRUE(r.stopped && r.steps == S);
  const testing::PipelineRun resumed =
      testing::runInMemoryPipeline(data, options, [&](int i, StageTrainerConfig& c) {
        flips(c);
        c.checkpoint_dir = nodeDir(dir, i);
        c.resume_step = S;
      });
  expectSameLosses(reference.losses, stopped.losses, S, resumed.losses);
  expectSameState(reference, resumed);
  ASSERT_TRUE(reference.results.back().final_eval && resumed.results.back().final_eval);
  EXPECT_EQ(resumed.results.back().final_eval->loss, reference.results.back().final_eval->loss);
  std::printf("[ figure ] fashion-mnist slice, %lld steps: final test loss %.6f uninterrupted, "
              "%.6f stopped at %lld and resumed\n",
              (long long)kSteps, reference.results.back().final_eval->loss,
              resumed.results.back().final_eval->loss, (long long)S);
  fs::remove_all(dir);
}

// A broken or hostile upstream announcing a stop step that is not after the packet's step is a
// BadInput naming the packet, not a hang or a crash.
TEST(CheckpointResume, BadStopAtFromUpstreamIsRefused) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const JobSpec job = readJobSpec(jobSpecPath(nodeData()));
  StageTrainerConfig c;
  c.node = readNodeSpec(nodeSpecPath(nodeData(), "node_1"));
  c.options = parseTrainOptions(job.training, jobSpecPath(nodeData()));
  c.data = parseDataOptions(job.data, jobSpecPath(nodeData()));
  c.show_progress = false;
  for (const int64_t bad : {int64_t(0), int64_t(-3)}) {
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
                          {"__stop_at", torch::tensor(bad)}};
    hub.push(1, 0, activation);
    StageTrainer trainer(c, torch::jit::load(nodeDirectory(nodeData(), "node_1") + "/stage.pt"),
                         link);
    try {
      trainer.run();
      ADD_FAILURE() << "ran with __stop_at " << bad;
    } catch (const BadInput& e) {
      EXPECT_NE(std::string(e.what()).find("__stop_at must be one int64 greater than the step"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("got " + std::to_string(bad)), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace cairn
