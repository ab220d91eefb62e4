// ClusterFormer: groups nodes into clusters that can each hold the whole model, then lets the
// PartitionPlanner split the model inside each cluster. Deterministic for a given seed.
//
// The heuristic (docs/CLUSTERIZE.md has the reasoning):
//  1. Order nodes by memory (largest first), then speed, then bandwidth; ties are broken by a
//     shuffle seeded with `seed` (a Fisher-Yates pass over mt19937_64, identical everywhere).
//  2. For K clusters, deal the ordered nodes out like a greedy bin balancer: each node goes to the
//     cluster with the least memory so far (lowest index on ties). K = options.clusters when set;
//     otherwise the largest K (bisection between 1 and total memory / model memory) for which
//     every cluster's partition is feasible.
//  3. Balance: up to `balance_rounds` times, pair the slowest cluster with the fastest (then the
//     next fastest, up to 8) and try moving one node to the slowest or swapping one node between
//     them; keep the change that lowers the slower of the two bottlenecks the most; stop when no
//     partner gives an improvement.
//  4. Inside each cluster, the planner runs on four node orders (as dealt, then memory, speed,
//     bandwidth first) and keeps the fastest; a cluster with a GPU node (PlannerNode::isGpu) and
//     at most 5 nodes also on every other order. Nodes a partition leaves out are spare.
// Not thread-safe (pure function of its inputs, but allocates freely).
#pragma once

#include <cstdint>
#include <vector>

#include "clusterize/CostModel.h"
#include "clusterize/PartitionPlanner.h"

namespace cairn::clusterize {

struct ClusterFormerOptions {
  int clusters = 0;         // 0: as many as memory allows
  uint64_t seed = 0;        // tie-breaking among equal nodes
  int balance_rounds = 1000;  // step 3's limit
  int max_atoms_per_stage = 0;  // passed to partitionCluster (1: one atom per stage; 0: any)
  double tolerance = 0;         // passed to partitionCluster (0: the exact optimum)
};

struct FormedCluster {
  std::vector<int> nodes;       // indices into the node list, in the order given to the planner
  ClusterPartition partition;   // its stages' `node` fields index `nodes`
};

struct ClusterFormation {
  std::vector<FormedCluster> clusters;
  std::vector<int> spare;  // node indices no cluster uses, ascending
};

// Throws BadInput when no cluster (or not options.clusters clusters) can hold the model.
ClusterFormation formClusters(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                              const ClusterFormerOptions& options);

}  // namespace cairn::clusterize
