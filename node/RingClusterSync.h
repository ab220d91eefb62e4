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
// names, dtypes, shapes and bytes of its tensors is all-gathered; a differing member is named in a
// BadInput and nothing is trained.
//
// Several rings (clusters cut differently: one node shares different tensors with different
// peers) run concurrently, one thread per ring with more than one live member (the calling thread
// takes the first), for the identical-start check, every sync and every gradient average; the call
// returns when all have. Each ring's transaction (below) is its own: a loss in one ring re-forms
// that ring only. The threads share the node's Mailbox and transport, which are thread-safe (one
// receiver at a time, per-peer send locks; docs/THREADS.md), and each ring's collective messages
// carry its own group id, so rings never wait on each other: no order between them is needed.
// Flow control: with k concurrent rings each ring keeps at most max(1, 8 / k) messages in flight
// per link (ProcessGroupOptions::max_in_flight), so the rings sharing a link together stay within
// the transport's per-peer queues. SyncOptions::concurrent_rings = false (job.json
// "sync": {"concurrent_rings": false}) runs them one after another in ring id order instead (the
// same total order on every node, so two nodes sharing several rings never wait in a cycle).
// Torch thread-local state (grad mode…) is carried into the ring threads.
//
// Lost and returning members (docs/TRAINING.md "Across clusters", "Lost and returning ring
// members"). Each ring has a *view* (its live members, in cluster order) and a *generation*; the
// ProcessGroup of generation g > 0 has group id "<ring id>@<g>", so messages of an aborted attempt
// are never taken for the current one. Every sync (average, DiLoCo, gradients, buffer average) is
// a transaction: the ring's tensors (and gradients, θ_prev, momentum) are copied first; the sync
// ends with a barrier (the commit). When a member is lost (PeerLost: a timeout, an abort naming
// it, its leave message, or the transport reporting it disconnected), every live member restores
// its copy, drops the member named by the PeerLost (ProcessGroup's abort makes every survivor
// name the same one), moves to generation g+1 and redoes the sync among the survivors. A ring
// left with only this node makes its syncs no-ops (logged once).
// Joining: every sync point of the average/DiLoCo/buffer kind starts with a tiny max-all-reduce of
// the join requests each member has received (so all live members agree on whom to admit); after
// the commit the lowest-ranked member of the view sends each admitted joiner a welcome (view,
// generation, the ring's parameters, buffers and DiLoCo θ_prev/momentum, a checksum), and every
// member moves to the next generation with the joiner included.
// Recovery: after dropping a lost member, the survivors agree (a max-all-reduce of 2·S + "my work
// phase did not complete", S = transactions committed so far) whether the failed attempt stands:
// a member found dying inside the commit barrier has sent everything, so those who completed the
// reductions keep them, and a member behind the others (they committed and went on) keeps its
// result instead of redoing a sync nobody else will redo. Otherwise everyone restores and redoes.
// Known limit: a join admitted at the very sync where a member is lost inside the commit barrier
// can split the view (the admitting side moved on); the next loss detection repairs neither.
//
// Memory: a sync holds one copy of each ring's tensors (the restore point) while it runs; with
// concurrent rings, every ring's copy at once (at most one copy of the tensors the node shares).
//
// Ownership: borrows the Mailbox (it must outlive this object); the constructor adds every other
// ring member as a transport peer. Thread-safety: one calling thread (the trainer's); the ring
// threads it starts live only inside a call.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/NodeData.h"
#include "node/Mailbox.h"
#include "node/ProcessGroup.h"
#include "trainer/ClusterSync.h"
#include "trainer/TrainOptions.h"

