#include "clusterize/PlannerNodes.h"

#include <algorithm>

#include "core/Error.h"

namespace cairn::clusterize {
namespace {

constexpr double kPlannerBytesPerGb = 1e9;

}  // namespace

bool anyGpu(const std::vector<NodeConfig>& nodes) {
  return std::any_of(nodes.begin(), nodes.end(), [](const NodeConfig& n) { return !n.gpus.empty(); });
}

std::vector<double> relativeSpeeds(const std::vector<NodeConfig>& nodes) {
  double sum = 0;
  int count = 0;
  for (const auto& n : nodes)
    if (n.compute) {
      sum += *n.compute;
      ++count;
    }
  const double mean = count > 0 ? sum / count : 1.0;
  std::vector<double> speeds;
  for (const auto& n : nodes) speeds.push_back(n.compute ? *n.compute / mean : 1.0);
  return speeds;
}

double nodeGflops(const NodeConfig& node, const SpeedBasis& basis) {
  if (!node.gpus.empty()) {
    const GpuFigures& gpu = node.gpus.front();
    return (basis.bf16 ? gpu.bf16_tflops : gpu.fp32_tflops) * 1000;
  }
  return node.compute ? *node.compute : basis.host_gflops;
}

std::vector<PlannerNode> plannerNodes(const std::vector<NodeConfig>& configs,
                                      const SpeedBasis& basis) {
  const bool gpus = anyGpu(configs);
  CAIRN_ENFORCE(!gpus || basis.host_gflops > 0, "GPU nodes need the profiling host's GFLOPS");
  const std::vector<double> relative = gpus ? std::vector<double>() : relativeSpeeds(configs);
  std::vector<PlannerNode> nodes;
  for (size_t i = 0; i < configs.size(); ++i) {
    const NodeConfig& config = configs[i];
    PlannerNode node;
    node.capacity_bytes = config.ram_gb * kPlannerBytesPerGb;
    node.speed = gpus ? nodeGflops(config, basis) / basis.host_gflops : relative[i];
    node.bandwidth_bytes_per_s = config.bandwidth_mbps * 1e6 / 8;
    if (!config.gpus.empty()) {
      const GpuFigures& gpu = config.gpus.front();
      node.capacity_bytes = gpu.memory_gb * kPlannerBytesPerGb;
      node.h2d_bytes_per_s = gpu.h2d_gb_per_s * kPlannerBytesPerGb;
      node.d2h_bytes_per_s = gpu.d2h_gb_per_s * kPlannerBytesPerGb;
    }
    nodes.push_back(node);
  }
  return nodes;
}

}  // namespace cairn::clusterize
