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

#include <functional>
#include <vector>

#include "trainer/Dataset.h"
#include "trainer/DealSampler.h"
#include "trainer/TrainerContext.h"

namespace cairn {

// What a resumed run continues from.
struct ResumePoint {
  int64_t start_step = 0;                 // the checkpoint's step (0: a fresh run)
  int64_t updates = 0, since_update = 0;  // async counters of the checkpoint
  // The checkpoint's "writer" is another process (or none is named): its weights were never in
  // this process's memory before (ClusterSync::setResumedFromAnotherProcess).
  bool another_process = false;
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
  // cursor. Nothing when not resuming. A plan whose epoch_steps differ from the checkpoint's is
  // taken only when a deal changed epochs after the checkpoint's (dealChangedAfter).
  void checkResumedPlan();
  const ResumePoint& resumePoint() const { return resume_; }
  // The Root: the deal its sampler follows now (BatchFeeder::deal), kept in each checkpoint's
  // meta "deal" and compared when resuming under a changed deal.
  void setDeal(std::function<const std::vector<DealEntry>&()> deal) { deal_ = std::move(deal); }

 private:
  TrainerContext& ctx_;
  DatasetPair& data_;
  ResumePoint resume_;
  // Resumed under a deal the cluster took after the checkpoint (DealChange.h): the checkpoint's
  // table `written` and this run's agree on every epoch up to the checkpoint's, so the run goes
  // on under the new one. False for any other difference (which checkResumedPlan refuses).
  // BadInput when the checkpoint's epoch_steps is malformed.
  bool dealChangedAfter(const nlohmann::json& written, const std::string& path) const;
  nlohmann::json resumed_meta_;
  std::function<const std::vector<DealEntry>&()> deal_;  // resumed: the checkpoint's meta (checked against the plan)
};

// A Root resuming (cfg->resume_step) from a checkpoint written under a deal its cluster took
// (DealChange.h) that the configuration it resumes with does not hold in force: its node.json
// was read before the take (a pause and resume inside one provider run, whose configuration is
// read once), or was written after it by an update that still only offers the deal
// (extra.offered_deal: before the coordinator heard every Root take it; a spare's assignment
// then). The checkpoint's meta "deal" extends the deal in force (the same entries, then more:
// deals only grow by later epochs), so extra.deal becomes it and the Root plans with it. Before,
// the Root planned with the old deal and refused its own checkpoint, and the cluster gave its
// nodes up (the 24-volunteer soak: a growth offer taken, then two replacements at once). Anything
// else is left as it is. NodeRunner calls it before each resumed attempt; BadInput when the
// checkpoint or a deal is malformed.
void adoptDealOfCheckpoint(StageTrainerConfig* cfg);
// A resumed Root plans with `deal`, the deal in force now (node.json's extra.deal as on disk: the
// Root writes a deal it takes there), when it is one (an object or array) and differs from its
// configuration's. A Root that took a deal and paused before its next checkpoint resumed from a
// checkpoint of the old deal with the configuration its run began with, and retrained those steps
// under the old deal: other samples than the first time, and some another cluster trains (the
// 24-volunteer soak: step 124 of one cluster). NodeRunner calls it before adoptDealOfCheckpoint;
// checkResumedPlan then checks the checkpoint against it as always.
void takeDealInForce(StageTrainerConfig* cfg, const nlohmann::json& deal);

}  // namespace cairn
