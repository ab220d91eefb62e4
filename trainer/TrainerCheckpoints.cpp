#include "trainer/TrainerCheckpoints.h"

#include <ATen/CPUGeneratorImpl.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/Error.h"
#include "core/Log.h"
#include "trainer/Checkpoint.h"
#include "trainer/DealSampler.h"
#include "trainer/ClusterSync.h"
#include "trainer/Device.h"
#include "trainer/Metrics.h"
#include "trainer/Optimizer.h"
#include "trainer/RunPlan.h"
#include "trainer/StageExecutor.h"

namespace cairn {

namespace {

// RunPlan::epoch_steps as the checkpoint meta keeps it: [[from_epoch, steps], …].
nlohmann::json epochStepsJson(const RunPlan& plan) {
  nlohmann::json t = nlohmann::json::array();
  for (const EpochSteps& e : plan.epoch_steps) t.push_back({e.from_epoch, e.steps});
  return t;
}

}  // namespace
namespace {

torch::Tensor cpuGeneratorState() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

// The default generator of a CUDA device (dropout on the GPU draws from it; through ATen's
// context, so no CUDA header is needed).
at::Generator deviceGenerator(torch::Device device) {
  return at::globalContext().defaultGenerator(device);
}

// The tensors a checkpoint keeps of the stage's own state, which live on the training device:
// the parameters and buffers, the optimizer state, the accumulated gradients. The generator
// states and the ClusterSync's tensors are host state and stay on the host.
bool onTrainingDevice(const std::string& name) {
  return name.rfind("stage.", 0) == 0 || name.rfind("optim.", 0) == 0 ||
         name.rfind("grad.", 0) == 0;
}

}  // namespace

bool TrainerCheckpoints::on() const { return !ctx_.cfg.checkpoint_dir.empty(); }

bool TrainerCheckpoints::due(int64_t steps_done) const {
  return on() && ctx_.opt.checkpoint_every > 0 && steps_done > 0 &&
         steps_done % ctx_.opt.checkpoint_every == 0;
}

void TrainerCheckpoints::save(int64_t steps_done, int64_t updates, int64_t since_update) {
  CAIRN_ENFORCE(ctx_.executor.pendingMicrobatches() == 0,
                "checkpoint with micro-batches in flight");
  const auto t = TrainerClock::now();
  CheckpointData d;
  d.step = steps_done;
  // No copies: nothing changes the tensors while this thread writes them.
  for (const auto& p : ctx_.executor.module().named_parameters(/*recurse=*/true))
    d.tensors.emplace_back("stage." + p.name, p.value.detach());
  for (const auto& b : ctx_.executor.module().named_buffers(/*recurse=*/true))
    d.tensors.emplace_back("stage." + b.name, b.value.detach());
  ctx_.optimizer.exportState(&d.tensors);
  if (since_update > 0) {  // async: gradients accumulated towards the next update
    const auto& params = ctx_.optimizer.parameters();
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].grad().defined())
        d.tensors.emplace_back("grad." + std::to_string(i), params[i].grad().detach());
  }
  d.tensors.emplace_back("rng.cpu", cpuGeneratorState());
  const torch::Device device = ctx_.placement.device();
  if (device.is_cuda()) {  // read on a CUDA machine only; a CPU resume leaves it unused
    at::Generator gen = deviceGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    d.tensors.emplace_back("rng.cuda", gen.get_state());
  }
  nlohmann::json sync_meta = nlohmann::json::object(), sync_names = nlohmann::json::array();
  if (ctx_.cfg.cluster_sync) {
    std::vector<std::pair<std::string, torch::Tensor>> sync_tensors;
    ctx_.cfg.cluster_sync->saveState(&sync_tensors, &sync_meta);
    for (auto& [name, tensor] : sync_tensors) {
      for (const char* own : {"stage.", "optim.", "grad.", "rng."})
        CAIRN_ENFORCE(name.rfind(own, 0) != 0, "ClusterSync::saveState tensor ", name,
                      " uses the trainer's prefix ", own);
      sync_names.push_back(name);
      d.tensors.emplace_back(name, tensor);
    }
  }
  d.meta = {{"job_id", ctx_.cfg.node.job_id},
            {"node", ctx_.cfg.node.name},
            {"cluster", ctx_.cfg.node.cluster},
            {"stage", ctx_.cfg.node.stage},
            {"num_stages", ctx_.cfg.node.num_stages},
            {"schedule", toString(ctx_.opt.schedule)},
            {"total_steps", ctx_.plan.total_steps},
            {"steps_per_epoch", ctx_.plan.steps_per_epoch},
            // The data cursor: ShardSampler's order is a pure function of (seed, cluster,
            // epoch), so (epoch, position) = (step / steps_per_epoch, step % steps_per_epoch)
            // (RunPlan::epochOf/positionOf: the same, or the epoch_steps table of a grown run).
            {"epoch", ctx_.plan.epochOf(steps_done)},
            {"position", ctx_.plan.positionOf(steps_done)},
            {"augmentation_draws", data_.train ? data_.train->trainingDraws() : 0},
            {"updates", updates},
            {"since_update", since_update},
            {"sync", sync_meta},
            {"sync_tensors", sync_names}};
  if (!ctx_.plan.epoch_steps.empty()) d.meta["epoch_steps"] = epochStepsJson(ctx_.plan);
  d.meta["device"] = device.str();  // where it was written: informative, any device resumes it
  d.meta["writer"] = thisProcessAsWriter();
  // Device-free files: the stage's own state crosses to the host (nothing moves when training on
  // the CPU); the generator and ClusterSync states are host tensors already.
  for (auto& [name, tensor] : d.tensors) {
    if (onTrainingDevice(name)) tensor = ctx_.placement.toHost(tensor);
    CAIRN_ENFORCE(tensor.device().is_cpu(), "checkpoint tensor ", name, " is on ",
                  tensor.device().str(), ", not on the host");
  }
  // The Root: the deal its samples follow.
  if (deal_ && !ctx_.plan.epoch_steps.empty()) d.meta["deal"] = dealToJson(deal_());
  writeCheckpoint(ctx_.cfg.checkpoint_dir, d, ctx_.opt.keep_checkpoints,
                  ctx_.cfg.keep_checkpoints_from ? ctx_.cfg.keep_checkpoints_from() : -1);
  const double seconds = secondsSince(t);
  CAIRN_INFO("checkpoint of step ", steps_done, " written to ",
             checkpointPath(ctx_.cfg.checkpoint_dir, steps_done), " (", seconds, " s)");
  ctx_.metrics.write({{"checkpoint", {{"step", steps_done}, {"seconds", seconds}}}});
}

