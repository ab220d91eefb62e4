#include "node/collectives/ReduceMath.h"

namespace cairn {

const char* toString(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAverage:
      return "average";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

const char* toString(ChunkCodec codec) {
  switch (codec) {
    case ChunkCodec::kFp32:
      return "fp32";
    case ChunkCodec::kBf16:
      return "bf16";
    case ChunkCodec::kInt8:
      return "int8";
  }
  return "?";
}

bool isReducedPrecision(torch::ScalarType t) {
  return t == torch::kFloat16 || t == torch::kBFloat16;
}

torch::ScalarType accumulationType(torch::ScalarType t) {
  return isReducedPrecision(t) ? torch::kFloat32 : t;
}

// acc ← acc ∘ in, elementwise, in place (acc and in have the same dtype and size).
void reduceInto(torch::Tensor& acc, const torch::Tensor& in, ReduceOp op) {
  const bool is_bool = acc.scalar_type() == torch::kBool;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      if (is_bool)
        torch::logical_or_out(acc, acc, in);
      else
        acc.add_(in);
      return;
    case ReduceOp::kMax:
      if (is_bool)
        torch::logical_or_out(acc, acc, in);
      else
        torch::maximum_out(acc, acc, in);
      return;
    case ReduceOp::kMin:
      if (is_bool)
        torch::logical_and_out(acc, acc, in);
      else
        torch::minimum_out(acc, acc, in);
      return;
  }
}

}  // namespace cairn
