// LrSchedule: the learning rate for each optimizer step, a pure function of the step index, so
// every node of a cluster (and a restarted node) agrees on it without talking.
// Thread-safety: immutable after construction.
#pragma once

#include <cstdint>

#include "trainer/TrainOptions.h"

namespace cairn {

class LrSchedule {
 public:
  // `run_total_steps` is the run's number of optimizer steps (the cosine horizon unless
  // options.total_steps overrides it).
  LrSchedule(double base_lr, const LrScheduleOptions& options, int64_t run_total_steps);
  // Learning rate used by optimizer step `step` (0-based).
  double at(int64_t step) const;

 private:
  double base_lr_;
  LrScheduleOptions options_;
  int64_t total_;
};

}  // namespace cairn
