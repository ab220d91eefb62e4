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

std::string describe(const torch::Tensor& t) {
  std::ostringstream s;
  s << c10::toString(t.scalar_type()) << " " << t.sizes();
  return s.str();
}

// "optim.<i>.<field>" / "grad.<i>": the index and the field ("" for grad); false if malformed.
bool splitIndexed(const std::string& name, const std::string& prefix, size_t* index,
                  std::string* field) {
  if (name.rfind(prefix, 0) != 0) return false;
  const std::string rest = name.substr(prefix.size());
  const size_t dot = rest.find('.');
  const std::string digits = rest.substr(0, dot);
  if (digits.empty() || digits.size() > 9 ||
      digits.find_first_not_of("0123456789") != std::string::npos)
    return false;
  *index = size_t(std::stoul(digits));
  *field = dot == std::string::npos ? "" : rest.substr(dot + 1);
  return true;
}

std::string joinNames(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

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

// One cluster's old state, gathered by parameter name from its stages' checkpoints.
struct GatheredState {
  struct Held {
    torch::Tensor value;
    size_t stage = 0;
    bool used = false;
  };
  std::map<std::string, Held> weights;                              // by name
  std::map<std::string, std::map<std::string, torch::Tensor>> optim;  // name → field → state
  std::map<std::string, torch::Tensor> grads;                         // name → gradient
  std::vector<torch::Tensor> rng;                                     // by old stage
};

// Checkpoint k must be of its node and of one run at one step with checkpoint 0.
void checkSameRun(const CarryStage& stage, size_t k,
                  const std::vector<CheckpointData>& old_checkpoints,
                  const std::vector<std::string>& sources) {
  const CheckpointData& d = old_checkpoints[k];
  const std::string& src = sources[k];
  const nlohmann::json& m = d.meta;
  const int64_t step = old_checkpoints[0].step;
  if (d.step != step)
    CAIRN_THROW(BadInput, src, ": holds step ", d.step, " but ", sources[0], " holds step ", step);
  if (m.value("node", std::string()) != stage.node.name ||
      m.value("stage", -1) != stage.node.stage || m.value("cluster", -1) != stage.node.cluster)
    CAIRN_THROW(BadInput, src, ": checkpoint meta node/cluster/stage ",
                m.value("node", std::string("?")), "/", m.value("cluster", -1), "/",
                m.value("stage", -1), " is not node ", stage.node.name, " (cluster ",
                stage.node.cluster, ", stage ", stage.node.stage, ")");
  for (const char* key : {"job_id", "schedule", "total_steps", "steps_per_epoch", "updates",
                          "since_update", "epoch_steps"})
    if (m.value(key, nlohmann::json()) != old_checkpoints[0].meta.value(key, nlohmann::json()))
      CAIRN_THROW(BadInput, src, ": checkpoint meta key ", key, " is ",
                  m.value(key, nlohmann::json()).dump(), " but ", sources[0], " has ",
                  old_checkpoints[0].meta.value(key, nlohmann::json()).dump(),
                  ": not one run's checkpoints of one step");
  if (!m.value("sync_tensors", nlohmann::json::array()).empty())
    CAIRN_THROW(BadInput, src, ": holds ring-sync state tensors (",
                m["sync_tensors"].dump(), ", the DiLoCo outer state): carrying them into a "
                "re-cut plan is not supported (its flat buckets follow the old rings)");
}

// Adds old stage k's checkpoint tensors to `state` by parameter name; then checks the checkpoint
// holds every tensor of the stage file and the generator state.
void gatherStage(const CarryStage& stage, size_t k, const CheckpointData& d,
                 const std::vector<std::string>& sources, GatheredState* state) {
  const std::string& src = sources[k];
  for (const auto& [name, t] : d.tensors) {
    size_t index = 0;
    std::string field;
    if (name.rfind("stage.", 0) == 0) {
      const std::string n = name.substr(6);
      auto [it, fresh] = state->weights.emplace(n, GatheredState::Held{t, k, false});
      if (!fresh)
        CAIRN_THROW(BadInput, src, ": tensor \"", n, "\" is also in ", sources[it->second.stage],
                    ": two stages of cluster ", stage.node.cluster, " hold it");
    } else if (splitIndexed(name, "optim.", &index, &field) && !field.empty()) {
      if (index >= stage.trainable.size())
        CAIRN_THROW(BadInput, src, ": optimizer tensor \"", name, "\" names parameter ", index,
                    " but node ", stage.node.name, "'s stage has ", stage.trainable.size(),
                    " trainable parameters");
      state->optim[stage.trainable[index]][field] = t;
    } else if (splitIndexed(name, "grad.", &index, &field) && field.empty()) {
      if (index >= stage.trainable.size())
        CAIRN_THROW(BadInput, src, ": gradient \"", name, "\" names parameter ", index,
                    " but node ", stage.node.name, "'s stage has ", stage.trainable.size(),
                    " trainable parameters");
      state->grads[stage.trainable[index]] = t;
    } else if (name == "rng.cpu") {
      state->rng[k] = t;
    } else if (name == "rng.cuda") {
      // A CUDA generator (written on a GPU): not carried; the recut stage's device generator
      // starts as seeded, like one of a checkpoint written on the CPU.
    } else {
      CAIRN_THROW(BadInput, src, ": tensor \"", name, "\" is not one carrying knows (stage.*, "
                  "optim.<i>.*, grad.<i>, rng.cpu, rng.cuda)");
    }
  }
  // The checkpoint must be of this very stage file: the same tensors.
  for (const auto& [name, t] : stage.tensors) {
    auto it = state->weights.find(name);
    if (it == state->weights.end() || it->second.stage != k)
      CAIRN_THROW(BadInput, src, ": lacks stage tensor \"", name, "\" of node ", stage.node.name,
                  "'s stage file: a checkpoint of another plan?");
  }
  if (!state->rng[k].defined()) CAIRN_THROW(BadInput, src, ": lacks the generator state rng.cpu");
}

// Every gathered weight must be a tensor of the stage file of the checkpoint that held it.
void checkWeightsInStageFiles(const GatheredState& state,
                              const std::vector<CarryStage>& old_stages,
                              const std::vector<std::string>& sources) {
  for (const auto& [name, held] : state.weights) {
    const auto& tensors = old_stages[held.stage].tensors;
    const std::string& wanted = name;  // C++17: a lambda cannot capture a structured binding
    if (std::none_of(tensors.begin(), tensors.end(), [&](const auto& p) { return p.first == wanted; }))
      CAIRN_THROW(BadInput, sources[held.stage], ": stage tensor \"", name, "\" is not in node ",
                  old_stages[held.stage].node.name, "'s stage file");
  }
}

// Moves the new stage's weights from `state` into `d` ("stage.<name>"), checking each is held,
// by no other new stage, with the same shape and dtype; returns the old stage whose generator
// state the new stage takes (the one that held its first tensor).
size_t carryWeights(const CarryStage& stage, const std::string& who,
                    const std::vector<CarryStage>& old_stages,
                    const std::vector<std::string>& sources, int64_t step, GatheredState* state,
                    CheckpointData* d) {
  size_t rng_from = size_t(std::min<int>(stage.node.stage, int(old_stages.size()) - 1));
  for (size_t j = 0; j < stage.tensors.size(); ++j) {
    const auto& [name, target] = stage.tensors[j];
    auto it = state->weights.find(name);
    if (it == state->weights.end())
      CAIRN_THROW(BadInput, who, " holds \"", name, "\" but no checkpoint of cluster ",
                  old_stages[0].node.cluster, " at step ", step,
                  " has it (parameter names do not match: another model?)");
    if (it->second.used)
      CAIRN_THROW(BadInput, who, " holds \"", name, "\" which another new stage holds too");
    if (it->second.value.sizes() != target.sizes() ||
        it->second.value.scalar_type() != target.scalar_type())
      CAIRN_THROW(BadInput, sources[it->second.stage], ": \"", name, "\" is ",
                  describe(it->second.value), " but ", who, " has ", describe(target));
    it->second.used = true;
    if (j == 0) rng_from = it->second.stage;
    d->tensors.emplace_back("stage." + name, it->second.value);
  }
  return rng_from;
}

// Moves the optimizer state and gradients of the new stage's trainable parameters from `state`
// into `d`, under the new stage's positions ("optim.<i>.<field>", "grad.<i>").
void carryOptimizerState(const CarryStage& stage, GatheredState* state, CheckpointData* d) {
  for (size_t i = 0; i < stage.trainable.size(); ++i) {
    auto it = state->optim.find(stage.trainable[i]);
    if (it != state->optim.end()) {
      for (const auto& [field, t] : it->second)
        d->tensors.emplace_back("optim." + std::to_string(i) + "." + field, t);
      state->optim.erase(it);
    }
  }
  for (size_t i = 0; i < stage.trainable.size(); ++i) {
    auto it = state->grads.find(stage.trainable[i]);
    if (it != state->grads.end()) {
      d->tensors.emplace_back("grad." + std::to_string(i), it->second);
      state->grads.erase(it);
    }
  }
}

// The new stage's checkpoint meta: the old Root's, re-addressed to the new stage.
nlohmann::json carriedMeta(const CarryStage& stage, const std::vector<CarryStage>& old_stages,
                           const std::vector<CheckpointData>& old_checkpoints, int64_t step) {
  const nlohmann::json& root_meta = old_checkpoints[0].meta;
  // The run's position is the old Root's (the same in every old checkpoint, checked above);
  // the data cursor's augmentation draws are the Root's, the only node that reads data.
  const size_t same = size_t(std::min<int>(stage.node.stage, int(old_stages.size()) - 1));
  nlohmann::json meta = root_meta;
  meta.erase("step");
  meta.erase("format");
  meta["node"] = stage.node.name;
  meta["cluster"] = stage.node.cluster;
  meta["stage"] = stage.node.stage;
  meta["num_stages"] = stage.node.num_stages;
  meta["augmentation_draws"] =
      old_checkpoints[same].meta.value("augmentation_draws", nlohmann::json(0));
  nlohmann::json sync = nlohmann::json::object();
  const nlohmann::json old_sync = root_meta.value("sync", nlohmann::json::object());
  for (const char* key : {"last_synced_step", "mode"})
    if (old_sync.is_object() && old_sync.contains(key)) sync[key] = old_sync[key];
  meta["sync"] = sync;  // the old rings' generations and views do not apply to new rings
  meta["sync_tensors"] = nlohmann::json::array();
  std::vector<std::string> from;
  for (const CarryStage& s : old_stages) from.push_back(s.node.name);
  meta["carried_from"] = {{"step", step}, {"nodes", from}};
  return meta;
}

// After every new stage took its part: nothing of the old cluster may be left behind.
void checkAllCarried(const GatheredState& state, const std::vector<CarryStage>& old_stages,
                     int64_t step) {
  std::vector<std::string> unused;
  for (const auto& [name, held] : state.weights)
    if (!held.used) unused.push_back(name);
  if (!unused.empty())
    CAIRN_THROW(BadInput, "cluster ", old_stages[0].node.cluster, "'s checkpoints at step ", step,
                " hold ", joinNames(unused), " but no stage of the new plan does (parameter "
                "names do not match: another model?)");
  if (!state.optim.empty())
    CAIRN_THROW(BadInput, "cluster ", old_stages[0].node.cluster, "'s checkpoints at step ", step,
                " hold optimizer state of \"", state.optim.begin()->first,
                "\", which is not trainable in the new plan's stage");
  if (!state.grads.empty())
    CAIRN_THROW(BadInput, "cluster ", old_stages[0].node.cluster, "'s checkpoints at step ", step,
                " hold an accumulated gradient of \"", state.grads.begin()->first,
                "\", which is not trainable in the new plan's stage");
}

}  // namespace