namespace {

using TensorsByName = std::map<std::string, torch::Tensor>;

// The checkpoint's meta `key` must be `want`: a checkpoint of this node of this job.
void expectMeta(const nlohmann::json& m, const char* key, const nlohmann::json& want,
                const std::string& path, const NodeSpec& node) {
  if (!m.contains(key) || m[key] != want)
    CAIRN_THROW(BadInput, path, ": checkpoint of ", key, " ",
                m.contains(key) ? m[key].dump() : std::string("(none)"), ", but this is ", key,
                " ", want.dump(), " (node ", node.name, " of job ", node.job_id,
                "): refusing to load another node's or job's state");
}

// Gradients accumulated towards the next update (async): "grad.<i>" of the optimizer's i-th
// parameter.
void restoreGradients(const std::vector<torch::Tensor>& params, const TensorsByName& by_name,
                      const std::string& path) {
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = by_name.find("grad." + std::to_string(i));
    if (it == by_name.end()) continue;
    if (it->second.sizes() != params[i].sizes())
      CAIRN_THROW(BadInput, path, ": gradient ", it->first, " does not fit its parameter");
    params[i].mutable_grad() = it->second.clone();
  }
}

// A CUDA generator's state when the checkpoint has one and the stage trains on CUDA (a checkpoint
// written on the CPU resumes on a GPU with the generator as seeded; dropout then draws anew).
void restoreDeviceGenerator(const TensorsByName& by_name, torch::Device device,
                            const std::string& path) {
  auto rng = by_name.find("rng.cuda");
  if (rng == by_name.end() || !device.is_cuda()) return;
  at::Generator gen = deviceGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  try {
    gen.set_state(rng->second);
  } catch (const c10::Error& e) {
    CAIRN_THROW(BadInput, path,
                ": rng.cuda is not a CUDA generator state: ", e.what_without_backtrace());
  }
}

void restoreCpuGenerator(const TensorsByName& by_name, const std::string& path) {
  auto rng = by_name.find("rng.cpu");
  if (rng == by_name.end()) CAIRN_THROW(BadInput, path, ": lacks the generator state rng.cpu");
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  try {
    gen.set_state(rng->second);
  } catch (const c10::Error& e) {
    CAIRN_THROW(BadInput, path,
                ": rng.cpu is not a CPU generator state: ", e.what_without_backtrace());
  }
}

