// SharedParameters: a parameter that several stages of this node's cluster hold (node.json
// "shared_parameters": a tied embedding and head cut apart, docs/CLUSTERIZE.md "Shared
// parameters"). Each holder trains a copy; the copies stay equal, as one tensor would train:
//   gradients  before the stage's last backward of a step, the partial sums of the holders below
//              it (from downstream, "shared_partial") are added into its copy's .grad, so after
//              that backward its .grad is its own part plus theirs; it sends that upstream. The
//              first holder's .grad is then the whole cluster's gradient. After the cross-cluster
//              gradient sync (gradients mode) the first holder sends its .grad down
//              ("shared_total") and every other holder's .grad becomes it, bit for bit.
//   clipping   only the first holder's copy counts in the global norm (excludedFromNorm).
//   optimizer  every copy steps with the same gradient from the same state: equal weights.
//   rings      only the first holder's copy joins the cross-cluster rings (clusterize lists it
//              there alone); after every optimizer step the first holder sends its weights down
//              when a sync changed them (ClusterSync::weightsVersion), else an empty packet
//              ("shared_weights"), and once after ClusterSync::start and finish.
// Nodes between two holders relay both ways. Every packet is a control packet between pipeline
// neighbours (the link the plan lists, with its security and re-pointing), sent uncompressed;
// its tensors are named "__shared:" + the parameter's first name and checked against the copy
// (shape and dtype) before use: a wrong packet is a BadInput naming the neighbour and the tensor.
// Ownership: borrows the context and the link. Thread-safety: the trainer thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/NodeData.h"
#include "trainer/TrainOptions.h"
#include "trainer/TrainerContext.h"

namespace cairn {

// BadInput naming `job_path` when `node` shares parameters with other stages and `options` asks
// for the async schedule, which cannot keep copies equal (each stage steps on its own).
void checkSharedParameters(const NodeSpec& node, const TrainOptions& options,
                           const std::string& job_path);

class SharedParameters {
 public:
  // Resolves each local copy in the stage module (BadInput when node.json names a missing one).
  SharedParameters(TrainerContext& ctx, TimedLink& link);
  bool empty() const { return groups_.empty(); }

  // Before the step's last backward: the partial sums from downstream.
  void receivePartials(int64_t step);
  // After the last backward, before the cross-cluster gradient sync: this node's partials upstream.
  void sendPartials(int64_t step);
  // After the cross-cluster gradient sync: every copy's gradient becomes the first holder's.
  void shareTotals(int64_t step);
  // The copies that must not count in the global gradient norm (held here, not first).
  std::vector<torch::Tensor> withoutCopies(const std::vector<torch::Tensor>& parameters) const;

  // After ClusterSync::start (`always`), after every optimizer step (when a sync changed the
  // first holder's weights) and after ClusterSync::finish: the first holder's weights down.
  // `tag` tells the three apart; `step` is the number of steps done.
  void shareWeights(int64_t step, const char* tag, bool always);

 private:
  struct Group {
    std::string name;         // the parameter's first name (the key on the wire)
    int first = 0, last = 0;  // first and last holding stage
    torch::Tensor copy;       // this node's copy (undefined: a relay)
    bool first_holder = false;
    torch::Tensor kept;       // what a relay passes on
  };
  // Groups crossing the edge between stage `upper` and upper + 1.
  std::vector<Group*> across(int upper);
  void send(Neighbour to, int upper, int64_t step, const char* tag,
            const std::function<torch::Tensor(Group&)>& value);
  // The packet from `from` over edge `upper`; `take` gets each group and its checked tensor.
  void receive(Neighbour from, int upper, int64_t step, const char* tag, bool all_required,
               const std::function<void(Group&, const torch::Tensor&)>& take);

  TrainerContext& ctx_;
  TimedLink& link_;
  int stage_ = 0;
  std::vector<Group> groups_;
  uint64_t weights_sent_version_ = 0;
};

}  // namespace cairn
