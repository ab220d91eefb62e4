#include "trainer/Loss.h"

#include <ATen/ATen.h>

#include "core/Error.h"

namespace cairn {
namespace {

bool isClassification(const LossOptions& o) { return o.kind != LossKind::kMse; }

// Flattens (N, C) / (N, T, C) outputs and (N) / (N, T) targets to (M, C) and (M).
void flattenClassification(const torch::Tensor& output, const torch::Tensor& targets,
                           torch::Tensor* flat_output, torch::Tensor* flat_targets) {
  if (output.dim() < 2)
    CAIRN_THROW(BadInput,
                "classification loss: the model output must have a class dimension, got shape ",
                output.sizes());
  const int64_t classes = output.size(-1);
  *flat_output = output.reshape({-1, classes});
  *flat_targets = targets.reshape({-1}).to(torch::kLong);
  if (flat_output->size(0) != flat_targets->size(0))
    CAIRN_THROW(BadInput, "classification loss: output shape ", output.sizes(),
                " does not match targets shape ", targets.sizes());
}

}  // namespace

int64_t lossTermCount(const LossOptions& options, const torch::Tensor& targets) {
  if (!isClassification(options)) return targets.numel();
  return targets.ne(options.ignore_index).sum().item<int64_t>();
}

torch::Tensor microbatchLoss(const LossOptions& options, const torch::Tensor& output,
                             const torch::Tensor& targets, double denominator) {
  CAIRN_ENFORCE(denominator > 0, "loss denominator must be positive");
  if (!isClassification(options)) {
    if (output.sizes() != targets.sizes())
      CAIRN_THROW(BadInput, "mse loss: output shape ", output.sizes(),
                  " differs from targets shape ", targets.sizes());
    return at::mse_loss(output, targets.to(output.scalar_type()), at::Reduction::Sum) / denominator;
  }
  torch::Tensor flat_output, flat_targets;
  flattenClassification(output, targets, &flat_output, &flat_targets);
  torch::Tensor log_probabilities =
      options.kind == LossKind::kCrossEntropy ? at::log_softmax(flat_output, 1) : flat_output;
  return at::nll_loss(log_probabilities, flat_targets, {}, at::Reduction::Sum,
                      options.ignore_index) /
         denominator;
}

EvalTally evaluationTally(const LossOptions& options, const torch::Tensor& output,
                          const torch::Tensor& targets) {
  EvalTally tally;
  if (!isClassification(options)) {
    tally.loss_sum =
        at::mse_loss(output, targets.to(output.scalar_type()), at::Reduction::Sum).item<double>();
    tally.terms = targets.numel();
    return tally;
  }
  torch::Tensor flat_output, flat_targets;
  flattenClassification(output, targets, &flat_output, &flat_targets);
  torch::Tensor log_probabilities =
      options.kind == LossKind::kCrossEntropy ? at::log_softmax(flat_output, 1) : flat_output;
  tally.loss_sum =
      at::nll_loss(log_probabilities, flat_targets, {}, at::Reduction::Sum, options.ignore_index)
          .item<double>();
  const torch::Tensor valid = flat_targets.ne(options.ignore_index);
  tally.terms = valid.sum().item<int64_t>();
  tally.correct = (flat_output.argmax(1).eq(flat_targets) & valid).sum().item<int64_t>();
  return tally;
}

}  // namespace cairn
