// PlannerNodes: node_configs.json's figures as the planner sees them (PlannerNode): memory bound in
// bytes, speed relative to the profiling host, link bytes/s, and for a GPU node its host<->device
// copy rates. docs/CLUSTERIZE.md "GPU nodes" has the formulas. Pure functions; thread-safe.
//
// Without GPU nodes the speed is relative, as it always was: compute / mean compute of the nodes
// that give one (1 when absent), so a node of average compute runs at the profiling host's speed.
// With a GPU node, speeds are absolute: profiled seconds were measured on this host, so a node
// runs them at node GFLOPS / host GFLOPS, where node GFLOPS = its first GPU's fp32_tflops x 1000
// (bf16_tflops x 1000 when the job trains in bf16), or its CPU `compute` (GFLOPS), or the host's
// own when it gives none. A GPU node's memory bound is its first GPU's memory_gb, not its ram.
#pragma once

#include <vector>

#include "clusterize/PartitionPlanner.h"
#include "core/NodeConfigs.h"

namespace cairn::clusterize {

// What absolute speeds are measured against.
struct SpeedBasis {
  double host_gflops = 0;  // the profiling host's float32 sgemm GFLOPS (needed when a GPU is in)
  bool bf16 = false;       // training_definition.precision is "bf16": GPUs count bf16_tflops
};

bool anyGpu(const std::vector<NodeConfig>& nodes);

// Per-node speed relative to the profiling host: compute / mean compute (1 when absent). The rule
// without GPU nodes.
std::vector<double> relativeSpeeds(const std::vector<NodeConfig>& nodes);

// The GFLOPS a node trains at: gpus[0]'s (fp32 or bf16) TFLOP/s x 1000, else `compute`, else the
// host's.
double nodeGflops(const NodeConfig& node, const SpeedBasis& basis);

// The planner's nodes. Without GPU nodes basis is not used (relative speeds); with one,
// basis.host_gflops must be positive.
std::vector<PlannerNode> plannerNodes(const std::vector<NodeConfig>& configs,
                                      const SpeedBasis& basis);

}  // namespace cairn::clusterize
