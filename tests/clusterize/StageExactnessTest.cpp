// Cutting is exact: for every valid cut (and several multi-cut plans), running the stage modules in
// sequence — with tensors crossing each boundary as fresh autograd leaves, as over a network —
// gives the original model's output and, after backward of the same loss, the same parameter
// gradients. The reference is the original TorchScript model run whole in libtorch.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include <torch/csrc/autograd/autograd.h>

#include "TestModels.h"
#include "clusterize/ModelGraph.h"
#include "clusterize/StageBuilder.h"

namespace cairn::clusterize {
namespace {

using testing::exampleInputs;
using testing::modelPath;

struct Reference {
  at::Tensor output;
  std::map<std::string, at::Tensor> grads;
};

// loss = sum(output * weights), with fixed weights: every output element matters.
at::Tensor lossOf(const at::Tensor& output) {
  at::manual_seed(11);
  const at::Tensor weights = at::randn(output.sizes());
  return (output * weights).sum();
}

Reference runOriginal(torch::jit::Module model, const std::vector<c10::IValue>& inputs) {
  for (const auto& p : model.parameters()) p.mutable_grad() = at::Tensor();
  const at::Tensor out = model.forward(inputs).toTensor();
  lossOf(out).backward();
  Reference ref;
  ref.output = out.detach();
  for (const auto& p : model.named_parameters())
    if (p.value.grad().defined()) ref.grads[p.name] = p.value.grad().clone();
  return ref;
}

c10::IValue asLeaf(const c10::IValue& v) {
  if (!v.isTensor()) return v;
  at::Tensor t = v.toTensor().detach();
  if (t.is_floating_point()) t.requires_grad_(true);
  return t;
}

// Runs the stages like a pipeline of separate processes: forward in order, then backward from the
// last stage, handing each stage's input gradients to the stage before.
Reference runStages(std::vector<StageModule>& stages, const std::vector<c10::IValue>& inputs,
                    const ModelGraph& graph) {
  std::vector<std::vector<c10::IValue>> stage_inputs(stages.size());
  std::vector<std::vector<c10::IValue>> stage_outputs(stages.size());
  std::vector<c10::IValue> carry = inputs;
  for (size_t s = 0; s < stages.size(); ++s) {
    for (const auto& p : stages[s].module.parameters()) p.mutable_grad() = at::Tensor();
    for (const auto& v : carry) stage_inputs[s].push_back(s == 0 ? v : asLeaf(v));
    const c10::IValue out = stages[s].module.forward(stage_inputs[s]);
    if (stages[s].outputs.size() == 1) {
      stage_outputs[s] = {out};
    } else {
      stage_outputs[s] = out.toTupleRef().elements().vec();
    }
    EXPECT_EQ(stage_outputs[s].size(), stages[s].outputs.size());
    carry = stage_outputs[s];
  }
  Reference result;
  const at::Tensor final_output = stage_outputs.back()[0].toTensor();
  result.output = final_output.detach();
  lossOf(final_output).backward();
  for (size_t s = stages.size() - 1; s-- > 0;) {
    std::vector<at::Tensor> outs, grads;
    for (size_t i = 0; i < stage_outputs[s].size(); ++i) {
      const c10::IValue& next_in = stage_inputs[s + 1][i];
      if (!next_in.isTensor() || !next_in.toTensor().grad().defined()) continue;
      const at::Tensor& out = stage_outputs[s][i].toTensor();
      if (!out.requires_grad()) continue;
      outs.push_back(out);
      grads.push_back(next_in.toTensor().grad());
    }
    if (!outs.empty()) torch::autograd::backward(outs, grads);
  }
  std::map<std::string, int> holders;
  for (auto& stage : stages) {
    for (const auto& p : stage.module.named_parameters()) {
      ++holders[p.name];
      if (p.value.grad().defined()) result.grads[p.name] = p.value.grad().clone();
    }
  }
  // A shared parameter (ModelGraph::sharedParameters) has a copy in each stage using it: the whole
  // model's gradient is the sum of the copies' (what trainer/SharedParameters.h makes), under
  // every one of its names. Anything else is held by one stage.
  std::set<std::string> shared_names;
  for (const SharedParameter& shared : graph.sharedParameters()) {
    at::Tensor total;
    for (auto& stage : stages) {
      std::set<const c10::TensorImpl*> seen;  // a stage holding it under two names: one copy
      for (const auto& p : stage.module.named_parameters())
        if (std::count(shared.names.begin(), shared.names.end(), p.name) &&
            seen.insert(p.value.unsafeGetTensorImpl()).second && p.value.grad().defined())
          total = total.defined() ? total + p.value.grad() : p.value.grad().clone();
    }
    for (const auto& name : shared.names) {
      shared_names.insert(name);
      if (total.defined() && holders.count(name)) result.grads[name] = total;
    }
  }
  for (const auto& [name, count] : holders)
    if (!shared_names.count(name)) {
      EXPECT_EQ(count, 1) << name << " is held by several stages";
    }
  return result;
}

double maxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return 1e30;
  return (a - b).abs().max().item<double>();
}

void expectSame(const Reference& ref, const Reference& got, const std::string& what) {
  EXPECT_LE(maxAbsDiff(ref.output, got.output), 1e-6) << what << ": output differs";
  EXPECT_EQ(ref.grads.size(), got.grads.size()) << what;
  for (const auto& [name, grad] : ref.grads) {
    auto it = got.grads.find(name);
    ASSERT_NE(it, got.grads.end()) << what << ": no gradient for " << name;
    EXPECT_LE(maxAbsDiff(grad, it->second), 1e-5 * std::max(1.0, grad.abs().max().item<double>()))
        << what << ": gradient of " << name << " differs";
  }
}

std::vector<StageModule> buildPlan(const ModelGraph& graph, const std::vector<int>& cuts) {
  StageBuilder builder(graph);
  std::vector<StageModule> stages;
  for (size_t i = 0; i + 1 < cuts.size(); ++i)
    stages.push_back(builder.build(cuts[i], cuts[i + 1], "Stage" + std::to_string(i)));
  return stages;
}

std::string describe(const std::vector<int>& cuts) {
  std::string s;
  for (int c : cuts) s += (s.empty() ? "" : ",") + std::to_string(c);
  return "cuts {" + s + "}";
}

struct ModelCase {
  const char* name;
  Granularity granularity;
  int min_valid_cuts;  // guards against a model that silently has nothing to cut
};

void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.name; }

