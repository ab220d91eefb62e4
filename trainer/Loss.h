// Losses computed at the Leaf. A batch is cut into micro-batches, but training must equal the
// unsplit model on the whole batch, whose loss is a mean over the batch's loss terms. So every
// micro-batch computes the SUM of its terms divided by the number of terms in the whole batch
// (the "denominator", counted by the Root, which sees the whole batch, and sent with each
// micro-batch). The micro-batch losses then add up to exactly the batch mean, and so do their
// gradients.
//   cross_entropy: output (N, C) or (N, T, C) logits, targets (N) or (N, T) class ids;
//                  terms = targets != ignore_index
//   nll:           the same on log-probabilities
//   mse:           output and targets of one shape; terms = every element
// Thread-safety: free functions.
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
  int64_t correct = 0;  // top-1 hits (classification losses only)
};
EvalTally evaluationTally(const LossOptions& options, const torch::Tensor& output,
                          const torch::Tensor& targets);

}  // namespace cairn
