// GPU nodes in the planner, on made-up node configs and synthetic atom costs (no timing): how a
// node's speed, memory and copies come from benchmarks.gpus (PlannerNodes), that a GPU next to two
// CPU nodes gets the stage with the most compute (checked against a brute force over every order
// and split), and that the whole-model-per-GPU choice (WholeModelChoice) wins on slow links and
// loses to cutting on fast ones. The references below recompute stage times, memory and the run
// estimate from the scenario's own numbers, not through CostModel.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>

#include "clusterize/ClusterFormer.h"
#include "clusterize/CostModel.h"
#include "clusterize/PlannerNodes.h"
#include "clusterize/WholeModelChoice.h"

namespace cairn::clusterize {
namespace {

constexpr double kHostGflops = 100;
constexpr double kGb = 1e9;

// A model of equal-shaped atoms: every atom has these parameters and saved bytes, every interior
// cut carries `boundary` bytes, the input `input` bytes, the output 4 kB. SGD: memory = 2 x
// parameters (weights + gradients) + M x (saved + incoming) + incoming + outgoing.
struct Scenario {
  std::vector<double> seconds;  // per atom, at the host's speed
  double parameter_bytes = 0.1e9;
  double saved_bytes = 1e6;
  double boundary = 1e6;
  double input = 1e6;
  int microbatches = 8;