namespace cairn {

struct RingClusterSyncStats {
  int64_t syncs = 0;           // averages / outer steps done
  int64_t gradient_syncs = 0;  // gradient all-reduces done
  double seconds = 0;          // in collectives, all calls together
  uint64_t bytes_sent = 0;     // tensor bytes, all rings together
  int64_t members_lost = 0;    // members dropped after a timeout, abort or disconnect
  int64_t members_left = 0;    // members dropped because they announced leave()
  int64_t members_joined = 0;  // joiners admitted by this node's rings (this node as joiner: 0)
  int64_t redone_syncs = 0;    // sync attempts restored and redone after a loss
  int64_t joined_rings = 0;    // rings this node joined through a welcome (setJoining)
  uint64_t last_welcome_checksum = 0;  // FNV-1a of the ring tensors sent/received in the last welcome
};

class RingClusterSync : public ClusterSync {
 public:
  // `timeout`: longest wait for one message of a ring member (the first collective, the
  // checksum check, also waits for members that start late).
  RingClusterSync(Mailbox& mailbox, const NodeSpec& node, SyncOptions sync, int64_t local_steps,
                  std::chrono::milliseconds timeout);
  ~RingClusterSync() override;

  void start(torch::jit::Module& stage) override;
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
  // other member is asking to join too) it falls back to the ordinary start.
  void setJoining(bool joining) { joining_ = joining; }

  // The sync itself (average or DiLoCo outer step, by mode), callable directly by tests.
  void synchronize();
  // Rings whose current view has more than one member (the others need no exchange).
  size_t activeRings() const;
  // The current view (live members, cluster order) and generation of ring `id` (tests, logs).
  std::vector<std::string> view(const std::string& id) const;
  int64_t generation(const std::string& id) const;
  const RingClusterSyncStats& stats() const { return stats_; }

 private:
  struct Ring;
  struct Snapshot;
  void buildBuckets(Ring& ring, torch::jit::Module& stage);
  void checkIdenticalStart(Ring& ring);
  void applyLoadedState(Ring& ring);
  bool join();  // true when at least one ring was joined through a welcome
  void reduceBuckets(Ring& ring, bool parameters, bool buffers);
  void outerStep(Ring& ring);
  void averageGradients(Ring& ring);
  // Runs `work` on `ring` as a transaction (see above): redone among the survivors after a loss;
  // with `admit`, join requests are agreed on first and joiners admitted after the commit.
  void transact(Ring& ring, bool gradients, bool admit, const std::function<void()>& work);
  // Runs body(ring) for each ring of `rings`, concurrently when there are several and
  // sync_.concurrent_rings (else in order); rethrows the first error in ring order once all ended.
  void forEachRing(const std::vector<Ring*>& rings, const std::function<void(Ring&)>& body);
  bool recover(Ring& ring, bool work_done);
  void dropMember(Ring& ring, const std::string& lost, bool left, const std::string& why);
  void regroup(Ring& ring, std::vector<std::string> view, int64_t generation);
  void collectJoinRequests(Ring& ring);
  void admit(Ring& ring, const std::vector<std::string>& joiners);
  uint64_t checksum(const Ring& ring) const;
  // Updates stats_ under stats_mutex_ (ring threads count losses, joins and redone syncs at once).
  template <typename F>
  void countStats(F&& update) {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    update(stats_);
  }

  Mailbox& mailbox_;
  std::chrono::milliseconds timeout_;
  ProcessGroupOptions group_options_;
  std::map<std::string, torch::Tensor> loaded_;  // loadState's "sync.*" tensors, for start()
  bool left_ = false;
  // Guards stats_ and bytes_retired_, which the ring threads of one call update together.
  mutable std::mutex stats_mutex_;
  uint64_t bytes_retired_ = 0;  // sent by the groups of earlier generations
  NodeSpec node_;
  SyncOptions sync_;
  int64_t local_steps_;
  std::vector<std::unique_ptr<Ring>> rings_;  // ring id order
  int64_t last_synced_step_ = 0;              // optimizer steps done at the last sync
  bool started_ = false;
  bool joining_ = false;
  RingClusterSyncStats stats_;
};

}  // namespace cairn
