// ClusterSync: how a node brings the state it shares with other clusters together (parameter
// average, DiLoCo outer step, or gradient all-reduce; docs/TRAINING.md "Across clusters"). The
// trainer knows only this interface (no sockets in trainer/); node/RingClusterSync implements it
// over one ProcessGroup per ring group of node.json.
//
// StageTrainer calls, on its own thread, in this order:
//   setPlacement(placement)              before each start: the device the stage trains on
//   start(stage)                         once, after the run plan is known and before step 0
//   beforeBackward(step, stage, last)    (schedule "sync") before each backward of a step, `last`
//                                        for the step's last one, after which every gradient of
//                                        the stage is final
//   beforeOptimizerStep(step, stage)     every step, after the last backward and before gradient
//                                        clipping and the optimizer step
//   afterOptimizerStep(step, stage)      every step, after the optimizer step (0-based `step`)
//   finish(steps, stage)                 once, after the last step and before the final evaluation
// The implementation decides from its options what each call does (e.g. average only every
// `local_steps` steps). Every node of every cluster makes the same calls for the same steps, which
// is what keeps the collectives of a ring in step.
// Ownership: the caller owns it and keeps it alive for the run; it borrows nothing from the
// trainer between calls. Thread-safety: the trainer thread only.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cairn {

class TensorPlacement;  // trainer/Device.h

// What the proposing members of a sync agreed on (ClusterSync::takeDealAgreement).
struct DealAgreement {
  uint64_t offer = 0;         // the fingerprint of the offer every proposing member held
  bool all_can_take = true;   // no proposing member's own check (its data cache, its shard) refused it
  // The most steps any member of the agreeing rings had done at that sync (clusters that resumed
  // from a checkpoint lag the others by whole syncs): the deal is judged, and the new cluster's
  // admission placed, by the leading cluster's count (trainer/DealChange.h). 0: unknown (the
  // deciding Root's own count is used).
  int64_t leading_steps_done = 0;
  // Some proposing member had already taken this offer (ClusterSync::proposeDeal `taken`): it
  // was decided at an earlier sync this Root missed (its cluster was paused or resuming), and is
  // taken if this Root's own epoch allows (trainer/DealChange.h).
  bool taken_before = false;
};

// Members of some clusters admitted into the rings at the sync boundary after `steps_done` steps
// (ClusterSync::gateAdmissions).
// `growth`: also the members a growth added (ClusterSync::admitJoinersAt on the Root): the held
// additions are taken in there and every member that asks is admitted.
struct ClusterAdmission {
  int64_t steps_done = 0;
  std::vector<int64_t> clusters;
  bool growth = false;
};

