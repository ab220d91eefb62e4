// RingClusterSync: the ClusterSync of a real node — one ProcessGroup per ring group of node.json
// (group id = ring id, members in cluster order), over the node's one Mailbox.
//
// What a ring brings together: the parameters AND buffers node.json lists for it (dotted names, as
// inside stage.pt). Each ring's tensors are flattened into one buffer per (dtype, role) so a ring
// costs one all-reduce per dtype, not one per tensor:
//   floating tensors   averaged (sum / members; float16/bfloat16 accumulate in float32)
//   integer/bool ones  element-wise max (BatchNorm's num_batches_tracked: every copy counted the
//                      same batches per step, so max keeps the count exact and never goes back)
// Modes (TrainOptions::sync, TrainOptions::local_steps):
//   average    after every local_steps-th optimizer step: average parameters and buffers
//   diloco     after every local_steps-th step: Δ = θ_prev − θ_local per parameter, averaged
//              across the ring; outer SGD (lr, momentum, Nesterov as torch.optim.SGD) applied to
//              θ_prev; then θ_local ← θ_prev. Buffers are averaged. The inner optimizer state is
//              not touched (it stays local).
//   gradients  before every optimizer step: average the gradients (data-parallel, as DDP); a
//              parameter without a gradient contributes zeros. Buffers averaged every local_steps.
// finish() runs one more sync (average/diloco) when steps were done since the last one, and a
// buffer average (gradients), so every cluster ends the run with the same weights; then leave().
//
// start() checks that every cluster starts from identical state: per ring, an FNV-1a hash of the
// names, dtypes, shapes and bytes of its tensors is all-gathered; at the run's first start a
// differing member is named in a BadInput and nothing is trained; when every member is restarting,
// the one with the newest last sync welcomes the others (RingRestart.h).
// Joiners (a cluster that resumes) are welcomed at a sync; in the sync schedule at the sync its
// Roots decided, the same in every ring (gateAdmissions); otherwise at the next sync, or at once
// by a member alone (RingWelcomeDesk.h).
//
// Several rings (clusters cut differently: one node shares different tensors with different
// peers) run concurrently, one thread per ring with more than one live member, for the
// identical-start check, every sync and every gradient average (RingThreads.h); each ring's
// transaction is its own: a loss in one ring re-forms that ring only. The threads share the node's
// Mailbox and transport, which are thread-safe (one receiver at a time, per-peer send locks;
// docs/THREADS.md), and each ring's collective messages carry its own group id, so rings never
// wait on each other. Flow control: with k concurrent rings each ring keeps at most max(1, 8 / k)
// messages in flight per link (ProcessGroupOptions::max_in_flight), so the rings sharing a link
// together stay within the transport's per-peer queues.
//
// Lost and returning members (docs/TRAINING.md "Across clusters", "Lost and returning ring
// members"). Each ring has a *view* (its live members, in cluster order) and a *generation*; the
// ProcessGroup of generation g > 0 has group id "<ring id>@<g>", so messages of an aborted attempt
// are never taken for the current one (RingState.h). Every sync is a transaction, redone among
// the survivors after a loss (RingTransaction.h: copy, agree on joiners, reduce, commit, recovery
// vote). Joining: RingMembership.h (join requests, the welcome). The sync maths: RingSyncMath.h;
// buckets and checksums: RingBuckets.h; checkpoint state: RingCheckpoint.h.
//
// Memory: a sync holds one copy of each ring's tensors (the restore point) while it runs; with
// concurrent rings, every ring's copy at once (at most one copy of the tensors the node shares).
//
// Overlap ("gradients", GradientSyncOptions::overlap, default on): the gradient buckets of each
// ring (RingBuckets.h, GradientSyncOptions::bucket_bytes) are all-reduced by a communication thread per ring while the
// step's last backward still runs (GradientOverlap.h); beforeOptimizerStep waits for the rest and
// commits. Overlapped or not, the same buckets are reduced in the same order: bit-identical.
//
// Joining between syncs: a member alone in a ring's view answers join requests at any time, from
// the state of its last sync, on a thread of its own (RingWelcomeDesk.h), so a joiner never waits
// for this node's next sync point (which may itself wait, through a pipeline, on the joiner).
//
// Ownership: borrows the Mailbox (it must outlive this object); the constructor adds every other
// ring member as a transport peer. Thread-safety: one calling thread (the trainer's); the ring
// threads it starts live only inside a call, the communication threads of the overlap from
// beforeBackward to beforeOptimizerStep, the welcome desk's thread from start() to leave() (it
// touches the rings only under the rings' lock, while no call is under way).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/NodeData.h"
#include "node/transport/Mailbox.h"
#include "node/ring/GradientOverlap.h"
#include "node/collectives/ProcessGroup.h"
#include "node/ring/RingState.h"
#include "node/ring/RingWelcomeDesk.h"
#include "trainer/ClusterSync.h"
#include "trainer/TrainOptions.h"

