// StageBuilder: turns a contiguous range of units of a ModelGraph into a standalone TorchScript
// module that holds only the parameters, buffers and attributes that range uses, under their
// original dotted names ("features.0.weight"), with a forward(incoming boundary...) that returns
// the outgoing boundary (one value as itself, several as a tuple in boundary order).
//
// Child modules used whole are deep copies (same TorchScript class, so their methods are shared);
// modules the stage needs only part of ("blocks" when it holds blocks.0 and blocks.1) become new
// classes holding just those parts. Tensors are copied (no autograd history) and keep the original
// requires_grad; tensors tied inside the stage stay tied. The ModelGraph must outlive the builder.
// Not thread-safe.
#pragma once

#include <string>
#include <vector>

#include <torch/script.h>

#include "clusterize/ModelGraph.h"

namespace cairn::clusterize {

struct StageModule {
  torch::jit::Module module;
  int begin = 0;  // first unit
  int end = 0;    // one past the last unit
  std::vector<torch::jit::Value*> inputs;   // ModelGraph values taken, in argument order
  std::vector<torch::jit::Value*> outputs;  // ModelGraph values returned, in order
};

class StageBuilder {
 public:
  explicit StageBuilder(const ModelGraph& graph) : graph_(graph) {}

  // Units [begin, end); both must be valid cuts. `tag` makes class names readable ("Stage3").
  StageModule build(int begin, int end, const std::string& tag) const;

 private:
  const ModelGraph& graph_;
};

}  // namespace cairn::clusterize
