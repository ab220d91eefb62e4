#include "coordinator/FinalResult.h"

#include <filesystem>
#include <sstream>

#include "core/Error.h"
#include "core/Log.h"
#include "core/NodeData.h"
#include "trainer/Checkpoint.h"

namespace cairn::coordinator {

std::optional<ResultUpload> resultFromFinalCheckpoint(const std::string& out, const std::string& name,
                                                      const StoredCheckpoint& checkpoint) {
  const std::filesystem::path path(checkpoint.path);
  const CheckpointData data = readCheckpoint(path.parent_path().string(), checkpoint.step);
  const auto total = data.meta.find("total_steps");
  if (total == data.meta.end() || !total->is_number_integer() || data.step < total->get<int64_t>())
    return std::nullopt;
  const NodeSpec node = readNodeSpec(nodeSpecPath(out, name));
  const std::string dir = nodeDirectory(out, name);
  torch::jit::Module stage = torch::jit::load(dir + "/" + node.stage_file);
  loadStageWeights(stage, data, checkpoint.path);
  std::ostringstream bytes;  // the bytes a node's `result` upload carries; onResult writes the file
  stage.save(bytes);
  ResultUpload result;
  result.name = name;
  result.trained_stage = bytes.str();
  result.summary = {{"steps", data.step}, {"stopped", false}, {"from_checkpoint", data.step}};
  return result;
}

std::optional<ResultUpload> FinalResults::take(const std::string& out, const std::string& name,
                                               const std::optional<StoredCheckpoint>& held) {
  if (!held) return std::nullopt;
  const auto seen = not_final_.find(name);
  if (seen != not_final_.end() && seen->second == held->step) return std::nullopt;
  std::optional<ResultUpload> result;
  try {
    result = resultFromFinalCheckpoint(out, name, *held);
  } catch (const Error& e) {
    CAIRN_WARN("coordinator: cannot make ", name, "'s result from its checkpoint: ", e.what());
  }
  if (!result) {
    not_final_[name] = held->step;
    return std::nullopt;
  }
  CAIRN_WARN("coordinator: ", name, " was lost after its final checkpoint (step ", held->step,
             "): its result is that checkpoint's weights; no spare needed");
  return result;
}

}  // namespace cairn::coordinator
