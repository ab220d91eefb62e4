// Rebalance: re-cut a planned cluster from what its providers measured (issue [I] part 2).
//
// Rule (docs/CLUSTERIZE.md "Rebalancing from measurement"): a stage's measured cost per
// micro-batch is the median over training steps of metrics.jsonl compute_s divided by the job's
// micro-batches. It is spread over the stage's atoms in proportion to their profiled seconds
// (equally when the stage's profiled seconds sum to 0). The planner (partitionCluster) then cuts
// the measured per-atom costs again; memory estimates are the plan's. Nodes count as equally fast
// (the measured times already include the node each stage ran on) and transfers are left out:
// compute_s excludes sends and waits.
// Pure functions apart from the file readers; no torch.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "clusterize/PartitionPlanner.h"

namespace cairn::clusterize {

// Median compute_s over the step records of a provider's metrics.jsonl (records with "step" and
// "compute_s"; eval/checkpoint/done records are skipped). BadInput naming the file and line for a
// malformed line or compute_s, and the file when it holds no step record.
double medianComputeSeconds(const std::string& metrics_path);

struct MeasuredStage {
  int begin_atom = 0;
  int end_atom = 0;
  double seconds = 0;  // measured per micro-batch
};

// Per-atom measured seconds: each stage's measured seconds spread over its atoms in proportion to
// `profiled` (the plan's atom seconds). Stages must tile [0, profiled.size()) in order.
std::vector<double> measuredAtomSeconds(const std::vector<double>& profiled,
                                        const std::vector<MeasuredStage>& stages);

struct RebalanceResult {
  std::string node_data;
  int cluster = 0;
  int microbatches = 0;
  std::vector<std::string> nodes;             // the cluster's chain, in order
  std::vector<int> old_cuts, new_cuts;        // unit indices where stages 1.. begin
  std::vector<double> measured_stage_seconds; // per micro-batch, old cut
  std::vector<double> predicted_stage_seconds;// per micro-batch, new cut, measured atom costs
  std::vector<double> atom_seconds;           // measured per-atom costs
  ClusterPartition partition;                 // new cut over the measured costs
  nlohmann::json toJson() const;
};

// Reads NODE_DATA/plan.json and NODE_DATA/nodes/<node>/metrics.jsonl of cluster `cluster`'s
// stages and re-cuts. BadInput (exit 2) naming plan.json and the key when NODE_DATA is not a
// plan, and the metrics file when one is missing or malformed.
RebalanceResult rebalanceFromNodeData(const std::string& node_data, int cluster, double tolerance);

}  // namespace cairn::clusterize
