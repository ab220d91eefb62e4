// RunPlan: how long this run is — total optimizer steps, steps per epoch, evaluation batches —
// and its negotiation. Only the Root has the data, so the Root computes the plan from its shard
// and the test set and, before the first step, sends it downstream as a "plan" control packet;
// every other node receives it from upstream and passes it on.
// Ownership: plain values. Thread-safety: one thread (the node's trainer thread).
#pragma once

#include <cstdint>

#include "trainer/TrainerContext.h"

namespace cairn {

struct RunPlan {
  int64_t total_steps = 0, steps_per_epoch = 0, eval_batches = 0;

  int64_t epochs() const { return (total_steps + steps_per_epoch - 1) / steps_per_epoch; }
  // The Root's plan: `shard` training samples for this cluster, `test` test samples; BadInput when
  // the batch does not fit the shard.
  static RunPlan forShard(const TrainOptions& opt, int64_t shard, int64_t test);
  // Non-Root nodes: the plan from upstream (BadInput when malformed). Then, on every node but the
  // Leaf, the plan is sent downstream.
  static RunPlan receiveFromUpstream(TimedLink& link);
  void sendDownstream(TimedLink& link) const;
};

}  // namespace cairn
