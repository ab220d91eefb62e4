#include "clusterize/CostModel.h"

#include <algorithm>

#include "core/Error.h"

namespace cairn::clusterize {

OptimizerKind parseOptimizer(const std::string& name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "momentum") return OptimizerKind::kMomentum;
  if (name == "adam") return OptimizerKind::kAdam;
  if (name == "adamw") return OptimizerKind::kAdamW;
  CAIRN_THROW(BadInput, "optimizer must be sgd, momentum, adam or adamw (got \"", name, "\")");
}

std::string toString(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kMomentum:
      return "momentum";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kAdamW:
      return "adamw";
  }
  return "?";
}

int optimizerStateCopies(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kMomentum:
      return 1;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return 2;
  }
  return 2;
}

CostModel::CostModel(std::vector<AtomCost> atoms, std::vector<double> boundary_bytes,
                     CostOptions options, std::vector<double> wire_bytes,
                     std::vector<SharedCost> shared)
    : atoms_(std::move(atoms)),
      shared_(std::move(shared)),
      boundary_(std::move(boundary_bytes)),
      wire_(std::move(wire_bytes)),
      options_(options) {
  CAIRN_ENFORCE_EQ(boundary_.size(), atoms_.size() + 1);
  if (wire_.empty()) wire_ = boundary_;
  CAIRN_ENFORCE_EQ(wire_.size(), boundary_.size());
  CAIRN_ENFORCE(options_.microbatches >= 1, "microbatches must be positive");
  const double copies = 1 + optimizerStateCopies(options_.optimizer);
  static_prefix_.assign(atoms_.size() + 1, 0);
  saved_prefix_.assign(atoms_.size() + 1, 0);
  seconds_prefix_.assign(atoms_.size() + 1, 0);
  state_prefix_.assign(atoms_.size() + 1, 0);
  trainable_prefix_.assign(atoms_.size() + 1, 0);
  for (size_t i = 0; i < atoms_.size(); ++i) {
    const AtomCost& a = atoms_[i];
    static_prefix_[i + 1] =
        static_prefix_[i] + a.parameter_bytes + a.buffer_bytes + copies * a.trainable_bytes;
    saved_prefix_[i + 1] = saved_prefix_[i] + a.saved_bytes;
    seconds_prefix_[i + 1] = seconds_prefix_[i] + a.seconds;
    state_prefix_[i + 1] = state_prefix_[i] + a.parameter_bytes + a.buffer_bytes;
    trainable_prefix_[i + 1] = trainable_prefix_[i] + a.trainable_bytes;
  }
}

double CostModel::sharedExcess(int begin, int end, double per_parameter,
                               double per_trainable) const {
  double excess = 0;
  for (const SharedCost& s : shared_) {
    const auto first = std::lower_bound(s.atoms.begin(), s.atoms.end(), begin);
    const auto last = std::lower_bound(s.atoms.begin(), s.atoms.end(), end);
    const auto uses = last - first;
    if (uses > 1)
      excess += double(uses - 1) * (per_parameter * s.parameter_bytes + per_trainable * s.trainable_bytes);
  }
  return excess;
}

double CostModel::memoryLowerBound(int begin, int end) const {
  const double copies = 1 + optimizerStateCopies(options_.optimizer);
  return static_prefix_[end] - static_prefix_[begin] - sharedExcess(begin, end, 1, copies) +
         options_.microbatches * (saved_prefix_[end] - saved_prefix_[begin]);
}

double CostModel::memoryBytes(int begin, int end) const {
  const double in = boundary_[begin], out = boundary_[end];
  return memoryLowerBound(begin, end) + options_.microbatches * in + in + out;
}

double CostModel::computeSeconds(int begin, int end) const {
  return seconds_prefix_[end] - seconds_prefix_[begin];
}

double CostModel::transferBytes(int begin, int end) const {
  double bytes = 0;
  if (begin > 0) bytes += wire_[begin];                    // gradients sent upstream
  if (end < numAtoms()) bytes += wire_[end];               // activations sent downstream
  return bytes;
}

double CostModel::deviceInBytes(int begin, int end) const {
  return boundary_[begin] + (end < numAtoms() ? boundary_[end] : 0);
}

double CostModel::deviceOutBytes(int begin, int end) const {
  return (end < numAtoms() ? boundary_[end] : 0) + (begin > 0 ? boundary_[begin] : 0);
}

double CostModel::stateBytes(int begin, int end) const {
  return state_prefix_[end] - state_prefix_[begin] - sharedExcess(begin, end, 1, 0);
}

double CostModel::trainableBytes(int begin, int end) const {
  return trainable_prefix_[end] - trainable_prefix_[begin] - sharedExcess(begin, end, 0, 1);
}

}  // namespace cairn::clusterize
