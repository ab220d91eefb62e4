#include "trainer/ParamGroups.h"

#include <fnmatch.h>

#include <map>
#include <set>
#include <sstream>

#include "core/Log.h"
#include "trainer/Optimizer.h"

namespace cairn {
namespace {

// "__torch__.torch.nn.modules.normalization.___torch_mangle_3.LayerNorm" -> "LayerNorm"
std::string className(const torch::jit::Module& module) {
  const auto name = module.type()->name();
  return name ? name->name() : "";
}

}  // namespace

std::vector<ParamGroupRule> parseParamGroups(const JsonReader& optimizer) {
  std::vector<ParamGroupRule> rules;
  if (!optimizer.has("param_groups")) return rules;
  const std::vector<JsonReader> groups = optimizer.objectList("param_groups");
  for (const JsonReader& g : groups) {
    g.rejectUnknownKeys({"names", "biases", "norm_layers", "max_dim", "weight_decay", "lr_scale"});
    ParamGroupRule rule;
    if (g.has("names")) {
      rule.names = g.stringList("names");
      for (const auto& n : rule.names)
        if (n.empty()) g.fail("names", "must hold non-empty glob patterns");
      if (rule.names.empty()) g.fail("names", "must list at least one glob pattern");
    }
    rule.biases = g.booleanOr("biases", false);
    rule.norm_layers = g.booleanOr("norm_layers", false);
    rule.max_dim = g.integerOr("max_dim", 0, 64, -1);
    if (rule.names.empty() && !rule.biases && !rule.norm_layers && rule.max_dim < 0)
      g.fail("names", "and biases, norm_layers, max_dim are all absent: the group selects nothing");
    if (g.has("weight_decay")) {
      rule.weight_decay = g.number("weight_decay");
      if (!(rule.weight_decay >= 0)) g.fail("weight_decay", "must be a non-negative number");
    }
    rule.lr_scale = g.numberOr("lr_scale", 1);
    if (!(rule.lr_scale >= 0)) g.fail("lr_scale", "must be a non-negative number");
    rules.push_back(rule);
  }
  return rules;
}

std::vector<GroupedParameter> trainableParameters(const torch::jit::Module& module) {
  std::map<std::string, std::string> owner;  // parameter name -> class of the module holding it
  for (const auto& m : module.named_modules())
    for (const auto& p : m.value.named_parameters(/*recurse=*/false))
      owner[m.name.empty() ? p.name : m.name + "." + p.name] = className(m.value);
  std::vector<GroupedParameter> out;
  // A tensor tied under two names (a GPT's embedding and head in one stage) is one parameter,
  // under its first name: listed twice, the optimizer stepped it twice and gradient clipping
  // counted its gradient twice.
  std::set<const c10::TensorImpl*> seen;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    if (!p.value.requires_grad()) continue;
    if (!seen.insert(p.value.unsafeGetTensorImpl()).second) continue;
    const auto it = owner.find(p.name);
    out.push_back({p.name, it == owner.end() ? "" : it->second, p.value});
  }
  return out;
}

bool globMatches(const std::string& pattern, const std::string& name) {
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

int paramGroupOf(const GroupedParameter& p, const std::vector<ParamGroupRule>& rules) {
  const size_t dot = p.name.rfind('.');
  const std::string last = dot == std::string::npos ? p.name : p.name.substr(dot + 1);
  for (size_t i = 0; i < rules.size(); ++i) {
    const ParamGroupRule& r = rules[i];
    bool selected = (r.biases && last == "bias") ||
                    (r.norm_layers && p.owner_class.find("Norm") != std::string::npos) ||
                    (r.max_dim >= 0 && p.tensor.dim() <= r.max_dim);
    for (size_t k = 0; !selected && k < r.names.size(); ++k)
      selected = globMatches(r.names[k], p.name);
    if (selected) return int(i);
  }
  return -1;
}

std::unique_ptr<Optimizer> makeStageOptimizer(const torch::jit::Module& module,
                                              const OptimizerOptions& options) {
  std::vector<torch::Tensor> tensors;
  std::vector<int> groups;
  std::vector<int64_t> members(options.param_groups.size() + 1, 0);
  for (const GroupedParameter& p : trainableParameters(module)) {
    tensors.push_back(p.tensor);
    groups.push_back(paramGroupOf(p, options.param_groups));
    ++members[size_t(groups.back() + 1)];
  }
  if (!options.param_groups.empty()) {
    std::ostringstream line;
    line << "optimizer: " << members[0] << " parameter tensor(s) with the optimizer's settings";
    for (size_t i = 0; i < options.param_groups.size(); ++i)
      line << ", " << members[i + 1] << " in param_groups[" << i << "]";
    CAIRN_INFO(line.str());
  }
  return std::make_unique<Optimizer>(std::move(tensors), options, std::move(groups));
}

}  // namespace cairn
