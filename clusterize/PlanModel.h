// PlanModel: the planning half of clusterize, for callers that already profiled (no model
// execution): the nodes formed into clusters (ClusterFormer), the model cut inside each, the rings
// of the state that several clusters hold, and node.json for every placed node. Messages about
// the nodes name PlanSettings::nodes_source. Single-threaded.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/script.h>

#include "clusterize/CostModel.h"
#include "clusterize/ModelGraph.h"
#include "clusterize/PartitionPlan.h"
#include "clusterize/Profiler.h"
#include "core/NodeConfigs.h"
#include "core/NodeData.h"

namespace cairn::clusterize {

struct ClusterizeResult {
  PartitionPlan plan;
  JobSpec job;
  std::vector<NodeSpec> nodes;                        // one per placed node
  std::map<std::string, torch::jit::Module> stages;   // node name → its stage module
};

struct PlanSettings {
  std::string model_path;
  Granularity granularity = Granularity::kTop;
  CostOptions cost;
  int clusters = 0;
  uint64_t seed = 0;
  std::vector<int> cuts;  // ClusterizeOptions::cuts
  double tolerance = 0;   // ClusterizeOptions::plan_tolerance
  std::string nodes_source = "node_configs.json";  // names the file in messages
};

// The plan and the node specs; `stages` stays empty (planNodes in Clusterize.h builds them).
ClusterizeResult planModel(const ModelGraph& graph, const ModelProfile& profile,
                           const std::vector<NodeConfig>& nodes, const JobSpec& job,
                           const PlanSettings& settings);

// Per-node speed relative to the profiling host: compute / mean compute (1 when absent).
std::vector<double> relativeSpeeds(const std::vector<NodeConfig>& nodes);

}  // namespace cairn::clusterize
