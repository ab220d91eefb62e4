// Evaluator: one evaluation pass over the test set (every `eval_every` steps and at the end). The
// Root loads test batches and runs them forward; every stage passes its outputs downstream with
// "__targets" as evaluation packets; the Leaf tallies loss, accuracy and perplexity, and the
// result travels back upstream ("eval_result" control packets) so every node logs and records it
// (metrics.jsonl "eval").
// Ownership: borrows the context, the link and the datasets (Root). Thread-safety: one thread
// (the node's trainer thread).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "trainer/Dataset.h"
#include "trainer/TrainerContext.h"

namespace cairn {

struct EvalTally;

class Evaluator {
 public:
  Evaluator(TrainerContext& ctx, TimedLink& link, DatasetPair& data)
      : ctx_(ctx), link_(link), data_(data) {}
  // Evaluates after `step` optimizer steps (evaluation packets carry that number).
  EvalResult evaluate(int64_t step);

 private:
  // One test batch's forward at this stage: the Root reads it, the others receive it; sets
  // `*targets`, returns the stage's outputs.
  std::vector<torch::Tensor> forwardBatch(int64_t step, int64_t b, torch::Tensor* targets);
  // Test batch `b`: forward, then the Leaf tallies it and the others pass it downstream.
  void passBatch(int64_t step, int64_t b, EvalTally* tally, int64_t* samples);
  // The result travels from the Leaf upstream: completes `*result` off the Leaf, passes it on
  // off the Root; returns it as the metrics line's "eval".
  nlohmann::json shareResult(int64_t step, EvalResult* result);

  TrainerContext& ctx_;
  TimedLink& link_;
  DatasetPair& data_;
};

}  // namespace cairn