std::vector<CheckpointData> remapClusterCheckpoints(const std::vector<CarryStage>& old_stages,
                                                    const std::vector<CheckpointData>& old_checkpoints,
                                                    const std::vector<std::string>& sources,
                                                    const std::vector<CarryStage>& new_stages) {
  CAIRN_ENFORCE(!old_stages.empty() && old_stages.size() == old_checkpoints.size() &&
                    old_stages.size() == sources.size() && !new_stages.empty(),
                "remapClusterCheckpoints: mismatched inputs");
  const int64_t step = old_checkpoints[0].step;
  GatheredState state;
  state.rng.resize(old_stages.size());
  for (size_t k = 0; k < old_stages.size(); ++k) {
    checkSameRun(old_stages[k], k, old_checkpoints, sources);
    gatherStage(old_stages[k], k, old_checkpoints[k], sources, &state);
  }
  checkWeightsInStageFiles(state, old_stages, sources);

  std::vector<CheckpointData> out;
  for (const CarryStage& stage : new_stages) {
    const std::string who = "node " + stage.node.name + " (cluster " +
                            std::to_string(stage.node.cluster) + ", stage " +
                            std::to_string(stage.node.stage) + ") of the new plan";
    CheckpointData d;
    d.step = step;
    const size_t rng_from = carryWeights(stage, who, old_stages, sources, step, &state, &d);
    carryOptimizerState(stage, &state, &d);
    d.tensors.emplace_back("rng.cpu", state.rng[rng_from]);
    d.meta = carriedMeta(stage, old_stages, old_checkpoints, step);
    out.push_back(std::move(d));
  }
  checkAllCarried(state, old_stages, step);
  return out;
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