class StageExactness : public ::testing::TestWithParam<ModelCase> {};

TEST_P(StageExactness, EveryCutAndMultiCutPlansMatchTheWholeModel) {
  const ModelCase& c = GetParam();
  torch::jit::Module model = torch::jit::load(modelPath(c.name));
  model.eval();
  const ModelGraph graph(model, c.granularity);
  const auto inputs = exampleInputs(c.name);
  const Reference ref = runOriginal(model, inputs);
  ASSERT_FALSE(ref.grads.empty());

  const std::vector<int> atoms = graph.atomCuts();
  const int interior = static_cast<int>(atoms.size()) - 2;
  EXPECT_GE(interior, c.min_valid_cuts);
  // Every valid single cut.
  for (int k = 1; k + 1 < static_cast<int>(atoms.size()); ++k) {
    auto stages = buildPlan(graph, {0, atoms[k], graph.numUnits()});
    expectSame(ref, runStages(stages, inputs, graph), describe({0, atoms[k], graph.numUnits()}));
  }
  // Multi-cut plans: every atom its own stage, every second cut, and random subsets.
  std::vector<std::vector<int>> plans = {atoms};
  std::vector<int> every_second = {0};
  for (size_t k = 2; k + 1 < atoms.size(); k += 2) every_second.push_back(atoms[k]);
  every_second.push_back(graph.numUnits());
  plans.push_back(every_second);
  std::mt19937 rng(5);
  for (int r = 0; r < 3; ++r) {
    std::vector<int> random = {0};
    for (size_t k = 1; k + 1 < atoms.size(); ++k)
      if (rng() % 2) random.push_back(atoms[k]);
    random.push_back(graph.numUnits());
    plans.push_back(random);
  }
  for (const auto& cuts : plans) {
    auto stages = buildPlan(graph, cuts);
    expectSame(ref, runStages(stages, inputs, graph), describe(cuts));
  }
  // The finest plan also survives save + load (what providers do).
  auto stages = buildPlan(graph, atoms);
  const std::string dir = testing::temporaryDirectory(std::string("roundtrip_") + c.name);
  for (size_t s = 0; s < stages.size(); ++s) {
    const std::string path = dir + "/stage" + std::to_string(s) + ".pt";
    stages[s].module.save(path);
    stages[s].module = torch::jit::load(path);
  }
  expectSame(ref, runStages(stages, inputs, graph), "saved and loaded " + describe(atoms));
}

