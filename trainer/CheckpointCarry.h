// CheckpointCarry: carries a run's checkpoints into a re-cut plan of the same model (issue [I]
// part 2; docs/CLUSTERIZE.md "Rebalancing from measurement", "Carrying the run over"). A stage
// checkpoint (trainer/Checkpoint.h) keys its weights by parameter name ("stage.<name>") but its
// optimizer state and accumulated gradients by the parameter's position in its stage
// ("optim.<i>.<field>", "grad.<i>"). Carrying maps every old stage's positions to names (the
// stage module's trainable parameters in the optimizer's order, trainableParameters), gathers a
// cluster's state by name, and writes one checkpoint per new stage with that stage's positions,
// so `provider --resume` (StageTrainerConfig::resume_step) loads it as if the new stage had
// written it. The step, the run plan, the data cursor, the async counters and the ring-sync
// step are the old checkpoints'; the CPU generator state of a new stage is the one of the old
// stage that held its first parameter or buffer (dropout draws of units that moved differ from
// the uninterrupted run's). Old cluster c continues as new cluster c.
// Refused (BadInput, exit 2, naming the file and key): a node without a valid checkpoint, no step
// every old node holds, job ids, optimizers or schedules that differ, a parameter or buffer one
// side holds and the other does not (or of another shape or dtype), a different number of
// clusters, DiLoCo outer state (sync tensors: not re-mapped).
// Thread-safety: free functions. Needs torch (loads the stage modules).
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/NodeData.h"
#include "trainer/Checkpoint.h"

namespace cairn {

// One stage of a plan as carrying sees it.
struct CarryStage {
  NodeSpec node;
  // The stage module's parameters then buffers (named_parameters, named_buffers order): names,
  // shapes and dtypes.
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::vector<std::string> trainable;  // the optimizer's order (trainableParameters)
  // A parameter's other names: tied inside the stage (one tensor under several names) and, for a
  // copy of a parameter several stages hold (node.json shared_parameters), its first name. Keys:
  // the names with others, and every such copy's name (its list may be empty: one name).
  std::map<std::string, std::vector<std::string>> aliases;
};

CarryStage carryStageOf(const NodeSpec& node, const torch::jit::Module& stage);
// Every node of NODE_DATA (nodes/*/node.json with its stage file), by cluster then stage.
std::vector<CarryStage> readCarryStages(const std::string& node_data);

// The checkpoint folder a provider uses for a node: NODE_DATA/nodes/<name>/checkpoints.
std::string nodeCheckpointDir(const std::string& node_data, const std::string& node_name);

// The pure re-mapping of one cluster: `old_stages[i]`'s state at one step is `old_checkpoints[i]`
// (`sources[i]` names its file in errors); returns one checkpoint per `new_stages` entry, same
// order. Both lists are one cluster's stages in chain order.
std::vector<CheckpointData> remapClusterCheckpoints(const std::vector<CarryStage>& old_stages,
                                                    const std::vector<CheckpointData>& old_checkpoints,
                                                    const std::vector<std::string>& sources,
                                                    const std::vector<CarryStage>& new_stages);

struct CarryResult {
  int64_t step = 0;
  std::map<std::string, CheckpointData> checkpoints;  // new node name → its checkpoint
};

// Reads OLD_NODE_DATA's plan (node.json + stage files), job.json and every node's checkpoints,
// picks `step` (-1: the newest step every old node holds a valid checkpoint of) and re-maps
// them onto `new_stages` (every node of the new plan) trained under `new_job` (`new_job_source`
// names it in errors). Nothing is written.
CarryResult planCarry(const std::string& old_node_data, const JobSpec& new_job,
                      const std::string& new_job_source, const std::vector<CarryStage>& new_stages,
                      int64_t step = -1);
// Writes each checkpoint to NEW_NODE_DATA/nodes/<name>/checkpoints/step_<S>.ckpt; returns the paths.
std::vector<std::string> writeCarry(const std::string& new_node_data, const CarryResult& carry);

}  // namespace cairn