class ClusterSync {
 public:
  virtual ~ClusterSync() = default;
  virtual void start(torch::jit::Module& stage) = 0;
  // An implementation may start bringing gradients together while the last backward produces
  // them (RingClusterSync's overlapped gradient all-reduce, docs/TRAINING.md "Overlap");
  // beforeOptimizerStep then completes that. A call with `last_microbatch` must be followed by
  // beforeOptimizerStep for the same step before the next backward. Default: nothing.
  virtual void beforeBackward(int64_t /*step*/, torch::jit::Module& /*stage*/,
                              bool /*last_microbatch*/) {}
  virtual void beforeOptimizerStep(int64_t step, torch::jit::Module& stage) = 0;
  virtual void afterOptimizerStep(int64_t step, torch::jit::Module& stage) = 0;
  virtual void finish(int64_t steps, torch::jit::Module& stage) = 0;
  // Before start(): take the current weights from the ring peers instead of checking that every
  // cluster starts from the same ones (a cluster that resumes or is added mid-run). Default: no
  // peers, nothing to do.
  virtual void setJoining(bool /*joining*/) {}
  // Before start(): the stage's weights come from a checkpoint another process wrote (a spare
  // resuming a lost node's, a provider started again: ResumePoint::another_process), not from this
  // process's own training. RingClusterSync: a copy that looks corrupt next to a ring peer's
  // welcome was then corrupted in that other process's memory, and this node takes the welcome's
  // copy instead of refusing to go on (docs/TRAINING.md "A welcome is checked too"). Default: nothing.
  virtual void setResumedFromAnotherProcess(bool /*another*/) {}
  // Before start(): where the stage trains (trainer/Device.h). RingClusterSync copies its
  // overlapped gradient buckets out to the host during backward when the placement's copies run
  // behind the host (a GPU's). Default: nothing.
  virtual void setPlacement(std::shared_ptr<const TensorPlacement> /*placement*/) {}
  // Changes whenever a call may have written the stage's weights (start taking its peers' weights,
  // a sync): trainer/SharedParameters.h passes a shared parameter's new value to its other copies
  // then. Default: the weights are never written here.
  virtual uint64_t weightsVersion() const { return 0; }
  // A cluster the deal adds (docs/TRAINING.md "the deal"): at the sync boundary after `steps_done`
  // of this node's steps the rings take the members added for it in, waiting for them, so its
  // weights are exactly these. Called on the Root's trainer thread when it takes the deal
  // (trainer/DealChange.h: the new cluster's first step, less this cluster's lag behind the
  // leading one, so every cluster admits it at the same sync). Gated (below), the admission is
  // pending like a decided one and rides down the pipeline with `growth` set. Default: nothing.
  virtual void admitJoinersAt(int64_t /*steps_done*/) {}
  // A cluster that resumes must be admitted at the same sync of the live clusters in every ring:
  // admitted at different ones, its pipeline is a sync out of step with the others in some ring,
  // and with several such clusters the rings wait on each other through the pipelines
  // (docs/TRAINING.md "Lost and returning ring members"). gateAdmissions (before start(), sync
  // schedule): join requests are then taken in only at the admission steps admitClustersAt names.
  // The Root (`decides`) names them: once it sees members of some clusters asking (after a step
  // between syncs, or at a sync whose rings agreed on it), it admits those clusters at its next
  // sync boundary, and pendingAdmission() says so until then; the pipeline carries it downstream
  // with the activations ("__admit"), and every other stage calls admitClustersAt with it. Its
  // cluster has a member in every ring, whose "admit now" flag the ring's join agreement
  // max-reduces, so every ring admits the cluster at that sync ordinal. Defaults: no rings,
  // nothing to do.
  virtual void gateAdmissions(bool /*decides*/) {}
  virtual void admitClustersAt(const ClusterAdmission& /*admission*/) {}
  virtual std::optional<ClusterAdmission> pendingAdmission() const { return std::nullopt; }
  // Several running clusters take a new deal together (trainer/DealChange.h): a Root that shares
  // a ring with other clusters (agreesOnDeals) does not decide an offer alone. Before each step it
  // proposes the newest offer it holds (a fingerprint of its text; a Root holding none proposes a
  // value of its own for that, DealChange.h kNoOffer) and whether its own checks allow it; every
  // sync that can admit joiners also agrees on the proposals of the ring's live members (members
  // that propose nothing, 0, abstain: the non-Roots). takeDealAgreement then returns, once,
  // the offer when every proposing member held that same one, nullopt when no such sync ran since
  // the last call or the proposals differed. Every Root of those rings syncs at the same ordinal,
  // so every Root decides the same offer at the same sync. `taken`: this Root already took the
  // offer it proposes (DealAgreement::taken_before). Defaults: no rings, decide alone.
  virtual bool agreesOnDeals() const { return false; }
  virtual void proposeDeal(uint64_t /*offer*/, bool /*can_take*/, bool /*taken*/ = false) {}
  virtual std::optional<DealAgreement> takeDealAgreement() { return std::nullopt; }

  // Checkpoints (trainer/Checkpoint.h): the state this object must carry across a restart (DiLoCo
  // outer parameters and momentum, the step of the last sync, ...) as named tensors plus JSON.
  // saveState is called right after a checkpointed step's afterOptimizerStep; loadState, when
  // resuming, before start(). Names must not start with "stage." or "optim." (the trainer's).
  virtual void saveState(std::vector<std::pair<std::string, torch::Tensor>>* /*tensors*/,
                         nlohmann::json* /*meta*/) const {}
  virtual void loadState(const std::vector<std::pair<std::string, torch::Tensor>>& /*tensors*/,
                         const nlohmann::json& /*meta*/) {}
};

}  // namespace cairn
