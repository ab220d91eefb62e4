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
// buffer average (gradients), so every cluster ends the run with the same weights.
//
// start() checks that every cluster starts from identical state: per ring, an FNV-1a hash of the
// names, dtypes, shapes and bytes of its tensors is all-gathered; a differing member is named in a
// BadInput and nothing is trained.
//
// Rings run one after another in ring id order (the same total order on every node, so two nodes
// that share several rings can never wait on each other in a cycle); they are not concurrent.
//
// Ownership: borrows the Mailbox (it must outlive this object); the constructor adds every other
// ring member as a transport peer. Thread-safety: the transport's owning thread only.
#pragma once

#include <chrono>
#include <memory>
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

  // Failures ([E], docs/OPERATIONS.md "Failures while training"). A ring member lost during a sync
  // is dropped from the ring: the others complete the sync without it and keep training.
  // leave(): this node stops taking part (its cluster pauses, it shuts down, or its run ended);
  // the ring peers drop it at once instead of waiting for a timeout. Idempotent.
  void leave();
  // Call before start() when this node (re)starts while other clusters may be training (provider
  // --resume, or resuming after its cluster paused): start() then asks the live ring peers to
  // admit it and copies their current parameters and buffers (and DiLoCo outer state) into the
  // stage before training; when no ring peer is live it falls back to the ordinary start.
  void setJoining(bool joining) { joining_ = joining; }

  // The sync itself (average or DiLoCo outer step, by mode), callable directly by tests.
  void synchronize();
  // Rings with more than one member (the others need no exchange).
  size_t activeRings() const;
  const RingClusterSyncStats& stats() const { return stats_; }

 private:
  struct Ring;
  void reduceBuckets(Ring& ring, bool parameters, bool buffers);
  void outerStep(Ring& ring);
  void averageGradients(Ring& ring);

  Mailbox& mailbox_;
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
