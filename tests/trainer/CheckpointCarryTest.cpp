// Carrying a run into a re-cut plan (trainer/CheckpointCarry.h, issue [I] part 2): a CNN with
// BatchNorm trained under AdamW at cut a ([l0 | l1 | l2 l3]) is stopped at step S with its
// checkpoints, carried to cut b ([l0 l1 | l2 | l3]) or c ([l0 l1 l2 | l3], fewer stages) and
// continued; its losses, parameters and buffers must be those of the uninterrupted run at cut a
// (a cut does not change the arithmetic; the optimizer state, the data cursor across the epoch
// boundary and the lr schedule's position must all carry over). Plus the refusals.
// Fixture: tests/trainer/make_recut_models.py (ctest trainer.make_recut_models).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>

#include "core/Error.h"
#include "tests/trainer/InMemoryPipeline.h"
#include "tests/trainer/TrainerTestPaths.h"
#include "trainer/Checkpoint.h"
#include "trainer/CheckpointCarry.h"
#include "tests/common/ScratchDir.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& cut) {
  return testing::trainerModelsDir() + "/recut/" + cut + "/node_data";
}

// A private copy of a fixture plan (checkpoints are written into it).
std::string copyPlan(const std::string& cut, const std::string& name) {
  const fs::path dir = ::cairn::testing::scratchDir("carry_" + name);
  fs::copy(fixture(cut), dir / "node_data", fs::copy_options::recursive);
  return (dir / "node_data").string();
}

constexpr int64_t kCheckpointCarrySteps = 22;  // 16 steps per epoch: the continuation crosses the boundary

void options(TrainOptions& t) {
  t.max_steps = kCheckpointCarrySteps;
  t.checkpoint_every = 3;
  t.lr_scheduler.kind = LrScheduleKind::kCosine;  // the schedule's position must carry too
}

void optionsClipped(TrainOptions& t) {
  options(t);
  t.clip_grad_norm = 0.5;
}

// stop_requested that says yes from its `nth` poll on.
std::function<bool()> checkpointCarryStopFromPoll(int nth) {
  auto calls = std::make_shared<int>(0);
  return [calls, nth] { return ++*calls >= nth; };
}

std::string nodeName(int i) { return "node_" + std::to_string(i); }

struct Carried {
  testing::PipelineRun stopped, resumed;
  int64_t step = 0;
};

// Runs `from` until the Root is asked to stop, carries its checkpoints into `to`, continues there.
Carried stopCarryContinue(const std::string& from, const std::string& to,
                          void (*adjust)(TrainOptions&)) {
  Carried c;
  c.stopped = testing::runInMemoryPipeline(from, adjust, [&](int i, StageTrainerConfig& cfg) {
    cfg.checkpoint_dir = nodeCheckpointDir(from, nodeName(i));
    if (i == 0) cfg.stop_requested = checkpointCarryStopFromPoll(8);
  });
  const CarryResult carry =
      planCarry(from, readJobSpec(jobSpecPath(to)), jobSpecPath(to), readCarryStages(to));
  c.step = carry.step;
  writeCarry(to, carry);
  c.resumed = testing::runInMemoryPipeline(to, adjust, [&](int i, StageTrainerConfig& cfg) {
    cfg.checkpoint_dir = nodeCheckpointDir(to, nodeName(i));
    cfg.resume_step = carry.step;
  });
  return c;
}

// max |a − b| over the joined losses and every parameter and buffer (by name).
double maxDifference(const testing::PipelineRun& reference, const Carried& c) {
  EXPECT_EQ(int64_t(reference.losses.size()), kCheckpointCarrySteps);
  EXPECT_GE(int64_t(c.stopped.losses.size()), c.step);
  std::vector<double> joined(c.stopped.losses.begin(), c.stopped.losses.begin() + c.step);
  joined.insert(joined.end(), c.resumed.losses.begin(), c.resumed.losses.end());
  EXPECT_EQ(joined.size(), reference.losses.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(joined.size(), reference.losses.size()); ++i)
    worst = std::max(worst, std::abs(joined[i] - reference.losses[i]));
  EXPECT_EQ(reference.parameters.size(), c.resumed.parameters.size());
  for (const auto& [name, t] : reference.parameters) {
    auto it = c.resumed.parameters.find(name);
    if (it == c.resumed.parameters.end()) {
      ADD_FAILURE() << "parameter " << name << " missing after the carry";
      continue;
    }
    worst = std::max(worst, (t - it->second).abs().max().item<double>());
  }
  EXPECT_EQ(reference.buffers.size(), c.resumed.buffers.size());
  for (const auto& [name, t] : reference.buffers) {
    auto it = c.resumed.buffers.find(name);
    if (it == c.resumed.buffers.end()) {
      ADD_FAILURE() << "buffer " << name << " missing after the carry";
      continue;
    }
    worst = std::max(worst, (t.to(torch::kDouble) - it->second.to(torch::kDouble)).abs().max().item<double>());
  }
  return worst;
}

