#include "clusterize/ClusterFormer.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>

#include "core/Error.h"

namespace cairn::clusterize {
namespace {

std::vector<PlannerNode> pick(const std::vector<PlannerNode>& nodes, const std::vector<int>& ids) {
  std::vector<PlannerNode> out;
  out.reserve(ids.size());
  for (int id : ids) out.push_back(nodes[id]);
  return out;
}

// Clusters with a GPU node and at most this many nodes get their split on every node order.
constexpr size_t kAllOrdersUpTo = 5;

// The planner's limits for every split: atoms per stage and the noise tolerance.
struct Split {
  int span = 0;
  double tolerance = 0;
};

FormedCluster plan(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                   std::vector<int> ids, bool try_orders, Split span) {
  FormedCluster best;
  best.nodes = ids;
  best.partition = partitionCluster(cost, pick(nodes, ids), span.span, span.tolerance);
  if (!try_orders) return best;
  auto by = [&](auto key) {
    std::vector<int> order = ids;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key(nodes[a]) > key(nodes[b]); });
    return order;
  };
  auto consider = [&](const std::vector<int>& order) {
    ClusterPartition p = partitionCluster(cost, pick(nodes, order), span.span, span.tolerance);
    if (p.feasible && (!best.partition.feasible ||
                       p.bottleneck_seconds < best.partition.bottleneck_seconds)) {
      best.nodes = order;
      best.partition = std::move(p);
    }
  };
  for (const auto& order : {by([](const PlannerNode& n) { return n.capacity_bytes; }),
                            by([](const PlannerNode& n) { return n.speed; }),
                            by([](const PlannerNode& n) { return n.bandwidth_bytes_per_s; })})
    consider(order);
  // A GPU is far faster than the nodes around it, so where it sits in the chain decides which
  // stage it can take: small clusters with one try every order.
  const bool gpu = std::any_of(ids.begin(), ids.end(), [&](int id) { return nodes[id].isGpu(); });
  if (gpu && ids.size() <= kAllOrdersUpTo) {
    std::vector<int> order = ids;
    std::sort(order.begin(), order.end());
    do consider(order);
    while (std::next_permutation(order.begin(), order.end()));
  }
  return best;
}

double bottleneck(const FormedCluster& c) {
  return c.partition.feasible ? c.partition.bottleneck_seconds
                              : std::numeric_limits<double>::infinity();
}

// Deals the ordered nodes into k clusters, each node to the cluster with the least memory so far.
std::vector<std::vector<int>> deal(const std::vector<PlannerNode>& nodes,
                                   const std::vector<int>& order, int k) {
  std::vector<std::vector<int>> groups(k);
  std::vector<double> memory(k, 0);
  for (int id : order) {
    const int target = static_cast<int>(std::min_element(memory.begin(), memory.end()) - memory.begin());
    groups[target].push_back(id);
    memory[target] += nodes[id].capacity_bytes;
  }
  return groups;
}

bool allFeasible(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                 const std::vector<std::vector<int>>& groups, Split span,
                 std::vector<FormedCluster>* out) {
  std::vector<FormedCluster> formed;
  for (const auto& group : groups) {
    formed.push_back(plan(cost, nodes, group, false, span));
    if (!formed.back().partition.feasible) return false;
  }
  if (out) *out = std::move(formed);
  return true;
}

// Step 1: seeded shuffle, then a stable sort by memory, speed, bandwidth (largest first).
std::vector<int> orderNodes(const std::vector<PlannerNode>& nodes, uint64_t seed) {
  const int n = static_cast<int>(nodes.size());
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  for (int i = n - 1; i > 0; --i) {
    const int j = static_cast<int>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const PlannerNode &x = nodes[a], &y = nodes[b];
    if (x.capacity_bytes != y.capacity_bytes) return x.capacity_bytes > y.capacity_bytes;
    if (x.speed != y.speed) return x.speed > y.speed;
    return x.bandwidth_bytes_per_s > y.bandwidth_bytes_per_s;
  });
  return order;
}

// Step 2: how many clusters, and the ordered nodes dealt into them.
std::vector<FormedCluster> dealClusters(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                                        const std::vector<int>& order, int wanted, Split span) {
  const int n = static_cast<int>(nodes.size());
  const double model_memory = cost.memoryLowerBound(0, cost.numAtoms());
  double total = 0;
  for (const auto& node : nodes) total += node.capacity_bytes;
  const int upper = std::max(1, std::min(n, static_cast<int>(total / std::max(model_memory, 1.0))));
  std::vector<FormedCluster> clusters;
  if (wanted > 0) {
    if (wanted > n)
      CAIRN_THROW(BadInput, "--clusters ", wanted, " asks for more clusters than the ", n,
                  " nodes");
    if (!allFeasible(cost, nodes, deal(nodes, order, wanted), span, &clusters)) {
      int fits = 0;
      for (int k = std::min(upper, wanted - 1); k >= 1 && fits == 0; --k)
        if (allFeasible(cost, nodes, deal(nodes, order, k), span, nullptr)) fits = k;
      CAIRN_THROW(BadInput, "--clusters ", wanted, ": the nodes cannot be split into ",
                  wanted, " clusters that each hold the model",
                  fits > 0 ? " (at most " + std::to_string(fits) + " fit)" : std::string());
    }
  } else {
    if (!allFeasible(cost, nodes, deal(nodes, order, 1), span, &clusters))
      CAIRN_THROW(BadInput, "the model does not fit on these nodes: even all ", n,
                  " nodes in one pipeline cannot hold it (units too large for the nodes' memory)");
    int low = 1, high = upper;  // low is feasible
    while (low < high) {
      const int mid = low + (high - low + 1) / 2;
      std::vector<FormedCluster> attempt;
      if (allFeasible(cost, nodes, deal(nodes, order, mid), span, &attempt)) {
        low = mid;
        clusters = std::move(attempt);
      } else {
        high = mid - 1;
      }
    }
  }
  return clusters;
}

