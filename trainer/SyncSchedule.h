// SyncSchedule: the order in which one stage runs the micro-batches of one optimizer step under the
// `sync` schedule, as a small state machine: next() names the action to run now, complete() is
// the event that it finished. node/ (or a test's in-memory pipeline) turns actions into work and
// traffic:
//   kForward(k)         receive activation k from upstream (not Root), run forward, send downstream
//                       (not Leaf; the Leaf computes the loss instead)
//   kBackward(k)        receive the gradient of micro-batch k from downstream (not Leaf; the Leaf
//                       starts from its loss), run backward, send the input gradient upstream
//   kReduceGradNorm     (clipping only) add the squared gradient norms of all stages: partial sums
//                       travel Leaf -> Root, the total travels back Root -> Leaf
//   kOptimizerStep      every node steps after its last backward of the step (gradients of all
//                       micro-batches accumulated), then zeroes its gradients
// Orders: 1F1B runs (stages - 1 - stage) warm-up forwards, then alternates one forward and one
// backward, then drains the backwards; it keeps at most `stages` micro-batches in flight per node.
// GPipe runs every forward, then every backward. Both are deadlock-free with buffered sends.
// Thread-safety: one thread.
#pragma once

#include <string>
#include <vector>

#include "trainer/TrainOptions.h"

namespace cairn {

struct ScheduleAction {
  enum class Kind { kForward, kBackward, kReduceGradNorm, kOptimizerStep, kStepDone };
  Kind kind = Kind::kStepDone;
  int microbatch = -1;  // for kForward / kBackward
  bool operator==(const ScheduleAction& o) const {
    return kind == o.kind && microbatch == o.microbatch;
  }
};
std::string toString(const ScheduleAction& action);

class SyncSchedule {
 public:
  SyncSchedule(int stage, int num_stages, int microbatches, PipelineOrder order, bool reduce_norm);
  // Starts an optimizer step (the previous one must be done).
  void begin();
  // The action to run now; kStepDone when the step is over.
  ScheduleAction next() const;
  // The event: `action` (which must be next()) finished.
  void complete(const ScheduleAction& action);
  bool done() const { return position_ >= actions_.size(); }
  // The whole step's actions, in order (for tests and docs).
  const std::vector<ScheduleAction>& actions() const { return actions_; }

 private:
  std::vector<ScheduleAction> actions_;
  size_t position_ = 0;
};

}  // namespace cairn
