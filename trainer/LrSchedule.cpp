#include "trainer/LrSchedule.h"

#include <algorithm>
#include <cmath>

namespace cairn {

LrSchedule::LrSchedule(double base_lr, const LrScheduleOptions& options, int64_t run_total_steps)
    : base_lr_(base_lr),
      options_(options),
      total_(options.total_steps > 0 ? options.total_steps
                                     : std::max<int64_t>(run_total_steps, 1)) {}

double LrSchedule::at(int64_t step) const {
  const double pi = std::acos(-1.0);
  auto cosine = [&](int64_t t, int64_t horizon) {
    if (horizon <= 0) return base_lr_;
    const double progress = std::min(1.0, double(t) / double(horizon));
    return options_.min_lr + (base_lr_ - options_.min_lr) * 0.5 * (1.0 + std::cos(pi * progress));
  };
  switch (options_.kind) {
    case LrScheduleKind::kConstant:
      return base_lr_;
    case LrScheduleKind::kStep:
      return base_lr_ * std::pow(options_.gamma, double(step / options_.step_size));
    case LrScheduleKind::kCosine:
      // PyTorch's CosineAnnealingLR with T_max = total: lr reaches min_lr at step `total`.
      return cosine(step, total_);
    case LrScheduleKind::kWarmupCosine: {
      const int64_t warmup = options_.warmup_steps;
      if (step < warmup) return base_lr_ * double(step + 1) / double(warmup);
      return cosine(step - warmup, total_ - warmup);
    }
  }
  return base_lr_;
}

}  // namespace cairn
