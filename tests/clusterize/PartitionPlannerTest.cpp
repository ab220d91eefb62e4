// The DP split against a brute-force search over every assignment, cluster formation rules, and
// ring grouping, on synthetic cost models (no torch execution).
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <random>
#include <set>

#include "clusterize/ClusterFormer.h"
#include "clusterize/CostModel.h"
#include "clusterize/PartitionPlanner.h"
#include "clusterize/RingGroups.h"
#include "core/Error.h"

namespace cairn::clusterize {
namespace {

CostModel randomCost(std::mt19937& rng, int atoms, int microbatches = 2) {
  std::uniform_real_distribution<double> bytes(1e6, 1e7), secs(1e-3, 1e-2);
  std::vector<AtomCost> list;
  for (int a = 0; a < atoms; ++a) {
    const double params = bytes(rng);
    list.push_back({params, params, bytes(rng) / 10, bytes(rng), secs(rng)});
  }
  std::vector<double> boundary;
  for (int c = 0; c <= atoms; ++c) boundary.push_back(bytes(rng) / 5);
  return CostModel(list, boundary, {OptimizerKind::kAdam, microbatches});
}

// Every way to give each node (in order) an empty or contiguous non-empty range covering all atoms
// (ranges of at most `span` atoms when span > 0).
double partitionPlannerBruteForce(const CostModel& cost, const std::vector<PlannerNode>& nodes, int span = 0) {
  double best = std::numeric_limits<double>::infinity();
  std::function<void(size_t, int, double)> go = [&](size_t k, int placed, double worst) {
    if (k == nodes.size()) {
      if (placed == cost.numAtoms()) best = std::min(best, worst);
      return;
    }
    go(k + 1, placed, worst);  // node left out
    for (int end = placed + 1; end <= cost.numAtoms(); ++end) {
      if (span > 0 && end - placed > span) break;
      if (cost.memoryBytes(placed, end) > nodes[k].capacity_bytes) continue;
      const double t = cost.computeSeconds(placed, end) / nodes[k].speed +
                       cost.transferBytes(placed, end) / nodes[k].bandwidth_bytes_per_s;
      go(k + 1, end, std::max(worst, t));
    }
  };
  go(0, 0, 0);
  return best;
}

// Fixed cuts (clusterize --cuts) run the DP with at most one (merged) atom per stage: the same
// brute force, limited the same way, gives the same optimum, and every stage is one atom.
TEST(PartitionPlanner, OneAtomPerStageMatchesBruteForce) {
  std::mt19937 rng(7);
  int feasible = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int atoms = 1 + static_cast<int>(rng() % 5);
    const int count = 1 + static_cast<int>(rng() % 6);
    const CostModel cost = randomCost(rng, atoms);
    std::uniform_real_distribution<double> cap(3e7, 1.5e8), speed(0.5, 2.0), bw(1e7, 1e9);
    std::vector<PlannerNode> nodes;
    for (int k = 0; k < count; ++k) nodes.push_back({cap(rng), speed(rng), bw(rng)});
    const double expected = partitionPlannerBruteForce(cost, nodes, 1);
    const ClusterPartition got = partitionCluster(cost, nodes, 1);
    ASSERT_EQ(got.feasible, expected != std::numeric_limits<double>::infinity()) << "trial " << trial;
    if (count < atoms) {
      EXPECT_FALSE(got.feasible) << "trial " << trial << ": fewer nodes than stages";
    }
    if (!got.feasible) continue;
    ++feasible;
    EXPECT_NEAR(got.bottleneck_seconds, expected, 1e-12) << "trial " << trial;
    ASSERT_EQ(static_cast<int>(got.stages.size()), atoms) << "trial " << trial;
    for (int s = 0; s < atoms; ++s) {
      EXPECT_EQ(got.stages[s].begin_atom, s);
      EXPECT_EQ(got.stages[s].end_atom, s + 1);
    }
  }
  EXPECT_GT(feasible, 100);
}

TEST(PartitionPlanner, MatchesBruteForceOnSmallRandomCases) {
  std::mt19937 rng(42);
  int feasible = 0, infeasible = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int atoms = 1 + static_cast<int>(rng() % 7);
    const int count = 1 + static_cast<int>(rng() % 4);
    const CostModel cost = randomCost(rng, atoms);
    std::uniform_real_distribution<double> cap(1e7, 1.5e8), speed(0.5, 2.0), bw(1e7, 1e9);
    std::vector<PlannerNode> nodes;
    for (int k = 0; k < count; ++k) nodes.push_back({cap(rng), speed(rng), bw(rng)});
    const double expected = partitionPlannerBruteForce(cost, nodes);
    const ClusterPartition got = partitionCluster(cost, nodes);
    if (expected == std::numeric_limits<double>::infinity()) {
      EXPECT_FALSE(got.feasible) << "trial " << trial;
      ++infeasible;
      continue;
    }
    ++feasible;
    ASSERT_TRUE(got.feasible) << "trial " << trial;
    EXPECT_NEAR(got.bottleneck_seconds, expected, 1e-12) << "trial " << trial;
    // The returned stages are a real plan with that bottleneck.
    int next = 0;
    double worst = 0;
    int last_node = -1;
    for (const auto& s : got.stages) {
      EXPECT_EQ(s.begin_atom, next);
      EXPECT_GT(s.end_atom, s.begin_atom);
      EXPECT_GT(s.node, last_node);
      EXPECT_LE(cost.memoryBytes(s.begin_atom, s.end_atom), nodes[s.node].capacity_bytes);
      worst = std::max(worst, stageSeconds(cost, nodes[s.node], s.begin_atom, s.end_atom));
      next = s.end_atom;
      last_node = s.node;
    }
    EXPECT_EQ(next, atoms);
    EXPECT_NEAR(worst, got.bottleneck_seconds, 1e-12);
  }
  EXPECT_GT(feasible, 50);  // both branches exercised
  EXPECT_GT(infeasible, 5);
}