INSTANTIATE_TEST_SUITE_P(
    Models, StageExactness,
    ::testing::Values(ModelCase{"cnn", Granularity::kTop, 13},
                      ModelCase{"wrapped_cnn", Granularity::kExpandContainers, 13},
                      ModelCase{"resnet", Granularity::kTop, 13},
                      ModelCase{"gpt", Granularity::kTop, 13},
                      ModelCase{"gpt_tied", Granularity::kTop, 13},
                      ModelCase{"two_input", Granularity::kTop, 7}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(ModelGraph, TopGranularityLeavesAWrappedSequentialWhole) {
  const ModelGraph top(torch::jit::load(modelPath("wrapped_cnn")), Granularity::kTop);
  EXPECT_EQ(top.numUnits(), 1);
  const ModelGraph expanded(torch::jit::load(modelPath("wrapped_cnn")), Granularity::kExpandContainers);
  EXPECT_EQ(expanded.numUnits(), 14);
  EXPECT_EQ(expanded.units()[0].label, "body.0 (Conv2d)");
}

TEST(ModelGraph, SkipConnectionCrossesEveryCutItSpans) {
  const ModelGraph graph(torch::jit::load(modelPath("resnet")), Granularity::kTop);
  int conv1 = -1, add = -1;
  for (int u = 0; u < graph.numUnits(); ++u) {
    if (graph.units()[u].label == "conv1 (Conv2d)") conv1 = u;
    if (graph.units()[u].label == "aten::add") add = u;
  }
  ASSERT_GE(conv1, 0);
  ASSERT_GT(add, conv1 + 2);
  // Between conv1 and the add, two tensors cross: the skip `s` and the branch.
  for (int c = conv1 + 1; c <= add; ++c) {
    EXPECT_EQ(graph.boundary(c).size(), 2u) << "cut " << c;
    EXPECT_EQ(graph.valueName(graph.boundary(c)[0]), "s_1") << "cut " << c;
  }
}

TEST(ModelGraph, GptCarriesTheSequenceLengthAsAnInt) {
  const ModelGraph graph(torch::jit::load(modelPath("gpt")), Granularity::kTop);
  int head = -1;
  for (int u = 0; u < graph.numUnits(); ++u)
    if (graph.units()[u].label == "head (Linear)") head = u;
  ASSERT_GE(head, 0);
  ASSERT_TRUE(graph.isValidCut(head));
  std::vector<std::string> kinds;
  for (auto* v : graph.boundary(head)) kinds.push_back(toString(valueKindOf(v->type())));
  EXPECT_EQ(kinds, (std::vector<std::string>{"int", "tensor"}));
  // The Device from idx.device cannot cross: the cut after prim::device is refused, with a reason.
  bool refused_device = false;
  for (int c = 1; c < graph.numUnits(); ++c)
    if (graph.whyInvalid(c).find("Device") != std::string::npos) refused_device = true;
  EXPECT_TRUE(refused_device);
}

// A tied embedding and head (one tensor, two names, two units) no longer stops a cut: it is one
// SharedParameter named by its first user; each stage holds its own copy. With split_shared off
// (the async schedule) every cut between the two units is refused, naming both names.
TEST(ModelGraph, TiedWeightsAreSharedAcrossCutsUnlessAsync) {
  const ModelGraph graph(torch::jit::load(modelPath("gpt_tied")), Granularity::kTop);
  int tok = -1, head = -1;
  for (int u = 0; u < graph.numUnits(); ++u) {
    if (graph.units()[u].label == "tok (Embedding)") tok = u;
    if (graph.units()[u].label == "head (Linear)") head = u;
  }
  ASSERT_GE(tok, 0);
  ASSERT_GT(head, tok + 1);
  ASSERT_EQ(graph.sharedParameters().size(), 1u);
  const SharedParameter& shared = graph.sharedParameters()[0];
  EXPECT_EQ(shared.name, "tok.weight");
  EXPECT_EQ(shared.names, (std::vector<std::string>{"head.weight", "tok.weight"}));
  EXPECT_EQ(shared.units, (std::vector<int>{tok, head}));
  EXPECT_TRUE(graph.isValidCut(head)) << graph.whyInvalid(head);

  StageBuilder builder(graph);
  StageModule first = builder.build(0, head, "First"), last = builder.build(head, graph.numUnits(), "Last");
  at::Tensor a, b;
  for (const auto& p : first.module.named_parameters())
    if (p.name == "tok.weight") a = p.value;
  for (const auto& p : last.module.named_parameters())
    if (p.name == "head.weight") b = p.value;
  ASSERT_TRUE(a.defined() && b.defined());
  EXPECT_FALSE(a.is_same(b));  // a copy per stage
  EXPECT_TRUE(a.equal(b));

  const ModelGraph async(torch::jit::load(modelPath("gpt_tied")), Granularity::kTop,
                         /*split_shared=*/false);
  EXPECT_TRUE(async.sharedParameters().empty());
  for (int c = tok + 1; c <= head; ++c) {
    EXPECT_FALSE(async.isValidCut(c)) << c;
    EXPECT_NE(async.whyInvalid(c).find("head.weight = tok.weight"), std::string::npos)
        << async.whyInvalid(c);
  }
  // The stage holding both keeps one tensor under both names (no silent copy).
  StageBuilder whole_builder(async);
  StageModule whole = whole_builder.build(0, async.numUnits(), "Whole");
  at::Tensor x, y;
  for (const auto& p : whole.module.named_parameters()) {
    if (p.name == "tok.weight") x = p.value;
    if (p.name == "head.weight") y = p.value;
  }
  ASSERT_TRUE(x.defined() && y.defined());
  EXPECT_TRUE(x.is_same(y));
}

TEST(StageBuilder, StageHoldsOnlyItsOwnStateUnderOriginalNames) {
  const ModelGraph graph(torch::jit::load(modelPath("gpt")), Granularity::kTop);
  int first_block = -1;
  for (int u = 0; u < graph.numUnits(); ++u)
    if (graph.units()[u].label == "blocks.1 (Block)") first_block = u;
  ASSERT_GE(first_block, 0);
  StageBuilder builder(graph);
  StageModule tail = builder.build(first_block, graph.numUnits(), "Tail");
  std::set<std::string> names;
  for (const auto& p : tail.module.named_parameters()) names.insert(p.name);
  EXPECT_TRUE(names.count("blocks.1.qkv.weight"));
  EXPECT_TRUE(names.count("scale"));  // a parameter used directly on the top module
  EXPECT_FALSE(names.count("blocks.0.qkv.weight"));
  EXPECT_FALSE(names.count("tok.weight"));
}

}  // namespace
}  // namespace cairn::clusterize