namespace cairn {

// "gradients" only: the gradient buckets' cap (RingBuckets.h; a larger tensor is a bucket of its
// own) and whether their all-reduce overlaps the last backward (GradientOverlap.h).
struct GradientSyncOptions {
  int64_t bucket_bytes = int64_t(1) << 20;  // 1 MiB, like DDP's first bucket
  bool overlap = true;
};

// A stop asked of this node (a signal, its node given to another volunteer): a ring's wait that
// still goes on `grace` after it gives up with Interrupted (ProcessGroupOptions::interrupted), and
// the node leaves as after a stop mid-step (NodeRunner), instead of waiting out a silent member.
struct RingStopHook {
  std::function<bool()> asked;  // null: never
  std::chrono::milliseconds grace{10000};
};

class RingClusterSync : public ClusterSync {
 public:
  // `timeout`: longest wait for one message of a ring member (the first collective, the
  // checksum check, also waits for members that start late).
  RingClusterSync(Mailbox& mailbox, const NodeSpec& node, SyncOptions sync, int64_t local_steps,
                  std::chrono::milliseconds timeout, GradientSyncOptions gradients = {},
                  RingStopHook stop = {});
  ~RingClusterSync() override;

  void start(torch::jit::Module& stage) override;
  // "gradients" with GradientSyncOptions::overlap: before the step's last backward, arms the overlapped all-reduce
  // (GradientOverlap.h) for the active rings; beforeOptimizerStep completes it. Not armed (the
  // ordinary path runs): other modes, overlap off, no active ring, several active rings with
  // concurrent_rings off, before start() or after leave().
  void beforeBackward(int64_t step, torch::jit::Module& stage, bool last_microbatch) override;
  void beforeOptimizerStep(int64_t step, torch::jit::Module& stage) override;
  void afterOptimizerStep(int64_t step, torch::jit::Module& stage) override;
  void finish(int64_t steps, torch::jit::Module& stage) override;
  // Checkpoint state: per ring and DiLoCo bucket i, "sync.<ring>.previous.<i>" (θ_prev, flat) and
  // "sync.<ring>.momentum.<i>" (the outer momentum, once it exists); meta (the trainer keeps it
  // under the checkpoint's "sync" key): {"last_synced_step", "mode", "rings": {id: {"generation",
  // "view"}}}. loadState (before
  // start()) checks names, dtypes and sizes against the stage's buckets in start() (BadInput
  // naming the tensor).
  void saveState(std::vector<std::pair<std::string, torch::Tensor>>* tensors,
                 nlohmann::json* meta) const override;
  void loadState(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                 const nlohmann::json& meta) override;

  // Failures ([E], docs/OPERATIONS.md "Failures while training"). A ring member lost during a sync
  // is dropped from the ring: the others complete the sync without it and keep training.
  // leave(): this node stops taking part (its cluster pauses, it shuts down, or its run ended);
  // the ring peers drop it at once instead of waiting for a timeout. Idempotent.
  // Best effort: at most ~100 ms per ring peer. Later syncs are no-ops until start() again.
  void leave();
  // Call before start() when this node (re)starts while other clusters may be training (provider
  // --resume, or resuming after its cluster paused): start() then asks the live ring peers to
  // admit it and copies their current parameters and buffers (and DiLoCo outer state) into the
  // stage before training; when no ring peer admits it within 3 × timeout (at once when every
  // other member is asking to join too) the members start together (RingRestart.h: the newest
  // last sync welcomes the others).
  void setJoining(bool joining) override { joining_ = joining; }
  void setResumedFromAnotherProcess(bool another) override {
    context_.copy_from_another_process = another;
  }
  // Before start(): the stage's device (RingContext::placement).
  void setPlacement(std::shared_ptr<const TensorPlacement> placement) override;
  uint64_t weightsVersion() const override { return weights_version_; }

