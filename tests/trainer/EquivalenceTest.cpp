// The sync schedule across 3 stages must train exactly like the unsplit model in one process.
// Reference: libtorch's own C++ frontend (torch::optim, torch::nn::functional::cross_entropy,
// torch::nn::utils::clip_grad_norm_) on the whole model and the whole batch — none of cairn's
// executor, loss scaling, optimizers or clipping — fed the very sample ids the Root used.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>

#include "tests/trainer/InMemoryPipeline.h"
#include "tests/trainer/TrainerTestPaths.h"
#include "trainer/Dataset.h"
#include "trainer/Optimizer.h"
#include "trainer/ScriptedLoss.h"

namespace cairn {
namespace {

struct Reference {
  std::map<std::string, torch::Tensor> parameters;
  std::vector<double> losses;
};

using BatchFn = std::function<std::pair<torch::Tensor, torch::Tensor>(const std::vector<int64_t>&)>;

// A torch::optim parameter group of the reference: the parameters `selects` picks (first group
// wins; the rest keep the optimizer's settings), with their lr scale and weight decay.
struct RefGroup {
  std::function<bool(const std::string& name)> selects;
  double lr_scale = 1;
  double weight_decay = 0;
};

std::unique_ptr<torch::optim::Optimizer> groupedReference(
    const torch::jit::Module& model, const OptimizerOptions& o, const std::vector<RefGroup>& groups) {
  std::vector<std::vector<torch::Tensor>> members(groups.size() + 1);
  for (const auto& p : model.named_parameters()) {
    size_t g = 0;
    while (g < groups.size() && !groups[g].selects(p.name)) ++g;
    members[g == groups.size() ? 0 : g + 1].push_back(p.value);
  }
  std::vector<torch::optim::OptimizerParamGroup> torch_groups;
  for (size_t g = 0; g < members.size(); ++g) {
    if (members[g].empty()) continue;
    const double scale = g == 0 ? 1 : groups[g - 1].lr_scale;
    const double decay = g == 0 ? o.weight_decay : groups[g - 1].weight_decay;
    std::unique_ptr<torch::optim::OptimizerOptions> options;
    if (o.kind == OptimizerKind::kSgd)
      options = std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(o.lr * scale)
                                                               .momentum(o.momentum)
                                                               .weight_decay(decay)
                                                               .nesterov(o.nesterov));
    else if (o.kind == OptimizerKind::kAdamW)
      options = std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(o.lr * scale).weight_decay(decay).eps(o.eps).betas(
              {o.beta1, o.beta2}));
    else
      options = std::make_unique<torch::optim::AdamOptions>(
          torch::optim::AdamOptions(o.lr * scale).weight_decay(decay).eps(o.eps).betas(
              {o.beta1, o.beta2}));
    torch_groups.emplace_back(members[g], std::move(options));
  }
  if (o.kind == OptimizerKind::kSgd)
    return std::make_unique<torch::optim::SGD>(torch_groups, torch::optim::SGDOptions(o.lr));
  if (o.kind == OptimizerKind::kAdamW)
    return std::make_unique<torch::optim::AdamW>(torch_groups, torch::optim::AdamWOptions(o.lr));
  return std::make_unique<torch::optim::Adam>(torch_groups, torch::optim::AdamOptions(o.lr));
}

