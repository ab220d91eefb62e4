// CostModel: per-micro-batch time and memory of a stage that holds a contiguous range of atoms.
// Pure arithmetic over prefix sums (O(1) per query); no torch. Thread-safe for reading.
//
// Memory of a stage holding atoms [b, e):
//   parameters + buffers + trainable parameters * (1 gradient + optimizer copies), a parameter
//   several of its atoms use (SharedCost) counted once
//   + microbatches * (bytes saved for backward + incoming boundary kept as autograd leaf)
//   + incoming boundary + outgoing boundary (one receive/send buffer each)
// optimizer copies: 0 SGD, 1 momentum, 2 Adam/AdamW. All micro-batches of a step are assumed in
// flight (GPipe); 1F1B keeps fewer, so the estimate is an upper bound there.
// Time of a stage on a node = compute seconds / speed + transfer bytes / bandwidth, where transfer
// counts the boundary activations it sends downstream and the gradients it sends upstream, in the
// form they travel (wire_bytes: training_definition.wire.activations compresses float32 values).
// A stage on a GPU node also copies what it receives host→device and what it sends device→host
// (deviceInBytes / deviceOutBytes, counted as held in memory: float32 after decoding).
#pragma once

#include <string>
#include <vector>

namespace cairn::clusterize {

enum class OptimizerKind { kSgd, kMomentum, kAdam, kAdamW };
OptimizerKind parseOptimizer(const std::string& name);  // sgd | momentum | adam | adamw
std::string toString(OptimizerKind kind);
int optimizerStateCopies(OptimizerKind kind);

struct CostOptions {
  OptimizerKind optimizer = OptimizerKind::kAdam;
  int microbatches = 4;  // micro-batches in flight per step
};

struct AtomCost {
  double parameter_bytes = 0;
  double trainable_bytes = 0;
  double buffer_bytes = 0;
  double saved_bytes = 0;
  double seconds = 0;  // forward + backward at the profiling host's speed
};

// A parameter several atoms use (ModelGraph.h SharedParameter): each atom's profile counts it, a
// stage holds it once (its copy) however many of its atoms use it.
struct SharedCost {
  std::vector<int> atoms;  // the atom of each profiled use, ascending (repeats allowed)
  double parameter_bytes = 0;
  double trainable_bytes = 0;  // 0 for a parameter that does not require a gradient
};

class CostModel {
 public:
  // boundary_bytes has atoms.size() + 1 entries (entry 0: the model inputs): what each cut holds
  // in memory. wire_bytes (same length, or empty: equal to boundary_bytes) is what each cut sends.
  CostModel(std::vector<AtomCost> atoms, std::vector<double> boundary_bytes, CostOptions options,
            std::vector<double> wire_bytes = {}, std::vector<SharedCost> shared = {});

  int numAtoms() const { return static_cast<int>(atoms_.size()); }
  const AtomCost& atom(int index) const { return atoms_.at(index); }
  const CostOptions& options() const { return options_; }
  double boundaryBytes(int cut) const { return boundary_[cut]; }

  double memoryBytes(int begin, int end) const;
  // memoryBytes without the boundary terms: grows as the range grows (used to stop searches).
  double memoryLowerBound(int begin, int end) const;
  double computeSeconds(int begin, int end) const;
  // Bytes this stage sends per micro-batch: activations downstream + gradients upstream.
  double transferBytes(int begin, int end) const;
  // Per micro-batch on a GPU node: host→device = the incoming boundary (the data batch for the
  // first stage) + the gradients of the outgoing boundary (unless last); device→host = the
  // outgoing boundary (unless last) + the gradients of the incoming boundary (unless first).
  double deviceInBytes(int begin, int end) const;
  double deviceOutBytes(int begin, int end) const;
  // Parameter + buffer bytes of the range (what average/diloco rings reduce), and the trainable
  // bytes alone (what a gradients ring reduces).
  double stateBytes(int begin, int end) const;
  double trainableBytes(int begin, int end) const;

 private:
  // What the atoms of [begin, end) count more than once of the shared parameters, weighted.
  double sharedExcess(int begin, int end, double per_parameter, double per_trainable) const;

  std::vector<AtomCost> atoms_;
  std::vector<SharedCost> shared_;
  std::vector<double> boundary_;
  std::vector<double> wire_;
  CostOptions options_;
  std::vector<double> static_prefix_;  // parameters, buffers, gradients, optimizer state
  std::vector<double> saved_prefix_;
  std::vector<double> seconds_prefix_;
  std::vector<double> state_prefix_;      // parameters + buffers
  std::vector<double> trainable_prefix_;
};

}  // namespace cairn::clusterize
