#include "clusterize/PartitionPlanner.h"

#include <algorithm>
#include <limits>

namespace cairn::clusterize {

double stageSeconds(const CostModel& cost, const PlannerNode& node, int begin, int end) {
  double seconds = cost.computeSeconds(begin, end) / node.speed +
                   cost.transferBytes(begin, end) / node.bandwidth_bytes_per_s;
  if (node.isGpu())
    seconds += cost.deviceInBytes(begin, end) / node.h2d_bytes_per_s +
               cost.deviceOutBytes(begin, end) / node.d2h_bytes_per_s;
  return seconds;
}

namespace {

StagePlacement placement(const CostModel& cost, const std::vector<PlannerNode>& nodes, int k,
                         int begin, int end) {
  StagePlacement stage;
  stage.node = k;
  stage.begin_atom = begin;
  stage.end_atom = end;
  stage.seconds = stageSeconds(cost, nodes[k], begin, end);
  stage.memory_bytes = cost.memoryBytes(begin, end);
  return stage;
}

bool fits(const CostModel& cost, const PlannerNode& node, int begin, int end, int span,
          double bound) {
  if (span > 0 && end - begin > span) return false;
  return cost.memoryBytes(begin, end) <= node.capacity_bytes &&
         stageSeconds(cost, node, begin, end) <= bound;
}

// The canonical split whose every stage takes at most `bound`: feasible[k][j] says whether atoms
// [j, atoms) can go on nodes k.. within the bound; then each node in order takes the largest end
// that keeps the rest feasible (an empty range only when no non-empty one does).
ClusterPartition canonicalWithin(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                                 int span, double bound) {
  const int atoms = cost.numAtoms();
  const int count = static_cast<int>(nodes.size());
  const int width = atoms + 1;
  std::vector<char> feasible(static_cast<size_t>(count + 1) * width, 0);
  feasible[static_cast<size_t>(count) * width + atoms] = 1;
  for (int k = count - 1; k >= 0; --k) {
    for (int j = 0; j <= atoms; ++j) {
      bool ok = feasible[static_cast<size_t>(k + 1) * width + j] != 0;
      for (int e = j + 1; !ok && e <= atoms; ++e)
        ok = feasible[static_cast<size_t>(k + 1) * width + e] != 0 &&
             fits(cost, nodes[k], j, e, span, bound);
      feasible[static_cast<size_t>(k) * width + j] = ok ? 1 : 0;
    }
  }
  ClusterPartition result;
  if (!feasible[0]) return result;
  result.feasible = true;
  for (int k = 0, j = 0; k < count; ++k) {
    for (int e = atoms; e > j; --e) {
      if (feasible[static_cast<size_t>(k + 1) * width + e] &&
          fits(cost, nodes[k], j, e, span, bound)) {
        result.stages.push_back(placement(cost, nodes, k, j, e));
        j = e;
        break;
      }
    }
  }
  for (const StagePlacement& stage : result.stages)
    result.bottleneck_seconds = std::max(result.bottleneck_seconds, stage.seconds);
  return result;
}

}  // namespace

ClusterPartition partitionCluster(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                                  int max_atoms_per_stage, double tolerance) {
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
  if (tolerance > 0) {
    ClusterPartition canonical =
        canonicalWithin(cost, nodes, max_atoms_per_stage, total * (1 + tolerance));
    if (canonical.feasible) return canonical;  // always, since the optimum is within the bound
  }
  result.feasible = true;
  result.bottleneck_seconds = total;
  for (int k = count, j = atoms; k > 0; --k) {
    const int i = from[static_cast<size_t>(k) * width + j];
    if (i < 0) continue;
    result.stages.push_back(placement(cost, nodes, k - 1, i, j));
    j = i;
  }
  std::reverse(result.stages.begin(), result.stages.end());
  return result;
}

}  // namespace cairn::clusterize
