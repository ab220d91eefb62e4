// SyncLoop: the run under schedule "sync" (docs/TRAINING.md "Schedules"): every optimizer step
// walks the SyncSchedule (1F1B or GPipe) over the step's micro-batches — forwards, backwards, the
// global gradient norm when clipping, the optimizer step with the ClusterSync hooks — and every
// node of the cluster steps together. Between steps: the clean-stop decision, then the shared
// StepRecorder (metrics, checkpoints, stop, evaluation).
// Ownership: borrows every unit it drives. Thread-safety: one thread (the node's trainer thread).
#pragma once

#include <cstdint>
#include <map>

#include "trainer/BatchFeeder.h"
#include "trainer/DealChange.h"
#include "trainer/GradNormReducer.h"
#include "trainer/MicrobatchPasses.h"
#include "trainer/StepRecorder.h"
#include "trainer/StopCoordinator.h"
#include "trainer/SyncSchedule.h"
#include "trainer/TrainerContext.h"

namespace cairn {

class SyncLoop {
 public:
  SyncLoop(TrainerContext& ctx, SyncSchedule& schedule, BatchFeeder& feeder,
           MicrobatchPasses& passes, GradNormReducer& norm, StopCoordinator& stop,
           StepRecorder& recorder, DealChange* deal = nullptr)
      : ctx_(ctx),
        schedule_(schedule),
        feeder_(feeder),
        passes_(passes),
        norm_(norm),
        stop_(stop),
        recorder_(recorder),
        deal_(deal) {}
  // Steps [start_step, total_steps), or until a clean stop.
  TrainerResult run(int64_t start_step, TrainerClock::time_point run_start);

 private:
  void forward(int k);
  void backward(int k);
  // One step's schedule: forwards, backwards, the gradient norm, the optimizer step at `lr`.
  // Returns the global gradient norm (-1: not clipping).
  double walkSchedule(double lr);

  TrainerContext& ctx_;
  SyncSchedule& schedule_;
  BatchFeeder& feeder_;
  MicrobatchPasses& passes_;
  GradNormReducer& norm_;
  StopCoordinator& stop_;
  StepRecorder& recorder_;
  DealChange* deal_;  // the Root takes a new deal between steps (may be null)
  // The current step.
  int64_t step_ = 0;
  int last_backward_ = -1;  // micro-batch of the step's last backward (ClusterSync::beforeBackward)
  std::map<int, Microbatch> micro_;
  double step_loss_ = 0;
  uint64_t checksum_ = 0;
};

}  // namespace cairn
