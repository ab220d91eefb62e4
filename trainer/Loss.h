// Losses computed at the Leaf. A batch is cut into micro-batches, but training must equal the
// unsplit model on the whole batch, whose loss is a mean over the batch's loss terms. So every
// micro-batch computes the SUM of its terms divided by the number of terms in the whole batch
// (the "denominator", counted by the Root, which sees the whole batch, and sent with each
// micro-batch). The micro-batch losses then add up to exactly the batch mean, and so do their
// gradients.
//   cross_entropy:   output (N, C) or (N, T, C) logits, targets (N) or (N, T) class ids;
//                    terms = targets != ignore_index. With label_smoothing e each term is
//                    (1 - e) * -log p[target] + e / C * sum over classes of -log p[c], which is
//                    torch's cross_entropy(label_smoothing=e) times its count.
//   nll:             the same on log-probabilities (no smoothing)
//   mse:             output and targets of one shape; terms = every element
//   bce_with_logits: output and targets of one shape, targets in [0, 1]; terms = every element;
//                    pos_weight broadcast over the last dimension, as in torch
//   torchscript:     the module's (sum, count) (trainer/ScriptedLoss.h); the Root's count is the
//                    module's count(target)
// Thread-safety: free functions; a torchscript loss is used by one thread.
#pragma once

#include <torch/script.h>

#include "trainer/TrainOptions.h"

namespace cairn {

// Number of loss terms `targets` contributes (what the Root adds up into the denominator).
int64_t lossTermCount(const LossOptions& options, const torch::Tensor& targets);
// Sum of the loss terms of this micro-batch divided by `denominator` (a 0-d float tensor result
// that backward can run from).
torch::Tensor microbatchLoss(const LossOptions& options, const torch::Tensor& output,
                             const torch::Tensor& targets, double denominator);

// Evaluation figures of one batch (no gradient).
struct EvalTally {
  double loss_sum = 0;  // sum of loss terms
  int64_t terms = 0;    // loss terms counted
  int64_t correct = 0;  // top-1 hits (classification losses), or labels on the right side of 0
                        // (bce_with_logits); 0 where lossReportsAccuracy is false
};
EvalTally evaluationTally(const LossOptions& options, const torch::Tensor& output,
                          const torch::Tensor& targets);
// Whether correct / terms is an accuracy (cross_entropy, nll, bce_with_logits; not mse, not a
// torchscript loss, whose terms cairn knows nothing about).
bool lossReportsAccuracy(const LossOptions& options);

}  // namespace cairn
