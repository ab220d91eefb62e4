// AsyncLoop: the run under schedule "async" (docs/TRAINING.md "Async schedule"). Micro-batch g
// (0 <= g < total_steps * microbatches) belongs to step g / M as micro-batch g % M; packets keep
// the sync addressing (step, micro-batch). Each node runs the fixed order F^W (B F)* B^W with
// W = max(1, K - stage) forwards ahead (the Leaf: 1): deadlock-free because W never grows
// downstream. The optimizer steps after every `update_frequency` backwards (and after the last
// one); every forward and its backward use the same weights (StageExecutor weight stashing).
// Before the first forward of a checkpointed step the pipeline drains. A step is recorded (the
// shared StepRecorder) once its last micro-batch has done its backward on this node.
// Ownership: borrows every unit it drives. Thread-safety: one thread (the node's trainer thread).
#pragma once

#include <cstdint>
#include <map>

#include "trainer/BatchFeeder.h"
#include "trainer/MicrobatchPasses.h"
#include "trainer/StepRecorder.h"
#include "trainer/StopCoordinator.h"
#include "trainer/TrainerCheckpoints.h"
#include "trainer/TrainerContext.h"

namespace cairn {

class AsyncLoop {
 public:
  AsyncLoop(TrainerContext& ctx, BatchFeeder& feeder, MicrobatchPasses& passes,
            StopCoordinator& stop, TrainerCheckpoints& checkpoints, StepRecorder& recorder)
      : ctx_(ctx),
        feeder_(feeder),
        passes_(passes),
        stop_(stop),
        checkpoints_(checkpoints),
        recorder_(recorder) {}
  // From the resume point (or the start) to the end, or until a clean stop. Weight stashing must
  // be on (StageExecutor::enableWeightStashing).
  TrainerResult run(const ResumePoint& resume, TrainerClock::time_point run_start);

 private:
  struct StepTally {
    double loss = 0;
    uint64_t checksum = 0;
  };
  void forward(int64_t g);
  void backward(int64_t g);
  // Step `s` is complete on this node: its metrics line, with the async counters (`updates`
  // optimizer steps so far, `in_flight` micro-batches) and the weight stash's figures.
  void recordStep(int64_t s, double lr, int64_t updates, int64_t in_flight, TrainerResult* result);

  TrainerContext& ctx_;
  BatchFeeder& feeder_;
  MicrobatchPasses& passes_;
  StopCoordinator& stop_;
  TrainerCheckpoints& checkpoints_;
  StepRecorder& recorder_;
  std::map<int64_t, Microbatch> micro_;  // by global micro-batch index g
  std::map<int64_t, StepTally> steps_;   // steps with micro-batches in flight
};

}  // namespace cairn
