// Optimizer parameter groups (job.json "optimizer.param_groups"): rules that give some parameters
// their own weight decay and learning-rate scale, as torch.optim's parameter groups do, e.g.
//   "param_groups": [{"biases": true, "norm_layers": true, "max_dim": 1, "weight_decay": 0},
//                    {"names": ["head.*"], "lr_scale": 0.1}]
// A parameter belongs to the FIRST rule that selects it by any of the rule's selectors (names,
// biases, norm_layers, max_dim); parameters no rule selects keep the optimizer's own settings. The
// rules see the parameters under their names in the unsplit model (a stage keeps them), so every
// stage puts a parameter in the group the unsplit model would.
// Thread-safety: free functions.
#pragma once

#include <torch/script.h>

#include <memory>
#include <string>
#include <vector>

#include "core/JsonReader.h"
#include "trainer/TrainOptions.h"

namespace cairn {

class Optimizer;

// Reads "param_groups" of the optimizer object `optimizer` (absent: no rules). BadInput names the
// key, e.g. "job.json: training_definition.optimizer.param_groups[1].lr_scale must be ...".
std::vector<ParamGroupRule> parseParamGroups(const JsonReader& optimizer);

// One trainable parameter of a module, with what the rules look at.
struct GroupedParameter {
  std::string name;          // dotted, as named_parameters gives it ("blocks.0.ln1.weight")
  std::string owner_class;   // class name of the module holding it ("LayerNorm"; "" if unknown)
  torch::Tensor tensor;
};
// The module's parameters that require grad, in named_parameters order (the optimizer's order),
// each tensor once: a tensor tied under several names is listed under its first.
std::vector<GroupedParameter> trainableParameters(const torch::jit::Module& module);
// Index of the first rule selecting `p`, or -1.
int paramGroupOf(const GroupedParameter& p, const std::vector<ParamGroupRule>& rules);
// Shell-style glob (fnmatch without flags: "*" also crosses dots).
bool globMatches(const std::string& pattern, const std::string& name);

// The stage's optimizer over its trainable parameters, grouped by options.param_groups (and logs
// how many parameters each group got).
std::unique_ptr<Optimizer> makeStageOptimizer(const torch::jit::Module& module,
                                              const OptimizerOptions& options);

}  // namespace cairn
