// Schedule "async": weight stashing (a stashed micro-batch's backward equals a recomputation with
// the weights its forward used), the in-memory 3-stage async run (step count, clean ending, and
// with one micro-batch in flight and one update per batch it IS the sync schedule), and the
// async-only options.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>

#include "core/Error.h"
#include "tests/trainer/InMemoryPipeline.h"
#include "tests/trainer/TrainerTestPaths.h"
#include "trainer/Optimizer.h"

namespace cairn {
namespace {

std::map<std::string, torch::Tensor> snapshot(const StageExecutor& e) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, p] : e.namedParameters()) out[name] = p.detach().clone();
  return out;
}

// Forward + backward of (x, gy) on a fresh copy of the model holding `weights`.
std::pair<torch::Tensor, std::map<std::string, torch::Tensor>> recompute(
    const std::string& model, const std::map<std::string, torch::Tensor>& weights,
    const torch::Tensor& x, const torch::Tensor& gy) {
  torch::jit::Module m = torch::jit::load(model);
  m.train();
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : m.named_parameters()) p.value.copy_(weights.at(p.name));
  }
  torch::Tensor xi = x.detach().clone().requires_grad_(true);
  torch::Tensor y = m.forward({xi}).toTensor();
  torch::autograd::backward({y}, {gy});
  std::map<std::string, torch::Tensor> grads;
  for (const auto& p : m.named_parameters()) grads[p.name] = p.value.grad().clone();
  return {xi.grad().clone(), grads};
}

TEST(WeightStashing, StashedBackwardEqualsRecomputationWithStashedWeights) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const std::string model = testing::trainerModelsDir() + "/cnn/full.pt";
  torch::manual_seed(11);
  StageExecutor e(torch::jit::load(model), {{"x", "tensor", "float32", {}}},
                  {{"logits", "tensor", "float32", {}}}, /*inputs_need_grad=*/true);
  e.enableWeightStashing();
  OptimizerOptions o;
  o.kind = OptimizerKind::kSgd;
  o.lr = 0.5;
  o.momentum = 0.9;
  Optimizer optimizer(e.parameters(), o);
  std::vector<torch::Tensor> x, gy;
  for (int i = 0; i < 6; ++i) {
    x.push_back(torch::randn({4, 1, 8, 8}));
    gy.push_back(torch::randn({4, 5}));
  }
  std::map<int, std::map<std::string, torch::Tensor>> weights_of;  // micro-batch -> its weights
  auto forward = [&](int id) {
    weights_of[id] = snapshot(e);
    e.forward(uint64_t(id), {x[size_t(id)]});
  };
  double max_diff = 0, max_weight_change = 0;
  auto backwardAndStep = [&](int id) {
    auto input_grads = e.backward(uint64_t(id), {gy[size_t(id)]});
    auto [rx, rgrads] = recompute(model, weights_of[id], x[size_t(id)], gy[size_t(id)]);
    max_diff = std::max(max_diff, (input_grads.at(0) - rx).abs().max().item<double>());
    for (auto& [name, p] : e.namedParameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      max_diff = std::max(max_diff, (p.grad() - rgrads.at(name)).abs().max().item<double>());
      max_weight_change = std::max(
          max_weight_change, (p.detach() - weights_of[id].at(name)).abs().max().item<double>());
    }
    e.newVersion();
    optimizer.step(o.lr);
    optimizer.zeroGrad();
  };
  // Three in flight on version 0; updates between every forward and its backward.
  forward(0);
  forward(1);
  forward(2);
  backwardAndStep(0);  // -> version 1 (0 still used by 1, 2)
  forward(3);
  backwardAndStep(1);  // stashed version 0, one update later
  forward(4);
  backwardAndStep(2);  // stashed version 0, two updates later
  forward(5);
  backwardAndStep(3);
  backwardAndStep(4);
  backwardAndStep(5);
  EXPECT_LE(max_diff, 1e-6);
  EXPECT_GT(max_weight_change, 1e-3) << "the weights never moved: the test would prove nothing";
  EXPECT_EQ(e.pendingMicrobatches(), 0u);
  const auto& s = e.stashStats();
  EXPECT_LE(s.max_versions, 3);  // never more versions than micro-batches in flight
  EXPECT_GE(s.max_versions, 2);
  EXPECT_EQ(s.versions, 0);
  int64_t param_bytes = 0;
  for (auto& p : e.parameters()) param_bytes += p.numel() * int64_t(p.element_size());
  EXPECT_EQ(s.max_bytes, s.max_versions * param_bytes);
}

