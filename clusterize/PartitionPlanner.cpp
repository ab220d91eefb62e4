#include "clusterize/PartitionPlanner.h"

#include <algorithm>
#include <limits>

namespace cairn::clusterize {

double stageSeconds(const CostModel& cost, const PlannerNode& node, int begin, int end) {
  return cost.computeSeconds(begin, end) / node.speed +
         cost.transferBytes(begin, end) / node.bandwidth_bytes_per_s;
}

ClusterPartition partitionCluster(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                                  int max_atoms_per_stage) {
  const int atoms = cost.numAtoms();
  const int count = static_cast<int>(nodes.size());
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const int width = atoms + 1;
  std::vector<double> best(static_cast<size_t>(count + 1) * width, kInf);
  std::vector<int> from(static_cast<size_t>(count + 1) * width, -1);  // -1: node left out
  best[0] = 0;
  for (int k = 1; k <= count; ++k) {
    const PlannerNode& node = nodes[k - 1];
    double* row = &best[static_cast<size_t>(k) * width];
    const double* prev = &best[static_cast<size_t>(k - 1) * width];
    int* choice = &from[static_cast<size_t>(k) * width];
    for (int j = 0; j <= atoms; ++j) {
      row[j] = prev[j];
      choice[j] = -1;
      const int lowest = max_atoms_per_stage > 0 ? std::max(0, j - max_atoms_per_stage) : 0;
      for (int i = j - 1; i >= lowest; --i) {
        if (cost.memoryLowerBound(i, j) > node.capacity_bytes) break;
        if (prev[i] >= row[j]) continue;
        if (cost.memoryBytes(i, j) > node.capacity_bytes) continue;
        const double value = std::max(prev[i], stageSeconds(cost, node, i, j));
        if (value < row[j]) {
          row[j] = value;
          choice[j] = i;
        }
      }
    }
  }
  ClusterPartition result;
  const double total = best[static_cast<size_t>(count) * width + atoms];
  if (total == kInf) return result;
  result.feasible = true;
  result.bottleneck_seconds = total;
  for (int k = count, j = atoms; k > 0; --k) {
    const int i = from[static_cast<size_t>(k) * width + j];
    if (i < 0) continue;
    StagePlacement stage;
    stage.node = k - 1;
    stage.begin_atom = i;
    stage.end_atom = j;
    stage.seconds = stageSeconds(cost, nodes[k - 1], i, j);
    stage.memory_bytes = cost.memoryBytes(i, j);
    result.stages.push_back(stage);
    j = i;
  }
  std::reverse(result.stages.begin(), result.stages.end());
  return result;
}

}  // namespace cairn::clusterize