  // A new cluster joins the run (docs/OPERATIONS.md "Growing"): `updated` is this node's node.json
  // with members appended to some of its rings (the coordinator's peers update). Checks it and
  // queues the additions; returns the names added (empty: nothing new). Safe from any thread
  // (the volunteer session's); the transport must already know the new peers (LivePeers::apply).
  // The additions take effect on the trainer's thread at the next sync boundary
  // (afterOptimizerStep, finish): the ring's tensors are gathered if it had been alone, and the
  // new member is welcomed once it asks to join (its request may come before or after).
  // BadInput (nothing queued) when `updated` is another node, names a ring this node does not
  // have, or changes, reorders or drops a present member.
  // `at_admission_step` (a growth update that also brings a new deal): the additions are held
  // until the sync boundary admitJoinersAt names, never taken in at an earlier sync. An update
  // without it whose ring lists fewer members than held drops the held ones (an abandoned growth).
  std::vector<std::string> addMembers(const NodeSpec& updated, bool at_admission_step = false);
  // Ring members whose process was replaced (the coordinator re-pointed them to a spare that took
  // their node over): a sync waiting on one of them ends at once and drops it, and the
  // replacement is admitted when it asks (RingState.h ReplacedMembers). Any thread.
  void markReplaced(const std::vector<std::string>& names) { context_.replaced->mark(names); }
  // The new cluster's admission (DealChange: its firstStepOf(E) less this cluster's lag): at the
  // sync boundary after `steps_done` steps the held additions are taken in — waiting up to the
  // ring timeout for the update and for each new member's join request — and a sync runs (also
  // off the local_steps grid), which welcomes them with exactly these weights. Gated, it is a
  // pending admission with `growth` (pendingAdmission: the pipeline carries it to the other
  // stages, whose admitClustersAt arms it there).
  void admitJoinersAt(int64_t steps_done) override;
  // Joiners admitted together (ClusterSync::gateAdmissions): gated, a sync admits only the joiners
  // of the clusters of an admission step (every joiner at a growth admission step); the Root
  // (`decides`) schedules one at its next sync boundary once it sees members of other clusters
  // asking: after any step that is no boundary, from the requests that reached its own rings
  // (admitAskersBetweenSyncs), and after a sync whose rings agreed that some asked. The welcome
  // desk is off.
  // At the admission step each ring waits (up to the ring timeout) for the join requests of
  // those clusters' members, then syncs.
  void gateAdmissions(bool decides) override;
  void admitClustersAt(const ClusterAdmission& admission) override;
  std::optional<ClusterAdmission> pendingAdmission() const override;

  // The deal agreement (ClusterSync): agreesOnDeals while started, not left, and some ring has
  // members in other clusters. Each synchronize() tallies the proposals of every shared ring's
  // live members (RingTransaction.h); the agreement is the one offer every proposer of every such
  // ring held (a ring left with this node alone tallies its own proposal).
  bool agreesOnDeals() const override;
  void proposeDeal(uint64_t offer, bool can_take, bool taken = false) override;
  std::optional<DealAgreement> takeDealAgreement() override;

  // The sync itself (average or DiLoCo outer step, by mode), callable directly by tests.
  void synchronize();
  // Rings whose current view has more than one member (the others need no exchange).
  size_t activeRings() const;
  // The current view (live members, cluster order) and generation of ring `id` (tests, logs).
  std::vector<std::string> view(const std::string& id) const;
  int64_t generation(const std::string& id) const;
  const RingClusterSyncStats& stats() const { return context_.stats; }