TEST(CheckpointCarry, RecutContinuationEqualsTheUninterruptedRunBitForBit) {
  const testing::PipelineRun reference = testing::runInMemoryPipeline(fixture("a"), options);
  for (const std::string cut : {"b", "c"}) {
    SCOPED_TRACE("a -> " + cut);
    const Carried c = stopCarryContinue(copyPlan("a", "bits_a" + cut), copyPlan(cut, "bits_" + cut),
                                        options);
    EXPECT_GT(c.step, 0);
    EXPECT_LT(c.step, 16);  // stopped in the first epoch: the continuation crosses into the second
    for (const auto& r : c.resumed.results) {
      EXPECT_FALSE(r.stopped);
      EXPECT_EQ(r.steps, kCheckpointCarrySteps);
    }
    EXPECT_EQ(maxDifference(reference, c), 0.0);
    // The data order carried over: the continuation's batches are the reference's.
    ASSERT_EQ(c.step + int64_t(c.resumed.batches.size()), int64_t(reference.batches.size()));
    for (size_t i = 0; i < c.resumed.batches.size(); ++i)
      EXPECT_EQ(c.resumed.batches[i], reference.batches[size_t(c.step) + i]) << "step " << c.step + int64_t(i);
  }
}

TEST(CheckpointCarry, WithoutTheOptimizerStateTheContinuationDiffers) {
  // The test above has teeth: the same carry with the Adam moments and step counts dropped
  // continues from the right weights and data position but does not match.
  const testing::PipelineRun reference = testing::runInMemoryPipeline(fixture("a"), options);
  const std::string from = copyPlan("a", "teeth_a"), to = copyPlan("b", "teeth_b");
  Carried c;
  c.stopped = testing::runInMemoryPipeline(from, options, [&](int i, StageTrainerConfig& cfg) {
    cfg.checkpoint_dir = nodeCheckpointDir(from, nodeName(i));
    if (i == 0) cfg.stop_requested = checkpointCarryStopFromPoll(8);
  });
  CarryResult carry =
      planCarry(from, readJobSpec(jobSpecPath(to)), jobSpecPath(to), readCarryStages(to));
  size_t dropped = 0;
  for (auto& [name, d] : carry.checkpoints)
    for (auto it = d.tensors.begin(); it != d.tensors.end();)
      if (it->first.rfind("optim.", 0) == 0) {
        it = d.tensors.erase(it);
        ++dropped;
      } else {
        ++it;
      }
  EXPECT_EQ(dropped, 3u * 12u);  // 12 trainable tensors, exp_avg + exp_avg_sq + step each
  c.step = carry.step;
  writeCarry(to, carry);
  c.resumed = testing::runInMemoryPipeline(to, options, [&](int i, StageTrainerConfig& cfg) {
    cfg.checkpoint_dir = nodeCheckpointDir(to, nodeName(i));
    cfg.resume_step = carry.step;
  });
  EXPECT_GT(maxDifference(reference, c), 1e-4);
}

TEST(CheckpointCarry, RecutContinuationWithGradientClippingWithin1e6) {
  // clip_grad_norm sums the stages' squared norms in another grouping after a re-cut: equal up to
  // rounding.
  const testing::PipelineRun reference = testing::runInMemoryPipeline(fixture("a"), optionsClipped);
  const Carried c =
      stopCarryContinue(copyPlan("a", "clip_a"), copyPlan("b", "clip_b"), optionsClipped);
  EXPECT_LE(maxDifference(reference, c), 1e-6);
}

// Checkpoints of cut a at some steps, in a private copy.
std::string checkpointedA(const std::string& name) {
  const std::string a = copyPlan("a", name);
  testing::runInMemoryPipeline(a, options, [&](int i, StageTrainerConfig& cfg) {
    cfg.checkpoint_dir = nodeCheckpointDir(a, nodeName(i));
    if (i == 0) cfg.stop_requested = checkpointCarryStopFromPoll(8);
  });
  return a;
}