// Fixed per-unit costs (no profiling): seconds per atom, no memory limit, no transfer.
CostModel fixedCost(const std::vector<double>& seconds) {
  std::vector<AtomCost> list;
  for (double s : seconds) list.push_back({1e6, 1e6, 0, 1e6, s});
  return CostModel(list, std::vector<double>(seconds.size() + 1, 0.0), {OptimizerKind::kAdam, 2});
}

std::vector<PlannerNode> equalNodes(int count) {
  return std::vector<PlannerNode>(static_cast<size_t>(count), PlannerNode{1e18, 1, 1e18});
}

// Each node's end atom in node order (a node left out ends where the previous one ended).
std::vector<int> ends(const ClusterPartition& plan, int count) {
  std::vector<int> result;
  int end = 0;
  size_t next = 0;
  for (int k = 0; k < count; ++k) {
    if (next < plan.stages.size() && plan.stages[next].node == k) end = plan.stages[next++].end_atom;
    result.push_back(end);
  }
  return result;
}

// Brute-force reference of the tolerant planner: among every split whose slowest stage is within
// (1 + tolerance) of the optimum, the one with the lexicographically largest end atoms per node.
std::vector<int> bruteForceCanonical(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                                     double tolerance, double* optimum) {
  std::vector<std::pair<double, std::vector<int>>> all;
  std::vector<int> path;
  std::function<void(size_t, int, double)> go = [&](size_t k, int placed, double worst) {
    if (k == nodes.size()) {
      if (placed == cost.numAtoms()) all.push_back({worst, path});
      return;
    }
    for (int end = placed; end <= cost.numAtoms(); ++end) {
      if (end > placed && cost.memoryBytes(placed, end) > nodes[k].capacity_bytes) continue;
      const double t = end > placed ? stageSeconds(cost, nodes[k], placed, end) : 0;
      path.push_back(end);
      go(k + 1, end, std::max(worst, t));
      path.pop_back();
    }
  };
  go(0, 0, 0);
  double best = std::numeric_limits<double>::infinity();
  for (const auto& [worst, split] : all) best = std::min(best, worst);
  *optimum = best;
  std::vector<int> chosen;
  for (const auto& [worst, split] : all)
    if (worst <= best * (1 + tolerance) && split > chosen) chosen = split;
  return chosen;
}

