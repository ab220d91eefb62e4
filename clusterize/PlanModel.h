// PlanModel: the planning half of clusterize, for callers that already profiled (no model
// execution): the nodes formed into clusters (ClusterFormer), the model cut inside each, the rings
// of the state that several clusters hold, and node.json for every placed node. Messages about
// the nodes name PlanSettings::nodes_source. Single-threaded.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/script.h>

#include "clusterize/CostModel.h"
#include "clusterize/ModelGraph.h"
#include "clusterize/PartitionPlan.h"
#include "clusterize/PlannerNodes.h"
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
  // The profiling host's float32 GFLOPS (--host-gflops): the yardstick of GPU nodes' speeds.
  // Unset: measured (core/MatmulSpeed.h) when some node has a GPU, with `profile_threads` threads.
  std::optional<double> host_gflops;
  int profile_threads = 1;              // training_definition.threads the atoms were timed with
  int64_t profiled_microbatch_size = 0;  // the example's first dimension; 0: unknown
};

// The plan and the node specs; `stages` stays empty (planNodes in Clusterize.h builds them).
ClusterizeResult planModel(const ModelGraph& graph, const ModelProfile& profile,
                           const std::vector<NodeConfig>& nodes, const JobSpec& job,
                           const PlanSettings& settings);

}  // namespace cairn::clusterize