  int atoms() const { return static_cast<int>(seconds.size()); }
  double cut(int c) const { return c == 0 ? input : c == atoms() ? 4e3 : boundary; }
};

CostModel costOf(const Scenario& s) {
  std::vector<AtomCost> atoms;
  for (double sec : s.seconds) atoms.push_back({s.parameter_bytes, s.parameter_bytes, 0, s.saved_bytes, sec});
  std::vector<double> boundary;
  for (int c = 0; c <= s.atoms(); ++c) boundary.push_back(s.cut(c));
  return CostModel(std::move(atoms), std::move(boundary), {OptimizerKind::kSgd, s.microbatches});
}

NodeConfig cpuNode(const std::string& id, double ram_gb, double gflops, double mbps) {
  NodeConfig n;
  n.id = id;
  n.name = "node_" + id;
  n.host = "127.0.0.1";
  n.port = 5000 + std::stoi(id);
  n.ram_gb = ram_gb;
  n.bandwidth_mbps = mbps;
  n.compute = gflops;
  return n;
}

NodeConfig gpuNode(const std::string& id, double memory_gb, double fp32_tflops, double mbps) {
  NodeConfig n = cpuNode(id, 64, 150, mbps);  // its CPU figures do not count: it trains on the GPU
  n.gpus.push_back({"Test GPU", memory_gb, fp32_tflops, 4 * fp32_tflops, 10, 10});
  return n;
}

// --- the independent reference -------------------------------------------------------------

double refGflops(const NodeConfig& n) { return n.gpus.empty() ? *n.compute : n.gpus[0].fp32_tflops * 1000; }
double refCapacity(const NodeConfig& n) { return (n.gpus.empty() ? n.ram_gb : n.gpus[0].memory_gb) * kGb; }

double refSeconds(const Scenario& s, const NodeConfig& n, int b, int e) {
  double compute = 0;
  for (int a = b; a < e; ++a) compute += s.seconds[a];
  const double in = s.cut(b), out = e < s.atoms() ? s.cut(e) : 0, grad_up = b > 0 ? s.cut(b) : 0;
  double t = compute * kHostGflops / refGflops(n) + (out + grad_up) / (n.bandwidth_mbps * 1e6 / 8);
  if (!n.gpus.empty()) t += (in + out) / (n.gpus[0].h2d_gb_per_s * kGb) + (out + grad_up) / (n.gpus[0].d2h_gb_per_s * kGb);
  return t;
}

bool refFits(const Scenario& s, const NodeConfig& n, int b, int e) {
  const double in = s.cut(b), out = s.cut(e);
  const double memory = (e - b) * (2 * s.parameter_bytes + s.microbatches * s.saved_bytes) +
                        s.microbatches * in + in + out;
  return memory <= refCapacity(n);
}

struct RefBest {
  double bottleneck = std::numeric_limits<double>::infinity();  // smallest slowest stage
  double step = std::numeric_limits<double>::infinity();        // smallest (M + S - 1) x slowest
  int step_stages = 0;                                          // S of that one
};

// Every order of the nodes and every split into contiguous, possibly empty ranges: one pipeline.
RefBest bruteForce(const Scenario& s, const std::vector<NodeConfig>& nodes) {
  RefBest best;
  std::vector<int> order(nodes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  const int n = s.atoms();
  do {
    std::vector<int> ends(order.size(), 0);
    // ends[k]: where node order[k]'s range ends (it begins where order[k - 1]'s ended).
    std::function<void(size_t, int)> place = [&](size_t k, int begin) {
      const bool last = k + 1 == order.size();
      for (int e = last ? n : begin; e <= n; ++e) {
        ends[k] = e;
        if (!last) {
          place(k + 1, e);
          continue;
        }
        double slowest = 0;
        int stages = 0;
        bool ok = true;
        for (size_t j = 0; j < order.size(); ++j) {
          const int b = j == 0 ? 0 : ends[j - 1];
          if (ends[j] == b) continue;  // an empty range: the node is left out
          const NodeConfig& node = nodes[order[j]];
          ok = ok && refFits(s, node, b, ends[j]);
          slowest = std::max(slowest, refSeconds(s, node, b, ends[j]));
          ++stages;
        }
        if (!ok) continue;
        best.bottleneck = std::min(best.bottleneck, slowest);
        const double step = (s.microbatches + stages - 1) * slowest;
        if (step < best.step) {
          best.step = step;
          best.step_stages = stages;
        }
      }
    };
    place(0, 0);
  } while (std::next_permutation(order.begin(), order.end()));
  return best;
}

// --- helpers -------------------------------------------------------------------------------

std::vector<PlannerNode> planned(const std::vector<NodeConfig>& configs) {
  return plannerNodes(configs, SpeedBasis{kHostGflops, false});
}

struct Chosen {
  ClusterFormation formation;
  GpuPlanChoice choice;
};

Chosen choose(const Scenario& s, const std::vector<NodeConfig>& configs) {
  Chosen out;
  const CostModel cost = costOf(s);
  RunShape shape;
  shape.microbatches = s.microbatches;
  out.formation = chooseFormation(cost, planned(configs), ClusterFormerOptions{}, shape, "", &out.choice);
  return out;
}

double stageCompute(const Scenario& s, const StagePlacement& stage) {
  double sum = 0;
  for (int a = stage.begin_atom; a < stage.end_atom; ++a) sum += s.seconds[a];
  return sum;
}

Scenario equalAtoms(double boundary) {
  Scenario s;
  s.seconds.assign(16, 1.0);
  s.boundary = boundary;
  return s;
}

// One GPU (0.4 TFLOP/s: 4x this host; 8 GB holds the 3.3 GB model) and two CPU nodes (200 GFLOPS:
// 2x; 1 GB each, at most 4 of the 16 atoms, so they cannot hold the model even together).
std::vector<NodeConfig> oneGpuTwoCpus(double mbps, double gpu_gb = 8, double cpu_gb = 1) {
  return {gpuNode("0", gpu_gb, 0.4, mbps), cpuNode("1", cpu_gb, 200, mbps), cpuNode("2", cpu_gb, 200, mbps)};
}

// --- PlannerNodes ---------------------------------------------------------------------------

TEST(GpuPlannerNodes, SpeedsScaleByHostGflopsAndGpuMemoryIsTheBound) {
  const std::vector<NodeConfig> configs = {gpuNode("0", 24, 51, 1000), cpuNode("1", 16, 250, 100),
                                           [] { NodeConfig n = cpuNode("2", 8, 1, 100); n.compute.reset(); return n; }()};
  const auto fp32 = plannerNodes(configs, SpeedBasis{kHostGflops, false});
  EXPECT_DOUBLE_EQ(fp32[0].speed, 51000 / kHostGflops);  // fp32_tflops x 1000 / host GFLOPS
  EXPECT_DOUBLE_EQ(fp32[1].speed, 250 / kHostGflops);    // compute / host GFLOPS
  EXPECT_DOUBLE_EQ(fp32[2].speed, 1);                    // no figure: the host's own speed
  EXPECT_DOUBLE_EQ(fp32[0].capacity_bytes, 24e9);        // the GPU's memory, not the 64 GB ram
  EXPECT_DOUBLE_EQ(fp32[1].capacity_bytes, 16e9);
  EXPECT_DOUBLE_EQ(fp32[0].h2d_bytes_per_s, 10e9);
  EXPECT_TRUE(fp32[0].isGpu());
  EXPECT_FALSE(fp32[1].isGpu());
  EXPECT_DOUBLE_EQ(fp32[0].bandwidth_bytes_per_s, 1000e6 / 8);
  const auto bf16 = plannerNodes(configs, SpeedBasis{kHostGflops, true});
  EXPECT_DOUBLE_EQ(bf16[0].speed, 4 * 51000 / kHostGflops);  // bf16_tflops for a bf16 job
  EXPECT_DOUBLE_EQ(bf16[1].speed, 250 / kHostGflops);
}

TEST(GpuPlannerNodes, WithoutGpusSpeedsStayRelativeToTheMean) {
  const std::vector<NodeConfig> configs = {cpuNode("0", 8, 10, 100), cpuNode("1", 8, 30, 100)};
  const auto nodes = plannerNodes(configs, SpeedBasis{});  // no host figure needed
  EXPECT_DOUBLE_EQ(nodes[0].speed, 0.5);
  EXPECT_DOUBLE_EQ(nodes[1].speed, 1.5);
  EXPECT_DOUBLE_EQ(nodes[0].capacity_bytes, 8e9);
  EXPECT_FALSE(nodes[0].isGpu());
}

TEST(GpuPlannerNodes, AGpuStagePaysItsCopiesBothWays) {
  const Scenario s = equalAtoms(25e6);
  const CostModel cost = costOf(s);
  const auto configs = oneGpuTwoCpus(50);
  const auto nodes = planned(configs);
  for (int b : {0, 3})
    for (int e : {5, 16})
      for (int n = 0; n < 3; ++n)
        EXPECT_NEAR(stageSeconds(cost, nodes[n], b, e), refSeconds(s, configs[n], b, e), 1e-12)
            << "node " << n << " [" << b << ", " << e << ")";
}

TEST(GpuRunShape, ReadsSyncLocalStepsWireAndPrecision) {
  const auto shape = runShapeOf(nlohmann::json::parse(
      R"({"sync": {"name": "diloco", "outer_lr": 0.7}, "local_steps": 20, "wire": {"sync": "bf16"}})"), 6);
  EXPECT_EQ(shape.microbatches, 6);
  EXPECT_EQ(shape.sync, "diloco");
  EXPECT_EQ(shape.local_steps, 20);
  EXPECT_DOUBLE_EQ(shape.sync_bytes_factor, 0.5);
  const auto plain = runShapeOf(nlohmann::json::object(), 4);
  EXPECT_EQ(plain.sync, "average");
  EXPECT_EQ(plain.local_steps, 1);
  EXPECT_DOUBLE_EQ(plain.sync_bytes_factor, 1);
  EXPECT_TRUE(trainsInBf16(nlohmann::json::parse(R"({"precision": "bf16"})")));
  EXPECT_FALSE(trainsInBf16(nlohmann::json::parse(R"({"precision": "fp32"})")));
}

// --- (a) the GPU gets the stage with the most compute ---------------------------------------

TEST(GpuPlan, TheGpuGetsTheStageWithTheMostComputeOnFastLinks) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    Scenario s;
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> cost(0.2, 2.0);
    for (int a = 0; a < 10; ++a) s.seconds.push_back(cost(rng));
    // GPU 2 TFLOP/s (20x the host), CPUs 100 and 50 GFLOPS (1x, 0.5x); 10 Gbit/s. The GPU's
    // 1.8 GB holds at most 8 of the 10 atoms (0.2 GB each), a CPU's 0.7 GB 3: the model is cut.
    const std::vector<NodeConfig> configs = {cpuNode("0", 0.7, 100, 10000), gpuNode("1", 1.8, 2.0, 10000),
                                             cpuNode("2", 0.7, 50, 10000)};
    const Chosen chosen = choose(s, configs);
    SCOPED_TRACE("seed " + std::to_string(seed));
    EXPECT_EQ(chosen.choice.chosen, "cut");
    EXPECT_EQ(chosen.choice.whole_microbatches_per_s, 0);
    EXPECT_NE(chosen.choice.note.find("no GPU's memory holds the whole model"), std::string::npos);
    ASSERT_EQ(chosen.formation.clusters.size(), 1u);
    const FormedCluster& cluster = chosen.formation.clusters[0];
    const RefBest ref = bruteForce(s, configs);
    EXPECT_NEAR(cluster.partition.bottleneck_seconds, ref.bottleneck, 1e-9 * ref.bottleneck);
    double gpu_compute = -1, most = 0;
    for (const StagePlacement& stage : cluster.partition.stages) {
      most = std::max(most, stageCompute(s, stage));
      if (cluster.nodes[stage.node] == 1) gpu_compute = stageCompute(s, stage);
    }
    EXPECT_EQ(gpu_compute, most);
  }
}

// --- (c) a fast link: cutting wins ----------------------------------------------------------

TEST(GpuPlan, FastLinksCutTheModelOverTheGpuAndCpus) {
  const Scenario s = equalAtoms(1e6);
  const auto configs = oneGpuTwoCpus(10000);  // 10 Gbit/s
  const Chosen chosen = choose(s, configs);
  EXPECT_EQ(chosen.choice.chosen, "cut");
  ASSERT_EQ(chosen.formation.clusters.size(), 1u);
  const FormedCluster& cluster = chosen.formation.clusters[0];
  ASSERT_EQ(cluster.partition.stages.size(), 3u);
  for (const StagePlacement& stage : cluster.partition.stages)
    if (cluster.nodes[stage.node] == 0) {
      EXPECT_EQ(stage.end_atom - stage.begin_atom, 8);  // 8 of 16
    }
  // The estimates, recomputed: one pipeline of S = 3 at the brute-force bottleneck, against the GPU
  // alone (M x its whole-model time per step).
  const RefBest ref = bruteForce(s, configs);
  const double whole_step = s.microbatches * refSeconds(s, configs[0], 0, 16);
  EXPECT_NEAR(chosen.choice.cut_microbatches_per_s, s.microbatches / ((s.microbatches + 2) * ref.bottleneck), 1e-9);
  EXPECT_NEAR(chosen.choice.whole_microbatches_per_s, s.microbatches / whole_step, 1e-9);
  EXPECT_GT(chosen.choice.cut_microbatches_per_s, 1.5 * chosen.choice.whole_microbatches_per_s);
  EXPECT_LT(ref.step, whole_step);  // brute force agrees: some cut steps faster than the GPU alone
}

// --- (b) slow links: a whole model per GPU --------------------------------------------------

TEST(GpuPlan, SlowLinksAndBigBoundariesKeepTheWholeModelOnTheGpu) {
  // One cut of a 163M GPT carries ~25 MB each way; a home link moves 50 Mbit/s (4 s per transfer).
  const Scenario s = equalAtoms(25e6);
  const auto configs = oneGpuTwoCpus(50);
  const Chosen chosen = choose(s, configs);
  EXPECT_EQ(chosen.choice.chosen, "whole_model_per_gpu");
  ASSERT_EQ(chosen.formation.clusters.size(), 1u);
  const FormedCluster& cluster = chosen.formation.clusters[0];
  ASSERT_EQ(cluster.partition.stages.size(), 1u);
  EXPECT_EQ(cluster.nodes[cluster.partition.stages[0].node], 0);
  EXPECT_EQ(cluster.partition.stages[0].end_atom, 16);
  EXPECT_EQ(chosen.formation.spare, (std::vector<int>{1, 2}));
  EXPECT_GE(chosen.choice.whole_microbatches_per_s, chosen.choice.cut_microbatches_per_s);
  EXPECT_NEAR(chosen.choice.whole_microbatches_per_s, 1 / refSeconds(s, configs[0], 0, 16), 1e-9);
  EXPECT_EQ(bruteForce(s, configs).step_stages, 1);  // no cut of any order steps faster
}

TEST(GpuPlan, ASlowLinkCutWithASmallerBottleneckStillLosesToTheWholeModel) {
  // 6.25 MB boundaries at 50 Mbit/s: 1 s per transfer. Cutting lowers the slowest stage (GPU 10
  // atoms + 1 s vs 4 s for all 16) but three stages fill and drain the pipeline: per step
  // (8 + 2) x 3.5 s > 8 x 4 s.
  const Scenario s = equalAtoms(6.25e6);
  const auto configs = oneGpuTwoCpus(50);
  const CostModel cost = costOf(s);
  const ClusterFormation cut = formClusters(cost, planned(configs), ClusterFormerOptions{});
  ASSERT_EQ(cut.clusters.size(), 1u);
  EXPECT_EQ(cut.clusters[0].partition.stages.size(), 3u);
  EXPECT_LT(cut.clusters[0].partition.bottleneck_seconds, refSeconds(s, configs[0], 0, 16));

  const Chosen chosen = choose(s, configs);
  EXPECT_EQ(chosen.choice.chosen, "whole_model_per_gpu");
  EXPECT_GT(chosen.choice.whole_microbatches_per_s, 1.05 * chosen.choice.cut_microbatches_per_s);
  const RefBest ref = bruteForce(s, configs);
  EXPECT_EQ(ref.step_stages, 1);
  EXPECT_NEAR(chosen.choice.cut_microbatches_per_s, s.microbatches / ((s.microbatches + 2) * ref.bottleneck), 1e-9);
}

TEST(GpuPlan, SlowLinksDropACpuClusterThatHoldsEveryoneBackAtTheSync) {
  // The CPU nodes hold the model together (2.5 GB each), so the cluster former makes two clusters:
  // the GPU alone and a CPU pipeline. In lock-step with average sync every step over 50 Mbit/s
  // (1.6 GB of parameters), that run is far slower than the GPU alone, the CPUs spare.
  const Scenario s = equalAtoms(6.25e6);
  const auto configs = oneGpuTwoCpus(50, 8, 2.5);
  const CostModel cost = costOf(s);
  const ClusterFormation cut = formClusters(cost, planned(configs), ClusterFormerOptions{});
  ASSERT_EQ(cut.clusters.size(), 2u);

  const Chosen chosen = choose(s, configs);
  EXPECT_EQ(chosen.choice.chosen, "whole_model_per_gpu");
  ASSERT_EQ(chosen.formation.clusters.size(), 1u);
  EXPECT_EQ(chosen.formation.spare, (std::vector<int>{1, 2}));
  // The cut run's estimate, recomputed: K = 2, M = 8; step = slowest pipeline + one ring sync of
  // the largest stage state: 2 (K - 1) / K x bytes / bandwidth (+ the GPU's copies of its state).
  double pipelines = 0, sync = 0;
  for (const FormedCluster& c : cut.clusters) {
    const double stages = static_cast<double>(c.partition.stages.size());
    pipelines = std::max(pipelines, (s.microbatches + stages - 1) * c.partition.bottleneck_seconds);
    for (const StagePlacement& st : c.partition.stages) {
      const NodeConfig& n = configs[c.nodes[st.node]];
      const double state = (st.end_atom - st.begin_atom) * s.parameter_bytes;
      double t = state / (n.bandwidth_mbps * 1e6 / 8);
      if (!n.gpus.empty()) t += 2 * state / 10e9;
      sync = std::max(sync, t);
    }
  }
  EXPECT_NEAR(chosen.choice.cut_microbatches_per_s, 2 * s.microbatches / (pipelines + sync), 1e-9);
  EXPECT_GT(chosen.choice.whole_microbatches_per_s, 3 * chosen.choice.cut_microbatches_per_s);
}

TEST(GpuPlan, FixedShapesAreNotReconsidered) {
  const Scenario s = equalAtoms(25e6);
  const auto configs = oneGpuTwoCpus(50);
  const CostModel cost = costOf(s);
  GpuPlanChoice choice;
  ClusterFormerOptions options;
  options.clusters = 1;
  chooseFormation(cost, planned(configs), options, RunShape{}, "--clusters fixes the number of clusters",
                  &choice);
  EXPECT_EQ(choice.chosen, "cut");
  EXPECT_EQ(choice.whole_microbatches_per_s, 0);
  EXPECT_EQ(choice.note, "whole model per GPU not considered: --clusters fixes the number of clusters");
  EXPECT_GT(choice.cut_microbatches_per_s, 0);
}

}  // namespace
}  // namespace cairn::clusterize
