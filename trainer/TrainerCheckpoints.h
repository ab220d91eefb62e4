// TrainerCheckpoints: saving and loading one node's stage state at a step boundary
// (docs/OPERATIONS.md "Checkpoints and resume"): the stage's parameters and buffers, the optimizer
// state (and, under the async schedule, gradients accumulated towards the next update), the CPU
// generator, the data cursor and the ClusterSync state, in trainer/Checkpoint files. Every
// `checkpoint_every` steps (async: after draining the pipeline) each node writes one; a resumed
// trainer loads one before its first step and continues bit-identically.
// Ownership: borrows the context and the datasets (Root). Thread-safety: one thread (the node's
// trainer thread).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "trainer/Dataset.h"
#include "trainer/TrainerContext.h"

namespace cairn {

// What a resumed run continues from.
struct ResumePoint {
  int64_t start_step = 0;                 // the checkpoint's step (0: a fresh run)
  int64_t updates = 0, since_update = 0;  // async counters of the checkpoint
};

class TrainerCheckpoints {
 public:
  TrainerCheckpoints(TrainerContext& ctx, DatasetPair& data) : ctx_(ctx), data_(data) {}

  bool on() const;
  // A checkpoint is written after `steps_done` steps (checkpoint_every)?
  bool due(int64_t steps_done) const;
  // Writes the checkpoint of `steps_done` (the pipeline is drained: no micro-batch in flight).
  // `updates` / `since_update`: the async schedule's optimizer counters (sync: steps, 0).
  void save(int64_t steps_done, int64_t updates, int64_t since_update);
  // Resume: loads the checkpoint of cfg.resume_step into the stage, optimizer, RNG and
  // ClusterSync. The run plan (received later) is checked against it in checkResumedPlan().
  void load();
  // After the plan: the checkpoint must belong to this run plan; the Root restores the data
  // cursor. Nothing when not resuming.
  void checkResumedPlan();
  const ResumePoint& resumePoint() const { return resume_; }

 private:
  TrainerContext& ctx_;
  DatasetPair& data_;
  ResumePoint resume_;
  nlohmann::json resumed_meta_;  // resumed: the checkpoint's meta (checked against the plan)
};

}  // namespace cairn