TEST(PartitionPlanner, TolerantPlanIsTheBruteForceCanonicalSplit) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int atoms = 1 + static_cast<int>(rng() % 7);
    const int count = 1 + static_cast<int>(rng() % 4);
    const CostModel cost = randomCost(rng, atoms);
    std::vector<PlannerNode> nodes;
    std::uniform_real_distribution<double> capacity(1e7, 2e8), speed(0.5, 2.0);
    for (int k = 0; k < count; ++k) nodes.push_back({capacity(rng), speed(rng), 1e9});
    const double tolerance = trial % 2 == 0 ? 0.05 : 0.2;
    double optimum = 0;
    const std::vector<int> expected = bruteForceCanonical(cost, nodes, tolerance, &optimum);
    const ClusterPartition plan = partitionCluster(cost, nodes, 0, tolerance);
    ASSERT_EQ(plan.feasible, !expected.empty()) << "trial " << trial;
    if (!plan.feasible) continue;
    EXPECT_EQ(ends(plan, count), expected) << "trial " << trial;
    EXPECT_LE(plan.bottleneck_seconds, optimum * (1 + tolerance) * (1 + 1e-12));
    EXPECT_NEAR(partitionCluster(cost, nodes).bottleneck_seconds, optimum, optimum * 1e-12);
  }
}

