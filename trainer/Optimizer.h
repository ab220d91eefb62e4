// Optimizer: SGD (momentum, dampening, nesterov, weight decay), Adam and AdamW over one stage's
// parameters, written out to match torch.optim's update rules (PyTorch 1.13, single-tensor path)
// step for step. The learning rate is passed to every step() so the LR schedule stays a pure
// function of the step index. Parameter groups (OptimizerOptions::param_groups, trainer/ParamGroups.h)
// give a parameter its group's weight decay and lr_scale, as torch.optim's groups do: the group's
// lr is lr * lr_scale at every step. Owns its state tensors; borrows the parameters (they alias the stage
// module's, and are updated in place). Thread-safety: one thread (the node's trainer thread).
#pragma once

#include <torch/script.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainer/TrainOptions.h"

namespace cairn {

class Optimizer {
 public:
  // `groups[i]`: index into options.param_groups of parameter i's group, -1 for the optimizer's
  // own settings; empty: every parameter has the optimizer's settings.
  Optimizer(std::vector<torch::Tensor> parameters, const OptimizerOptions& options,
            std::vector<int> groups = {});
  // One update with learning rate `lr`; parameters without a gradient are skipped (as in PyTorch).
  void step(double lr);
  // Drops every parameter's gradient (torch's zero_grad(set_to_none=True)): the next backward
  // sets it afresh.
  void zeroGrad();
  const std::vector<torch::Tensor>& parameters() const { return parameters_; }

  // Checkpoints: the state as named tensors "optim.<i>.momentum_buffer" / ".exp_avg" /
  // ".exp_avg_sq" / ".step" (int64 scalar), i = the parameter's index; state not created yet is
  // left out; the tensors alias the live state (write them before the next step). importState
  // restores exactly that (state absent from `tensors` is reset); BadInput naming `source` and the
  // tensor when a shape or dtype does not match its parameter.
  void exportState(std::vector<std::pair<std::string, torch::Tensor>>* tensors) const;
  void importState(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                   const std::string& source);

 private:
  void sgdStep(double base_lr);
  void adamStep(double base_lr);
  struct State {
    torch::Tensor momentum_buffer;  // sgd
    torch::Tensor exp_avg;          // adam/adamw
    torch::Tensor exp_avg_sq;
    int64_t step = 0;
  };
  std::vector<torch::Tensor> parameters_;
  std::vector<State> states_;
  std::vector<double> weight_decay_;  // per parameter (its group's)
  std::vector<double> lr_scale_;      // per parameter (its group's)
  OptimizerOptions options_;
};

// Sum over `gradients` of the squared L2 norm of each, in float64 (one stage's share of the global
// gradient norm: nodes add their shares along the pipeline, then take the square root).
double squaredGradientNorm(const std::vector<torch::Tensor>& parameters);
// Multiplies every gradient by min(1, max_norm / (total_norm + 1e-6)), as clip_grad_norm_ does.
void scaleGradientsForClipping(const std::vector<torch::Tensor>& parameters, double total_norm,
                               double max_norm);

}  // namespace cairn
