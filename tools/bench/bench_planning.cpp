// Planning time (profiling excluded): a synthetic 200-unit model over 1,000 heterogeneous nodes,
// through cluster formation, the per-cluster DP and ring grouping. Prints figures; no assertion.
//   build/tools/bench/bench_planning [--units 200] [--nodes 1000] [--seed 1]
#include <chrono>
#include <cstdio>
#include <random>

#include <CLI/CLI.hpp>

#include "clusterize/ClusterFormer.h"
#include "clusterize/CostModel.h"
#include "clusterize/RingGroups.h"

#include "tools/bench/BenchMains.h"

// Inside cairn_bench (tools/bench/bench_main.cpp), run as build/tools/bench/bench_planning.
namespace cairn::bench::planning {

int run(int argc, char** argv) {
  using namespace cairn::clusterize;
  int units = 200, node_count = 1000, rounds = ClusterFormerOptions{}.balance_rounds;
  uint64_t seed = 1;
  CLI::App app{"bench_planning: time clusterize's planning for a synthetic model and node set"};
  app.add_option("--units", units, "units (atoms) in the model")->capture_default_str();
  app.add_option("--nodes", node_count, "nodes")->capture_default_str();
  app.add_option("--seed", seed, "seed for the synthetic costs and nodes")->capture_default_str();
  app.add_option("--balance-rounds", rounds, "cluster balancing rounds")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> param_mb(1, 40), saved_mb(1, 20), ms(1, 10), boundary_mb(0.5, 8);
  std::vector<AtomCost> atoms;
  for (int i = 0; i < units; ++i) {
    const double p = param_mb(rng) * 1e6;
    atoms.push_back({p, p, 0, saved_mb(rng) * 1e6, ms(rng) * 1e-3});
  }
  std::vector<double> boundary;
  for (int i = 0; i <= units; ++i) boundary.push_back(boundary_mb(rng) * 1e6);
  const CostModel cost(atoms, boundary, {OptimizerKind::kAdam, 4});
  const double model_gb = cost.memoryLowerBound(0, units) / 1e9;

  std::vector<PlannerNode> nodes;
  std::uniform_int_distribution<int> ram_choice(0, 3);
  const double ram_gb[] = {4, 8, 16, 24};
  std::uniform_real_distribution<double> speed(0.5, 2.0), mbps(50, 1000);
  for (int i = 0; i < node_count; ++i)
    nodes.push_back({ram_gb[ram_choice(rng)] * 1e9, speed(rng), mbps(rng) * 1e6 / 8});

  const auto start = std::chrono::steady_clock::now();
  ClusterFormerOptions options;
  options.seed = seed;
  options.balance_rounds = rounds;
  const ClusterFormation formation = formClusters(cost, nodes, options);
  const auto formed = std::chrono::steady_clock::now();
  // Ring membership: each unit's parameters are one named tensor here.
  std::vector<std::string> params;
  for (int i = 0; i < units; ++i) params.push_back("unit" + std::to_string(i) + ".weight");
  std::vector<std::vector<std::string>> holders;
  for (const auto& c : formation.clusters) {
    std::vector<std::string> holder(units);
    for (const auto& s : c.partition.stages)
      for (int a = s.begin_atom; a < s.end_atom; ++a) holder[a] = "node_" + std::to_string(c.nodes[s.node]);
    holders.push_back(holder);
  }
  const auto rings = groupRings(params, holders);
  const auto end = std::chrono::steady_clock::now();

  double slow = 0, fast = 1e30;
  size_t stages = 0;
  for (const auto& c : formation.clusters) {
    slow = std::max(slow, c.partition.bottleneck_seconds);
    fast = std::min(fast, c.partition.bottleneck_seconds);
    stages += c.partition.stages.size();
  }
  std::printf("model: %d units, %.1f GB to train (Adam, 4 micro-batches in flight)\n", units, model_gb);
  std::printf("nodes: %d (4-24 GB, speed 0.5-2.0, 50-1000 Mbps)\n", node_count);
  std::printf("clusters: %zu, stages: %zu, spare nodes: %zu, ring groups: %zu\n",
              formation.clusters.size(), stages, formation.spare.size(), rings.size());
  std::printf("bottleneck per micro-batch: fastest cluster %.1f ms, slowest %.1f ms\n", fast * 1e3, slow * 1e3);
  std::printf("planning time: %.3f s (cluster formation + DP %.3f s, rings %.3f s)\n",
              std::chrono::duration<double>(end - start).count(),
              std::chrono::duration<double>(formed - start).count(),
              std::chrono::duration<double>(end - formed).count());
  return 0;
}

}  // namespace cairn::bench::planning
