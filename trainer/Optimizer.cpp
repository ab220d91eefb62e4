#include "trainer/Optimizer.h"

#include <cmath>

#include "core/Error.h"

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

void Optimizer::zeroGrad() {
  for (auto& p : parameters_) {
    if (p.grad().defined()) {
      p.mutable_grad().detach_();
      p.mutable_grad().zero_();
    }
  }
}

void Optimizer::step(double base_lr) {
  torch::NoGradGuard no_grad;
  const auto& o = options_;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    torch::Tensor& p = parameters_[i];
    if (!p.grad().defined()) continue;
    State& s = states_[i];
    torch::Tensor grad = p.grad();
    const double lr = base_lr * lr_scale_[i];
    const double weight_decay = weight_decay_[i];
    switch (o.kind) {
      case OptimizerKind::kSgd: {
        // torch/optim/sgd.py _single_tensor_sgd
        if (weight_decay != 0) grad = grad.add(p, weight_decay);
        if (o.momentum != 0) {
          if (!s.momentum_buffer.defined()) {
            s.momentum_buffer = grad.clone().detach();
          } else {
            s.momentum_buffer.mul_(o.momentum).add_(grad, 1 - o.dampening);
          }
          grad = o.nesterov ? grad.add(s.momentum_buffer, o.momentum) : s.momentum_buffer;
        }
        p.add_(grad, -lr);
        break;
      }
      case OptimizerKind::kAdam:
      case OptimizerKind::kAdamW: {
        // torch/optim/adam.py and adamw.py _single_tensor_*
        if (!s.exp_avg.defined()) {
          s.exp_avg = torch::zeros_like(p, at::MemoryFormat::Preserve);
          s.exp_avg_sq = torch::zeros_like(p, at::MemoryFormat::Preserve);
        }
        s.step += 1;
        if (o.kind == OptimizerKind::kAdamW) {
          p.mul_(1 - lr * weight_decay);
        } else if (weight_decay != 0) {
          grad = grad.add(p, weight_decay);
        }
        s.exp_avg.mul_(o.beta1).add_(grad, 1 - o.beta1);
        s.exp_avg_sq.mul_(o.beta2).addcmul_(grad, grad.conj(), 1 - o.beta2);
        const double bias_correction1 = 1 - std::pow(o.beta1, double(s.step));
        const double bias_correction2 = 1 - std::pow(o.beta2, double(s.step));
        const double step_size = lr / bias_correction1;
        const double bias_correction2_sqrt = std::sqrt(bias_correction2);
        torch::Tensor denom = (s.exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(o.eps);
        p.addcdiv_(s.exp_avg, denom, -step_size);
        break;
      }
    }
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
  double sum = 0;
  for (const auto& p : parameters) {
    if (!p.grad().defined()) continue;
    const double n = p.grad().detach().norm(2).item<double>();
    sum += n * n;
  }
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