// Equal-cost alternatives resolve the same way: three equal atoms on two equal nodes split 2 | 1,
// and costs moved by 1% either way (which flips the exact optimum between 2 | 1 and 1 | 2) do not
// change the tolerant plan; six equal atoms on three nodes stay 2 | 2 | 2 under random 1% noise.
TEST(PartitionPlanner, TiesBreakTheSameWayAndNoiseWithinToleranceKeepsThePlan) {
  const auto nodes2 = equalNodes(2);
  EXPECT_EQ(ends(partitionCluster(fixedCost({1, 1, 1}), nodes2, 0, 0.05), 2),
            (std::vector<int>{2, 3}));
  EXPECT_EQ(ends(partitionCluster(fixedCost({1.01, 1, 1}), nodes2), 2), (std::vector<int>{1, 3}));
  EXPECT_EQ(ends(partitionCluster(fixedCost({1, 1, 1.01}), nodes2), 2), (std::vector<int>{2, 3}));
  for (const auto& seconds : {std::vector<double>{1.01, 1, 1}, std::vector<double>{1, 1, 1.01},
                              std::vector<double>{0.99, 1.01, 1}}) {
    EXPECT_EQ(ends(partitionCluster(fixedCost(seconds), nodes2, 0, 0.05), 2),
              (std::vector<int>{2, 3}));
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> noise(0.99, 1.01);
  const auto nodes3 = equalNodes(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> seconds;
    for (int a = 0; a < 6; ++a) seconds.push_back(0.01 * noise(rng));
    const ClusterPartition plan = partitionCluster(fixedCost(seconds), nodes3, 0, 0.05);
    ASSERT_EQ(ends(plan, 3), (std::vector<int>{2, 4, 6})) << "trial " << trial;
  }
}

TEST(CostModel, OptimizerStateAndMicrobatchesEnterMemory) {
  const std::vector<AtomCost> atoms = {{100, 100, 10, 1000, 1}, {50, 0, 0, 500, 1}};
  const std::vector<double> boundary = {40, 30, 20};
  const CostModel sgd(atoms, boundary, {OptimizerKind::kSgd, 1});
  const CostModel adam(atoms, boundary, {OptimizerKind::kAdam, 3});
  // params 150 + buffers 10 + trainable 100 * (1 grad + k) + M * (saved 1500 + in 40) + in 40 + out 20
  EXPECT_DOUBLE_EQ(sgd.memoryBytes(0, 2), 150 + 10 + 100 + 1 * (1500 + 40) + 40 + 20);
  EXPECT_DOUBLE_EQ(adam.memoryBytes(0, 2), 150 + 10 + 300 + 3 * (1500 + 40) + 40 + 20);
  EXPECT_DOUBLE_EQ(adam.transferBytes(0, 1), 30);       // root sends activations only
  EXPECT_DOUBLE_EQ(adam.transferBytes(1, 2), 30);       // leaf sends input gradients only
  EXPECT_DOUBLE_EQ(adam.transferBytes(0, 2), 0);        // one stage sends nothing
}

// A tied embedding and head (one 64-byte trainable parameter used by atoms 0 and 2, each of which
// counts it): a stage holding both holds it once, with one gradient and one optimizer state;
// stages holding one each hold a copy each.
TEST(CostModel, ASharedParameterIsHeldOncePerStage) {
  const std::vector<AtomCost> atoms = {{64, 64, 0, 0, 1}, {10, 10, 0, 0, 1}, {64, 64, 0, 0, 1}};
  const std::vector<double> boundary = {0, 0, 0, 0};
  const CostModel plain(atoms, boundary, {OptimizerKind::kAdam, 1});
  const CostModel shared(atoms, boundary, {OptimizerKind::kAdam, 1}, {}, {SharedCost{{0, 2}, 64, 64}});
  // Adam: parameter + gradient + 2 states = 4 copies of each trainable byte.
  EXPECT_DOUBLE_EQ(plain.memoryBytes(0, 3), 4 * (64 + 10 + 64));
  EXPECT_DOUBLE_EQ(shared.memoryBytes(0, 3), 4 * (64 + 10));
  EXPECT_DOUBLE_EQ(shared.memoryBytes(0, 2), plain.memoryBytes(0, 2));  // one use in the range
  EXPECT_DOUBLE_EQ(shared.memoryBytes(2, 3), plain.memoryBytes(2, 3));
  EXPECT_DOUBLE_EQ(shared.stateBytes(0, 3), 64 + 10);
  EXPECT_DOUBLE_EQ(shared.trainableBytes(0, 3), 64 + 10);
  EXPECT_DOUBLE_EQ(shared.trainableBytes(0, 1) + shared.trainableBytes(1, 3), 64 + 10 + 64);
}

// With compressed activations (wire bytes) only the transfer changes: memory still holds float32,
// and on a slow link the planner's bottleneck follows the smaller transfer.
TEST(CostModel, WireBytesChangeTransferNotMemory) {
  const std::vector<AtomCost> atoms = {{100, 100, 10, 1000, 0.001}, {50, 0, 0, 500, 0.001}};
  const std::vector<double> boundary = {40, 4000, 20};
  const CostModel fp32(atoms, boundary, {OptimizerKind::kAdam, 2});
  const CostModel int8(atoms, boundary, {OptimizerKind::kAdam, 2}, {40, 1000, 20});
  EXPECT_DOUBLE_EQ(int8.memoryBytes(0, 1), fp32.memoryBytes(0, 1));
  EXPECT_DOUBLE_EQ(int8.memoryBytes(1, 2), fp32.memoryBytes(1, 2));
  EXPECT_DOUBLE_EQ(int8.transferBytes(0, 1), 1000);
  EXPECT_DOUBLE_EQ(int8.transferBytes(1, 2), 1000);
  const PlannerNode slow{1e9, 1.0, 1e5};  // 100 kB/s
  EXPECT_DOUBLE_EQ(stageSeconds(fp32, slow, 0, 1), 0.001 + 4000 / 1e5);
  EXPECT_DOUBLE_EQ(stageSeconds(int8, slow, 0, 1), 0.001 + 1000 / 1e5);
  EXPECT_THROW(CostModel(atoms, boundary, {OptimizerKind::kAdam, 2}, {1, 2}), InternalError);
}

std::vector<PlannerNode> uniformNodes(int count, double capacity) {
  return std::vector<PlannerNode>(count, PlannerNode{capacity, 1.0, 1e8});
}

TEST(ClusterFormer, MakesAsManyClustersAsMemoryAllowsAndReportsSpares) {
  std::mt19937 rng(1);
  const CostModel cost = randomCost(rng, 12);
  const double whole = cost.memoryBytes(0, cost.numAtoms());
  // 7 nodes that each hold the whole model: 7 one-node clusters.
  auto formation = formClusters(cost, uniformNodes(7, whole * 1.01), {});
  EXPECT_EQ(formation.clusters.size(), 7u);
  EXPECT_TRUE(formation.spare.empty());
  // Nodes holding ~40% of the model: three per cluster are needed; 10 nodes → 3 clusters + 1 spare.
  formation = formClusters(cost, uniformNodes(10, whole * 0.45), {});
  EXPECT_EQ(formation.clusters.size(), 3u);
  std::set<int> used;
  for (const auto& c : formation.clusters) {
    EXPECT_TRUE(c.partition.feasible);
    for (const auto& s : c.partition.stages) EXPECT_TRUE(used.insert(c.nodes[s.node]).second);
  }
  EXPECT_EQ(used.size() + formation.spare.size(), 10u);
  // Two nodes too small for any atom: dealt into clusters but left out by the split → spare.
  auto nodes = uniformNodes(7, whole * 1.01);
  nodes.push_back({1.0, 1.0, 1e8});
  nodes.push_back({2.0, 1.0, 1e8});
  formation = formClusters(cost, nodes, {});
  EXPECT_EQ(formation.clusters.size(), 7u);
  EXPECT_EQ(formation.spare, (std::vector<int>{7, 8}));
}

TEST(ClusterFormer, ForcedClusterCountAndClearFailure) {
  std::mt19937 rng(2);
  const CostModel cost = randomCost(rng, 10);
  const double whole = cost.memoryBytes(0, cost.numAtoms());
  ClusterFormerOptions options;
  options.clusters = 2;
  EXPECT_EQ(formClusters(cost, uniformNodes(6, whole * 1.01), options).clusters.size(), 2u);
  options.clusters = 4;
  try {
    formClusters(cost, uniformNodes(6, whole * 0.45), options);
    FAIL() << "accepted 4 clusters";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("--clusters 4: the nodes cannot be split into 4 clusters"),
              std::string::npos)
        << e.what();
  }
}

