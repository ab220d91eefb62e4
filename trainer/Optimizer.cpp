#include "trainer/Optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/Error.h"
#include "trainer/Device.h"

namespace cairn {

Optimizer::Optimizer(std::vector<torch::Tensor> parameters, const OptimizerOptions& options,
                     std::vector<int> groups)
    : parameters_(std::move(parameters)), states_(parameters_.size()), options_(options) {
  if (options_.weight_decay < 0)
    options_.weight_decay = options_.kind == OptimizerKind::kAdamW ? 0.01 : 0;
  CAIRN_ENFORCE(groups.empty() || groups.size() == parameters_.size(),
                "optimizer: ", groups.size(), " group indices for ", parameters_.size(),
                " parameters");
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const int g = groups.empty() ? -1 : groups[i];
    CAIRN_ENFORCE(g >= -1 && g < int(options_.param_groups.size()), "optimizer: parameter ", i,
                  " is in group ", g, " of ", options_.param_groups.size());
    const ParamGroupRule* rule = g < 0 ? nullptr : &options_.param_groups[size_t(g)];
    weight_decay_.push_back(rule && rule->weight_decay >= 0 ? rule->weight_decay
                                                            : options_.weight_decay);
    lr_scale_.push_back(rule ? rule->lr_scale : 1.0);
  }
}

// Drops the gradients (torch's zero_grad(set_to_none=True), PyTorch 2's default) instead of
// filling them with zeros: the next backward then hands each parameter its gradient as computed
// instead of adding it to zeros, which saves two passes over every gradient per step (on a GPU two
// kernel launches per parameter tensor). The values are the same: 0 + g is g.
void Optimizer::zeroGrad() {
  for (auto& p : parameters_)
    if (p.grad().defined()) p.mutable_grad().reset();
}

void Optimizer::step(double base_lr) {
  torch::NoGradGuard no_grad;
  if (options_.kind == OptimizerKind::kSgd) {
    sgdStep(base_lr);
  } else {
    adamStep(base_lr);
  }
}

// SGD as torch/optim/sgd.py's _single_tensor_sgd computes it, op for op, but each op over all
// parameters that share a learning rate and weight decay at once (ATen's _foreach_* ops, as
// adamStep below): on a GPU one launch per op instead of one per op and parameter tensor; on the
// CPU _foreach_* runs the per-tensor op on each, so the results are the loop's bit for bit.
void Optimizer::sgdStep(double base_lr) {
  const auto& o = options_;
  struct Group {
    double lr, weight_decay;
    std::vector<size_t> index;
    std::vector<torch::Tensor> params, grads;
  };
  std::vector<Group> groups;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    torch::Tensor& p = parameters_[i];
    if (!p.grad().defined()) continue;
    const double lr = base_lr * lr_scale_[i];
    auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& x) {
      return x.lr == lr && x.weight_decay == weight_decay_[i];
    });
    if (g == groups.end()) g = groups.insert(groups.end(), Group{lr, weight_decay_[i], {}, {}, {}});
    g->index.push_back(i);
    g->params.push_back(p);
    g->grads.push_back(p.grad());
  }
  for (Group& g : groups) {
    if (g.weight_decay != 0) g.grads = at::_foreach_add(g.grads, g.params, g.weight_decay);
    if (o.momentum != 0) {
      // A parameter's first step starts its buffer from the gradient; the others update theirs.
      std::vector<torch::Tensor> buffers, grads;
      for (size_t k = 0; k < g.index.size(); ++k) {
        State& s = states_[g.index[k]];
        if (!s.momentum_buffer.defined()) {
          s.momentum_buffer = g.grads[k].clone().detach();
        } else {
          buffers.push_back(s.momentum_buffer);
          grads.push_back(g.grads[k]);
        }
      }
      if (!buffers.empty()) {
        at::_foreach_mul_(buffers, o.momentum);
        at::_foreach_add_(buffers, grads, 1 - o.dampening);
      }
      std::vector<torch::Tensor> all;
      for (size_t i : g.index) all.push_back(states_[i].momentum_buffer);
      g.grads = o.nesterov ? at::_foreach_add(g.grads, all, o.momentum) : all;
    }
    at::_foreach_add_(g.params, g.grads, -g.lr);
  }
}

