#include "trainer/SyncSchedule.h"

#include <algorithm>

#include "core/Error.h"

namespace cairn {

std::string toString(const ScheduleAction& a) {
  switch (a.kind) {
    case ScheduleAction::Kind::kForward:
      return "F" + std::to_string(a.microbatch);
    case ScheduleAction::Kind::kBackward:
      return "B" + std::to_string(a.microbatch);
    case ScheduleAction::Kind::kReduceGradNorm:
      return "N";
    case ScheduleAction::Kind::kOptimizerStep:
      return "S";
    case ScheduleAction::Kind::kStepDone:
      return "done";
  }
  return "?";
}

SyncSchedule::SyncSchedule(int stage, int num_stages, int microbatches, PipelineOrder order,
                           bool reduce_norm) {
  CAIRN_ENFORCE(num_stages >= 1 && stage >= 0 && stage < num_stages && microbatches >= 1);
  using K = ScheduleAction::Kind;
  auto F = [](int k) { return ScheduleAction{K::kForward, k}; };
  auto B = [](int k) { return ScheduleAction{K::kBackward, k}; };
  if (order == PipelineOrder::kGPipe) {
    for (int k = 0; k < microbatches; ++k) actions_.push_back(F(k));
    for (int k = 0; k < microbatches; ++k) actions_.push_back(B(k));
  } else {
    const int warmup = std::min(num_stages - 1 - stage, microbatches);
    int forwarded = 0, backwarded = 0;
    for (; forwarded < warmup; ++forwarded) actions_.push_back(F(forwarded));
    while (forwarded < microbatches) {
      actions_.push_back(F(forwarded++));
      actions_.push_back(B(backwarded++));
    }
    while (backwarded < microbatches) actions_.push_back(B(backwarded++));
  }
  if (reduce_norm) actions_.push_back({K::kReduceGradNorm, -1});
  actions_.push_back({K::kOptimizerStep, -1});
  position_ = actions_.size();
}

void SyncSchedule::begin() {
  CAIRN_ENFORCE(done(), "a step began before the previous one finished");
  position_ = 0;
}

ScheduleAction SyncSchedule::next() const {
  if (done()) return {};
  return actions_[position_];
}

void SyncSchedule::complete(const ScheduleAction& action) {
  CAIRN_ENFORCE(!done() && actions_[position_] == action, "schedule expected ",
                done() ? std::string("nothing") : toString(actions_[position_]), " but ",
                toString(action), " completed");
  ++position_;
}

}  // namespace cairn
