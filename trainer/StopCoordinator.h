// StopCoordinator: the in-band clean stop (docs/TRAINING.md "Stopping"). A stop request anywhere
// in the cluster (StageTrainerConfig::stop_requested, polled between steps) travels upstream as
// "__stop" on gradient packets; the Root fixes the number of steps at which the whole cluster
// stops and sends it downstream as "__stop_at" on every activation packet from then on, so every
// node of the cluster stops after the same step (and writes a checkpoint of it).
// A stop has a kind (StageTrainerConfig::stop_hands_over): a stop of the whole cluster, or a
// hand-over, where only the nodes that asked leave and the others wait for their replacement
// (NodeRunner). "__stop" carries the kind upstream, "__stop_kind" downstream with "__stop_at"; when
// requests of both kinds meet, the whole-cluster stop wins.
// Ownership: borrows the configuration (the stop_requested callback). Thread-safety: one thread
// (the node's trainer thread).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "trainer/StageLink.h"
#include "trainer/StageTrainer.h"

namespace cairn {

class StopCoordinator {
 public:
  StopCoordinator(const StageTrainerConfig& cfg, bool is_root) : cfg_(cfg), is_root_(is_root) {}

  // Between steps: asks stop_requested (when set). Returns true the first time it says yes.
  bool poll();
  // The Root, once it knows of a stop request: the cluster stops after `steps_done` steps (a
  // decision, once made, never changes). Other nodes: nothing.
  void decide(int64_t steps_done);
  // Steps done when the cluster stops, as the Root decided it (-1: not decided / not yet heard).
  int64_t stopAt() const { return stop_at_; }
  // The decided stop is a hand-over (only the nodes that asked leave).
  bool handsOver() const { return stop_at_ >= 0 && kind_ == kHandOver; }
  // This node itself was asked to stop (stop_requested said yes here).
  bool askedHere() const { return asked_here_; }
  // Stopping after `steps_done` steps (and not at the run's natural end of `total_steps`)?
  bool stopsAfter(int64_t steps_done, int64_t total_steps) const {
    return stop_at_ == steps_done && steps_done < total_steps;
  }

  // Activations: attach "__stop_at" once decided; read it from upstream (BadInput when it is not
  // one int64 after the packet's step, or differs from the value announced before).
  void attachStopAt(StagePacket& activation) const;
  void readStopAt(const StagePacket& activation, int64_t total_steps);
  // Gradients: attach "__stop" when this node or one downstream of it asked to stop; note it.
  void attachStop(StagePacket& gradient) const;
  void readStop(const StagePacket& gradient);

 private:
  static constexpr int64_t kNone = 0, kStop = 1, kHandOver = 2;  // the kinds on the wire
  // The kind of two requests together: a whole-cluster stop beats a hand-over.
  static int64_t combined(int64_t a, int64_t b) { return a == kNone ? b : b == kNone ? a : std::min(a, b); }
  // The int64 kind a bookkeeping tensor carries; BadInput naming `what` when it is not 1 or 2.
  static int64_t readKind(const torch::Tensor& t, const std::string& what);

  const StageTrainerConfig& cfg_;
  bool is_root_;
  bool stop_flag_ = false;   // this node, or one downstream of it, asked to stop
  bool asked_here_ = false;  // this node asked
  int64_t kind_ = kNone;     // of the requests seen; once stop_at_ is set, the decided kind
  int64_t stop_at_ = -1;     // steps done when the cluster stops (Root decides; -1: none)
};

}  // namespace cairn
