// PartitionPlanner: the exact split of a model over an ordered list of nodes. Dynamic programming
// over cut positions: best[k][j] = the smallest possible slowest-stage time when atoms [0, j) are
// placed on the first k nodes, each node taking one contiguous (possibly empty: the node is left
// out) range, subject to every node's memory. O(nodes * atoms * range) with ranges cut short by
// memory. Thread-safe (pure function).
#pragma once

#include <vector>

#include "clusterize/CostModel.h"

namespace cairn::clusterize {

struct PlannerNode {
  double capacity_bytes = 0;
  double speed = 1;                   // relative to the profiling host
  double bandwidth_bytes_per_s = 1;
  // A GPU node's pinned host<->device copy rates; 0: a CPU node (nothing to copy).
  double h2d_bytes_per_s = 0;
  double d2h_bytes_per_s = 0;
  bool isGpu() const { return h2d_bytes_per_s > 0 && d2h_bytes_per_s > 0; }
};

struct StagePlacement {
  int node = 0;        // index into the node list given to partitionCluster
  int begin_atom = 0;
  int end_atom = 0;
  double seconds = 0;  // per micro-batch
  double memory_bytes = 0;
};

struct ClusterPartition {
  bool feasible = false;
  double bottleneck_seconds = 0;
  std::vector<StagePlacement> stages;  // in pipeline order; nodes left out do not appear
};

// compute seconds / speed + transfer bytes / bandwidth, and on a GPU node + deviceInBytes / h2d +
// deviceOutBytes / d2h (CostModel.h).
double stageSeconds(const CostModel& cost, const PlannerNode& node, int begin, int end);

// max_atoms_per_stage > 0 limits how many atoms one stage may hold (1: every stage is exactly one
// atom, as when the user fixed the cuts and each atom is one of their stages); 0: no limit.
//
// tolerance > 0 (relative, e.g. 0.05) makes the plan stable against timing noise: the DP first
// finds the optimal bottleneck B; then every split whose slowest stage is at most B * (1 +
// tolerance) counts as equally good, and the canonical one among them is taken: nodes in order,
// each takes the longest range (largest end atom) that still lets the rest be placed within that
// bound. Costs that move by less than the margin between the canonical split and the bound leave
// the plan unchanged; equal-cost alternatives always resolve the same way. tolerance 0: the exact
// DP optimum (ties: the first found scanning cut positions from the largest begin down).
ClusterPartition partitionCluster(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                                  int max_atoms_per_stage = 0, double tolerance = 0);

}  // namespace cairn::clusterize
