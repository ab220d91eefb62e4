#include "trainer/StageExecutor.h"

#include <torch/csrc/autograd/autograd.h>

#include <algorithm>

#include "core/Error.h"
#include "trainer/Device.h"

namespace cairn {

StageExecutor::StageExecutor(torch::jit::Module module, std::vector<BoundaryValue> inputs,
                             std::vector<BoundaryValue> outputs, bool inputs_need_grad)
    : module_(std::move(module)),
      input_specs_(std::move(inputs)),
      output_specs_(std::move(outputs)),
      inputs_need_grad_(inputs_need_grad),
      placement_(makePlacement(torch::kCPU)) {
  module_.train();
}

void StageExecutor::setPlacement(std::shared_ptr<const TensorPlacement> placement) {
  CAIRN_ENFORCE(placement != nullptr && pending_.empty(),
                "the placement is set before the first forward");
  placement_ = std::move(placement);
}

std::vector<torch::Tensor> StageExecutor::onDevice(const std::vector<torch::Tensor>& inputs) const {
  std::vector<torch::Tensor> out = inputs;
  for (size_t i = 0; i < out.size() && i < input_specs_.size(); ++i)
    if (input_specs_[i].type == "tensor") out[i] = placement_->toDevice(out[i]);
  return out;
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
    if (v.isTensor()) {  // bf16: float32 again at the boundary (trainer/Precision.h)
      out.push_back(precision_ != Precision::kBf16 ? v.toTensor()
                                                   : toFloat32IfReduced(v.toTensor()));
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
  const std::vector<torch::Tensor> placed = onDevice(inputs);
  for (size_t i = 0; i < placed.size(); ++i) {
    torch::Tensor t = placed[i];
    const bool wants_grad = inputs_need_grad_ && i < input_specs_.size() &&
                            input_specs_[i].type == "tensor" && t.is_floating_point();
    if (wants_grad) t = t.detach().requires_grad_(true);
    pending.inputs.push_back(t);
  }
  torch::IValue result;
  if (stashing_) {
    Version& v = versions_[current_version_];
    if (v.tensors.empty() && !stashed_.empty()) {
      torch::NoGradGuard no_grad;
      for (const Slot& s : stashed_)
        v.tensors.push_back(s.master.detach().clone().requires_grad_(true));
      ++stash_stats_.copies;
    }
    ++v.in_flight;
    pending.version = current_version_;
    updateStashStats();
    setParameters(true, &v);
    try {
      AutocastScope autocast(precision_, placement_->device().type());
      result = module_.forward(toArguments(pending.inputs));
    } catch (...) {
      setParameters(false, nullptr);
      releaseVersion(pending.version, false);
      throw;
    }
    setParameters(false, nullptr);
  } else {
    AutocastScope autocast(precision_, placement_->device().type());
    result = module_.forward(toArguments(pending.inputs));
  }
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
    grads.push_back(placement_->toDevice(g).to(out.scalar_type()));
  }
  if (!roots.empty()) torch::autograd::backward(roots, grads);
  if (pending.version >= 0) releaseVersion(pending.version, true);
  return inputGradients(pending);
}

std::vector<torch::Tensor> StageExecutor::backwardFromLoss(uint64_t id, const torch::Tensor& loss) {
  auto it = pending_.find(id);
  CAIRN_ENFORCE(it != pending_.end(), "backward for micro-batch ", id, " without a forward");
  Pending pending = std::move(it->second);
  pending_.erase(it);
  if (loss.requires_grad()) torch::autograd::backward({loss}, {});
  if (pending.version >= 0) releaseVersion(pending.version, true);
  return inputGradients(pending);
}

std::vector<torch::Tensor> StageExecutor::evaluate(const std::vector<torch::Tensor>& inputs) {
  torch::NoGradGuard no_grad;
  module_.eval();
  std::vector<torch::Tensor> out;
  try {
    torch::IValue result;
    {
      AutocastScope autocast(precision_, placement_->device().type());
      result = module_.forward(toArguments(onDevice(inputs)));
    }
    out = fromResult(result);
  } catch (...) {
    module_.train();
    throw;
  }
  module_.train();
  return out;
}

void StageExecutor::enableWeightStashing() {
  CAIRN_ENFORCE(pending_.empty(), "weight stashing must be enabled before the first forward");
  stashing_ = true;
  stashed_.clear();
  std::map<const c10::TensorImpl*, size_t> slot_of;  // a tied tensor is one slot
  for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
    if (!p.value.requires_grad()) continue;
    torch::jit::Module owner = module_;
    std::string name = p.name;
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.')) {
      owner = owner.attr(name.substr(0, dot)).toModule();
      name = name.substr(dot + 1);
    }
    const auto [it, fresh] = slot_of.emplace(p.value.unsafeGetTensorImpl(), stashed_.size());
    if (fresh) {
      stashed_.emplace_back();
      stashed_.back().master = p.value;
    }
    stashed_[it->second].holders.emplace_back(owner, name);
  }
}

void StageExecutor::setParameters(bool use_version, const Version* version) {
  for (size_t i = 0; i < stashed_.size(); ++i)
    for (auto& [owner, name] : stashed_[i].holders)
      owner.setattr(name, use_version ? version->tensors[i] : stashed_[i].master);
}

void StageExecutor::releaseVersion(int64_t version, bool move_gradients) {
  auto it = versions_.find(version);
  CAIRN_ENFORCE(it != versions_.end(), "weight version ", version, " is not held");
  Version& v = it->second;
  if (move_gradients) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < stashed_.size() && i < v.tensors.size(); ++i) {
      torch::Tensor& t = v.tensors[i];
      if (!t.grad().defined()) continue;
      torch::Tensor& master = stashed_[i].master;
      if (master.grad().defined())
        master.mutable_grad().add_(t.grad());
      else
        master.mutable_grad() = t.grad().detach();
      t.mutable_grad().reset();
    }
  }
  if (--v.in_flight == 0 && version != current_version_) versions_.erase(it);
  updateStashStats();
}

void StageExecutor::newVersion() {
  if (!stashing_) return;
  auto it = versions_.find(current_version_);
  if (it != versions_.end() && it->second.in_flight == 0) versions_.erase(it);
  ++current_version_;
  updateStashStats();
}

void StageExecutor::updateStashStats() {
  int64_t per_version = 0;
  for (const Slot& s : stashed_) per_version += int64_t(s.master.numel() * s.master.element_size());
  int64_t held = 0;
  for (const auto& [id, v] : versions_)
    if (!v.tensors.empty()) ++held;
  stash_stats_.versions = held;
  stash_stats_.bytes = held * per_version;
  stash_stats_.max_versions = std::max(stash_stats_.max_versions, held);
  stash_stats_.max_bytes = std::max(stash_stats_.max_bytes, stash_stats_.bytes);
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