// Step 3 for one pair: the move of one node to the slow cluster, or the swap of one node between
// the two, that lowers the slower of their bottlenecks the most; false when none lowers it.
bool improvePair(const CostModel& cost, const std::vector<PlannerNode>& nodes, Split span,
                 std::vector<FormedCluster>& clusters, size_t slow, size_t fast) {
  const double current = bottleneck(clusters[slow]);
  double best_value = current;
  std::pair<FormedCluster, FormedCluster> best;
  auto consider = [&](std::vector<int> slow_ids, std::vector<int> fast_ids) {
    if (fast_ids.empty()) return;
    FormedCluster s = plan(cost, nodes, std::move(slow_ids), false, span);
    if (!s.partition.feasible || bottleneck(s) >= best_value) return;
    FormedCluster f = plan(cost, nodes, std::move(fast_ids), false, span);
    const double value = std::max(bottleneck(s), bottleneck(f));
    if (value < best_value * (1 - 1e-9)) {
      best_value = value;
      best = {std::move(s), std::move(f)};
    }
  };
  const auto& s_ids = clusters[slow].nodes;
  const auto& f_ids = clusters[fast].nodes;
  for (size_t y = 0; y < f_ids.size(); ++y) {
    std::vector<int> s2 = s_ids, f2 = f_ids;
    s2.push_back(f_ids[y]);
    f2.erase(f2.begin() + y);
    consider(s2, f2);
    for (size_t x = 0; x < s_ids.size() && s_ids.size() * f_ids.size() <= 256; ++x) {
      std::vector<int> s3 = s_ids, f3 = f_ids;
      std::swap(s3[x], f3[y]);
      consider(s3, f3);
    }
  }
  if (best_value >= current) return false;
  clusters[slow] = std::move(best.first);
  clusters[fast] = std::move(best.second);
  return true;
}

// Step 3: the slowest cluster against the fastest ones (up to kPartners of them).
void balance(const CostModel& cost, const std::vector<PlannerNode>& nodes, Split span, int rounds,
             std::vector<FormedCluster>& clusters) {
  constexpr size_t kPartners = 8;
  for (int round = 0; round < rounds && clusters.size() > 1; ++round) {
    std::vector<size_t> by_speed(clusters.size());
    std::iota(by_speed.begin(), by_speed.end(), 0);
    std::stable_sort(by_speed.begin(), by_speed.end(), [&](size_t a, size_t b) {
      return bottleneck(clusters[a]) < bottleneck(clusters[b]);
    });
    const size_t slow = by_speed.back();
    bool improved = false;
    for (size_t p = 0; p < std::min(kPartners, by_speed.size() - 1) && !improved; ++p)
      improved = improvePair(cost, nodes, span, clusters, slow, by_speed[p]);
    if (!improved) break;
  }
}

}  // namespace

ClusterFormation formClusters(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                              const ClusterFormerOptions& options) {
  const int n = static_cast<int>(nodes.size());
  if (n == 0) CAIRN_THROW(BadInput, "there are no nodes to place the model on");
  const Split span{options.max_atoms_per_stage, options.tolerance};
  const std::vector<int> order = orderNodes(nodes, options.seed);
  std::vector<FormedCluster> clusters = dealClusters(cost, nodes, order, options.clusters, span);
  balance(cost, nodes, span, options.balance_rounds, clusters);

  // 4. Final split with several node orders; unused nodes are spare.
  ClusterFormation formation;
  std::vector<bool> used(n, false);
  for (auto& cluster : clusters) {
    FormedCluster final_cluster = plan(cost, nodes, cluster.nodes, true, span);
    CAIRN_ENFORCE(final_cluster.partition.feasible, "a feasible cluster became infeasible");
    for (const auto& stage : final_cluster.partition.stages) used[final_cluster.nodes[stage.node]] = true;
    formation.clusters.push_back(std::move(final_cluster));
  }
  for (int i = 0; i < n; ++i)
    if (!used[i]) formation.spare.push_back(i);
  return formation;
}

}  // namespace cairn::clusterize
