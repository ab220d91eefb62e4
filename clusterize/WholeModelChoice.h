// WholeModelChoice: with GPU nodes, cutting the model is not always worth it. A pipeline stage on
// a GPU waits for activations over the network (one cut of a 163M GPT carries ~25 MB per step
// each way; a home link moves ~6 MB/s), while a GPU that holds the whole model needs none. So
// when some node has a GPU the planner weighs two plans by the estimated throughput of the whole
// run and keeps the better (docs/CLUSTERIZE.md "GPU nodes"):
//   cut                  the ClusterFormer's clusters and splits (stage times with link costs);
//   whole_model_per_gpu  each GPU node that holds the whole model is a cluster of its own (the
//                        fastest k of them, k chosen by the estimate), the other nodes form
//                        clusters of their own if that raises the estimate, else stay spare;
//                        clusters sync with the job's mode (average / diloco).
// The estimate (runStepSeconds): clusters step in lock-step between syncs, so
//   step  = max over clusters c of (M + S_c - 1) * b_c  +  sync / L
//   rate  = K * M / step                                  micro-batches per second, whole run
// b_c: cluster c's slowest stage seconds per micro-batch, S_c its stages, M micro-batches per
// step, K clusters; sync (0 when K = 1) = the slowest placed node's ring all-reduce,
// 2 (K - 1) / K * bytes * codec / bandwidth (+ the GPU's copies of those bytes both ways), bytes =
// its stage's parameters and buffers (average, diloco; every L = local_steps steps) or trainable
// parameters (gradients; every step, L = 1); codec = training_definition.wire.sync (fp32 1,
// bf16 1/2, int8 1/4). Pure functions; thread-safe.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "clusterize/ClusterFormer.h"
#include "clusterize/CostModel.h"
#include "clusterize/PartitionPlan.h"
#include "clusterize/PartitionPlanner.h"

namespace cairn::clusterize {

// How a step of the run goes, for the estimate: read leniently from training_definition (the
// providers validate it; anything unreadable counts as the default).
struct RunShape {
  int microbatches = 4;           // M
  std::string sync = "average";   // "average" | "diloco" | "gradients"
  int local_steps = 1;            // L for average / diloco
  double sync_bytes_factor = 1;   // wire.sync: fp32 1, bf16 0.5, int8 0.25
};
RunShape runShapeOf(const nlohmann::json& training_definition, int microbatches);
// training_definition.precision is "bf16".
bool trainsInBf16(const nlohmann::json& training_definition);

double runStepSeconds(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                      const ClusterFormation& formation, const RunShape& shape);
// K * M / runStepSeconds; 0 for a formation without clusters.
double runMicrobatchesPerSecond(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                                const ClusterFormation& formation, const RunShape& shape);

// The whole-model-per-GPU plan with the best estimate; no clusters when no GPU node holds the
// whole model. The other nodes' clusters are formed with `options` (seed, tolerance; as many
// clusters as memory allows).
ClusterFormation wholeModelPerGpu(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                                  const RunShape& shape, const ClusterFormerOptions& options);

// formClusters(cost, nodes, options), and, unless `whole_not_considered` says why not (e.g.
// fixed --cuts), wholeModelPerGpu; returns the one with the higher estimate (ties: the whole
// model per GPU, which sends no activations) and
// fills choice's chosen, estimates and note. Throws as formClusters does.
ClusterFormation chooseFormation(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                                 const ClusterFormerOptions& options, const RunShape& shape,
                                 const std::string& whole_not_considered, GpuPlanChoice* choice);

}  // namespace cairn::clusterize