std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const BadInput& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CheckpointCarry, Refusals) {
  const std::string a = checkpointedA("refuse_a");
  const std::string b = fixture("b");
  const JobSpec job = readJobSpec(jobSpecPath(b));
  const std::vector<CarryStage> stages = readCarryStages(b);
  const std::vector<int64_t> steps = validCheckpointSteps(nodeCheckpointDir(a, "node_1"));
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(planCarry(a, job, "b/job.json", stages).step, steps.back());

  // A step not checkpointed everywhere.
  EXPECT_NE(refusal([&] { planCarry(a, job, "b/job.json", stages, 999); })
                .find("step 999 is not checkpointed on every node"),
            std::string::npos);
  // Another optimizer.
  JobSpec sgd = job;
  sgd.training["optimizer"] = {{"name", "sgd"}, {"lr", 0.1}, {"momentum", 0.9}};
  EXPECT_NE(refusal([&] { planCarry(a, sgd, "b/job.json", stages); })
                .find("b/job.json: training_definition.optimizer is sgd"),
            std::string::npos);
  // Another job.
  JobSpec other = job;
  other.job_id = "someone_else";
  EXPECT_NE(refusal([&] { planCarry(a, other, "b/job.json", stages); }).find("job_id \"someone_else\""),
            std::string::npos);
  // A parameter the checkpoints lack (renamed in the new plan).
  std::vector<CarryStage> renamed = stages;
  renamed[1].tensors[0].first = "l9.fc.weight";
  renamed[1].trainable[0] = "l9.fc.weight";
  const std::string names = refusal([&] { planCarry(a, job, "b/job.json", renamed); });
  EXPECT_NE(names.find("holds \"l9.fc.weight\" but no checkpoint of cluster 0"), std::string::npos)
      << names;
  // A shape that differs.
  std::vector<CarryStage> reshaped = stages;
  reshaped[2].tensors[0].second = torch::zeros({5, 17});
  const std::string shape = refusal([&] { planCarry(a, job, "b/job.json", reshaped); });
  EXPECT_NE(shape.find("\"l3.weight\" is Float [5, 16] but node node_2"), std::string::npos) << shape;
  // Another number of clusters.
  std::vector<CarryStage> moved = stages;
  for (auto& s : moved) s.node.cluster = 1;
  EXPECT_NE(refusal([&] { planCarry(a, job, "b/job.json", moved); }).find("cluster"),
            std::string::npos);
  // DiLoCo outer state (sync tensors) is not re-mapped.
  {
    const std::vector<CarryStage> olds = readCarryStages(a);
    std::vector<CheckpointData> checkpoints;
    std::vector<std::string> sources;
    for (const auto& s : olds) {
      checkpoints.push_back(readCheckpoint(nodeCheckpointDir(a, s.node.name), steps.back()));
      sources.push_back(s.node.name + ".ckpt");
    }
    checkpoints[1].meta["sync_tensors"] = {"sync.ring_1.previous.0"};
    checkpoints[1].tensors.emplace_back("sync.ring_1.previous.0", torch::zeros({4}));
    const std::string e =
        refusal([&] { remapClusterCheckpoints(olds, checkpoints, sources, stages); });
    EXPECT_NE(e.find("node_1.ckpt: holds ring-sync state tensors"), std::string::npos) << e;
    EXPECT_NE(e.find("DiLoCo"), std::string::npos) << e;
  }
  // A node without checkpoints.
  fs::remove_all(nodeCheckpointDir(a, "node_2"));
  EXPECT_NE(refusal([&] { planCarry(a, job, "b/job.json", stages); })
                .find("node node_2 has no valid checkpoint"),
            std::string::npos);
  // No plan at all.
  EXPECT_NE(refusal([&] { planCarry(a + "/nowhere", job, "b/job.json", stages); }).find("nowhere"),
            std::string::npos);
}

TEST(CheckpointCarry, NoCommonStepIsRefusedNamingEveryNodesSteps) {
  const std::string a = checkpointedA("common_a");
  const std::vector<int64_t> steps = validCheckpointSteps(nodeCheckpointDir(a, "node_0"));
  ASSERT_FALSE(steps.empty());
  // node_1 keeps only its oldest, node_0 only its newest.
  for (int64_t s : steps) {
    if (s != steps.front()) fs::remove(checkpointPath(nodeCheckpointDir(a, "node_1"), s));
    if (s != steps.back()) fs::remove(checkpointPath(nodeCheckpointDir(a, "node_0"), s));
  }
  ASSERT_GT(steps.size(), 1u);
  const std::string b = fixture("b");
  const std::string e = refusal(
      [&] { planCarry(a, readJobSpec(jobSpecPath(b)), "b/job.json", readCarryStages(b)); });
  EXPECT_NE(e.find("no step has a valid checkpoint on every node"), std::string::npos) << e;
  EXPECT_NE(e.find("node_0: " + std::to_string(steps.back())), std::string::npos) << e;
}

}  // namespace
}  // namespace cairn
