// A ClusterSync's own state across a stop and resume of the in-memory 3-stage pipeline: saved in
// every node's checkpoint and loaded before start(); and whether the checkpoint resumed from was
// written by this process (ClusterSync::setResumedFromAnotherProcess).
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/trainer/ResumeTestHelpers.h"
#include "trainer/Checkpoint.h"
#include "trainer/ClusterSync.h"

namespace cairn {
namespace {

using namespace testing::resume;

// A ClusterSync that keeps state of its own: the number of afterOptimizerStep calls and the sum of
// one parameter's values after each (an "outer" state that depends on the whole history).
class RecordingSync : public ClusterSync {
 public:
  void start(torch::jit::Module&) override { started_after_load = loaded || !expect_load; }
  void setResumedFromAnotherProcess(bool another) override { another_process = another ? 1 : 0; }
  void beforeOptimizerStep(int64_t, torch::jit::Module&) override {}
  void afterOptimizerStep(int64_t step, torch::jit::Module& stage) override {
    steps.push_back(step);
    const auto p = *stage.parameters().begin();
    history = history.defined() ? history + p.detach() : p.detach().clone();
  }
  void finish(int64_t, torch::jit::Module&) override {}
  void saveState(std::vector<std::pair<std::string, torch::Tensor>>* tensors,
                 nlohmann::json* meta) const override {
    tensors->emplace_back("sync.history", history);
    (*meta)["calls"] = steps.size();
  }
  void loadState(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                 const nlohmann::json& meta) override {
    loaded = true;
    ASSERT_EQ(tensors.size(), 1u);
    EXPECT_EQ(tensors[0].first, "sync.history");
    history = tensors[0].second.clone();
    loaded_calls = meta.at("calls").get<int64_t>();
  }
  bool expect_load = false, loaded = false, started_after_load = false;
  int64_t loaded_calls = -1;
  int another_process = -1;  // setResumedFromAnotherProcess: -1 never called
  std::vector<int64_t> steps;
  torch::Tensor history;
};

TEST(CheckpointResume, ClusterSyncStateIsSavedAndLoadedBeforeStartAndItsWriterTold) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const std::string dir = scratch("sync_state");
  RecordingSync reference_sync[3], stopped_sync[3], resumed_sync[3];
  testing::runInMemoryPipeline(nodeData(), syncOptions, [&](int i, StageTrainerConfig& c) {
    c.cluster_sync = &reference_sync[i];
  });
  const testing::PipelineRun stopped =
      testing::runInMemoryPipeline(nodeData(), syncOptions, [&](int i, StageTrainerConfig& c) {
        c.cluster_sync = &stopped_sync[i];
        c.checkpoint_dir = nodeDir(dir, i);
        if (i == 1) c.stop_requested = stopFromPoll(4);
      });
  ASSERT_EQ(stopped.results[0].steps, 5);
  testing::runInMemoryPipeline(nodeData(), syncOptions, [&](int i, StageTrainerConfig& c) {
    resumed_sync[i].expect_load = true;
    c.cluster_sync = &resumed_sync[i];
    c.checkpoint_dir = nodeDir(dir, i);
    c.resume_step = 5;
  });
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(resumed_sync[i].loaded);
    EXPECT_TRUE(resumed_sync[i].started_after_load);
    EXPECT_EQ(resumed_sync[i].loaded_calls, 5);
    std::vector<int64_t> later(reference_sync[i].steps.begin() + 5, reference_sync[i].steps.end());
    EXPECT_EQ(resumed_sync[i].steps, later);
    EXPECT_TRUE(torch::equal(resumed_sync[i].history, reference_sync[i].history));
    EXPECT_EQ(reference_sync[i].another_process, 0);  // a fresh start: this process's weights
    EXPECT_EQ(resumed_sync[i].another_process, 0);    // this process wrote the checkpoint
  }
  // The same checkpoints as written by another process (their meta's "writer" another's, or none
  // named: an older cairn's): the sync is told, so that a copy that looks corrupt next to a ring
  // peer's is taken as the writer's fault, not this process's (docs/TRAINING.md).
  RecordingSync foreign_sync[3];
  for (int i = 0; i < 3; ++i) {
    CheckpointData d = readCheckpoint(nodeDir(dir, i), 5);
    ASSERT_EQ(d.meta.at("writer"), thisProcessAsWriter());
    if (i == 0) d.meta.erase("writer");
    else d.meta["writer"] = "0123456789abcdef";
    writeCheckpoint(nodeDir(dir + "/foreign", i), d, 0);
  }
  testing::runInMemoryPipeline(nodeData(), syncOptions, [&](int i, StageTrainerConfig& c) {
    foreign_sync[i].expect_load = true;
    c.cluster_sync = &foreign_sync[i];
    c.checkpoint_dir = nodeDir(dir + "/foreign", i);
    c.resume_step = 5;
  });
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(foreign_sync[i].another_process, 1) << "node " << i;
    EXPECT_TRUE(torch::equal(foreign_sync[i].history, resumed_sync[i].history)) << "node " << i;
  }
  std::filesystem::remove_all(dir);
}


}  // namespace
}  // namespace cairn