// A tensor tied under two names is stashed once and set under both names in a version: forward
// sees one tensor, the stash counts its bytes once, and the backward's gradient (both uses
// summed) equals a recomputation with the weights its forward used.
TEST(WeightStashing, ATiedTensorIsStashedOnce) {
  torch::jit::Module m("__torch__.StashTiedPair");
  const torch::Tensor tied = torch::randn({3, 3}).requires_grad_(true);
  m.register_parameter("a", tied, false);
  m.register_parameter("b", tied, false);
  m.define("def forward(self, x):\n    return (x @ self.a).tanh() @ self.b\n");
  StageExecutor e(m, {{"x", "tensor", "float32", {}}}, {{"y", "tensor", "float32", {}}},
                  /*inputs_need_grad=*/true);
  e.enableWeightStashing();
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({4, 3}), gy = torch::randn({4, 3});
  const torch::Tensor used = tied.detach().clone();
  e.forward(0, {x});
  {
    torch::NoGradGuard no_grad;
    tied.add_(1.0);  // an update between the forward and its backward
  }
  e.newVersion();
  e.backward(0, {gy});
  const torch::Tensor w = used.clone().requires_grad_(true);
  torch::autograd::backward({x.matmul(w).tanh().matmul(w)}, {gy});
  ASSERT_TRUE(tied.grad().defined());
  EXPECT_LE((tied.grad() - w.grad()).abs().max().item<double>(), 1e-6);
  EXPECT_EQ(e.stashStats().max_bytes, 9 * 4);  // one version of one 3x3 float tensor
}

TEST(AsyncSchedule, OneInFlightAndOneUpdatePerBatchIsTheSyncSchedule) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const std::string node_data = testing::trainerModelsDir() + "/cnn/node_data";
  auto common = [](TrainOptions& t) {
    t.optimizer.kind = OptimizerKind::kAdamW;
    t.optimizer.lr = 1e-2;
    t.optimizer.weight_decay = 0.01;
    t.microbatches = 4;
    t.max_steps = 10;
  };
  testing::PipelineRun sync = testing::runInMemoryPipeline(node_data, common);
  testing::PipelineRun async = testing::runInMemoryPipeline(node_data, [&](TrainOptions& t) {
    common(t);
    t.schedule = ScheduleKind::kAsync;
    t.max_in_flight = 1;
    t.update_frequency = 4;
  });
  ASSERT_EQ(async.losses.size(), 10u);
  ASSERT_EQ(async.batches, sync.batches);
  for (size_t i = 0; i < 10; ++i) EXPECT_NEAR(async.losses[i], sync.losses[i], 1e-6) << i;
  double max_diff = 0;
  for (auto& [name, p] : sync.parameters)
    max_diff = std::max(max_diff, (async.parameters.at(name) - p).abs().max().item<double>());
  EXPECT_LE(max_diff, 1e-6);
}