TEST(ClusterFormer, DeterministicForASeedAndBalanced) {
  std::mt19937 rng(3);
  const CostModel cost = randomCost(rng, 20);
  const double whole = cost.memoryBytes(0, cost.numAtoms());
  std::vector<PlannerNode> nodes;
  std::uniform_real_distribution<double> speed(0.5, 2.0);
  for (int i = 0; i < 24; ++i) nodes.push_back({whole * (0.3 + 0.05 * (i % 4)), speed(rng), 1e8});
  ClusterFormerOptions options;
  options.seed = 9;
  const auto a = formClusters(cost, nodes, options);
  const auto b = formClusters(cost, nodes, options);
  ASSERT_EQ(a.clusters.size(), b.clusters.size());
  for (size_t c = 0; c < a.clusters.size(); ++c) EXPECT_EQ(a.clusters[c].nodes, b.clusters[c].nodes);
  double slow = 0, fast = 1e30;
  for (const auto& c : a.clusters) {
    slow = std::max(slow, c.partition.bottleneck_seconds);
    fast = std::min(fast, c.partition.bottleneck_seconds);
  }
  EXPECT_GE(a.clusters.size(), 4u);
  EXPECT_LT(slow / fast, 2.0) << "clusters are badly unbalanced";
}

TEST(RingGroups, GroupsParametersWithTheSameHoldersInEveryCluster) {
  // Cluster 0 cuts after b, cluster 1 after a: a|b|c → rings {a}, {b}, {c}; d goes with c.
  const std::vector<std::string> params = {"a", "b", "c", "d"};
  const auto rings = groupRings(params, {{"n0", "n0", "n1", "n1"}, {"n2", "n3", "n3", "n3"}});
  ASSERT_EQ(rings.size(), 3u);
  EXPECT_EQ(rings[0].parameters, (std::vector<std::string>{"a"}));
  EXPECT_EQ(rings[0].holders, (std::vector<std::string>{"n0", "n2"}));
  EXPECT_EQ(rings[1].parameters, (std::vector<std::string>{"b"}));
  EXPECT_EQ(rings[1].holders, (std::vector<std::string>{"n0", "n3"}));
  EXPECT_EQ(rings[2].parameters, (std::vector<std::string>{"c", "d"}));
  EXPECT_EQ(rings[2].id, "ring_2");
}

}  // namespace
}  // namespace cairn::clusterize
