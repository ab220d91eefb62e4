#include "trainer/StageExecutor.h"

#include <torch/csrc/autograd/autograd.h>

#include "core/Error.h"

namespace cairn {

StageExecutor::StageExecutor(torch::jit::Module module, std::vector<BoundaryValue> inputs,
                             std::vector<BoundaryValue> outputs, bool inputs_need_grad)
    : module_(std::move(module)),
      input_specs_(std::move(inputs)),
      output_specs_(std::move(outputs)),
      inputs_need_grad_(inputs_need_grad) {
  module_.train();
}

std::vector<torch::IValue> StageExecutor::toArguments(
    const std::vector<torch::Tensor>& inputs) const {
  if (inputs.size() != input_specs_.size())
    CAIRN_THROW(BadInput, "stage expects ", input_specs_.size(),
                " input(s) (node.json inputs) but got ", inputs.size());
  std::vector<torch::IValue> args;
  args.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const BoundaryValue& spec = input_specs_[i];
    const torch::Tensor& t = inputs[i];
    if (spec.type == "tensor") {
      args.emplace_back(t);
    } else if (spec.type == "int") {
      args.emplace_back(t.item<int64_t>());
    } else if (spec.type == "float") {
      args.emplace_back(t.item<double>());
    } else if (spec.type == "bool") {
      args.emplace_back(t.item<int64_t>() != 0);
    } else if (spec.type == "int_list") {
      torch::Tensor c = t.to(torch::kLong).contiguous();
      std::vector<int64_t> v(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
      args.emplace_back(v);
    } else {
      CAIRN_THROW(BadInput, "node.json: input ", spec.name, " has unknown type ", spec.type);
    }
  }
  return args;
}

std::vector<torch::Tensor> StageExecutor::fromResult(const torch::IValue& result) const {
  std::vector<torch::IValue> values;
  if (result.isTuple()) {
    for (const auto& v : result.toTupleRef().elements()) values.push_back(v);
  } else if (result.isList()) {
    for (const auto& v : result.toListRef()) values.push_back(v);
  } else {
    values.push_back(result);
  }
  if (values.size() != output_specs_.size())
    CAIRN_THROW(BadInput, "stage returned ", values.size(), " value(s) but node.json lists ",
                output_specs_.size(), " output(s)");
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < values.size(); ++i) {
    const torch::IValue& v = values[i];
    if (v.isTensor()) {
      out.push_back(v.toTensor());
    } else if (v.isInt()) {
      out.push_back(torch::tensor(v.toInt(), torch::kLong));
    } else if (v.isDouble()) {
      out.push_back(torch::tensor(v.toDouble(), torch::kDouble));
    } else if (v.isBool()) {
      out.push_back(torch::tensor(int64_t(v.toBool()), torch::kLong));
    } else if (v.isIntList()) {
      out.push_back(torch::tensor(v.toIntVector(), torch::kLong));
    } else {
      CAIRN_THROW(BadInput, "stage output ", output_specs_[i].name, " is a ", v.tagKind(),
                  ", which cannot cross a stage boundary");
    }
  }
  return out;
}

std::vector<torch::Tensor> StageExecutor::forward(uint64_t id,
                                                  const std::vector<torch::Tensor>& inputs) {
  CAIRN_ENFORCE(!pending_.count(id), "micro-batch ", id, " is already in flight");
  Pending pending;
  for (size_t i = 0; i < inputs.size(); ++i) {
    torch::Tensor t = inputs[i];
    const bool wants_grad = inputs_need_grad_ && i < input_specs_.size() &&
                            input_specs_[i].type == "tensor" && t.is_floating_point();
    if (wants_grad) t = t.detach().requires_grad_(true);
    pending.inputs.push_back(t);
  }
  torch::IValue result = module_.forward(toArguments(pending.inputs));
  pending.outputs = fromResult(result);
  auto& stored = pending_[id] = std::move(pending);
  return stored.outputs;
}

const std::vector<torch::Tensor>& StageExecutor::outputsOf(uint64_t id) const {
  auto it = pending_.find(id);
  CAIRN_ENFORCE(it != pending_.end(), "no forward pending for micro-batch ", id);
  return it->second.outputs;
}

std::vector<torch::Tensor> StageExecutor::inputGradients(Pending& pending) const {
  std::vector<torch::Tensor> grads;
  for (auto& t : pending.inputs) {
    if (t.requires_grad()) {
      torch::Tensor g = t.grad();
      grads.push_back(g.defined() ? g : torch::zeros_like(t));
    } else {
      grads.emplace_back();
    }
  }
  return grads;
}

std::vector<torch::Tensor> StageExecutor::backward(uint64_t id,
                                                   const std::vector<torch::Tensor>& output_grads) {
  auto it = pending_.find(id);
  CAIRN_ENFORCE(it != pending_.end(), "backward for micro-batch ", id, " without a forward");
  Pending pending = std::move(it->second);
  pending_.erase(it);
  if (output_grads.size() != pending.outputs.size())
    CAIRN_THROW(BadInput, "got ", output_grads.size(), " output gradient(s) for ",
                pending.outputs.size(), " output(s)");
  std::vector<torch::Tensor> roots, grads;
  for (size_t i = 0; i < pending.outputs.size(); ++i) {
    const torch::Tensor& out = pending.outputs[i];
    const torch::Tensor& g = output_grads[i];
    if (!out.requires_grad() || !g.defined()) continue;
    if (g.sizes() != out.sizes())
      CAIRN_THROW(BadInput, "gradient for output ", output_specs_[i].name, " has shape ", g.sizes(),
                  " but the output has ", out.sizes());
    roots.push_back(out);
    grads.push_back(g.to(out.scalar_type()));
  }
  if (!roots.empty()) torch::autograd::backward(roots, grads);
  return inputGradients(pending);
}

std::vector<torch::Tensor> StageExecutor::backwardFromLoss(uint64_t id, const torch::Tensor& loss) {
  auto it = pending_.find(id);
  CAIRN_ENFORCE(it != pending_.end(), "backward for micro-batch ", id, " without a forward");
  Pending pending = std::move(it->second);
  pending_.erase(it);
  if (loss.requires_grad()) torch::autograd::backward({loss}, {});
  return inputGradients(pending);
}

std::vector<torch::Tensor> StageExecutor::evaluate(const std::vector<torch::Tensor>& inputs) {
  torch::NoGradGuard no_grad;
  module_.eval();
  std::vector<torch::Tensor> out;
  try {
    out = fromResult(module_.forward(toArguments(inputs)));
  } catch (...) {
    module_.train();
    throw;
  }
  module_.train();
  return out;
}

std::vector<torch::Tensor> StageExecutor::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& p : module_.parameters(/*recurse=*/true)) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> StageExecutor::namedParameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : module_.named_parameters(/*recurse=*/true))
    out.emplace_back(p.name, p.value);
  return out;
}

}  // namespace cairn
