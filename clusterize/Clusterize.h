// Clusterize: the whole clusterize pipeline as a library call — load the model, profile it, form
// clusters, split it, and describe every node — plus the human-readable report. The binary
// (apps/ClusterizeCommands.cpp) parses flags into ClusterizeOptions, calls clusterize(), writes the
// result with NodeDataWriter and prints the report. The planning half alone is PlanModel.h.
// Single-threaded.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <torch/script.h>

#include "clusterize/CostModel.h"
#include "clusterize/ModelGraph.h"
#include "clusterize/PartitionPlan.h"
#include "clusterize/PlanModel.h"
#include "clusterize/Profiler.h"
#include "core/NodeConfigs.h"
#include "core/NodeData.h"

namespace cairn::clusterize {

struct ClusterizeOptions {
  std::string model_path;                  // TorchScript model (required)
  std::string weights_path;                // safetensors initial weights; empty: the model's own
  std::string nodes_path;                  // node_configs.json (required)
  std::string job_path;                    // job.json to copy; empty: build one from the fields below
  std::string job_id = "cairn";
  std::string data_location = "/usr/share/datasets/fashion-mnist";
  std::string data_format = "idx";
  std::string loss = "cross_entropy";
  double learning_rate = 0.001;
  int local_steps = 10;
  int clusters = 0;                        // 0: as many as memory allows
  uint64_t seed = 0;
  Granularity granularity = Granularity::kTop;
  std::vector<std::string> input_shapes;   // one per model input: "64,1,28,28"
  std::vector<std::string> input_dtypes = {"float32"};
  std::string example_path;                // torch.save'd input(s), instead of shapes
  std::optional<int> microbatches;         // default: job's training_definition.microbatches, else 4
  std::optional<std::string> optimizer;    // default: job's training_definition.optimizer, else adam
  // Stage boundaries fixed by the user (--cuts): unit indices where stage 1, 2, ... begin, strictly
  // increasing, each a valid cut. Empty: the planner chooses the cuts. Given, every cluster has
  // exactly cuts.size() + 1 stages; the planner still chooses which node holds which stage.
  std::vector<int> cuts;
  // Splits whose slowest stage is within this fraction of the optimum count as equal; the
  // canonical one is taken (PartitionPlanner.h), so timing noise below it does not move cuts.
  double plan_tolerance = 0;
  // The profiling host's float32 GFLOPS (--host-gflops); unset: measured when a node has a GPU
  // (PlanSettings::host_gflops).
  std::optional<double> host_gflops;
  ProfileOptions profile;
};

// Loads, profiles and plans; the result (ClusterizeResult, clusterize/PlanModel.h) with the stage
// modules built.
ClusterizeResult clusterize(const ClusterizeOptions& options);

// clusterize() in two halves, for the coordinator (`clusterize --serve`), which profiles the model
// once at start and plans when volunteers have joined: prepareModel loads, profiles and builds the
// job (everything that does not depend on the nodes); planNodes places it on `configs` and builds
// the stage modules. clusterize() is prepareModel + planNodes(readNodeConfigs(nodes_path)).
struct PreparedModel {
  torch::jit::Module model;
  std::shared_ptr<const ModelGraph> graph;
  ModelProfile profile;
  JobSpec job;
  PlanSettings settings;
};
PreparedModel prepareModel(const ClusterizeOptions& options);
ClusterizeResult planNodes(const PreparedModel& prepared, const std::vector<NodeConfig>& configs,
                           const std::string& nodes_source);

void printReport(const PartitionPlan& plan, std::ostream& out);
std::string formatBytes(double bytes);  // "1.23 GB", "45.6 MB", "789 B" (decimal units)

}  // namespace cairn::clusterize