TEST(AsyncSchedule, ManyInFlightEndsCleanlyAndLearns) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const std::string node_data = testing::trainerModelsDir() + "/cnn/node_data";
  for (int64_t k : {3, 6}) {
    testing::PipelineRun run = testing::runInMemoryPipeline(node_data, [&](TrainOptions& t) {
      t.schedule = ScheduleKind::kAsync;
      t.max_in_flight = k;
      t.update_frequency = 1;
      t.optimizer.kind = OptimizerKind::kAdamW;
      t.optimizer.lr = 3e-3;
      t.microbatches = 4;
      t.epochs = 4;  // 16 steps per epoch of 512 samples
      t.max_steps = 0;
    });
    ASSERT_EQ(run.losses.size(), 64u) << "K " << k;
    // Ends cleanly: every node did every step, none stopped early, and every activation and
    // gradient sent while K micro-batches were in flight was received (nothing left in flight).
    for (const auto& r : run.results) {
      EXPECT_EQ(r.steps, 64) << "K " << k;
      EXPECT_FALSE(r.stopped) << "K " << k;
    }
    EXPECT_EQ(run.undelivered, 0u) << "K " << k << ": packets still in flight after the run";
    for (double loss : run.losses) ASSERT_TRUE(std::isfinite(loss)) << "K " << k;
    double first = 0, last = 0;
    for (int i = 0; i < 8; ++i) first += run.losses[size_t(i)] / 8;
    for (int i = 56; i < 64; ++i) last += run.losses[size_t(i)] / 8;
    EXPECT_LT(last, first) << "K " << k << ": async did not reduce the training loss";
  }
}

TEST(AsyncSchedule, OptionsNameTheKey) {
  TrainOptions a = parseTrainOptions({{"schedule", "async"}}, "job.json");
  EXPECT_EQ(a.schedule, ScheduleKind::kAsync);
  EXPECT_EQ(a.max_in_flight, 0);
  EXPECT_EQ(a.update_frequency, 1);
  a = parseTrainOptions({{"schedule", "async"}, {"max_in_flight", 5}, {"update_frequency", 2}},
                        "job.json");
  EXPECT_EQ(a.max_in_flight, 5);
  EXPECT_EQ(a.update_frequency, 2);
  auto message = [](const nlohmann::json& j) {
    try {
      parseTrainOptions(j, "job.json");
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{"max_in_flight", 2}}).find("max_in_flight"), std::string::npos);
  EXPECT_NE(message({{"schedule", "sync"}, {"update_frequency", 2}}).find("update_frequency"),
            std::string::npos);
  EXPECT_NE(message({{"schedule", "async"}, {"update_frequency", 0}}).find("update_frequency"),
            std::string::npos);
  EXPECT_NE(message({{"schedule", "async"}, {"pipeline", "gpipe"}}).find("pipeline"),
            std::string::npos);
  EXPECT_NE(message({{"schedule", "async"}, {"clip_grad_norm", 1.0}}).find("clip_grad_norm"),
            std::string::npos);
  EXPECT_NE(message({{"schedule", "bogus"}}).find("schedule"), std::string::npos);
}

}  // namespace
}  // namespace cairn

namespace cairn {
namespace {

// Fashion-MNIST slice (15,360 training images, 2,000 test images, 3 stages cut by
// make_node_data_by_hand), sync vs async on the same samples and steps. ctest's fixture
// trainer.make_fashion_slice writes it to $CAIRN_TEST_MODELS/fashion_slice;
// CAIRN_FASHION_NODE_DATA names another folder. The first 60 steps (7,680 images, half the
// epoch) by default; CAIRN_FASHION_STEPS=0: the epoch.
TEST(AsyncSchedule, FashionMnistSliceSyncVsAsync) {
  const std::string dir = testing::fashionSliceDir();
  ASSERT_FALSE(dir.empty()) << "neither CAIRN_FASHION_NODE_DATA nor CAIRN_TEST_MODELS is set";
  const int64_t steps = testing::fashionSliceSteps(60);
  double accuracy[2] = {0, 0};
  for (int async = 0; async < 2; ++async) {
    testing::PipelineRun run = testing::runInMemoryPipeline(dir, [&](TrainOptions& t) {
      t.epochs = 1;
      t.max_steps = steps;
      t.eval_every = 0;
      if (async) t.schedule = ScheduleKind::kAsync;
    });
    ASSERT_TRUE(run.results.back().final_eval.has_value());
    accuracy[async] = run.results.back().final_eval->accuracy;
    std::printf("fashion-mnist %s: %zu steps, accuracy %.2f%%, %.1f s\n", async ? "async" : "sync",
                run.losses.size(), 100 * accuracy[async], run.results.back().seconds);
  }
  EXPECT_GT(accuracy[1], 0.80);
  EXPECT_GT(accuracy[1], accuracy[0] - 0.02);
}

}  // namespace
}  // namespace cairn
