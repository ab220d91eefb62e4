#include "trainer/StageLink.h"

#include "core/Error.h"
#include "trainer/Int8Boundary.h"
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

torch::ScalarType wireFloat(WireCodec wire) {
  switch (wire) {
    case WireCodec::kBf16:
      return torch::kBFloat16;
    case WireCodec::kFp16:
      return torch::kHalf;
    case WireCodec::kInt8:
      return torch::kChar;
    case WireCodec::kFp32:
      break;
  }
  return torch::kFloat;
}

std::optional<torch::Tensor> wireForm(torch::ScalarType wire_float, PacketKind kind,
                                      const std::string& name, const torch::Tensor& t) {
  if (wire_float == torch::kFloat || !wireCompresses(kind, name, t)) return std::nullopt;
  // The wire form leaves autograd's graph alone: what is sent is a detached copy either way.
  if (wire_float != torch::kChar) return t.detach().to(wire_float);
  if (!int8Carries(t.dim())) return std::nullopt;
  return encodeInt8Boundary(t.detach());
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