Reference trainReference(const std::string& full_model, const BatchFn& batch_of,
                         const std::vector<std::vector<int64_t>>& batches,
                         const OptimizerOptions& o, double clip, double label_smoothing = 0,
                         const std::vector<RefGroup>& groups = {}) {
  torch::jit::Module model = torch::jit::load(full_model);
  model.train();
  std::vector<torch::Tensor> params;
  for (const auto& p : model.named_parameters()) params.push_back(p.value);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (!groups.empty()) {
    optimizer = groupedReference(model, o, groups);
  } else if (o.kind == OptimizerKind::kSgd) {
    optimizer = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(o.lr)
                                                                .momentum(o.momentum)
                                                                .weight_decay(o.weight_decay)
                                                                .nesterov(o.nesterov));
  } else if (o.kind == OptimizerKind::kAdamW) {
    optimizer = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(o.lr)
                                                                  .weight_decay(o.weight_decay)
                                                                  .eps(o.eps)
                                                                  .betas({o.beta1, o.beta2}));
  } else {
    optimizer = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(o.lr)
                                                                 .weight_decay(o.weight_decay)
                                                                 .eps(o.eps)
                                                                 .betas({o.beta1, o.beta2}));
  }
  Reference ref;
  for (const auto& ids : batches) {
    auto [inputs, targets] = batch_of(ids);
    optimizer->zero_grad();
    torch::Tensor out = model.forward({inputs}).toTensor();
    torch::Tensor loss = torch::nn::functional::cross_entropy(
        out.reshape({-1, out.size(-1)}), targets.reshape({-1}),
        torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(label_smoothing));
    loss.backward();
    if (clip > 0) torch::nn::utils::clip_grad_norm_(params, clip);
    optimizer->step();
    ref.losses.push_back(loss.item<double>());
  }
  for (const auto& p : model.named_parameters()) ref.parameters[p.name] = p.value.detach().clone();
  return ref;
}

BatchFn cnnBatches() {
  torch::Tensor inputs, targets;
  for (auto& [name, t] : readSafetensors(testing::trainerModelsDir() + "/cnn/data.safetensors")) {
    if (name == "inputs") inputs = t;
    if (name == "targets") targets = t;
  }
  return [inputs, targets](const std::vector<int64_t>& ids) {
    torch::Tensor index = torch::tensor(ids, torch::kLong);
    return std::make_pair(inputs.index_select(0, index), targets.index_select(0, index));
  };
}

BatchFn gptBatches() {
  std::ifstream in(testing::trainerModelsDir() + "/gpt/text.txt", std::ios::binary);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  return [bytes](const std::vector<int64_t>& ids) {
    const int64_t L = 16;
    torch::Tensor x = torch::empty({int64_t(ids.size()), L}, torch::kLong);
    torch::Tensor y = torch::empty({int64_t(ids.size()), L}, torch::kLong);
    for (size_t r = 0; r < ids.size(); ++r)
      for (int64_t j = 0; j < L; ++j) {
        x[int64_t(r)][j] = int64_t(bytes.at(size_t(ids[r] * L + j)));
        y[int64_t(r)][j] = int64_t(bytes.at(size_t(ids[r] * L + j + 1)));
      }
    return std::make_pair(x, y);
  };
}

struct Case {
  std::string model;  // cnn | gpt
  OptimizerKind optimizer;
  double clip;
  PipelineOrder order;
};

std::string caseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return c.model + "_" + toString(c.optimizer) + (c.clip > 0 ? "_clip" : "") +
         (c.order == PipelineOrder::kGPipe ? "_gpipe" : "_1f1b");
}

class SyncEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(SyncEquivalence, ThreeStagesMatchUnsplitModel) {
  ASSERT_FALSE(testing::trainerModelsDir().empty())
      << "CAIRN_TEST_MODELS is not set (ctest fixture trainer_models)";
  const Case c = GetParam();
  OptimizerOptions o;
  o.kind = c.optimizer;
  if (c.optimizer == OptimizerKind::kSgd) {
    o.lr = 0.05;
    o.momentum = 0.9;
    o.weight_decay = 1e-3;
  } else {
    o.lr = 1e-2;
    o.weight_decay = 0.01;
  }
  const std::string node_data = testing::trainerModelsDir() + "/" + c.model + "/node_data";
  testing::PipelineRun run = testing::runInMemoryPipeline(node_data, [&](TrainOptions& t) {
    t.optimizer = o;
    t.clip_grad_norm = c.clip;
    t.pipeline = c.order;
    t.microbatches = 4;
    t.max_steps = 10;
  });
  ASSERT_EQ(run.batches.size(), 10u);
  Reference ref =
      trainReference(testing::trainerModelsDir() + "/" + c.model + "/full.pt",
                     c.model == "cnn" ? cnnBatches() : gptBatches(), run.batches, o, c.clip);
  ASSERT_EQ(run.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(run.losses[i], ref.losses[i], 1e-5) << "step " << i;
  ASSERT_EQ(run.parameters.size(), ref.parameters.size());
  double max_diff = 0, max_change = 0;
  torch::jit::Module initial =
      torch::jit::load(testing::trainerModelsDir() + "/" + c.model + "/full.pt");
  std::map<std::string, torch::Tensor> start;
  for (const auto& p : initial.named_parameters()) start[p.name] = p.value;
  for (const auto& [name, expected] : ref.parameters) {
    ASSERT_TRUE(run.parameters.count(name)) << name << " missing from the stages";
    max_diff = std::max(max_diff, (run.parameters[name] - expected).abs().max().item<double>());
    max_change = std::max(max_change, (expected - start[name]).abs().max().item<double>());
  }
  EXPECT_LE(max_diff, 1e-5);
  EXPECT_GT(max_change, 1e-3)
      << "training did not move the parameters: the comparison would prove nothing";
  if (c.clip > 0) {
    EXPECT_LT(c.clip, 5.0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Trainer, SyncEquivalence,
    ::testing::Values(Case{"cnn", OptimizerKind::kSgd, 0, PipelineOrder::k1F1B},
                      Case{"cnn", OptimizerKind::kAdamW, 0, PipelineOrder::k1F1B},
                      Case{"gpt", OptimizerKind::kSgd, 0, PipelineOrder::k1F1B},
                      Case{"gpt", OptimizerKind::kAdamW, 0, PipelineOrder::k1F1B},
                      Case{"cnn", OptimizerKind::kSgd, 0.05, PipelineOrder::k1F1B},
                      Case{"gpt", OptimizerKind::kAdamW, 0.5, PipelineOrder::k1F1B},
                      Case{"cnn", OptimizerKind::kAdam, 0, PipelineOrder::kGPipe}),
    caseName);

// The run's losses and trained parameters against the reference, which must have moved them.
void expectRunMatches(const testing::PipelineRun& run, const Reference& ref,
                      const std::string& full_model, double tolerance) {
  ASSERT_EQ(run.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(run.losses[i], ref.losses[i], tolerance) << "step " << i;
  torch::jit::Module initial = torch::jit::load(full_model);
  std::map<std::string, torch::Tensor> start;
  for (const auto& p : initial.named_parameters()) start[p.name] = p.value;
  double max_diff = 0, max_change = 0;
  for (const auto& [name, expected] : ref.parameters) {
    ASSERT_TRUE(run.parameters.count(name)) << name << " missing from the stages";
    max_diff = std::max(max_diff, (run.parameters.at(name) - expected).abs().max().item<double>());
    max_change = std::max(max_change, (expected - start[name]).abs().max().item<double>());
  }
  EXPECT_LE(max_diff, tolerance);
  EXPECT_GT(max_change, 1e-3) << "training did not move the parameters";
}

// One stage holding the whole model (Root and Leaf at once, a GPU volunteer's usual plan) trains
// as the unsplit model does, under both schedules (async with one micro-batch in flight and one
// update per batch is the sync schedule): it keeps its loss shares on the device and reads them
// once per step (MicrobatchPasses::takeLosses), and their sums are the reference's step losses.
TEST(WholeModelEquivalence, OneStageMatchesUnsplitModel) {
  const std::string dir = testing::trainerModelsDir() + "/cnn";
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdamW;
  o.lr = 1e-2;
  o.weight_decay = 0.01;
  for (const bool async : {false, true}) {
    const testing::PipelineRun run =
        testing::runInMemoryPipeline(dir + "/whole/node_data", [&](TrainOptions& t) {
          t.optimizer = o;
          t.microbatches = 4;
          t.max_steps = 10;
          if (async) {
            t.schedule = ScheduleKind::kAsync;
            t.max_in_flight = 1;
            t.update_frequency = 4;
          }
        });
    ASSERT_EQ(run.batches.size(), 10u);
    SCOPED_TRACE(async ? "async" : "sync");
    expectRunMatches(run, trainReference(dir + "/full.pt", cnnBatches(), run.batches, o, 0),
                     dir + "/full.pt", 1e-5);
  }
}

// A TorchScript loss (make_loss_references.py's hand-written cross-entropy: (sum, count) and
// count(target)) over 3 stages, micro-batches of 8, 8, 7 and 7 samples: the unsplit model with
// libtorch's cross_entropy on the whole batch.
TEST(LossEquivalence, TorchScriptLossUnequalMicrobatches) {
  const std::string dir = testing::trainerModelsDir() + "/cnn";
  const std::string file = testing::trainerModelsDir() + "/losses/loss_ce.pt";
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdam;
  o.lr = 1e-2;
  o.weight_decay = 0;
  testing::PipelineRun run = testing::runInMemoryPipeline(dir + "/node_data", [&](TrainOptions& t) {
    t.loss.kind = LossKind::kTorchScript;  // each node its own module, as each provider
    t.loss.torchscript_path = file;
    t.loss.scripted = ScriptedLoss::load(file, "job.json", "loss_fn.torchscript");
    t.optimizer = o;
    t.batch_size = 30;
    t.microbatches = 4;
    t.max_steps = 8;
  });
  ASSERT_EQ(run.batches.size(), 8u);
  ASSERT_EQ(run.batches[0].size(), 30u);
  expectRunMatches(run, trainReference(dir + "/full.pt", cnnBatches(), run.batches, o, 0),
                   dir + "/full.pt", 1e-5);
}

// Label smoothing on the GPT (sequence targets), against libtorch's cross_entropy(label_smoothing).
TEST(LossEquivalence, LabelSmoothingMatchesUnsplitModel) {
  const std::string dir = testing::trainerModelsDir() + "/gpt";
  OptimizerOptions o;
  o.kind = OptimizerKind::kSgd;
  o.lr = 0.05;
  o.momentum = 0.9;
  o.weight_decay = 0;
  testing::PipelineRun run = testing::runInMemoryPipeline(dir + "/node_data", [&](TrainOptions& t) {
    t.loss.label_smoothing = 0.1;
    t.optimizer = o;
    t.max_steps = 8;
  });
  expectRunMatches(run, trainReference(dir + "/full.pt", gptBatches(), run.batches, o, 0, 0.1),
                   dir + "/full.pt", 1e-5);
}

// Parameter groups across the split GPT (LayerNorms and biases in every stage, the head in the
// last): no weight decay on biases and norm layers, half the lr on the head, as torch::optim
// param groups on the unsplit model selected by the names written out here.
TEST(OptimizerEquivalence, ParamGroupsMatchTorchOptimGroups) {
  const std::string dir = testing::trainerModelsDir() + "/gpt";
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdamW;
  o.lr = 1e-2;
  o.weight_decay = 0.05;
  ParamGroupRule no_decay;
  no_decay.biases = true;
  no_decay.norm_layers = true;
  no_decay.weight_decay = 0;
  ParamGroupRule head;
  head.names = {"head.*"};
  head.lr_scale = 0.5;
  o.param_groups = {no_decay, head};
  testing::PipelineRun run = testing::runInMemoryPipeline(dir + "/node_data", [&](TrainOptions& t) {
    t.optimizer = o;
    t.max_steps = 8;
  });
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  std::vector<RefGroup> groups = {
      {[&](const std::string& n) { return ends_with(n, ".bias") || n.find("ln") != std::string::npos; },
       1.0, 0.0},
      {[](const std::string& n) { return n.rfind("head.", 0) == 0; }, 0.5, 0.05}};
  expectRunMatches(run,
                   trainReference(dir + "/full.pt", gptBatches(), run.batches, o, 0, 0, groups),
                   dir + "/full.pt", 1e-5);
}

// Same job and seed twice: bit-identical losses.
TEST(Reproducibility, SameSeedGivesBitIdenticalLosses) {
  const std::string node_data = testing::trainerModelsDir() + "/gpt/node_data";
  auto adjust = [](TrainOptions& t) { t.max_steps = 5; };
  testing::PipelineRun a = testing::runInMemoryPipeline(node_data, adjust);
  testing::PipelineRun b = testing::runInMemoryPipeline(node_data, adjust);
  ASSERT_EQ(a.losses.size(), 5u);
  ASSERT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.batches, b.batches);
  testing::PipelineRun c = testing::runInMemoryPipeline(node_data, [](TrainOptions& t) {
    t.max_steps = 5;
    t.seed = 99;
  });
  EXPECT_NE(a.batches, c.batches) << "a different seed must shuffle differently";
}

// cairn's optimizers against torch::optim on the same parameters and gradients, step by step.
class OptimizerMatchesTorch : public ::testing::TestWithParam<int> {};

TEST_P(OptimizerMatchesTorch, TwentySteps) {
  torch::manual_seed(GetParam());
  OptimizerOptions o;
  std::vector<torch::Tensor> mine = {torch::randn({5, 3}), torch::randn({7})};
  std::vector<torch::Tensor> theirs;
  for (auto& p : mine) {
    p.requires_grad_(true);
    theirs.push_back(p.detach().clone().requires_grad_(true));
  }
  std::unique_ptr<torch::optim::Optimizer> reference;
  switch (GetParam()) {
    case 0:
      o.kind = OptimizerKind::kSgd, o.lr = 0.1, o.momentum = 0.9, o.nesterov = true,
      o.weight_decay = 0.01;
      reference = std::make_unique<torch::optim::SGD>(
          theirs, torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01));
      break;
    case 1:
      o.kind = OptimizerKind::kSgd, o.lr = 0.1, o.momentum = 0.5, o.dampening = 0.3,
      o.weight_decay = 0;
      reference = std::make_unique<torch::optim::SGD>(
          theirs, torch::optim::SGDOptions(0.1).momentum(0.5).dampening(0.3));
      break;
    case 2:
      o.kind = OptimizerKind::kAdam, o.lr = 0.01, o.weight_decay = 0.1;
      reference = std::make_unique<torch::optim::Adam>(
          theirs, torch::optim::AdamOptions(0.01).weight_decay(0.1));
      break;
    default:
      o.kind = OptimizerKind::kAdamW, o.lr = 0.01, o.weight_decay = 0.05, o.beta1 = 0.8,
      o.beta2 = 0.99;
      reference = std::make_unique<torch::optim::AdamW>(
          theirs, torch::optim::AdamWOptions(0.01).weight_decay(0.05).betas({0.8, 0.99}));
  }
  Optimizer optimizer(mine, o);
  for (int step = 0; step < 20; ++step) {
    for (size_t i = 0; i < mine.size(); ++i) {
      torch::Tensor g = torch::randn(mine[i].sizes());
      mine[i].mutable_grad() = g.clone();
      theirs[i].mutable_grad() = g.clone();
    }
    optimizer.step(o.lr);
    reference->step();
  }
  for (size_t i = 0; i < mine.size(); ++i)
    EXPECT_LE((mine[i] - theirs[i]).abs().max().item<double>(), 1e-6);
}
INSTANTIATE_TEST_SUITE_P(Trainer, OptimizerMatchesTorch, ::testing::Values(0, 1, 2, 3));

TEST(GradientClipping, SplitNormMatchesClipGradNorm) {
  torch::manual_seed(5);
  std::vector<torch::Tensor> a = {torch::randn({4, 4}), torch::randn({3})};
  std::vector<torch::Tensor> b = {torch::randn({6})};
  std::vector<torch::Tensor> all;
  for (auto* group : {&a, &b})
    for (auto& p : *group) {
      p.requires_grad_(true);
      p.mutable_grad() = torch::randn(p.sizes());
      torch::Tensor copy = p.detach().clone().requires_grad_(true);
      copy.mutable_grad() = p.grad().clone();
      all.push_back(copy);
    }
  const double total = std::sqrt(squaredGradientNorm(a) + squaredGradientNorm(b));
  const double reference_norm = torch::nn::utils::clip_grad_norm_(all, 1.0);
  EXPECT_NEAR(total, reference_norm, 1e-5);
  scaleGradientsForClipping(a, total, 1.0);
  scaleGradientsForClipping(b, total, 1.0);
  size_t i = 0;
  for (auto* group : {&a, &b})
    for (auto& p : *group) EXPECT_LE((p.grad() - all[i++].grad()).abs().max().item<double>(), 1e-6);
}

}  // namespace
}  // namespace cairn
