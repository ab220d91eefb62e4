#include "trainer/CheckpointCarry.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>

#include "core/Error.h"
#include "trainer/ParamGroups.h"
#include "trainer/TrainOptions.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;

// A cluster's stages in chain order; BadInput when the stage numbers do not form 0..n-1.
std::map<int, std::vector<const CarryStage*>> byCluster(const std::vector<CarryStage>& stages,
                                                        const std::string& where) {
  std::map<int, std::vector<const CarryStage*>> clusters;
  for (const CarryStage& s : stages) clusters[s.node.cluster].push_back(&s);
  for (auto& [c, list] : clusters) {
    std::sort(list.begin(), list.end(),
              [](const CarryStage* a, const CarryStage* b) { return a->node.stage < b->node.stage; });
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i]->node.stage != int(i) || list[i]->node.num_stages != int(list.size()))
        CAIRN_THROW(BadInput, where, ": cluster ", c, " has ", list.size(),
                    " node(s) but node ", list[i]->node.name, " says stage ", list[i]->node.stage,
                    " of ", list[i]->node.num_stages, " (node.json keys stage / num_stages)");
  }
  return clusters;
}

}  // namespace

std::string nodeCheckpointDir(const std::string& node_data, const std::string& node_name) {
  return nodeDirectory(node_data, node_name) + "/checkpoints";
}

CarryStage carryStageOf(const NodeSpec& node, const torch::jit::Module& stage) {
  CarryStage s;
  s.node = node;
  for (const auto& p : stage.named_parameters(/*recurse=*/true))
    s.tensors.emplace_back(p.name, p.value.detach());
  for (const auto& b : stage.named_buffers(/*recurse=*/true))
    s.tensors.emplace_back(b.name, b.value.detach());
  for (const GroupedParameter& p : trainableParameters(stage)) s.trainable.push_back(p.name);
  std::map<const c10::TensorImpl*, std::set<std::string>> names_of;  // tied inside the stage
  for (const auto& p : stage.named_parameters(/*recurse=*/true))
    names_of[p.value.unsafeGetTensorImpl()].insert(p.name);
  for (const SharedParameterSpec& shared : node.shared_parameters)
    for (auto& [impl, names] : names_of)
      if (!shared.local_name.empty() && names.count(shared.local_name)) names.insert(shared.name);
  for (const auto& [impl, names] : names_of)
    if (names.size() > 1)
      for (const auto& name : names)
        for (const auto& other : names)
          if (other != name) s.aliases[name].push_back(other);
  // A copy used under one name by several stages (a parameter two units use) has no other name,
  // and is shared all the same.
  for (const SharedParameterSpec& shared : node.shared_parameters)
    if (!shared.local_name.empty()) s.aliases[shared.local_name];
  return s;
}

std::vector<CarryStage> readCarryStages(const std::string& node_data) {
  const fs::path nodes = fs::path(node_data) / "nodes";
  std::error_code ec;
  if (!fs::is_directory(nodes, ec))
    CAIRN_THROW(BadInput, nodes.string(), ": no such folder: ", node_data,
                " is not a node_data folder written by clusterize");
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(nodes, ec))
    if (fs::is_regular_file(entry.path() / "node.json", ec))
      names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  if (names.empty()) CAIRN_THROW(BadInput, nodes.string(), ": holds no node folder with a node.json");
  std::vector<CarryStage> stages;
  for (const auto& name : names) {
    const NodeSpec node = readNodeSpec(nodeSpecPath(node_data, name));
    const std::string file = nodeDirectory(node_data, name) + "/" + node.stage_file;
    torch::jit::Module module;
    try {
      module = torch::jit::load(file);
    } catch (const c10::Error& e) {
      CAIRN_THROW(BadInput, file, ": cannot load the stage file: ", e.what_without_backtrace());
    }
    stages.push_back(carryStageOf(node, module));
  }
  std::sort(stages.begin(), stages.end(), [](const CarryStage& a, const CarryStage& b) {
    return std::make_pair(a.node.cluster, a.node.stage) < std::make_pair(b.node.cluster, b.node.stage);
  });
  return stages;
}


