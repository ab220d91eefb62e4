#include "coordinator/FinalResult.h"

#include <filesystem>

#include "clusterize/ModelMerge.h"
#include "coordinator/RunAssembly.h"
#include "core/Error.h"
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
  const std::string weights = dir + "/" + clusterize::kTrainedStageFile + ".from_checkpoint.tmp";
  stage.save(weights);
  ResultUpload result;
  result.name = name;
  result.trained_stage = readFileBytes(weights);
  std::filesystem::remove(weights);
  result.summary = {{"steps", data.step}, {"stopped", false}, {"from_checkpoint", data.step}};
  return result;
}

}  // namespace cairn::coordinator
