// TrainerContext: what the parts of one node's training run (trainer/StageTrainer.cpp and the
// units it is made of) share, passed to each by reference so every unit's dependencies show in its
// constructor: the configuration and the node's role, the stage's executor and optimizer, the
// metrics log, the run plan, and the timing of the current step. Also the few timed operations
// every loop uses (a packet sent or awaited, the optimizer step with the cross-cluster hooks).
// Ownership: StageTrainer owns every object referenced here and outlives the units that use them.
// Thread-safety: one thread (the node's trainer thread).
#pragma once

#include <torch/script.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainer/Device.h"
#include "trainer/StageLink.h"
#include "trainer/StageTrainer.h"
#include "trainer/TrainOptions.h"

namespace cairn {

class MetricsLog;
class Optimizer;
class SharedParameters;
class StageExecutor;
class TensorPlacement;
struct RunPlan;

using TrainerClock = std::chrono::steady_clock;
inline double secondsSince(TrainerClock::time_point t) {
  return std::chrono::duration<double>(TrainerClock::now() - t).count();
}

// A float64 scalar tensor (losses, norms, denominators travel as these).
inline torch::Tensor scalar64(double v) { return torch::tensor(v, torch::kDouble); }

// Where the current step's time went (metrics.jsonl: compute_s, send_s, wait_s, sync_s), and, on a
// device whose copies run later, how its packets left (later_sends, held_through_receives).
struct StepTimes {
  double compute_s = 0, send_s = 0, wait_s = 0;
  double sync_s = 0;  // cross-cluster sync (ClusterSync) within the step
  int64_t later_sends = 0;            // packets TimedLink::sendLater held back
  int64_t held_through_receives = 0;  // receives that found their packet while one was held
  void reset() { *this = StepTimes(); }
};

// One micro-batch between its forward and its backward.
struct Microbatch {
  std::vector<torch::Tensor> inputs;  // Root: data inputs
  torch::Tensor targets, ids, denominator;
  torch::Tensor loss;  // Leaf: this micro-batch's share of the batch loss
};

// The StageLink with the time spent sending (send_s) and waiting (wait_s) counted. What it sends
// crosses to the host first (`placement`: packets leave from the host, whatever device the stage
// trains on); what it receives stays on the host until the executor or the loss takes it.
// With wire.activations bf16, fp16 or int8 (`wire`), a float32 activation, gradient or evaluation
// output off the host takes its wire form on its device before the crossing (wireForm, StageLink.h),
// so a half or a quarter of the bytes cross PCIe; the link sends a tensor already in its wire form
// as it is. On the CPU the link compresses.
// sendLater: a packet off the host leaves at the next flush, send or wait for a peer, whichever
// comes first; its copies to the host are started at once (TensorPlacement::toHostLater) and
// waited for then, so the caller can queue the device's next work before the wait (the next
// micro-batch's forward or backward runs on the GPU while this one's outputs are copied and
// sent). A receive whose packet has arrived already takes it without sending (StageLink::
// tryReceive); every other receive, and every send, flushes first: a packet never waits behind a
// wait for a peer, and packets leave in the order they were given.
class TimedLink {
 public:
  TimedLink(StageLink& link, StepTimes& times, const TensorPlacement& placement,
            WireCodec wire = WireCodec::kFp32)
      : link_(link), times_(times), placement_(placement), wire_(wire) {}
  void send(Neighbour to, const StagePacket& packet);
  // send, leaving at the next flush when the placement's copies run behind the host thread
  // (TensorPlacement::copiesLater: a GPU); otherwise send.
  void sendLater(Neighbour to, const StagePacket& packet);
  // Sends what sendLater left, once its copies are complete; nothing when nothing is left.
  void flush();
  StagePacket receive(Neighbour from, PacketKind kind, uint64_t step, uint64_t microbatch,
                      const std::string& tag);

 private:
  struct Later {
    Neighbour to;
    StagePacket host;                    // its tensors filled in by the copies
    std::vector<HostCopy> copies;        // waited for before it leaves
    std::vector<torch::Tensor> sources;  // what the copies read, kept until they are done
  };
  // The packet's tensors in the form they cross to the host (wireForm on the device).
  StagePacket crossingForm(const StagePacket& packet) const;

  StageLink& link_;
  StepTimes& times_;
  const TensorPlacement& placement_;
  WireCodec wire_;
  std::optional<Later> later_;
};

struct TrainerContext {
  const StageTrainerConfig& cfg;
  const TrainOptions& opt;
  bool is_root, is_leaf;
  StageExecutor& executor;
  Optimizer& optimizer;
  MetricsLog& metrics;
  const RunPlan& plan;  // negotiated before the first step (trainer/RunPlan.h)
  StepTimes& times;
  TrainerObserver& observer;
  const TensorPlacement& placement;  // where the stage trains (trainer/Device.h)
  // Parameters other stages hold copies of (trainer/SharedParameters.h); set by StageTrainer.
  SharedParameters* shared = nullptr;
};

// ClusterSync::beforeBackward (when there is a ClusterSync): before micro-batch backwards; `last`
// for the step's last one. Not timed (it only arms what the backward triggers).
void syncBeforeBackward(TrainerContext& ctx, int64_t sync_step, bool last);
// ClusterSync::beforeOptimizerStep (when there is a ClusterSync), timed into sync_s.
void syncBeforeOptimizerStep(TrainerContext& ctx, int64_t sync_step);
// The optimizer step with learning rate `lr` (timed into compute_s), then
// ClusterSync::afterOptimizerStep (timed into sync_s). `new_version`: weight stashing is on, the
// forwards in flight keep the weights they used (StageExecutor::newVersion).
void optimizerStep(TrainerContext& ctx, double lr, int64_t sync_step, bool new_version);

}  // namespace cairn
