// The pure half of CheckpointCarry.h: one cluster's checkpoints re-mapped onto a re-cut plan's
// stages by parameter name (remapClusterCheckpoints). A parameter with several names (tied inside
// a stage, or shared by several stages: node.json shared_parameters) is gathered under each of
// them, may be carried into several new stages, and need not be carried under every name.
#include <algorithm>
#include <functional>
#include <set>

#include "core/Error.h"
#include "core/TensorText.h"
#include "trainer/CheckpointCarry.h"

namespace cairn {
namespace {

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

// One cluster's old state, gathered by parameter name from its stages' checkpoints.
struct GatheredState {
  struct Held {
    torch::Tensor value;
    size_t stage = 0;
    bool used = false;
    bool shared = false;  // a name of a parameter with several (CarryStage::aliases)
  };
  std::map<std::string, Held> weights;                              // by name
  std::map<std::string, std::map<std::string, torch::Tensor>> optim;  // name → field → state
  std::map<std::string, torch::Tensor> grads;                         // name → gradient
  std::vector<torch::Tensor> rng;                                     // by old stage
  std::set<std::string> shared;  // names of parameters with several names
};

// Optimizer state and gradient of `name` (old stage's trainable parameter), under every name of it.
void gatherTrainable(const CarryStage& stage, const std::string& name,
                     const std::function<void(const std::string&)>& put) {
  put(name);
  const auto aliases = stage.aliases.find(name);
  if (aliases != stage.aliases.end())
    for (const auto& alias : aliases->second) put(alias);
}

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
      const auto aliases = stage.aliases.find(n);
      const bool shared = aliases != stage.aliases.end();
      auto [it, fresh] = state->weights.emplace(n, GatheredState::Held{t, k, false, shared});
      if (!fresh && !(shared && it->second.shared))
        CAIRN_THROW(BadInput, src, ": tensor \"", n, "\" is also in ", sources[it->second.stage],
                    ": two stages of cluster ", stage.node.cluster, " hold it");
      if (!shared) continue;
      state->shared.insert(n);
      for (const auto& alias : aliases->second) {  // the same parameter under its other names
        state->weights.emplace(alias, GatheredState::Held{t, k, false, true});
        state->shared.insert(alias);
      }
    } else if (splitIndexed(name, "optim.", &index, &field) && !field.empty()) {
      if (index >= stage.trainable.size())
        CAIRN_THROW(BadInput, src, ": optimizer tensor \"", name, "\" names parameter ", index,
                    " but node ", stage.node.name, "'s stage has ", stage.trainable.size(),
                    " trainable parameters");
      gatherTrainable(stage, stage.trainable[index],
                      [&](const std::string& n) { state->optim[n].emplace(field, t); });
    } else if (splitIndexed(name, "grad.", &index, &field) && field.empty()) {
      if (index >= stage.trainable.size())
        CAIRN_THROW(BadInput, src, ": gradient \"", name, "\" names parameter ", index,
                    " but node ", stage.node.name, "'s stage has ", stage.trainable.size(),
                    " trainable parameters");
      gatherTrainable(stage, stage.trainable[index],
                      [&](const std::string& n) { state->grads.emplace(n, t); });
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
    if (it == state->weights.end() || (it->second.stage != k && !it->second.shared))
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
    if (held.shared) continue;  // also gathered under the names of its other copies
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
    if (it->second.used && !it->second.shared)
      CAIRN_THROW(BadInput, who, " holds \"", name, "\" which another new stage holds too");
    if (it->second.value.sizes() != target.sizes() ||
        it->second.value.scalar_type() != target.scalar_type())
      CAIRN_THROW(BadInput, sources[it->second.stage], ": \"", name, "\" is ",
                  describeTensor(it->second.value), " but ", who, " has ", describeTensor(target));
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
      if (!state->shared.count(it->first)) state->optim.erase(it);  // a copy may go to several
    }
  }
  for (size_t i = 0; i < stage.trainable.size(); ++i) {
    auto it = state->grads.find(stage.trainable[i]);
    if (it != state->grads.end()) {
      d->tensors.emplace_back("grad." + std::to_string(i), it->second);
      if (!state->shared.count(it->first)) state->grads.erase(it);
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
  // A parameter with several names needs to be carried under one of them only.
  std::vector<std::string> unused;
  for (const auto& [name, held] : state.weights)
    if (!held.used && !held.shared) unused.push_back(name);
  if (!unused.empty())
    CAIRN_THROW(BadInput, "cluster ", old_stages[0].node.cluster, "'s checkpoints at step ", step,
                " hold ", joinNames(unused), " but no stage of the new plan does (parameter "
                "names do not match: another model?)");
  for (const auto& [name, fields] : state.optim)
    if (!state.shared.count(name))
      CAIRN_THROW(BadInput, "cluster ", old_stages[0].node.cluster, "'s checkpoints at step ",
                  step, " hold optimizer state of \"", name,
                  "\", which is not trainable in the new plan's stage");
  for (const auto& [name, grad] : state.grads)
    if (!state.shared.count(name))
      CAIRN_THROW(BadInput, "cluster ", old_stages[0].node.cluster, "'s checkpoints at step ",
                  step, " hold an accumulated gradient of \"", name,
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

}  // namespace cairn
