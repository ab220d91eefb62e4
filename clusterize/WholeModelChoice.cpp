#include "clusterize/WholeModelChoice.h"

#include <algorithm>
#include <numeric>

#include "core/Error.h"

namespace cairn::clusterize {
namespace {

// The value under `key` when it is a string, else "".
std::string stringAt(const nlohmann::json& object, const char* key) {
  if (!object.is_object()) return "";
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

// Seconds the slowest placed node needs for one ring sync of its stage's state.
double syncSeconds(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                   const ClusterFormation& formation, const RunShape& shape) {
  const double clusters = static_cast<double>(formation.clusters.size());
  if (clusters < 2) return 0;
  const double ring = 2 * (clusters - 1) / clusters;
  double slowest = 0;
  for (const FormedCluster& cluster : formation.clusters)
    for (const StagePlacement& stage : cluster.partition.stages) {
      const PlannerNode& node = nodes[cluster.nodes[stage.node]];
      const double state = shape.sync == "gradients"
                               ? cost.trainableBytes(stage.begin_atom, stage.end_atom)
                               : cost.stateBytes(stage.begin_atom, stage.end_atom);
      double seconds = ring * state * shape.sync_bytes_factor / node.bandwidth_bytes_per_s;
      if (node.isGpu()) seconds += state / node.d2h_bytes_per_s + state / node.h2d_bytes_per_s;
      slowest = std::max(slowest, seconds);
    }
  return slowest;
}

// A formation of one whole-model cluster per node of `ids` (indices into nodes); no spare list.
ClusterFormation withWholeClusters(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                                   const std::vector<int>& ids) {
  ClusterFormation formation;
  for (int id : ids) {
    FormedCluster cluster;
    cluster.nodes = {id};
    cluster.partition = partitionCluster(cost, {nodes[id]});
    CAIRN_ENFORCE(cluster.partition.feasible, "a node that holds the model cannot take it");
    formation.clusters.push_back(std::move(cluster));
  }
  return formation;
}

// Nodes no cluster of `formation` uses, ascending, into its spare list.
void fillSpare(ClusterFormation& formation, size_t count) {
  std::vector<bool> used(count, false);
  for (const FormedCluster& cluster : formation.clusters)
    for (const StagePlacement& stage : cluster.partition.stages) used[cluster.nodes[stage.node]] = true;
  formation.spare.clear();
  for (size_t i = 0; i < count; ++i)
    if (!used[i]) formation.spare.push_back(static_cast<int>(i));
}

// `formation` plus clusters formed (ClusterFormer) from the nodes it leaves spare; nothing added
// when they cannot hold the model.
ClusterFormation withRestClustered(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                                   ClusterFormation formation, const ClusterFormerOptions& options) {
  const std::vector<int> rest = formation.spare;
  if (rest.empty()) return formation;
  std::vector<PlannerNode> rest_nodes;
  for (int id : rest) rest_nodes.push_back(nodes[id]);
  try {
    ClusterFormation more = formClusters(cost, rest_nodes, options);
    for (FormedCluster& cluster : more.clusters) {
      for (int& id : cluster.nodes) id = rest[id];
      formation.clusters.push_back(std::move(cluster));
    }
  } catch (const BadInput&) {
    return formation;  // the other nodes together cannot hold the model: they stay spare
  }
  fillSpare(formation, nodes.size());
  return formation;
}

}  // namespace

RunShape runShapeOf(const nlohmann::json& training, int microbatches) {
  RunShape shape;
  shape.microbatches = microbatches;
  std::string sync = stringAt(training, "sync");
  if (sync.empty() && training.is_object() && training.contains("sync"))
    sync = stringAt(training["sync"], "name");
  if (sync == "diloco" || sync == "gradients") shape.sync = sync;
  if (training.is_object() && training.contains("local_steps") &&
      training["local_steps"].is_number_integer() && training["local_steps"].get<int64_t>() >= 1)
    shape.local_steps =
        static_cast<int>(std::min<int64_t>(training["local_steps"].get<int64_t>(), 1 << 30));
  const std::string codec = training.is_object() && training.contains("wire")
                                ? stringAt(training["wire"], "sync")
                                : std::string();
  shape.sync_bytes_factor = codec == "bf16" ? 0.5 : codec == "int8" ? 0.25 : 1.0;
  return shape;
}

bool trainsInBf16(const nlohmann::json& training) {
  return stringAt(training, "precision") == "bf16";
}

double runStepSeconds(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                      const ClusterFormation& formation, const RunShape& shape) {
  double pipelines = 0;
  for (const FormedCluster& cluster : formation.clusters) {
    const double stages = static_cast<double>(cluster.partition.stages.size());
    pipelines = std::max(pipelines, (shape.microbatches + stages - 1) *
                                        cluster.partition.bottleneck_seconds);
  }
  const int every = shape.sync == "gradients" ? 1 : shape.local_steps;
  return pipelines + syncSeconds(cost, nodes, formation, shape) / every;
}

double runMicrobatchesPerSecond(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                                const ClusterFormation& formation, const RunShape& shape) {
  if (formation.clusters.empty()) return 0;
  const double step = runStepSeconds(cost, nodes, formation, shape);
  const double microbatches =
      static_cast<double>(formation.clusters.size()) * static_cast<double>(shape.microbatches);
  return step > 0 ? microbatches / step : 0;
}

ClusterFormation wholeModelPerGpu(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                                  const RunShape& shape, const ClusterFormerOptions& options) {
  const int atoms = cost.numAtoms();
  std::vector<int> gpus;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i)
    if (nodes[i].isGpu() && cost.memoryBytes(0, atoms) <= nodes[i].capacity_bytes) gpus.push_back(i);
  // Fastest first: a slow GPU in lock-step can only hold the others back.
  std::stable_sort(gpus.begin(), gpus.end(), [&](int a, int b) {
    return stageSeconds(cost, nodes[a], 0, atoms) < stageSeconds(cost, nodes[b], 0, atoms);
  });
  ClusterFormation best;
  double best_rate = 0;
  for (size_t k = 1; k <= gpus.size(); ++k) {
    ClusterFormation formation =
        withWholeClusters(cost, nodes, std::vector<int>(gpus.begin(), gpus.begin() + k));
    const double rate = runMicrobatchesPerSecond(cost, nodes, formation, shape);
    if (rate > best_rate) {
      best_rate = rate;
      best = std::move(formation);
    }
  }
  if (best.clusters.empty()) return best;
  fillSpare(best, nodes.size());
  ClusterFormerOptions rest = options;
  rest.clusters = 0;
  rest.max_atoms_per_stage = 0;
  ClusterFormation more = withRestClustered(cost, nodes, best, rest);
  if (runMicrobatchesPerSecond(cost, nodes, more, shape) > best_rate) return more;
  return best;
}

ClusterFormation chooseFormation(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                                 const ClusterFormerOptions& options, const RunShape& shape,
                                 const std::string& whole_not_considered, GpuPlanChoice* choice) {
  ClusterFormation cut = formClusters(cost, nodes, options);
  choice->chosen = "cut";
  choice->cut_microbatches_per_s = runMicrobatchesPerSecond(cost, nodes, cut, shape);
  choice->whole_microbatches_per_s = 0;
  if (!whole_not_considered.empty()) {
    choice->note = "whole model per GPU not considered: " + whole_not_considered;
    return cut;
  }
  ClusterFormation whole = wholeModelPerGpu(cost, nodes, shape, options);
  if (whole.clusters.empty()) {
    choice->note = "whole model per GPU not possible: no GPU's memory holds the whole model";
    return cut;
  }
  choice->whole_microbatches_per_s = runMicrobatchesPerSecond(cost, nodes, whole, shape);
  // Equal estimates (the cut plan put the model on one GPU too): the plan without cuts.
  if (choice->whole_microbatches_per_s >= choice->cut_microbatches_per_s) {
    choice->chosen = "whole_model_per_gpu";
    return whole;
  }
  return cut;
}

}  // namespace cairn::clusterize
