// precision "bf16": stage forwards under CPU autocast to bfloat16 with float32 master weights.
// References: the same stages and steps in float32 (libtorch's own kernels), which bf16 must
// follow within bfloat16's rounding (8 bits of mantissa) — and from which it must differ, or the
// autocast never happened.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "core/Error.h"
#include "tests/trainer/InMemoryPipeline.h"
#include "tests/trainer/TrainerTestPaths.h"
#include "trainer/Precision.h"
#include "trainer/StageExecutor.h"
#include "trainer/TrainOptions.h"

namespace cairn {
namespace {

torch::jit::Module linearStage() {
  torch::jit::Module m("LinearStage");
  torch::manual_seed(3);
  m.register_parameter("weight", torch::randn({64, 32}).requires_grad_(true), false);
  m.register_parameter("bias", torch::randn({64}).requires_grad_(true), false);
  m.define(R"(
    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(torch.linear(x, self.weight, self.bias))
  )");
  return m;
}

TEST(Precision, Bf16StageComputesInBf16AndKeepsFloat32Around) {
  std::vector<BoundaryValue> in = {{"x", "tensor", "float32", {}}};
  std::vector<BoundaryValue> out = {{"y", "tensor", "float32", {}}};
  StageExecutor fp32(linearStage(), in, out, /*inputs_need_grad=*/true);
  StageExecutor bf16(linearStage(), in, out, /*inputs_need_grad=*/true);
  bf16.setPrecision(Precision::kBf16);
  const torch::Tensor x = torch::randn({16, 32});
  const torch::Tensor y32 = fp32.forward(0, {x})[0];
  const torch::Tensor y16 = bf16.forward(0, {x})[0];
  EXPECT_EQ(y16.scalar_type(), torch::kFloat) << "what leaves a stage is float32";
  const double scale = y32.abs().max().item<double>();
  const double diff = (y16 - y32).abs().max().item<double>();
  EXPECT_GT(diff, 0) << "bf16 gave float32's exact values: autocast did not run";
  EXPECT_LT(diff, 0.05 * scale);
  // Backward: float32 gradients on float32 parameters and inputs, close to float32's.
  const torch::Tensor g = torch::randn(y32.sizes());
  auto gx32 = fp32.backward(0, {g});
  auto gx16 = bf16.backward(0, {g});
  EXPECT_EQ(gx16[0].scalar_type(), torch::kFloat);
  auto p32 = fp32.namedParameters(), p16 = bf16.namedParameters();
  for (size_t i = 0; i < p16.size(); ++i) {
    EXPECT_EQ(p16[i].second.scalar_type(), torch::kFloat) << p16[i].first;
    ASSERT_TRUE(p16[i].second.grad().defined()) << p16[i].first;
    EXPECT_EQ(p16[i].second.grad().scalar_type(), torch::kFloat) << p16[i].first;
    const double gscale = p32[i].second.grad().abs().max().item<double>();
    EXPECT_LT((p16[i].second.grad() - p32[i].second.grad()).abs().max().item<double>(),
              0.05 * gscale)
        << p16[i].first;
  }
  // An in-place update of the master weights (what the optimizer does) is what the next forward
  // sees: no stale bf16 copy from autocast's cache.
  {
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : bf16.namedParameters()) p.mul_(-1);
  }
  const torch::Tensor again = bf16.forward(1, {x})[0];
  const torch::Tensor expected =
      torch::relu(-at::linear(x, p32[0].second, p32[1].second));
  EXPECT_LT((again - expected).abs().max().item<double>(), 0.05 * scale);
  // Evaluation too, and autocast is off again outside the stage.
  const torch::Tensor eval16 = bf16.evaluate({x})[0];
  EXPECT_EQ(eval16.scalar_type(), torch::kFloat);
  EXPECT_LT((eval16 - expected).abs().max().item<double>(), 0.05 * scale);
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
  EXPECT_EQ(torch::mm(x, x.t()).scalar_type(), torch::kFloat);
}

// Three stages in bf16 against the same run in fp32: every step's loss within bf16's rounding,
// the trained parameters close, and not bit-identical.
class Bf16Pipeline : public ::testing::TestWithParam<std::string> {};

// |a - b| / |b - start| over all parameters (L2 norms of the differences from the initial model).
double relativeDeviation(const testing::PipelineRun& a, const testing::PipelineRun& b,
                         const torch::jit::Module& initial) {
  double deviation = 0, change = 0;
  for (const auto& p : initial.named_parameters()) {
    deviation += (a.parameters.at(p.name) - b.parameters.at(p.name)).pow(2).sum().item<double>();
    change += (b.parameters.at(p.name) - p.value).pow(2).sum().item<double>();
  }
  return std::sqrt(deviation / change);
}

TEST_P(Bf16Pipeline, FollowsTheFp32Run) {
  const std::string node_data = testing::trainerModelsDir() + "/" + GetParam() + "/node_data";
  // SGD: a parameter's deviation follows its gradients' (Adam would turn near-zero gradients'
  // rounding into lr-sized steps in any two implementations).
  auto adjust = [](Precision p, int64_t steps) {
    return [p, steps](TrainOptions& t) {
      t.precision = p;
      t.max_steps = steps;
      t.optimizer.kind = OptimizerKind::kSgd;
      t.optimizer.lr = 0.05;
      t.optimizer.momentum = 0.9;
      t.optimizer.weight_decay = 0;
    };
  };
  const int64_t steps = 10;
  using testing::runInMemoryPipeline;
  testing::PipelineRun fp32 = runInMemoryPipeline(node_data, adjust(Precision::kFp32, steps));
  testing::PipelineRun bf16 = runInMemoryPipeline(node_data, adjust(Precision::kBf16, steps));
  ASSERT_EQ(bf16.losses.size(), size_t(steps));
  ASSERT_EQ(bf16.batches, fp32.batches);
  double max_loss_diff = 0;
  for (size_t i = 0; i < fp32.losses.size(); ++i) {
    max_loss_diff = std::max(max_loss_diff, std::abs(bf16.losses[i] - fp32.losses[i]));
    EXPECT_NEAR(bf16.losses[i], fp32.losses[i], 0.02 * fp32.losses[i]) << "step " << i;
  }
  EXPECT_GT(max_loss_diff, 0) << "bf16 gave fp32's exact losses: autocast did not run";
  torch::jit::Module initial =
      torch::jit::load(testing::trainerModelsDir() + "/" + GetParam() + "/full.pt");
  for (const auto& p : initial.named_parameters())
    ASSERT_EQ(bf16.parameters.at(p.name).scalar_type(), torch::kFloat) << p.name;
  // The reference for the bound, from the same CPU's kernels: one step of each from the same
  // weights. Its parameter change is lr x the gradient, so `first` is the relative error of
  // bf16's first gradient — what this CPU's bfloat16 kernels (native or emulated) give.
  testing::PipelineRun fp32_first = runInMemoryPipeline(node_data, adjust(Precision::kFp32, 1));
  testing::PipelineRun bf16_first = runInMemoryPipeline(node_data, adjust(Precision::kBf16, 1));
  const double first = relativeDeviation(bf16_first, fp32_first, initial);
  const double ratio = relativeDeviation(bf16, fp32, initial);
  std::printf("%s bf16 vs fp32: max loss difference %.2e; |bf16 - fp32| / |fp32 - start| over "
              "the parameters: %.2e after 1 step, %.2e after %lld\n",
              GetParam().c_str(), max_loss_diff, first, ratio, (long long)steps);
  double change = 0;  // the training moved the parameters
  for (const auto& p : initial.named_parameters())
    change += (fp32.parameters.at(p.name) - p.value).pow(2).sum().item<double>();
  EXPECT_GT(std::sqrt(change), 1e-2);
  EXPECT_GT(first, 0) << "bf16 gave fp32's exact gradients: autocast did not run";
  // bf16 moved the parameters the way fp32 did, up to its rounding: after `steps` steps the
  // relative deviation stays within twice the first step's. Successive steps' rounding errors are
  // alike (the same weights, similar batches) and momentum SGD averages them (0.82x and 1.08x the
  // first step's for the two models on an AVX2 CPU that emulates bf16); a run that drifted away
  // from fp32's would grow past it. (A fixed bound of 5% held on one CPU's kernels, not another's.)
  EXPECT_LT(ratio, 2 * first);
}

INSTANTIATE_TEST_SUITE_P(Trainer, Bf16Pipeline, ::testing::Values("cnn", "gpt"),
                         [](const auto& info) { return info.param; });

TEST(TrainOptions, PrecisionIsValidated) {
  EXPECT_EQ(parseTrainOptions(nlohmann::json::object(), "job.json").precision, Precision::kFp32);
  EXPECT_EQ(parseTrainOptions({{"precision", "bf16"}}, "job.json").precision, Precision::kBf16);
  try {
    parseTrainOptions({{"precision", "fp16"}}, "job.json");
    FAIL() << "fp16 accepted";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("job.json: training_definition.precision"),
              std::string::npos)
        << e.what();
  }
}

