// RunPlan: how long this run is — total optimizer steps, steps per epoch, evaluation batches —
// and its negotiation. Only the Root has the data, so the Root computes the plan from its shard
// and the test set and, before the first step, sends it downstream as a "plan" control packet;
// every other node receives it from upstream and passes it on.
// Ownership: plain values. Thread-safety: one thread (the node's trainer thread).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/DealSampler.h"

#include "trainer/TrainerContext.h"

namespace cairn {

struct RunPlan {
  int64_t total_steps = 0, steps_per_epoch = 0, eval_batches = 0;
  // A run whose number of clusters changes (docs/TRAINING.md "the deal"): the steps per epoch
  // as DealSchedule::table() gives them; empty: steps_per_epoch in every epoch (as before).
  // steps_per_epoch is then the first entry's.
  std::vector<EpochSteps> epoch_steps;
  // The run-wide step this cluster starts at: a cluster formed mid-run (the deal adds it from
  // epoch E) starts at the first step of E, its weights from its ring peers; 0 otherwise.
  int64_t first_step = 0;

  int64_t epochs() const {
    if (epoch_steps.empty()) return (total_steps + steps_per_epoch - 1) / steps_per_epoch;
    return total_steps > 0 ? epochOf(total_steps - 1) + 1 : 0;
  }
  // The epoch of step `step` (0-based), the first step of `epoch`, and the step's place in its
  // epoch: step / steps_per_epoch and step % steps_per_epoch when epoch_steps is empty.
  int64_t epochOf(int64_t step) const {
    return epoch_steps.empty() ? step / steps_per_epoch : epochOfStep(epoch_steps, step);
  }
  int64_t firstStepOf(int64_t epoch) const {
    return epoch_steps.empty() ? epoch * steps_per_epoch : firstStepOfEpoch(epoch_steps, epoch);
  }
  int64_t positionOf(int64_t step) const { return step - firstStepOf(epochOf(step)); }
  // The Root's plan: `shard` training samples for this cluster, `test` test samples; BadInput when
  // the batch does not fit the shard.
  static RunPlan forShard(const TrainOptions& opt, int64_t shard, int64_t test);
  // Non-Root nodes: the plan from upstream (BadInput when malformed, naming the field). Then, on every node but the
  // Leaf, the plan is sent downstream.
  static RunPlan receiveFromUpstream(TimedLink& link);
  void sendDownstream(TimedLink& link) const;
  // The "plan" packet's text, and its parse (BadInput naming `where` and the field; `text` is what
  // came). A checkpoint's plan is checked the same way (TrainerCheckpoints).
  std::string toText() const;
  static RunPlan fromText(const std::string& text, const std::string& where = "run plan from upstream");
};

}  // namespace cairn
