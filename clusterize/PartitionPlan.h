// PartitionPlan: everything clusterize decided, as plain data; written as node_data/plan.json
// (docs/NODE_DATA.md, "## plan.json"). Only tools read plan.json; providers read node.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "clusterize/RingGroups.h"
#include "core/NodeData.h"

namespace cairn::clusterize {

struct PlannedStage {
  std::string node;     // "node_3"
  std::string address;  // "127.0.0.1:5003"
  int begin_unit = 0;   // units [begin_unit, end_unit) of the forward graph
  int end_unit = 0;
  std::vector<std::string> units;  // their labels
  std::vector<std::string> parameters;
  std::vector<std::string> buffers;
  int64_t parameter_count = 0;  // elements
  std::vector<BoundaryValue> inputs;
  std::vector<BoundaryValue> outputs;
  double memory_bytes = 0;    // estimate
  double capacity_bytes = 0;  // the node's ram
  double seconds = 0;         // estimated time per micro-batch on this node
  double sent_bytes = 0;      // per micro-batch: activations down + gradients up, as they travel
  std::string gpu;            // the node's first GPU (what it trains on); empty: a CPU node
};

// A parameter that several stages of one cluster hold (ModelGraph.h SharedParameter).
struct PlannedShared {
  std::string name;                      // its first name: the exchange's and the ring's key
  std::vector<std::string> names;        // every name units use it by
  std::vector<int> stages;               // the stages holding a copy, ascending
  std::vector<std::string> holders;      // their nodes
  std::vector<std::string> local_names;  // the copy's name in each of those stages
};

struct PlannedCluster {
  std::vector<PlannedStage> stages;  // pipeline order: Root first, Leaf last
  std::vector<PlannedShared> shared;  // parameters several of its stages hold
  double seconds_per_microbatch = 0;  // the slowest stage
};

struct UnitSummary {
  std::string label;
  bool cut_before_allowed = true;  // false: why_not says why
  std::string why_not;
};

struct AtomSummary {
  int begin_unit = 0, end_unit = 0;
  double parameter_bytes = 0, buffer_bytes = 0, saved_bytes = 0, output_bytes = 0, seconds = 0;
};

// When some node has a GPU: the profiling host's yardstick and the choice between the planner's
// cut plan and a whole model per GPU (WholeModelChoice.h), with both estimates.
struct GpuPlanChoice {
  bool present = false;          // some node has a GPU (the rest is meaningful only then)
  double host_gflops = 0;        // profiled seconds are scaled by host_gflops / node GFLOPS
  bool host_gflops_measured = false;  // false: --host-gflops gave it
  std::string precision = "fp32";     // which GPU TFLOP/s counted (training_definition.precision)
  std::string chosen = "cut";         // "cut" | "whole_model_per_gpu"
  double cut_microbatches_per_s = 0;  // estimated, the whole run (all clusters)
  double whole_microbatches_per_s = 0;  // 0: not considered or not possible (see note)
  double samples_per_microbatch = 0;    // the profiled micro-batch size; 0: unknown
  std::string note;                     // why a whole model per GPU was not considered
};

struct PartitionPlan {
  std::string job_id;
  std::string model;
  std::string granularity;
  std::string optimizer;
  int microbatches = 0;
  std::string wire_activations = "fp32";  // training_definition.wire.activations the estimate assumes
  uint64_t seed = 0;
  std::vector<UnitSummary> units;
  std::vector<AtomSummary> atoms;
  std::vector<PlannedCluster> clusters;
  std::vector<std::string> spare_nodes;
  std::vector<RingGroup> rings;
  // Parameters several units use (ModelGraph.h SharedParameter): its first name, every name.
  std::vector<std::pair<std::string, std::vector<std::string>>> shared_names;
  std::vector<std::string> notes;
  GpuPlanChoice gpu;
};

nlohmann::json toJson(const PartitionPlan& plan);

}  // namespace cairn::clusterize