// Fashion-MNIST slice (15,360 training images, 2,000 test images, the example CNN with BatchNorm
// in 3 stages): the same steps in fp32 and in bf16 on the same samples. Prints both times (not
// asserted: the machine is shared) and asserts bf16's accuracy is within 1.5 points of fp32's, and
// fp32's above 70 % (it trains: chance is 10 %). 30 steps (3,840 images) by default: where bf16 is
// emulated (AVX2 CPUs) a bf16 step costs ~10 fp32 steps (here 74.80 % and 74.45 %, 4.7 s and
// 40.8 s); CAIRN_FASHION_STEPS=N trains N steps, 0 the whole epoch (85.80 % and 85.45 %).
TEST(Precision, FashionMnistSliceBf16VsFp32) {
  const std::string dir = testing::fashionSliceDir();
  ASSERT_FALSE(dir.empty()) << "neither CAIRN_FASHION_NODE_DATA nor CAIRN_TEST_MODELS is set";
  const int64_t steps = testing::fashionSliceSteps(30);
  double accuracy[2] = {0, 0}, loss[2] = {0, 0};
  for (int bf16 = 0; bf16 < 2; ++bf16) {
    testing::PipelineRun run = testing::runInMemoryPipeline(dir, [&](TrainOptions& t) {
      t.epochs = 1;
      t.max_steps = steps;
      t.eval_every = 0;
      t.precision = bf16 ? Precision::kBf16 : Precision::kFp32;
    });
    ASSERT_TRUE(run.results.back().final_eval.has_value());
    accuracy[bf16] = run.results.back().final_eval->accuracy;
    loss[bf16] = run.results.back().final_eval->loss;
    std::printf("fashion-mnist %s: %zu steps, test loss %.4f, accuracy %.2f%%, %.1f s\n",
                bf16 ? "bf16" : "fp32", run.losses.size(), loss[bf16], 100 * accuracy[bf16],
                run.results.back().seconds);
  }
  EXPECT_GT(accuracy[0], 0.70);
  EXPECT_NEAR(accuracy[1], accuracy[0], 0.015);
}

}  // namespace
}  // namespace cairn
