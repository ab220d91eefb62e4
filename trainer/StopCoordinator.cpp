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
  asked_here_ = true;
  if (stop_at_ < 0) kind_ = combined(kind_, cfg_.stop_hands_over ? kHandOver : kStop);
  if (cfg_.stop_hands_over)
    CAIRN_INFO("stop requested: the cluster finishes the current step and writes a checkpoint; this "
               "node leaves and the others wait for its replacement");
  else
    CAIRN_INFO("stop requested: the cluster finishes the current step, writes a checkpoint and ",
               "stops");
  return true;
}

int64_t StopCoordinator::readKind(const torch::Tensor& t, const std::string& what) {
  const bool scalar = t.numel() == 1 && t.scalar_type() == torch::kLong;
  const int64_t value = scalar ? t.item<int64_t>() : -1;
  if (value != kStop && value != kHandOver)
    CAIRN_THROW(BadInput, what, " must be one int64, 1 (stop) or 2 (hand-over); got ",
                scalar ? std::to_string(value)
                       : std::string("a ") + c10::toString(t.scalar_type()) + " tensor of " +
                             std::to_string(t.numel()) + " elements");
  return value;
}

void StopCoordinator::decide(int64_t steps_done) {
  if (is_root_ && stop_flag_ && stop_at_ < 0) {
    stop_at_ = steps_done;
    if (kind_ == kHandOver)
      CAIRN_INFO("the cluster stops after step ", steps_done, " so that a node can hand its stage "
                 "over; the others wait for its replacement");
  }
}

void StopCoordinator::attachStopAt(StagePacket& activation) const {
  if (stop_at_ < 0) return;
  activation.tensors.emplace_back(kStopAtTensor, torch::tensor(stop_at_, torch::kLong));
  activation.tensors.emplace_back(kStopKindTensor, torch::tensor(kind_, torch::kLong));
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
  // A peer that sends no kind asks for the whole-cluster stop (docs/PROTOCOL.md).
  const std::string where = "activation from upstream for step " + std::to_string(in.step) + ": " +
                            kStopKindTensor;
  const int64_t kind = in.has(kStopKindTensor) ? readKind(in.tensor(kStopKindTensor), where) : kStop;
  if (stop_at_ >= 0 && kind != kind_)
    CAIRN_THROW(BadInput, where, " changed from the announced ", kind_, " to ", kind);
  stop_at_ = clamped;
  kind_ = kind;
}

void StopCoordinator::attachStop(StagePacket& gradient) const {
  if (stop_flag_)
    gradient.tensors.emplace_back(kStopTensor, torch::tensor(kind_ == kNone ? kStop : kind_, torch::kLong));
}

void StopCoordinator::readStop(const StagePacket& gradient) {
  if (!gradient.has(kStopTensor)) return;
  const int64_t kind = readKind(gradient.tensor(kStopTensor), "gradient from downstream for step " +
                                                                  std::to_string(gradient.step) +
                                                                  ": " + kStopTensor);
  stop_flag_ = true;
  if (stop_at_ < 0) kind_ = combined(kind_, kind);
}

}  // namespace cairn
