#include "trainer/StageLink.h"

#include "core/Error.h"
#include "trainer/ReservedTensors.h"

namespace cairn {

const char* toString(Neighbour n) { return n == Neighbour::kUpstream ? "upstream" : "downstream"; }

const char* toString(PacketKind k) {
  switch (k) {
    case PacketKind::kActivation:
      return "activation";
    case PacketKind::kGradient:
      return "gradient";
    case PacketKind::kEvaluation:
      return "evaluation";
    case PacketKind::kControl:
      return "control";
  }
  return "?";
}

bool wireCompresses(PacketKind kind, const std::string& name, const torch::Tensor& t) {
  return kind != PacketKind::kControl && !isReservedTensorName(name) && t.defined() &&
         t.scalar_type() == torch::kFloat;
}

bool StagePacket::has(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return true;
  return false;
}

const torch::Tensor& StagePacket::tensor(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  CAIRN_THROW(BadInput, toString(kind), " packet for step ", step, " micro-batch ", microbatch,
              " lacks tensor ", name);
}

}  // namespace cairn
