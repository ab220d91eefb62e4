// The cost model's memory estimate of a stage against the peak CPU tensor memory measured while
// that stage trains like a GPipe node: load stage.pt, run M micro-batches forward (inputs arrive as
// autograd leaves), backward each with a gradient from downstream, Adam step; two steps so the
// optimizer state exists. Measurement: MemoryMeter counts every CPU tensor allocation made while
// it is installed (loading included) and reports the peak of live bytes.
#include <gtest/gtest.h>

#include <cstdio>

#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adam.h>

#include "TestModels.h"
#include "clusterize/CostModel.h"
#include "clusterize/MemoryMeter.h"
#include "clusterize/ModelGraph.h"
#include "clusterize/Profiler.h"
#include "clusterize/StageBuilder.h"

namespace cairn::clusterize {
namespace {

struct Measured {
  double estimate = 0;
  double peak = 0;
};

Measured trainStage(const ModelGraph& graph, const ModelProfile& profile, int begin_atom,
                    int end_atom, int microbatches, const std::string& path) {
  std::vector<AtomCost> atoms;
  for (const auto& a : profile.atoms)
    atoms.push_back({double(a.parameter_bytes), double(a.trainable_bytes), double(a.buffer_bytes),
                     double(a.saved_bytes), a.seconds});
  const CostModel cost(atoms, {profile.boundary_bytes.begin(), profile.boundary_bytes.end()},
                       {OptimizerKind::kAdam, microbatches});
  const int begin = profile.cuts[begin_atom], end = profile.cuts[end_atom];
  StageBuilder(graph).build(begin, end, "Measured").module.save(path);
  const auto in_desc = profile.describeCut(graph, begin);
  const auto out_desc = profile.describeCut(graph, end);

  Measured m;
  m.estimate = cost.memoryBytes(begin_atom, end_atom);
  MemoryMeter meter;
  const int64_t base = meter.liveBytes();
  {
    torch::jit::Module stage = torch::jit::load(path);
    stage.train();
    std::vector<at::Tensor> params;
    for (const auto& p : stage.parameters()) params.push_back(p);
    torch::optim::Adam adam(params, torch::optim::AdamOptions(1e-3));
    for (int step = 0; step < 2; ++step) {
      std::vector<at::Tensor> outputs;
      for (int k = 0; k < microbatches; ++k) {
        std::vector<c10::IValue> args;
        for (const auto& b : in_desc) {
          at::Tensor t = at::randn(b.shape);
          if (begin_atom > 0) t.requires_grad_(true);  // received activations are leaves
          args.emplace_back(t);
        }
        outputs.push_back(stage.forward(args).toTensor());
      }
      for (auto& out : outputs) {
        const at::Tensor grad = at::randn(out_desc[0].shape);  // gradient from downstream
        torch::autograd::backward({out}, {grad});
        out = at::Tensor();
      }
      adam.step();
      adam.zero_grad();
    }
  }
  m.peak = static_cast<double>(meter.peakBytes() - base);
  return m;
}

TEST(MemoryEstimate, WithinThirtyPercentOfMeasuredPeakWhileTraining) {
  torch::jit::Module model = torch::jit::load(testing::modelPath("cnn"));
  const ModelGraph graph(model, Granularity::kTop);
  const auto inputs = testing::exampleInputs("cnn", 32);
  ProfileOptions options;
  options.timed_runs = 1;
  options.warmup_runs = 0;
  const ModelProfile profile = profileModel(graph, inputs, options);
  const int atoms = static_cast<int>(profile.atoms.size());
  const std::string dir = testing::temporaryDirectory("memory");
  struct Case {
    int begin, end, microbatches;
  };
  // The whole model, a root stage (convolutions) and a non-root stage (the rest).
  for (const Case& c : {Case{0, atoms, 4}, Case{0, 8, 4}, Case{8, atoms, 4}, Case{0, atoms, 1}}) {
    const Measured m = trainStage(graph, profile, c.begin, c.end, c.microbatches, dir + "/stage.pt");
    const double ratio = m.estimate / m.peak;
    std::printf("memory estimate: atoms %d..%d, %d micro-batches: estimate %.2f MB, measured peak "
                "%.2f MB (%+.1f%%)\n",
                c.begin, c.end, c.microbatches, m.estimate / 1e6, m.peak / 1e6, (ratio - 1) * 100);
    EXPECT_GT(m.peak, 0);
    EXPECT_NEAR(ratio, 1.0, 0.30) << "atoms " << c.begin << ".." << c.end;
  }
}

// Atoms are timed as a provider runs them: the Root's inputs are data and get no gradient
// (trainer/StageExecutor), every later atom's inputs do (its stage sends them upstream).
TEST(Profile, OnlyTheFirstAtomIsTimedWithoutInputGradients) {
  torch::jit::Module model = torch::jit::load(testing::modelPath("cnn"));
  const ModelGraph graph(model, Granularity::kTop);
  ProfileOptions options;
  options.timed_runs = 1;
  options.warmup_runs = 0;
  const ModelProfile profile = profileModel(graph, testing::exampleInputs("cnn", 8), options);
  ASSERT_GT(profile.atoms.size(), 2u);
  EXPECT_FALSE(profile.atoms[0].inputs_need_grad);
  for (size_t a = 1; a < profile.atoms.size(); ++a) EXPECT_TRUE(profile.atoms[a].inputs_need_grad) << a;
}

}  // namespace
}  // namespace cairn::clusterize