// Adam and AdamW as torch/optim/adam.py and adamw.py's _single_tensor_* compute them, op for op,
// but each op over all parameters that share a learning rate, weight decay and step count at once
// (ATen's _foreach_* ops): on a GPU one launch per op instead of one per op and parameter tensor
// (a transformer has dozens of them); on the CPU _foreach_* runs the per-tensor op on each, so the
// results are those of the single-tensor loop bit for bit (the equivalence tests hold).
void Optimizer::adamStep(double base_lr) {
  const auto& o = options_;
  struct Group {
    double lr, weight_decay;
    int64_t step;
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  };
  std::vector<Group> groups;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    torch::Tensor& p = parameters_[i];
    if (!p.grad().defined()) continue;
    State& s = states_[i];
    if (!s.exp_avg.defined()) {
      s.exp_avg = torch::zeros_like(p, at::MemoryFormat::Preserve);
      s.exp_avg_sq = torch::zeros_like(p, at::MemoryFormat::Preserve);
    }
    s.step += 1;
    const double lr = base_lr * lr_scale_[i];
    auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& x) {
      return x.lr == lr && x.weight_decay == weight_decay_[i] && x.step == s.step;
    });
    if (g == groups.end())
      g = groups.insert(groups.end(), Group{lr, weight_decay_[i], s.step, {}, {}, {}, {}});
    g->params.push_back(p);
    g->grads.push_back(p.grad());
    g->exp_avgs.push_back(s.exp_avg);
    g->exp_avg_sqs.push_back(s.exp_avg_sq);
  }
  for (Group& g : groups) {
    if (o.kind == OptimizerKind::kAdamW) {
      at::_foreach_mul_(g.params, 1 - g.lr * g.weight_decay);
    } else if (g.weight_decay != 0) {
      g.grads = at::_foreach_add(g.grads, g.params, g.weight_decay);
    }
    at::_foreach_mul_(g.exp_avgs, o.beta1);
    at::_foreach_add_(g.exp_avgs, g.grads, 1 - o.beta1);
    at::_foreach_mul_(g.exp_avg_sqs, o.beta2);
    at::_foreach_addcmul_(g.exp_avg_sqs, g.grads, g.grads, 1 - o.beta2);
    const double bias_correction1 = 1 - std::pow(o.beta1, double(g.step));
    const double bias_correction2 = 1 - std::pow(o.beta2, double(g.step));
    const double step_size = g.lr / bias_correction1;
    const double bias_correction2_sqrt = std::sqrt(bias_correction2);
    std::vector<torch::Tensor> denoms = at::_foreach_sqrt(g.exp_avg_sqs);
    at::_foreach_div_(denoms, bias_correction2_sqrt);
    at::_foreach_add_(denoms, o.eps);
    at::_foreach_addcdiv_(g.params, g.exp_avgs, denoms, -step_size);
  }
}

void Optimizer::exportState(std::vector<std::pair<std::string, torch::Tensor>>* tensors) const {
  for (size_t i = 0; i < states_.size(); ++i) {
    const State& s = states_[i];
    const std::string prefix = "optim." + std::to_string(i) + ".";
    if (s.momentum_buffer.defined())
      tensors->emplace_back(prefix + "momentum_buffer", s.momentum_buffer.detach());
    if (s.exp_avg.defined()) {
      tensors->emplace_back(prefix + "exp_avg", s.exp_avg.detach());
      tensors->emplace_back(prefix + "exp_avg_sq", s.exp_avg_sq.detach());
    }
    if (s.step != 0) tensors->emplace_back(prefix + "step", torch::tensor(s.step, torch::kLong));
  }
}

void Optimizer::importState(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                            const std::string& source) {
  std::vector<State> states(parameters_.size());
  for (const auto& [name, tensor] : tensors) {
    if (name.rfind("optim.", 0) != 0) continue;
    const size_t dot = name.find('.', 6);
    size_t i = 0;
    bool index_ok = dot != std::string::npos && dot > 6;
    try {
      if (index_ok) i = size_t(std::stoull(name.substr(6, dot - 6)));
    } catch (const std::exception&) {
      index_ok = false;
    }
    if (!index_ok || i >= parameters_.size())
      CAIRN_THROW(BadInput, source, ": optimizer tensor \"", name, "\" names no parameter (this ",
                  "stage's optimizer has ", parameters_.size(), ")");
    const std::string field = name.substr(dot + 1);
    const torch::Tensor& p = parameters_[i];
    State& s = states[i];
    if (field == "step") {
      if (tensor.numel() != 1 || tensor.scalar_type() != torch::kLong)
        CAIRN_THROW(BadInput, source, ": optimizer tensor \"", name, "\" must be one int64");
      s.step = tensor.item<int64_t>();
      continue;
    }
    if (tensor.sizes() != p.sizes() || tensor.scalar_type() != p.scalar_type())
      CAIRN_THROW(BadInput, source, ": optimizer tensor \"", name, "\" is ",
                  c10::toString(tensor.scalar_type()), " ", tensor.sizes(), " but parameter ", i,
                  " is ", c10::toString(p.scalar_type()), " ", p.sizes());
    torch::Tensor copy = tensor.detach().clone().to(p.device());
    if (field == "momentum_buffer")
      s.momentum_buffer = copy;
    else if (field == "exp_avg")
      s.exp_avg = copy;
    else if (field == "exp_avg_sq")
      s.exp_avg_sq = copy;
    else
      CAIRN_THROW(BadInput, source, ": unknown optimizer state \"", name, "\"");
  }
  for (size_t i = 0; i < states.size(); ++i)
    if (states[i].exp_avg.defined() != states[i].exp_avg_sq.defined())
      CAIRN_THROW(BadInput, source, ": optimizer state of parameter ", i,
                  " has only one of exp_avg and exp_avg_sq");
  states_ = std::move(states);
}

double squaredGradientNorm(const std::vector<torch::Tensor>& parameters) {
  // Each tensor's norm is computed where it lives; they cross to the host together, in one read:
  // on a GPU a read per tensor would wait for the device once per parameter tensor.
  std::vector<torch::Tensor> norms;
  for (const auto& p : parameters)
    if (p.grad().defined()) norms.push_back(p.grad().detach().norm(2));
  double sum = 0;
  for (const double n : readScalars(norms)) sum += n * n;
  return sum;
}

void scaleGradientsForClipping(const std::vector<torch::Tensor>& parameters, double total_norm,
                               double max_norm) {
  const double coefficient = max_norm / (total_norm + 1e-6);
  if (coefficient >= 1) return;
  torch::NoGradGuard no_grad;
  for (const auto& p : parameters)
    if (p.grad().defined()) p.grad().mul_(coefficient);
}

}  // namespace cairn
