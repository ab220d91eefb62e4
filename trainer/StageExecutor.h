// StageExecutor: runs one stage module (TorchScript, as clusterize cuts it) forward and backward,
// one micro-batch at a time, keeping what backward needs per micro-batch id between the two.
//   forward(id, inputs)        boundary tensors in  -> boundary tensors out (graph kept for `id`)
//   backward(id, grads)        gradients of the outputs -> gradients of the inputs (graph freed);
//                              parameter gradients accumulate across micro-batches
//   backwardFromLoss(id, loss) the Leaf's variant: backward from a scalar computed on the outputs
// Boundary values follow node.json: `tensor` inputs arrive as tensors; `int`, `float`, `bool` and
// `int_list` arrive as small int64/float64 tensors and are converted to the IValue the module's
// forward expects (and converted back on the way out). Only floating-point tensor inputs of a
// stage that has an upstream get gradients; the others come back as undefined tensors.
//
// Weight stashing (schedule "async", PipeDream): with enableWeightStashing() every forward runs on
// a *version* of the trainable parameters and its backward goes through the same version, however
// many optimizer steps happened in between. The module keeps its own parameter tensors (the
// "master" copy that the Optimizer, ClusterSync and checkpoints see, updated in place); a version
// is one copy of them, made at the first forward after newVersion() and shared by every forward
// until the next newVersion(). Backward accumulates into the version's tensors and the gradients
// are moved onto the master parameters at once. A version is dropped when its last in-flight
// micro-batch has done its backward, so at most (micro-batches in flight) versions live.
// Ownership: owns the module (shares its parameters with the Optimizer). Thread-safety: one thread.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/NodeData.h"
#include "trainer/Precision.h"

namespace cairn {

class TensorPlacement;  // trainer/Device.h

class StageExecutor {
 public:
  // `inputs_need_grad`: false for the Root (its inputs are data).
  StageExecutor(torch::jit::Module module, std::vector<BoundaryValue> inputs,
                std::vector<BoundaryValue> outputs, bool inputs_need_grad);

  std::vector<torch::Tensor> forward(uint64_t id, const std::vector<torch::Tensor>& inputs);
  // `output_grads` in outputs order; undefined entries (or outputs that need no gradient) are
  // skipped. Returns the input gradients in inputs order.
  std::vector<torch::Tensor> backward(uint64_t id, const std::vector<torch::Tensor>& output_grads);
  std::vector<torch::Tensor> backwardFromLoss(uint64_t id, const torch::Tensor& loss);
  // The outputs forward(id) returned (the Leaf computes its loss on them).
  const std::vector<torch::Tensor>& outputsOf(uint64_t id) const;
  // Forward without a graph (evaluation); the module is put in eval mode for the call.
  std::vector<torch::Tensor> evaluate(const std::vector<torch::Tensor>& inputs);

  std::vector<torch::Tensor> parameters() const;
  std::vector<std::pair<std::string, torch::Tensor>> namedParameters() const;
  size_t pendingMicrobatches() const { return pending_.size(); }

  // Weight stashing (see above). Call newVersion() right before the master parameters change
  // (optimizer step); forwards after it use (a copy of) the new values.
  void enableWeightStashing();
  void newVersion();
  struct StashStats {
    int64_t versions = 0, max_versions = 0;  // parameter versions held now / at most
    int64_t bytes = 0, max_bytes = 0;        // their bytes
    int64_t copies = 0;                      // versions made so far
  };
  const StashStats& stashStats() const { return stash_stats_; }
  torch::jit::Module& module() { return module_; }
  // "precision": bf16 runs forwards under autocast (on the module's device) and returns float32
  // outputs (Precision.h).
  void setPrecision(Precision precision) { precision_ = precision; }
  // Where the module lives (trainer/Device.h; default: the CPU). The module must already be there
  // (StageTrainer moves it). forward, backward and evaluate move their boundary tensors ("tensor"
  // inputs, output gradients) onto it; outputs and input gradients stay on it.
  void setPlacement(std::shared_ptr<const TensorPlacement> placement);
  const TensorPlacement& placement() const { return *placement_; }

 private:
  struct Pending {
    std::vector<torch::Tensor> inputs;   // leaves whose .grad() backward fills
    std::vector<torch::Tensor> outputs;  // as returned to the caller
    int64_t version = -1;                // weight stashing: the parameter version forward used
  };
  struct Version {
    std::vector<torch::Tensor> tensors;  // one per stashed_ parameter
    int64_t in_flight = 0;
  };
  struct Slot {
    // The (sub)modules holding the parameter and its attribute name in each: one, or several for
    // a tensor tied under several names (stashed once, set under every name).
    std::vector<std::pair<torch::jit::Module, std::string>> holders;
    torch::Tensor master;  // the module's own tensor
  };
  void setParameters(bool use_version, const Version* version);
  void releaseVersion(int64_t version, bool move_gradients);
  void updateStashStats();
  std::vector<torch::IValue> toArguments(const std::vector<torch::Tensor>& inputs) const;
  std::vector<torch::Tensor> fromResult(const torch::IValue& result) const;
  std::vector<torch::Tensor> inputGradients(Pending& pending) const;

  torch::jit::Module module_;
  std::vector<BoundaryValue> input_specs_;
  std::vector<BoundaryValue> output_specs_;
  bool inputs_need_grad_;
  std::map<uint64_t, Pending> pending_;
  bool stashing_ = false;
  std::vector<Slot> stashed_;  // trainable parameters
  std::map<int64_t, Version> versions_;
  int64_t current_version_ = 0;
  StashStats stash_stats_;
  Precision precision_ = Precision::kFp32;
  std::shared_ptr<const TensorPlacement> placement_;
  // The "tensor" inputs on the placement's device (the others stay where they are: they become
  // plain numbers).
  std::vector<torch::Tensor> onDevice(const std::vector<torch::Tensor>& inputs) const;
};

}  // namespace cairn
