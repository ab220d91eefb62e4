// Evaluator: one evaluation pass over the test set (every `eval_every` steps and at the end). The
// Root loads test batches and runs them forward; every stage passes its outputs downstream with
// "__targets" as evaluation packets; the Leaf tallies loss, accuracy and perplexity, and the
// result travels back upstream ("eval_result" control packets) so every node logs and records it
// (metrics.jsonl "eval").
// Ownership: borrows the context, the link and the datasets (Root). Thread-safety: one thread
// (the node's trainer thread).
#pragma once

#include <cstdint>

#include "trainer/Dataset.h"
#include "trainer/TrainerContext.h"

namespace cairn {

class Evaluator {
 public:
  Evaluator(TrainerContext& ctx, TimedLink& link, DatasetPair& data)
      : ctx_(ctx), link_(link), data_(data) {}
  // Evaluates after `step` optimizer steps (evaluation packets carry that number).
  EvalResult evaluate(int64_t step);

 private:
  TrainerContext& ctx_;
  TimedLink& link_;
  DatasetPair& data_;
};

}  // namespace cairn
