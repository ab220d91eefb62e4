// ReduceMath: the element-wise reductions of the collectives, per dtype (docs/COLLECTIVES.md
// "Semantics per dtype"): the reduction operators, the dtype partial reductions travel and
// accumulate in (float32 for float16/bfloat16), and acc ← acc ∘ in.
//
// Ownership: none (functions of the caller's tensors). Thread-safety: pure functions, callable
// from any thread.
#pragma once

#include <torch/script.h>

namespace cairn {

enum class ReduceOp {
  kSum,      // bool: logical or; integers: exact, wrapping like torch on overflow
  kAverage,  // sum / group size; floating dtypes only (BadInput otherwise)
  kMax,      // bool: logical or
  kMin,      // bool: logical and
};
const char* toString(ReduceOp op);

// How the chunks of a float32 sum/average allReduce travel (training_definition.wire.sync;
// docs/COLLECTIVES.md "Compressed chunks"): kFp32 exactly as always; kBf16 2 bytes per value
// (round to nearest even); kInt8 1 byte per value plus one fp32 scale per kInt8Block values of a
// chunk (core/WireCompression.h encodeInt8Blocks). Accumulation stays float32.
enum class ChunkCodec { kFp32, kBf16, kInt8 };
constexpr int64_t kInt8Block = 256;
const char* toString(ChunkCodec codec);

// float16 and bfloat16: reduced in float32 and rounded once at the end.
bool isReducedPrecision(torch::ScalarType t);
// The dtype partial reductions travel and accumulate in.
torch::ScalarType accumulationType(torch::ScalarType t);
// acc ← acc ∘ in, elementwise, in place (acc and in have the same dtype and size).
void reduceInto(torch::Tensor& acc, const torch::Tensor& in, ReduceOp op);

}  // namespace cairn
