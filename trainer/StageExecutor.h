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
// Ownership: owns the module (shares its parameters with the Optimizer). Thread-safety: one thread.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/NodeData.h"

namespace cairn {

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
  torch::jit::Module& module() { return module_; }

 private:
  struct Pending {
    std::vector<torch::Tensor> inputs;   // leaves whose .grad() backward fills
    std::vector<torch::Tensor> outputs;  // as returned to the caller
  };
  std::vector<torch::IValue> toArguments(const std::vector<torch::Tensor>& inputs) const;
  std::vector<torch::Tensor> fromResult(const torch::IValue& result) const;
  std::vector<torch::Tensor> inputGradients(Pending& pending) const;

  torch::jit::Module module_;
  std::vector<BoundaryValue> input_specs_;
  std::vector<BoundaryValue> output_specs_;
  bool inputs_need_grad_;
  std::map<uint64_t, Pending> pending_;
};

}  // namespace cairn
