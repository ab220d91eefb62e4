#include "trainer/Loss.h"

#include <ATen/ATen.h>

#include "core/Error.h"
#include "trainer/Device.h"
#include "trainer/ScriptedLoss.h"

namespace cairn {
namespace {

bool isClassification(const LossOptions& o) {
  return o.kind == LossKind::kCrossEntropy || o.kind == LossKind::kNll;
}

ScriptedLoss& scripted(const LossOptions& o) {
  CAIRN_ENFORCE(o.scripted != nullptr, "torchscript loss used before it was loaded");
  return *o.scripted;
}

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

void checkSameShape(const char* loss, const torch::Tensor& output, const torch::Tensor& targets) {
  if (output.sizes() != targets.sizes())
    CAIRN_THROW(BadInput, loss, " loss: output shape ", output.sizes(),
                " differs from targets shape ", targets.sizes());
}

// Sum of the classification terms (cross_entropy with its label smoothing, or nll).
torch::Tensor classificationSum(const LossOptions& o, const torch::Tensor& flat_output,
                                const torch::Tensor& flat_targets) {
  const bool ce = o.kind == LossKind::kCrossEntropy;
  const torch::Tensor log_probabilities = ce ? at::log_softmax(flat_output, 1) : flat_output;
  torch::Tensor sum =
      at::nll_loss(log_probabilities, flat_targets, {}, at::Reduction::Sum, o.ignore_index);
  if (!ce || o.label_smoothing == 0) return sum;
  // torch's cross_entropy_loss_label_smoothing: the uniform part over the same (kept) rows.
  const torch::Tensor kept = flat_targets.ne(o.ignore_index);
  const torch::Tensor smooth = -(log_probabilities.sum(1).masked_fill(kept.logical_not(), 0).sum());
  const double classes = double(flat_output.size(1));
  return sum * (1 - o.label_smoothing) + smooth * (o.label_smoothing / classes);
}

// `weights` as a tensor on `like`'s device and of its dtype: made once per thread and kept while
// the weights, device and dtype stay the same. Made per micro-batch, on a GPU each would copy from
// pageable host memory, a copy that waits for everything queued on the device before it. Kept on
// the heap and never freed (one small tensor per thread that computes losses): a thread_local
// tensor would be freed at exit, when the CUDA runtime may already be gone.
const torch::Tensor& weightsLike(const std::vector<double>& weights, const torch::Tensor& like) {
  struct Cached {
    std::vector<double> weights;
    c10::Device device{c10::kCPU};
    c10::ScalarType dtype = c10::kFloat;
    torch::Tensor tensor;
  };
  thread_local Cached* cached = new Cached;
  if (!cached->tensor.defined() || cached->weights != weights || cached->device != like.device() ||
      cached->dtype != like.scalar_type())
    *cached = Cached{weights, like.device(), like.scalar_type(),
                     torch::tensor(weights, torch::kDouble).to(like.device(), like.scalar_type())};
  return cached->tensor;
}

torch::Tensor bceSum(const LossOptions& o, const torch::Tensor& output,
                     const torch::Tensor& targets) {
  checkSameShape("bce_with_logits", output, targets);
  torch::Tensor pos_weight;
  if (!o.pos_weight.empty()) {
    pos_weight = weightsLike(o.pos_weight, output);
    if (o.pos_weight.size() > 1 && (output.dim() == 0 || output.size(-1) != pos_weight.size(0)))
      CAIRN_THROW(BadInput, "bce_with_logits loss: pos_weight has ", o.pos_weight.size(),
                  " entries but the output's last dimension is ",
                  output.dim() ? output.size(-1) : 0, " (shape ", output.sizes(), ")");
  }
  return at::binary_cross_entropy_with_logits(output, targets.to(output.scalar_type()), {},
                                              pos_weight, at::Reduction::Sum);
}

}  // namespace

int64_t lossTermCount(const LossOptions& options, const torch::Tensor& targets) {
  if (options.kind == LossKind::kTorchScript) return scripted(options).count(targets);
  if (!isClassification(options)) return targets.numel();
  return targets.ne(options.ignore_index).sum().item<int64_t>();
}

torch::Tensor microbatchLoss(const LossOptions& options, const torch::Tensor& output,
                             const torch::Tensor& received_targets, double denominator) {
  CAIRN_ENFORCE(denominator > 0, "loss denominator must be positive");
  // Targets travel on the host; the loss runs where the output is (trainer/Device.h).
  const torch::Tensor targets = received_targets.to(output.device());
  switch (options.kind) {
    case LossKind::kTorchScript:
      return scripted(options).microbatchLoss(output, targets, denominator);
    case LossKind::kMse:
      checkSameShape("mse", output, targets);
      return at::mse_loss(output, targets.to(output.scalar_type()), at::Reduction::Sum) /
             denominator;
    case LossKind::kBceWithLogits:
      return bceSum(options, output, targets) / denominator;
    case LossKind::kCrossEntropy:
    case LossKind::kNll:
      break;
  }
  torch::Tensor flat_output, flat_targets;
  flattenClassification(output, targets, &flat_output, &flat_targets);
  return classificationSum(options, flat_output, flat_targets) / denominator;
}

EvalTally evaluationTally(const LossOptions& options, const torch::Tensor& output,
                          const torch::Tensor& received_targets) {
  torch::NoGradGuard no_grad;
  const torch::Tensor targets = received_targets.to(output.device());
  EvalTally tally;
  switch (options.kind) {
    case LossKind::kTorchScript: {
      auto [sum, count] = scripted(options).sumAndCount(output, targets);
      tally.loss_sum = sum.item<double>();
      tally.terms = count;
      return tally;
    }
    case LossKind::kMse:
      checkSameShape("mse", output, targets);
      tally.loss_sum =
          at::mse_loss(output, targets.to(output.scalar_type()), at::Reduction::Sum).item<double>();
      tally.terms = targets.numel();
      return tally;
    case LossKind::kBceWithLogits: {
      // The sum and the count in one read (readScalars: on a GPU one wait, not two).
      const std::vector<double> read =
          readScalars({bceSum(options, output, targets),
                       output.gt(0).eq(targets.to(output.scalar_type()).ge(0.5)).sum()});
      tally.loss_sum = read[0];
      tally.terms = targets.numel();
      tally.correct = int64_t(read[1]);
      return tally;
    }
    case LossKind::kCrossEntropy:
    case LossKind::kNll:
      break;
  }
  torch::Tensor flat_output, flat_targets;
  flattenClassification(output, targets, &flat_output, &flat_targets);
  const torch::Tensor valid = flat_targets.ne(options.ignore_index);
  const std::vector<double> read =
      readScalars({classificationSum(options, flat_output, flat_targets), valid.sum(),
                   (flat_output.argmax(1).eq(flat_targets) & valid).sum()});
  tally.loss_sum = read[0];
  tally.terms = int64_t(read[1]);
  tally.correct = int64_t(read[2]);
  return tally;
}

bool lossReportsAccuracy(const LossOptions& options) {
  return options.kind != LossKind::kMse && options.kind != LossKind::kTorchScript;
}

}  // namespace cairn