 private:
  // Moves the queued additions into the rings (trainer's thread, between calls).
  void applyAddedMembers(torch::jit::Module& stage);
  // Before joining: each ring's members with the additions held or queued for it
  // (Ring::expected_members), which a welcome's view may already name.
  void expectAddedMembers();
  // The rings this node shares with other clusters (more than one member in node.json).
  std::vector<Ring*> sharedRings();

  RingContext context_;
  int64_t local_steps_;
  GradientSyncOptions gradients_;
  std::map<std::string, torch::Tensor> loaded_;  // loadState's "sync.*" tensors, for start()
  std::vector<std::unique_ptr<Ring>> rings_;     // ring id order
  bool left_ = false;
  bool started_ = false;
  uint64_t weights_version_ = 0;  // weightsVersion(): bumped by start() and every synchronize()
  bool joining_ = false;
  std::mutex added_mutex_;
  // Under added_mutex_: each ring's members as the latest addMembers left them (ring id → list).
  std::map<std::string, std::vector<PeerRef>> added_;
  // Under added_mutex_: additions held for an admission step (addMembers at_admission_step).
  std::map<std::string, std::vector<PeerRef>> held_;
  // Under added_mutex_: some ring took its held members in at a sync where another member
  // admitted them (Ring::held_members), so this node's own admission step, if it comes, has none
  // left to take.
  bool held_taken_in_ = false;
  // Around an admitting sync: each ring's held members copied into Ring::held_members, and after
  // it, the holds a sync took in dropped (trainer's thread).
  void shareHeldMembers();
  void dropHeldTakenIn();
  std::set<int64_t> admit_at_;  // admission steps (steps done), trainer's thread
  // Gated admissions (gateAdmissions), trainer's thread: whether this node decides (the Root),
  // and what is admitted at each admission step (steps done) not reached yet: clusters, and
  // whether a growth's held members are taken in there (admitJoinersAt on the Root).
  bool decides_ = false;
  struct PendingAdmission {
    std::set<int64_t> clusters;
    bool growth = false;
  };
  std::map<int64_t, PendingAdmission> admit_clusters_at_;
  // Clusters whose admission step passed while some ring's view still lacks their member: still
  // admitted at the following syncs.
  std::set<int64_t> admitted_clusters_;
  int64_t last_boundary_ = 0;  // steps done at the last afterOptimizerStep
  // Root: after a sync, the clusters its rings saw asking are admitted at the next boundary.
  void decideAdmission(int64_t steps_done);
  // Root, after a step that is no sync boundary: the clusters whose members asked this node's
  // rings to join since (outside the view, neither pending nor admitted already) are admitted at
  // the next boundary at once, not only after the next sync saw them (which cost the joiner up to
  // a sync interval more). Any one Root's decision is the whole ring's: its pipeline carries it to
  // its members in every ring, whose "admit now" flag the ring's join agreement max-reduces, so
  // every ring admits the cluster at that boundary, whether the other Roots decided it too or
  // later (a later decision finds the members in the view: nothing left to wait for).
  void admitAskersBetweenSyncs(int64_t steps_done);
  // The deal agreement of the last synchronize() not yet taken (trainer's thread).
  std::optional<DealAgreement> deal_agreement_;
  // The overlapped gradient all-reduce (created at its first use); destroyed before rings_.
  std::unique_ptr<GradientOverlap> overlap_;
  // At an admission step: the held additions in, their join requests awaited (trainer's thread).
  void admitHeld(torch::jit::Module& stage, int64_t steps_done);

  // The rings' lock: every public call that reads or changes the rings holds it (RingsBusy in
  // the .cpp; recursive, as calls nest), so does the welcome desk while it answers a join
  // request; busy_ counts the calls under way (raised before the lock is taken, lowered after it
  // is released) so the desk leaves join requests to them.
  mutable std::recursive_mutex rings_mutex_;
  mutable std::atomic<int> busy_{0};
  // Answers join requests between syncs (RingWelcomeDesk.h): from the end of start() to leave(),
  // outside "gradients" mode. Destroyed first (its thread uses the rings).
  std::unique_ptr<WelcomeDesk> desk_;
};

}  // namespace cairn
