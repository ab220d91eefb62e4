// Profiler: runs a model atom by atom (an atom is the range of units between two consecutive valid
// cuts) on an example input and measures, per atom, parameter/buffer bytes, the bytes its autograd
// graph keeps for backward, the bytes of its outgoing boundary and its forward+backward time
// (the fastest of the timed runs after warm-up). It also records the dtype and shape of every value that
// crosses a cut, for node.json. Each atom runs as its own stage module (StageBuilder), in train
// mode, so profiling also exercises the cutting. Single-threaded; uses a MemoryMeter.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/script.h>

#include "clusterize/ModelGraph.h"
#include "core/NodeData.h"

namespace cairn::clusterize {

struct AtomProfile {
  int begin_unit = 0;
  int end_unit = 0;
  std::vector<std::string> parameters;  // dotted names
  std::vector<std::string> buffers;
  int64_t parameter_bytes = 0;
  int64_t trainable_bytes = 0;  // parameters with requires_grad (get gradients and optimizer state)
  int64_t buffer_bytes = 0;
  int64_t output_bytes = 0;  // the boundary after this atom
  int64_t saved_bytes = 0;   // kept alive by its autograd graph until backward (inputs included)
  double seconds = 0;        // forward + backward, fastest timed run
  // Whether `seconds` includes the gradients of the atom's inputs: as a provider runs it, false
  // for atom 0 (the Root's data needs none), true for every other atom.
  bool inputs_need_grad = true;
};

struct ProfileOptions {
  int warmup_runs = 3;  // untimed runs first (TorchScript's profiling executor optimizes late)
  // The fastest of these is kept: other work on the machine only ever adds time (measured on a
  // busy 2-core machine: conv1 forward median 23.9 ms, fastest 0.65 ms over 30 runs), so the
  // minimum is the stable estimate of what the atom costs, and plans do not follow the noise.
  int timed_runs = 5;
};

struct ModelProfile {
  std::vector<int> cuts;                // unit index of each atom cut: 0, ..., numUnits()
  std::vector<AtomProfile> atoms;       // atoms.size() == cuts.size() - 1
  std::vector<int64_t> boundary_bytes;  // bytes crossing each atom cut (cut 0: the inputs)
  // dtype/shape of every value seen at a cut; tuples (a model output) expand to their elements.
  std::map<const torch::jit::Value*, std::vector<BoundaryValue>> values;

  // The values crossing unit cut `cut` of `graph`, described for node.json.
  std::vector<BoundaryValue> describeCut(const ModelGraph& graph, int cut) const;
};

ModelProfile profileModel(const ModelGraph& graph, const std::vector<c10::IValue>& inputs,
                          const ProfileOptions& options = {});

// Bytes of a value as it travels: tensors numel * element size; scalars 8; int lists 8 per element.
int64_t transferBytes(const c10::IValue& value);
// "float32", "int64", ... (core knownDtypeNames); BadInput for dtypes the wire cannot carry.
std::string dtypeName(c10::ScalarType type);
c10::ScalarType parseDtype(const std::string& name);  // BadInput naming the choices

}  // namespace cairn::clusterize