// The ClusterSync's state: the tensors the meta's "sync_tensors" names, and its "sync".
void restoreClusterSync(ClusterSync& sync, const nlohmann::json& m, const TensorsByName& by_name,
                        const std::string& path) {
  std::vector<std::pair<std::string, torch::Tensor>> sync_tensors;
  for (const auto& name : m.value("sync_tensors", nlohmann::json::array())) {
    auto it = by_name.find(name.get<std::string>());
    if (it == by_name.end()) CAIRN_THROW(BadInput, path, ": lacks sync tensor ", name.dump());
    sync_tensors.emplace_back(it->first, it->second);
  }
  sync.loadState(sync_tensors, m.value("sync", nlohmann::json::object()));
}

}  // namespace

void TrainerCheckpoints::load() {
  if (ctx_.cfg.checkpoint_dir.empty())
    CAIRN_THROW(BadInput, "resume from step ", ctx_.cfg.resume_step,
                " needs a checkpoint folder (StageTrainerConfig::checkpoint_dir is empty)");
  const std::string path = checkpointPath(ctx_.cfg.checkpoint_dir, ctx_.cfg.resume_step);
  CheckpointData d = readCheckpoint(ctx_.cfg.checkpoint_dir, ctx_.cfg.resume_step);
  const nlohmann::json& m = d.meta;
  const NodeSpec& node = ctx_.cfg.node;
  expectMeta(m, "job_id", node.job_id, path, node);
  expectMeta(m, "node", node.name, path, node);
  expectMeta(m, "cluster", node.cluster, path, node);
  expectMeta(m, "stage", node.stage, path, node);
  expectMeta(m, "num_stages", node.num_stages, path, node);
  expectMeta(m, "schedule", toString(ctx_.opt.schedule), path, node);
  // The stage's own state onto the training device (the file holds host tensors).
  for (auto& [name, tensor] : d.tensors)
    if (onTrainingDevice(name)) tensor = ctx_.placement.toDevice(tensor);
  TensorsByName by_name(d.tensors.begin(), d.tensors.end());
  restoreStageWeights(ctx_.executor.module(), &by_name, path);
  ctx_.optimizer.importState(d.tensors, path);
  restoreGradients(ctx_.optimizer.parameters(), by_name, path);
  restoreCpuGenerator(by_name, path);
  restoreDeviceGenerator(by_name, ctx_.placement.device(), path);
  if (ctx_.cfg.cluster_sync) restoreClusterSync(*ctx_.cfg.cluster_sync, m, by_name, path);
  try {
    resume_.updates = m.at("updates").get<int64_t>();
    resume_.since_update = m.at("since_update").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    CAIRN_THROW(BadInput, path,
                ": checkpoint meta lacks an integer updates/since_update: ", e.what());
  }
  resume_.start_step = d.step;
  resume_.another_process = !m.contains("writer") || m["writer"] != thisProcessAsWriter();
  resumed_meta_ = m;
  CAIRN_INFO("resuming from ", path, " (step ", resume_.start_step, ")");
  // Checkpoints of later steps are of the run abandoned here: gone now, not at the next write, so
  // none of them is uploaded or agreed on as if this run had trained it (provider --join uploads
  // the newest held: step `resume_step` again, which the coordinator takes as a roll-back).
  for (int64_t s : removeCheckpointsAfter(ctx_.cfg.checkpoint_dir, d.step))
    CAIRN_INFO("dropped checkpoint ", checkpointPath(ctx_.cfg.checkpoint_dir, s),
               ": written before this run resumed from step ", d.step);
  ctx_.metrics.write({{"resumed_from", resume_.start_step}});
}

bool TrainerCheckpoints::dealChangedAfter(const nlohmann::json& written, const std::string& path) const {
  if (ctx_.plan.epoch_steps.empty()) return false;  // this run has no deal: nothing was taken
  // The checkpoint's plan, parsed and checked as a plan packet is.
  nlohmann::json meta_plan = {{"total_steps", resumed_meta_.value("total_steps", nlohmann::json())},
                              {"steps_per_epoch", resumed_meta_.value("steps_per_epoch", nlohmann::json())},
                              {"eval_batches", 0}};
  if (!written.is_null()) meta_plan["epoch_steps"] = written;
  const RunPlan before = RunPlan::fromText(meta_plan.dump(), path + ": checkpoint meta run plan");
  // Every epoch up to the checkpoint's begins at the same step under both tables.
  const int64_t step = resume_.start_step;
  if (step > before.total_steps || step > ctx_.plan.total_steps) return false;
  const int64_t epoch = before.epochOf(step);
  if (ctx_.plan.epochOf(step) != epoch) return false;
  // The same steps in every epoch up to and including the checkpoint's …
  for (int64_t e = 0; e <= epoch + 1; ++e)
    if (before.firstStepOf(e) != ctx_.plan.firstStepOf(e)) return false;
  // … and at the Root the same deal up to it (the samples): checkpoints written under a deal
  // keep it in meta "deal"; one written without any had one cluster count throughout, which the
  // equal steps of its epochs already pin.
  if (deal_ && resumed_meta_.contains("deal") &&
      dealUpTo(dealFromJson(resumed_meta_["deal"], path + ": meta deal"), epoch) != dealUpTo(deal_(), epoch))
    return false;
  return true;
}

