// Optimizer parameter groups against torch.optim: make_loss_references.py built a model with
// biases, BatchNorm, LayerNorm, an RMSNorm, 0-D and 1-D parameters and a frozen Linear, put its
// parameters into groups by its OWN reading of the rules in cases.json (isinstance on the norm
// classes, fnmatch on names), and ran torch.optim SGD / Adam / AdamW with those groups for 8 steps
// on fixed gradients and a decaying lr. cairn reads the same rules the way job.json gives them,
// groups the TorchScript module's parameters and must end at the same parameters.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "core/Error.h"
#include "core/Safetensors.h"
#include "tests/trainer/TrainerTestPaths.h"
#include "trainer/Optimizer.h"
#include "trainer/ParamGroups.h"
#include "trainer/TrainOptions.h"

namespace cairn {
namespace {

std::string groupsDir() {
  return testing::trainerModelsDir() + "/groups";
}

class GroupsMatchTorchOptim : public ::testing::TestWithParam<std::string> {};

TEST_P(GroupsMatchTorchOptim, EightSteps) {
  const std::string name = GetParam();
  std::map<std::string, torch::Tensor> ref;
  for (auto& [n, t] : readSafetensors(groupsDir() + "/reference.safetensors")) ref[n] = t;
  const nlohmann::json cases = readJsonFile(groupsDir() + "/cases.json");
  const OptimizerOptions options =
      parseTrainOptions({{"optimizer", cases.at(name)}}, "job.json").optimizer;
  ASSERT_EQ(options.param_groups.size(), 2u);

  torch::jit::Module model = torch::jit::load(groupsDir() + "/model.pt");
  const std::vector<GroupedParameter> trainable = trainableParameters(model);
  // The frozen Linear is left out; the groups hold what torch's groups held.
  for (const auto& p : trainable) EXPECT_NE(p.name.rfind("frozen.", 0), 0u) << p.name;
  std::vector<int64_t> members(3, 0);
  for (const auto& p : trainable) ++members[size_t(paramGroupOf(p, options.param_groups) + 1)];
  const torch::Tensor expected_members = ref.at("groups." + name);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(members[i], expected_members[int64_t(i)].item<int64_t>()) << "group " << int(i) - 1;

  std::unique_ptr<Optimizer> optimizer = makeStageOptimizer(model, options);
  const torch::Tensor factors = ref.at("lr_factors");
  for (int64_t s = 0; s < factors.size(0); ++s) {
    for (const auto& p : trainable) {
      const auto g = ref.find("grad." + std::to_string(s) + "." + p.name);
      p.tensor.mutable_grad() = g == ref.end() ? torch::Tensor() : g->second.clone();
    }
    optimizer->step(options.lr * factors[s].item<double>());
  }
  double max_diff = 0, max_change = 0;
  torch::jit::Module initial = torch::jit::load(groupsDir() + "/model.pt");
  std::map<std::string, torch::Tensor> start;
  for (const auto& p : initial.named_parameters()) start[p.name] = p.value;
  for (const auto& p : trainable) {
    const torch::Tensor& expected = ref.at("final." + name + "." + p.name);
    max_diff = std::max(max_diff, (p.tensor - expected).abs().max().item<double>());
    max_change = std::max(max_change, (expected - start.at(p.name)).abs().max().item<double>());
  }
  EXPECT_LE(max_diff, 2e-6);
  EXPECT_GT(max_change, 1e-2) << "the steps did not move the parameters: nothing was compared";
}

INSTANTIATE_TEST_SUITE_P(Trainer, GroupsMatchTorchOptim, ::testing::Values("sgd", "adam", "adamw"),
                         [](const auto& info) { return info.param; });

// Without the groups the same steps end elsewhere: the groups above are not a no-op.
TEST(ParamGroups, GroupsChangeTheResult) {
  const nlohmann::json cases = readJsonFile(groupsDir() + "/cases.json");
  nlohmann::json plain = cases.at("adamw");
  plain.erase("param_groups");
  std::map<std::string, torch::Tensor> ref;
  for (auto& [n, t] : readSafetensors(groupsDir() + "/reference.safetensors")) ref[n] = t;
  torch::jit::Module model = torch::jit::load(groupsDir() + "/model.pt");
  const OptimizerOptions options = parseTrainOptions({{"optimizer", plain}}, "job.json").optimizer;
  std::unique_ptr<Optimizer> optimizer = makeStageOptimizer(model, options);
  const std::vector<GroupedParameter> trainable = trainableParameters(model);
  for (int64_t s = 0; s < 8; ++s) {
    for (const auto& p : trainable) {
      const auto g = ref.find("grad." + std::to_string(s) + "." + p.name);
      p.tensor.mutable_grad() = g == ref.end() ? torch::Tensor() : g->second.clone();
    }
    optimizer->step(options.lr * ref.at("lr_factors")[s].item<double>());
  }
  double max_diff = 0;
  for (const auto& p : trainable)
    max_diff = std::max(max_diff, (p.tensor - ref.at("final.adamw." + p.name)).abs().max().item<double>());
  EXPECT_GT(max_diff, 1e-4);
}

TEST(ParamGroups, SelectorsOnNamesAndClasses) {
  auto param = [](const std::string& name, const std::string& owner, std::vector<int64_t> shape) {
    return GroupedParameter{name, owner, torch::zeros(shape)};
  };
  ParamGroupRule biases;
  biases.biases = true;
  ParamGroupRule norms;
  norms.norm_layers = true;
  ParamGroupRule flat;
  flat.max_dim = 1;
  ParamGroupRule head;
  head.names = {"head.*", "*.embed?.weight"};
  const std::vector<ParamGroupRule> rules = {biases, norms, flat, head};
  EXPECT_EQ(paramGroupOf(param("blocks.0.fc.bias", "Linear", {4}), rules), 0);
  EXPECT_EQ(paramGroupOf(param("blocks.0.ln1.weight", "LayerNorm", {4}), rules), 1);
  EXPECT_EQ(paramGroupOf(param("bn.weight", "BatchNorm2d", {4}), rules), 1);
  EXPECT_EQ(paramGroupOf(param("bn.bias", "BatchNorm2d", {4}), rules), 0);  // first rule wins
  EXPECT_EQ(paramGroupOf(param("gain", "Net", {4}), rules), 2);
  EXPECT_EQ(paramGroupOf(param("temperature", "Net", {}), rules), 2);
  EXPECT_EQ(paramGroupOf(param("head.weight", "Linear", {3, 4}), rules), 3);
  EXPECT_EQ(paramGroupOf(param("tok.embed1.weight", "Embedding", {3, 4}), rules), 3);
  EXPECT_EQ(paramGroupOf(param("fc.weight", "Linear", {3, 4}), rules), -1);
  EXPECT_EQ(paramGroupOf(param("my_bias", "Net", {3, 4}), rules), -1);  // not named "bias"
}

TEST(TrainOptions, ParamGroupsAreValidated) {
  auto message = [](const nlohmann::json& groups) {
    try {
      parseTrainOptions({{"optimizer", {{"name", "adamw"}, {"param_groups", groups}}}}, "job.json");
    } catch (const BadInput& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string key = "job.json: training_definition.optimizer.param_groups[1].";
  EXPECT_EQ(message({{{"biases", true}}, {{"names", {"a*"}}, {"lr_scale", -1}}}),
            key + "lr_scale must be a non-negative number");
  EXPECT_EQ(message({{{"biases", true}}, {{"max_dim", 1}, {"weight_decay", -0.1}}}),
            key + "weight_decay must be a non-negative number");
  EXPECT_EQ(message({{{"biases", true}}, {{"weight_decay", 0}}}),
            key + "names and biases, norm_layers, max_dim are all absent: the group selects "
                  "nothing");
  EXPECT_NE(message({{{"biases", true}}, {{"biases", true}, {"weight_decy", 0}}})
                .find("param_groups[1].weight_decy"),
            std::string::npos);
  EXPECT_NE(message({{{"biases", true}}, {{"names", "head.*"}}}).find("param_groups[1].names"),
            std::string::npos);
  EXPECT_NE(message({{{"biases", true}}, {{"max_dim", 100}}}).find("param_groups[1].max_dim"),
            std::string::npos);
  EXPECT_NE(message({{"biases", true}}).find("optimizer.param_groups"), std::string::npos);
  const TrainOptions o = parseTrainOptions(
      {{"optimizer",
        {{"name", "sgd"},
         {"param_groups", {{{"norm_layers", true}, {"lr_scale", 0.5}}, {{"names", {"x"}}}}}}}},
      "job.json");
  ASSERT_EQ(o.optimizer.param_groups.size(), 2u);
  EXPECT_TRUE(o.optimizer.param_groups[0].norm_layers);
  EXPECT_DOUBLE_EQ(o.optimizer.param_groups[0].lr_scale, 0.5);
  EXPECT_LT(o.optimizer.param_groups[0].weight_decay, 0);  // the optimizer's
  EXPECT_EQ(o.optimizer.param_groups[1].names, std::vector<std::string>{"x"});
}

// A tensor tied under two names (embedding and head in one stage) is one trainable parameter, so
// an SGD step moves it once: by lr times its gradient, not twice that (issue [R]'s zoo found the
// tied GPT trained apart from PyTorch in every plan).
TEST(ParamGroups, ATiedTensorIsOneParameterSteppedOnce) {
  torch::jit::Module model("__torch__.TiedPair");
  const torch::Tensor tied = torch::ones({2, 3}).requires_grad_(true);
  model.register_parameter("tok", tied, false);
  model.register_parameter("head", tied, false);
  model.register_parameter("bias", torch::zeros({3}).requires_grad_(true), false);
  const std::vector<GroupedParameter> trainable = trainableParameters(model);
  ASSERT_EQ(trainable.size(), 2u);
  EXPECT_EQ(trainable[0].name, "tok");
  EXPECT_EQ(trainable[1].name, "bias");
  const OptimizerOptions options =
      parseTrainOptions({{"optimizer", {{"name", "sgd"}, {"lr", 0.5}}}}, "job.json").optimizer;
  std::unique_ptr<Optimizer> optimizer = makeStageOptimizer(model, options);
  tied.mutable_grad() = torch::full({2, 3}, 2.0);
  optimizer->step(options.lr);
  EXPECT_TRUE(tied.detach().equal(torch::full({2, 3}, 1.0 - 0.5 * 2.0)));
}

}  // namespace
}  // namespace cairn
