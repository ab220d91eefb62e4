#include "trainer/StopCoordinator.h"

#include <algorithm>
#include <string>

#include "core/Error.h"
#include "core/Log.h"
#include "trainer/ReservedTensors.h"

namespace cairn {

bool StopCoordinator::poll() {
  if (stop_flag_ || !cfg_.stop_requested || !cfg_.stop_requested()) return false;
  stop_flag_ = true;
  CAIRN_INFO("stop requested: the cluster finishes the current step, writes a checkpoint and ",
             "stops");
  return true;
}

void StopCoordinator::decide(int64_t steps_done) {
  if (is_root_ && stop_flag_ && stop_at_ < 0) stop_at_ = steps_done;
}

void StopCoordinator::attachStopAt(StagePacket& activation) const {
  if (stop_at_ >= 0)
    activation.tensors.emplace_back(kStopAtTensor, torch::tensor(stop_at_, torch::kLong));
}

void StopCoordinator::readStopAt(const StagePacket& in, int64_t total_steps) {
  if (!in.has(kStopAtTensor)) return;
  const torch::Tensor& t = in.tensor(kStopAtTensor);
  // The stop step must lie after the packet's step and never change once announced.
  const int64_t value = t.numel() == 1 && t.scalar_type() == torch::kLong ? t.item<int64_t>() : -1;
  const int64_t clamped = std::min(value, total_steps);  // past the end: the normal end
  const std::string got = t.numel() == 1 && t.scalar_type() == torch::kLong
                              ? std::to_string(value)
                              : std::string("a ") + c10::toString(t.scalar_type()) + " tensor of " +
                                    std::to_string(t.numel()) + " elements";
  if (value <= int64_t(in.step) || (stop_at_ >= 0 && clamped != stop_at_))
    CAIRN_THROW(BadInput, "activation from upstream for step ", in.step, " micro-batch ",
                in.microbatch, ": ", kStopAtTensor, " must be one int64 greater than the step",
                stop_at_ >= 0 ? " and equal to the announced " + std::to_string(stop_at_) : "",
                " (got ", got, ")");
  stop_at_ = clamped;
}

void StopCoordinator::attachStop(StagePacket& gradient) const {
  if (stop_flag_)
    gradient.tensors.emplace_back(kStopTensor, torch::tensor(int64_t(1), torch::kLong));
}

void StopCoordinator::readStop(const StagePacket& gradient) {
  if (gradient.has(kStopTensor)) stop_flag_ = true;
}

}  // namespace cairn