void TrainerCheckpoints::checkResumedPlan() {
  if (ctx_.cfg.resume_step < 0) return;
  const std::string path = checkpointPath(ctx_.cfg.checkpoint_dir, ctx_.cfg.resume_step);
  const nlohmann::json table = ctx_.plan.epoch_steps.empty() ? nlohmann::json()
                                                             : epochStepsJson(ctx_.plan);
  const nlohmann::json written = resumed_meta_.value("epoch_steps", nlohmann::json());
  if (written != table && dealChangedAfter(written, path)) {
    // The cluster took a new deal after this checkpoint (trainer/DealChange.h) and the node.json
    // its update wrote plans with it: it changes only epochs after the checkpoint's, so the steps
    // up to it keep their numbering and the run goes on under the deal the cluster took.
    CAIRN_INFO("resuming from ", path, " (steps per epoch ",
               written.is_null() ? std::string("fixed") : written.dump(), ") under the deal taken after it: ",
               table.dump(), ", ", ctx_.plan.total_steps, " steps");
  } else {
    if (resumed_meta_.value("total_steps", int64_t(-1)) != ctx_.plan.total_steps ||
        resumed_meta_.value("steps_per_epoch", int64_t(-1)) != ctx_.plan.steps_per_epoch)
      CAIRN_THROW(BadInput, path, ": written for a run of ", resumed_meta_.value("total_steps", -1),
                  " steps (", resumed_meta_.value("steps_per_epoch", -1),
                  " per epoch) but this run plans ", ctx_.plan.total_steps, " (",
                  ctx_.plan.steps_per_epoch, " per epoch): job.json changed?");
    if (written != table)
      CAIRN_THROW(BadInput, path, ": written for a run whose steps per epoch were ",
                  written.is_null() ? std::string("fixed") : written.dump(), " but this run plans ",
                  table.is_null() ? std::string("fixed ones") : table.dump(),
                  " (node.json extra.deal changed an epoch up to the checkpoint's?)");
  }
  if (resume_.start_step > ctx_.plan.total_steps)
    CAIRN_THROW(BadInput, path, ": step ", resume_.start_step, " is past the run's ",
                ctx_.plan.total_steps);
  if (data_.train)
    data_.train->setTrainingDraws(resumed_meta_.value("augmentation_draws", uint64_t(0)));
}

void takeDealInForce(StageTrainerConfig* cfg, const nlohmann::json& deal) {
  if (!deal.is_object() && !deal.is_array()) return;
  nlohmann::json& extra = cfg->node.extra;
  if (!extra.is_object()) extra = nlohmann::json::object();
  if (extra.contains("deal") && extra["deal"] == deal) return;
  extra["deal"] = deal;
  CAIRN_INFO("resume: plans with the deal in force in node.json, ", deal.dump(),
             " (taken since the run began)");
}

void adoptDealOfCheckpoint(StageTrainerConfig* cfg) {
  nlohmann::json& extra = cfg->node.extra;
  if (cfg->node.stage != 0 || cfg->checkpoint_dir.empty() || cfg->resume_step < 0) return;
  const CheckpointData data = readCheckpoint(cfg->checkpoint_dir, cfg->resume_step);
  if (!data.meta.is_object() || !data.meta.contains("deal")) return;
  const std::string where = "checkpoint of step " + std::to_string(cfg->resume_step);
  const auto written = dealFromJson(data.meta["deal"], where + ": meta deal");
  const bool dealt = extra.is_object() && extra.contains("deal");
  const std::vector<DealEntry> in_force =
      dealt ? dealFromJson(extra["deal"], "node.json extra.deal")
            : std::vector<DealEntry>{{0, int(cfg->num_clusters)}};
  // Deals only ever grow by entries for later epochs (trainer/DealChange.h): the checkpoint's
  // extends the one in force exactly when the cluster took a deal this configuration has not heard.
  const bool extends = written.size() > in_force.size() &&
                       std::equal(in_force.begin(), in_force.end(), written.begin());
  if (!extends) return;
  CAIRN_INFO("resume: the ", where, " was written under the deal this cluster took, ",
             dealToJson(written).dump(), "; node.json's configuration ",
             extra.is_object() && extra.contains("offered_deal") ? "only offers it" : "predates it",
             ": planning with it");
  putDealInForce(extra, dealToJson(written));
}

}  // namespace cairn
