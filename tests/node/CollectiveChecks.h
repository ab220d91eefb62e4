// Shared by the threaded collectives tests and the collectives_rank helper process: deterministic
// per-rank inputs, and a run of every collective whose results are compared with a direct
// computation from all ranks' inputs (stack + sum/amax/amin in float64 or int64), never with
// another collective.
#pragma once

#include <string>
#include <vector>

#include "node/collectives/ProcessGroup.h"

namespace cairn::testing {

// The shape used for `numel` elements: 2-d for 1000 (to exercise shapes), 1-d otherwise.
std::vector<int64_t> shapeFor(int64_t numel);

// Rank `rank`'s input for the collective numbered `salt`: small integers (exact sums in every
// dtype) for integer, bool and 16-bit float dtypes, uniform values in [-4, 4) for float32/float64.
torch::Tensor rankInput(int rank, int64_t numel, torch::ScalarType dtype, int salt);

// Inputs and references are cached across calls (and threads); a test drops them at its end.
void clearCaches();

// The all-reduce of every rank's rankInput(·, numel, dtype, salt), computed directly.
torch::Tensor directReduction(int world_size, int64_t numel, torch::ScalarType dtype, int salt,
                              ReduceOp op);

// "" when `actual` matches `expected` (exactly for integers and bool; within a dtype-dependent
// tolerance for floating dtypes), else what differs.
std::string compare(const torch::Tensor& actual, const torch::Tensor& expected);

struct CheckResult {
  std::vector<std::string> failures;  // "allReduce sum: …"
  torch::Tensor all_reduce_sum;       // this rank's result, to compare bit for bit across ranks
};

// Runs allReduce (sum, max, min, average where floating, and a non-contiguous sum), broadcast,
// reduce, allGather, gather, scatter and barrier on `group`, checking each result.
CheckResult checkAllCollectives(ProcessGroup& group, torch::ScalarType dtype, int64_t numel);

}  // namespace cairn::testing