namespace {

// Both jobs must be one job trained with the same optimizer and schedule; returns the new job's
// training options.
TrainOptions checkCarriableJob(const std::string& old_node_data, const JobSpec& new_job,
                               const std::string& new_job_source) {
  const std::string old_job_path = jobSpecPath(old_node_data);
  const JobSpec old_job = readJobSpec(old_job_path);
  if (old_job.job_id != new_job.job_id)
    CAIRN_THROW(BadInput, new_job_source, ": job_id \"", new_job.job_id, "\" but ", old_job_path,
                " (whose checkpoints are carried) has \"", old_job.job_id,
                "\": the new plan must train the same job");
  const TrainOptions old_opt = parseTrainOptions(old_job.training, old_job_path);
  TrainOptions new_opt = parseTrainOptions(new_job.training, new_job_source);
  if (old_opt.optimizer.kind != new_opt.optimizer.kind ||
      (old_opt.optimizer.kind == OptimizerKind::kSgd &&
       (old_opt.optimizer.momentum > 0) != (new_opt.optimizer.momentum > 0)))
    CAIRN_THROW(BadInput, new_job_source, ": training_definition.optimizer is ",
                toString(new_opt.optimizer.kind), " (momentum ", new_opt.optimizer.momentum,
                ") but ", old_job_path, " has ", toString(old_opt.optimizer.kind), " (momentum ",
                old_opt.optimizer.momentum, "): optimizer state cannot be carried across optimizers");
  if (old_opt.schedule != new_opt.schedule)
    CAIRN_THROW(BadInput, new_job_source, ": training_definition.schedule is ",
                toString(new_opt.schedule), " but ", old_job_path, " has ",
                toString(old_opt.schedule));
  return new_opt;
}

// The step to carry: `step` if every old node holds a valid checkpoint of it, or with step < 0
// the newest step every old node holds a valid checkpoint of.
int64_t chooseCarryStep(const std::string& old_node_data, const std::vector<CarryStage>& old_stages,
                        int64_t step) {
  std::set<int64_t> common;
  std::string listing;
  for (size_t i = 0; i < old_stages.size(); ++i) {
    const std::string dir = nodeCheckpointDir(old_node_data, old_stages[i].node.name);
    const std::vector<int64_t> steps = validCheckpointSteps(dir);
    if (steps.empty())
      CAIRN_THROW(BadInput, dir, ": node ", old_stages[i].node.name,
                  " has no valid checkpoint (train with training_definition.checkpoint_every, or "
                  "stop the run cleanly, before carrying it over)");
    std::string list;
    for (int64_t s : steps) list += (list.empty() ? "" : ",") + std::to_string(s);
    listing += " " + old_stages[i].node.name + ": " + list + ";";
    if (i == 0)
      common.insert(steps.begin(), steps.end());
    else
      for (auto it = common.begin(); it != common.end();)
        it = std::find(steps.begin(), steps.end(), *it) == steps.end() ? common.erase(it)
                                                                         : std::next(it);
  }
  if (step < 0) {
    if (common.empty())
      CAIRN_THROW(BadInput, old_node_data, ": no step has a valid checkpoint on every node (",
                  listing, " ): nothing consistent to carry");
    step = *common.rbegin();
  } else if (!common.count(step)) {
    CAIRN_THROW(BadInput, old_node_data, ": step ", step,
                " is not checkpointed on every node (", listing, " )");
  }
  return step;
}

// One old cluster's stages with their checkpoints at one step and the checkpoints' paths.
struct OldCluster {
  std::vector<CarryStage> stages;
  std::vector<CheckpointData> checkpoints;
  std::vector<std::string> sources;
};

// Reads the checkpoints at `step` of one old cluster's stages; each must be of the new job and
// written under its schedule.
OldCluster readOldCluster(const std::string& old_node_data,
                          const std::vector<const CarryStage*>& list, int64_t step,
                          const JobSpec& new_job, const std::string& new_job_source,
                          const TrainOptions& new_opt) {
  OldCluster old;
  for (const CarryStage* s : list) {
    old.stages.push_back(*s);
    const std::string dir = nodeCheckpointDir(old_node_data, s->node.name);
    old.checkpoints.push_back(readCheckpoint(dir, step));
    old.sources.push_back(checkpointPath(dir, step));
    const std::string schedule = old.checkpoints.back().meta.value("schedule", std::string());
    if (schedule != toString(new_opt.schedule))
      CAIRN_THROW(BadInput, old.sources.back(), ": written under the ", schedule,
                  " schedule but ", new_job_source, " trains ", toString(new_opt.schedule));
    if (old.checkpoints.back().meta.value("job_id", std::string()) != new_job.job_id)
      CAIRN_THROW(BadInput, old.sources.back(), ": a checkpoint of job ",
                  old.checkpoints.back().meta.value("job_id", nlohmann::json()).dump(),
                  ", not of job \"", new_job.job_id, "\"");
  }
  return old;
}

}  // namespace

CarryResult planCarry(const std::string& old_node_data, const JobSpec& new_job,
                      const std::string& new_job_source, const std::vector<CarryStage>& new_stages,
                      int64_t step) {
  const TrainOptions new_opt = checkCarriableJob(old_node_data, new_job, new_job_source);

  const std::vector<CarryStage> old_stages = readCarryStages(old_node_data);
  const auto old_clusters = byCluster(old_stages, old_node_data);
  const auto new_clusters = byCluster(new_stages, "the new plan");
  std::vector<int> old_ids, new_ids;
  for (const auto& [c, list] : old_clusters) old_ids.push_back(c);
  for (const auto& [c, list] : new_clusters) new_ids.push_back(c);
  if (old_ids != new_ids)
    CAIRN_THROW(BadInput, "the new plan has ", new_ids.size(), " cluster(s) but ", old_node_data,
                " has ", old_ids.size(), ": each cluster's data shard and position continue in the "
                "cluster of the same number (plan with the same --clusters)");

  CarryResult result;
  result.step = chooseCarryStep(old_node_data, old_stages, step);
  for (const auto& [c, old_list] : old_clusters) {
    const OldCluster old =
        readOldCluster(old_node_data, old_list, result.step, new_job, new_job_source, new_opt);
    std::vector<CarryStage> news;
    for (const CarryStage* s : new_clusters.at(c)) news.push_back(*s);
    std::vector<CheckpointData> carried =
        remapClusterCheckpoints(old.stages, old.checkpoints, old.sources, news);
    for (size_t i = 0; i < news.size(); ++i)
      result.checkpoints[news[i].node.name] = std::move(carried[i]);
  }
  return result;
}

std::vector<std::string> writeCarry(const std::string& new_node_data, const CarryResult& carry) {
  std::vector<std::string> paths;
  for (const auto& [name, data] : carry.checkpoints) {
    const std::string dir = nodeCheckpointDir(new_node_data, name);
    writeCheckpoint(dir, data, /*keep=*/0);
    paths.push_back(checkpointPath(dir, data.step));
  }
  return paths;
}

}  // namespace cairn
