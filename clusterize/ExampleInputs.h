// Example inputs for profiling: from shapes and dtypes on the command line, or from a file written
// by torch.save (one tensor, or a tuple/list of them for a model with several inputs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/script.h>

namespace cairn::clusterize {

// "64,1,28,28" → {64, 1, 28, 28}; BadInput naming `flag` on anything else.
std::vector<int64_t> parseShape(const std::string& text, const std::string& flag);
// One input per shape: floating dtypes are standard normal, integer dtypes are zeros (valid token
// ids for any embedding), bool is false. `dtypes` has one entry per shape, or one for all.
std::vector<c10::IValue> makeExampleInputs(const std::vector<std::vector<int64_t>>& shapes,
                                           const std::vector<std::string>& dtypes, uint64_t seed);
std::vector<c10::IValue> loadExampleInputs(const std::string& path);

}  // namespace cairn::clusterize
