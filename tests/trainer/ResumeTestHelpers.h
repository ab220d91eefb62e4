// What the checkpoint-and-resume tests share (CheckpointResumeTest.cpp, ClusterSyncResumeTest.cpp):
// the in-memory 3-stage pipeline's node data, scratch folders, the options of its runs, a stop
// from node 1, and the comparisons with the uninterrupted run.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/trainer/InMemoryPipeline.h"
#include "tests/trainer/TrainerTestPaths.h"

namespace cairn::testing::resume {

inline std::string nodeData() { return trainerModelsDir() + "/cnn_bn_dropout/node_data"; }

inline std::string scratch(const std::string& name) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("cairn_resume_" + std::to_string(::getpid()) + "_" + name))
                              .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string nodeDir(const std::string& root, int node) {
  return root + "/node_" + std::to_string(node);
}

constexpr int64_t kSteps = 20;  // crosses the epoch boundary (16 steps per epoch)

inline void syncOptions(TrainOptions& t) {
  t.optimizer.kind = OptimizerKind::kAdamW;
  t.optimizer.lr = 1e-2;
  t.optimizer.weight_decay = 0.01;
  t.microbatches = 4;
  t.max_steps = kSteps;
  t.clip_grad_norm = 1.0;
}

// syncOptions with a checkpoint every 2 steps.
inline void syncCheckpointEvery2(TrainOptions& t) {
  syncOptions(t);
  t.checkpoint_every = 2;
}

inline void asyncOptions(TrainOptions& t) {
  syncOptions(t);
  t.clip_grad_norm = 0;
  t.schedule = ScheduleKind::kAsync;
  t.update_frequency = 3;  // updates fall mid-step: checkpoints carry accumulated gradients
}

// stop_requested for node 1 that says yes from its `nth` poll on.
inline std::function<bool()> stopFromPoll(int nth) {
  auto calls = std::make_shared<int>(0);
  return [calls, nth] { return ++*calls >= nth; };
}

inline void expectSameState(const PipelineRun& expected, const PipelineRun& actual) {
  ASSERT_EQ(expected.parameters.size(), actual.parameters.size());
  for (const auto& [name, t] : expected.parameters)
    EXPECT_TRUE(torch::equal(t, actual.parameters.at(name)))
        << name << " differs by " << (t - actual.parameters.at(name)).abs().max().item<double>();
  ASSERT_EQ(expected.buffers.size(), actual.buffers.size());
  ASSERT_FALSE(expected.buffers.empty()) << "the model should have BatchNorm buffers";
  for (const auto& [name, t] : expected.buffers)
    EXPECT_TRUE(torch::equal(t, actual.buffers.at(name))) << name;
}

// The losses of the stopped run followed by the resumed run's must be the uninterrupted run's.
inline void expectSameLosses(const std::vector<double>& reference,
                             const std::vector<double>& before, int64_t resumed_from,
                             const std::vector<double>& after) {
  ASSERT_EQ(int64_t(reference.size()), kSteps);
  ASSERT_GE(int64_t(before.size()), resumed_from);
  std::vector<double> joined(before.begin(), before.begin() + resumed_from);
  joined.insert(joined.end(), after.begin(), after.end());
  ASSERT_EQ(joined.size(), reference.size());
  for (size_t i = 0; i < joined.size(); ++i) EXPECT_EQ(joined[i], reference[i]) << "step " << i;
}

}  // namespace cairn::testing::resume
