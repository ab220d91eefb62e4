#include "trainer/StageTrainer.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>

#include "core/Error.h"
#include "core/Log.h"
#include "trainer/Checkpoint.h"
#include "trainer/ClusterSync.h"
#include "trainer/Dataset.h"
#include "trainer/Loss.h"
#include "trainer/LrSchedule.h"
#include "trainer/Metrics.h"
#include "trainer/Optimizer.h"
#include "trainer/Sampler.h"
#include "trainer/StageExecutor.h"
#include "trainer/SyncSchedule.h"

namespace cairn {
namespace {

using Clock = std::chrono::steady_clock;
double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

const char* kTargets = "__targets";
const char* kIds = "__ids";
const char* kDenominator = "__denominator";
const char* kLoss = "__loss";
const char* kNorm = "__norm";
// Clean stop (docs/TRAINING.md "Stopping"): "__stop" rides upstream on gradient packets once a node
// (or one downstream of it) was asked to stop; "__stop_at" rides downstream on activation packets
// once the Root has decided the step count at which the whole cluster stops.
const char* kStop = "__stop";
const char* kStopAt = "__stop_at";

torch::Tensor scalar64(double v) { return torch::tensor(v, torch::kDouble); }

}  // namespace

const char* toString(Neighbour n) { return n == Neighbour::kUpstream ? "upstream" : "downstream"; }

const char* toString(PacketKind k) {
  switch (k) {
    case PacketKind::kActivation:
      return "activation";
    case PacketKind::kGradient:
      return "gradient";
    case PacketKind::kEvaluation:
      return "evaluation";
    case PacketKind::kControl:
      return "control";
  }
  return "?";
}

bool StagePacket::has(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return true;
  return false;
}

const torch::Tensor& StagePacket::tensor(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  CAIRN_THROW(BadInput, toString(kind), " packet for step ", step, " micro-batch ", microbatch,
              " lacks tensor ", name);
}

struct StageTrainer::Impl {
  struct Microbatch {
    std::vector<torch::Tensor> inputs;  // Root: data inputs
    torch::Tensor targets, ids, denominator;
    torch::Tensor loss;  // Leaf: this micro-batch's share of the batch loss
  };

  StageTrainerConfig cfg;
  StageLink& link;
  TrainerObserver observer;
  const TrainOptions& opt;
  bool is_root, is_leaf;
  std::unique_ptr<StageExecutor> executor;
  std::unique_ptr<Optimizer> optimizer;
  DatasetPair data;
  std::unique_ptr<ShardSampler> sampler;
  SyncSchedule schedule;
  MetricsLog metrics;
  std::ofstream sample_ids_out;
  ProgressLine progress;

  // The run plan (computed by the Root, learnt by the others).
  int64_t total_steps = 0, steps_per_epoch = 0, eval_batches = 0;

  // Per step.
  int64_t step = 0;
  std::map<int, Microbatch> micro;
  double step_loss = 0, compute_s = 0, send_s = 0, wait_s = 0, grad_norm = -1;
  double sync_s = 0;  // cross-cluster sync (ClusterSync) within the step
  uint64_t checksum = 0;
  std::vector<int64_t> epoch_order;
  int64_t epoch_of_order = -1;  // the epoch epoch_order belongs to

  // Checkpoints and clean stop (docs/OPERATIONS.md "Checkpoints and resume").
  int64_t start_step = 0;        // resumed: the checkpoint's step
  nlohmann::json resumed_meta;   // resumed: the checkpoint's meta (checked against the plan)
  int64_t resumed_updates = 0, resumed_since_update = 0;  // async counters of the checkpoint
  bool stop_flag = false;        // this node, or one downstream of it, asked to stop
  int64_t stop_at = -1;          // steps done when the cluster stops (Root decides; -1: none)

  Impl(StageTrainerConfig c, torch::jit::Module stage, StageLink& l, TrainerObserver o)
      : cfg(std::move(c)),
        link(l),
        observer(std::move(o)),
        opt(cfg.options),
        is_root(cfg.node.stage == 0),
        is_leaf(cfg.node.stage == cfg.node.num_stages - 1),
        schedule(cfg.node.stage, cfg.node.num_stages, int(cfg.options.microbatches),
                 cfg.options.pipeline, cfg.options.clip_grad_norm > 0),
        progress(is_leaf && cfg.show_progress, cfg.options.log_every_s) {
    executor = std::make_unique<StageExecutor>(std::move(stage), cfg.node.inputs, cfg.node.outputs,
                                               /*inputs_need_grad=*/!is_root);
    std::vector<torch::Tensor> trainable;
    for (auto& p : executor->parameters())
      if (p.requires_grad()) trainable.push_back(p);
    optimizer = std::make_unique<Optimizer>(trainable, opt.optimizer);
    if (!cfg.metrics_path.empty())
      metrics = MetricsLog(cfg.metrics_path, /*append=*/cfg.resume_step >= 0);
    torch::manual_seed(opt.seed * 1000003u + uint64_t(cfg.node.cluster) * 7919u +
                       uint64_t(cfg.node.stage));
    if (cfg.resume_step >= 0) loadCheckpoint();
  }

  // ---- checkpoints ----------------------------------------------------------------------------
  bool checkpointsOn() const { return !cfg.checkpoint_dir.empty(); }
  bool checkpointDue(int64_t steps_done) const {
    return checkpointsOn() && opt.checkpoint_every > 0 && steps_done > 0 &&
           steps_done % opt.checkpoint_every == 0;
  }

  static torch::Tensor cpuGeneratorState() {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.get_state();
  }

  // Writes the checkpoint of `steps_done` (the pipeline is drained: no micro-batch in flight).
  // `updates` / `since_update`: the async schedule's optimizer counters (sync: steps, 0).
  void saveCheckpoint(int64_t steps_done, int64_t updates, int64_t since_update) {
    CAIRN_ENFORCE(executor->pendingMicrobatches() == 0, "checkpoint with micro-batches in flight");
    const auto t = Clock::now();
    CheckpointData d;
    d.step = steps_done;
    // No copies: nothing changes the tensors while this thread writes them.
    for (const auto& p : executor->module().named_parameters(/*recurse=*/true))
      d.tensors.emplace_back("stage." + p.name, p.value.detach());
    for (const auto& b : executor->module().named_buffers(/*recurse=*/true))
      d.tensors.emplace_back("stage." + b.name, b.value.detach());
    optimizer->exportState(&d.tensors);
    if (since_update > 0) {  // async: gradients accumulated towards the next update
      const auto& params = optimizer->parameters();
      for (size_t i = 0; i < params.size(); ++i)
        if (params[i].grad().defined())
          d.tensors.emplace_back("grad." + std::to_string(i), params[i].grad().detach());
    }
    d.tensors.emplace_back("rng.cpu", cpuGeneratorState());
    nlohmann::json sync_meta = nlohmann::json::object(), sync_names = nlohmann::json::array();
    if (cfg.cluster_sync) {
      std::vector<std::pair<std::string, torch::Tensor>> sync_tensors;
      cfg.cluster_sync->saveState(&sync_tensors, &sync_meta);
      for (auto& [name, tensor] : sync_tensors) {
        for (const char* own : {"stage.", "optim.", "grad.", "rng."})
          CAIRN_ENFORCE(name.rfind(own, 0) != 0, "ClusterSync::saveState tensor ", name,
                        " uses the trainer's prefix ", own);
        sync_names.push_back(name);
        d.tensors.emplace_back(name, tensor);
      }
    }
    d.meta = {{"job_id", cfg.node.job_id},
              {"node", cfg.node.name},
              {"cluster", cfg.node.cluster},
              {"stage", cfg.node.stage},
              {"num_stages", cfg.node.num_stages},
              {"schedule", opt.schedule},
              {"total_steps", total_steps},
              {"steps_per_epoch", steps_per_epoch},
              // The data cursor: ShardSampler's order is a pure function of (seed, cluster,
              // epoch), so (epoch, position) = (step / steps_per_epoch, step % steps_per_epoch).
              {"epoch", steps_done / steps_per_epoch},
              {"position", steps_done % steps_per_epoch},
              {"augmentation_draws", data.train ? data.train->trainingDraws() : 0},
              {"updates", updates},
              {"since_update", since_update},
              {"sync", sync_meta},
              {"sync_tensors", sync_names}};
    writeCheckpoint(cfg.checkpoint_dir, d, opt.keep_checkpoints);
    const double seconds = secondsSince(t);
    CAIRN_INFO("checkpoint of step ", steps_done, " written to ",
               checkpointPath(cfg.checkpoint_dir, steps_done), " (", seconds, " s)");
    metrics.write({{"checkpoint", {{"step", steps_done}, {"seconds", seconds}}}});
  }

  // Resume: loads the checkpoint of cfg.resume_step into the stage, optimizer, RNG and ClusterSync.
  // The run plan (received later) is checked against it in checkResumedPlan().
  void loadCheckpoint() {
    if (cfg.checkpoint_dir.empty())
      CAIRN_THROW(BadInput, "resume from step ", cfg.resume_step,
                  " needs a checkpoint folder (StageTrainerConfig::checkpoint_dir is empty)");
    const std::string path = checkpointPath(cfg.checkpoint_dir, cfg.resume_step);
    CheckpointData d = readCheckpoint(cfg.checkpoint_dir, cfg.resume_step);
    const nlohmann::json& m = d.meta;
    auto expect = [&](const char* key, const nlohmann::json& want) {
      if (!m.contains(key) || m[key] != want)
        CAIRN_THROW(BadInput, path, ": checkpoint of ", key, " ",
                    m.contains(key) ? m[key].dump() : std::string("(none)"), ", but this is ", key,
                    " ", want.dump(), " (node ", cfg.node.name, " of job ", cfg.node.job_id,
                    "): refusing to load another node's or job's state");
    };
    expect("job_id", cfg.node.job_id);
    expect("node", cfg.node.name);
    expect("cluster", cfg.node.cluster);
    expect("stage", cfg.node.stage);
    expect("num_stages", cfg.node.num_stages);
    expect("schedule", opt.schedule);
    std::map<std::string, torch::Tensor> by_name(d.tensors.begin(), d.tensors.end());
    auto restore = [&](const std::string& name, torch::Tensor target) {
      auto it = by_name.find("stage." + name);
      if (it == by_name.end())
        CAIRN_THROW(BadInput, path, ": lacks stage tensor \"", name, "\"");
      if (it->second.sizes() != target.sizes() ||
          it->second.scalar_type() != target.scalar_type())
        CAIRN_THROW(BadInput, path, ": stage tensor \"", name, "\" is ",
                    c10::toString(it->second.scalar_type()), " ", it->second.sizes(),
                    "; the stage has ", c10::toString(target.scalar_type()), " ", target.sizes());
      target.copy_(it->second);
      by_name.erase(it);
    };
    {
      torch::NoGradGuard no_grad;
      for (const auto& p : executor->module().named_parameters(/*recurse=*/true))
        restore(p.name, p.value);
      for (const auto& b : executor->module().named_buffers(/*recurse=*/true))
        restore(b.name, b.value);
    }
    for (const auto& [name, t] : by_name)
      if (name.rfind("stage.", 0) == 0)
        CAIRN_THROW(BadInput, path, ": stage tensor \"", name.substr(6),
                    "\" is not in this node's stage");
    optimizer->importState(d.tensors, path);
    const auto& params = optimizer->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      auto it = by_name.find("grad." + std::to_string(i));
      if (it == by_name.end()) continue;
      if (it->second.sizes() != params[i].sizes())
        CAIRN_THROW(BadInput, path, ": gradient ", it->first, " does not fit its parameter");
      params[i].mutable_grad() = it->second.clone();
    }
    auto rng = by_name.find("rng.cpu");
    if (rng == by_name.end()) CAIRN_THROW(BadInput, path, ": lacks the generator state rng.cpu");
    {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      try {
        gen.set_state(rng->second);
      } catch (const c10::Error& e) {
        CAIRN_THROW(BadInput, path, ": rng.cpu is not a CPU generator state: ", e.what_without_backtrace());
      }
    }
    if (cfg.cluster_sync) {
      std::vector<std::pair<std::string, torch::Tensor>> sync_tensors;
      for (const auto& name : m.value("sync_tensors", nlohmann::json::array())) {
        auto it = by_name.find(name.get<std::string>());
        if (it == by_name.end()) CAIRN_THROW(BadInput, path, ": lacks sync tensor ", name.dump());
        sync_tensors.emplace_back(it->first, it->second);
      }
      cfg.cluster_sync->loadState(sync_tensors, m.value("sync", nlohmann::json::object()));
    }
    try {
      resumed_updates = m.at("updates").get<int64_t>();
      resumed_since_update = m.at("since_update").get<int64_t>();
    } catch (const nlohmann::json::exception& e) {
      CAIRN_THROW(BadInput, path, ": checkpoint meta lacks an integer updates/since_update: ",
                  e.what());
    }
    start_step = d.step;
    resumed_meta = m;
    CAIRN_INFO("resuming from ", path, " (step ", start_step, ")");
    metrics.write({{"resumed_from", start_step}});
  }

  // After the plan: the checkpoint must belong to this run plan; the Root restores the data cursor.
  void checkResumedPlan() {
    if (cfg.resume_step < 0) return;
    const std::string path = checkpointPath(cfg.checkpoint_dir, cfg.resume_step);
    if (resumed_meta.value("total_steps", int64_t(-1)) != total_steps ||
        resumed_meta.value("steps_per_epoch", int64_t(-1)) != steps_per_epoch)
      CAIRN_THROW(BadInput, path, ": written for a run of ", resumed_meta.value("total_steps", -1),
                  " steps (", resumed_meta.value("steps_per_epoch", -1),
                  " per epoch) but this run plans ", total_steps, " (", steps_per_epoch,
                  " per epoch): job.json changed?");
    if (start_step > total_steps)
      CAIRN_THROW(BadInput, path, ": step ", start_step, " is past the run's ", total_steps);
    if (data.train) data.train->setTrainingDraws(resumed_meta.value("augmentation_draws", uint64_t(0)));
  }

  // Between steps: asks stop_requested (when set). Returns true the first time it says yes.
  bool pollStop() {
    if (stop_flag || !cfg.stop_requested || !cfg.stop_requested()) return false;
    stop_flag = true;
    CAIRN_INFO("stop requested: the cluster finishes the current step, writes a checkpoint and ",
               "stops");
    return true;
  }
  // Stopping after `steps_done` steps (and not at the run's natural end)?
  bool stopsAfter(int64_t steps_done) const {
    return stop_at == steps_done && steps_done < total_steps;
  }

  // ---- timing helpers -------------------------------------------------------------------------
  void send(Neighbour to, const StagePacket& p) {
    const auto t = Clock::now();
    link.send(to, p);
    send_s += secondsSince(t);
  }
  StagePacket receive(Neighbour from, PacketKind kind, uint64_t s, uint64_t mb,
                      const std::string& tag) {
    const auto t = Clock::now();
    StagePacket p = link.receive(from, kind, s, mb, tag);
    wait_s += secondsSince(t);
    return p;
  }

  // ---- the plan -------------------------------------------------------------------------------
  void makePlan() {
    if (is_root) {
      data = loadDatasets(cfg.data, opt.seed);
      sampler =
          std::make_unique<ShardSampler>(data.train->size(), cfg.node.cluster, cfg.num_clusters,
                                         cfg.data.chunks, cfg.data.chunk, opt.seed);
      const int64_t shard = int64_t(sampler->shard().size());
      steps_per_epoch = shard / opt.batch_size;
      if (steps_per_epoch == 0)
        CAIRN_THROW(BadInput, "job.json: training_definition.batch_size (", opt.batch_size,
                    ") exceeds this cluster's shard of ", shard, " samples");
      total_steps = opt.epochs > 0 ? opt.epochs * steps_per_epoch : opt.max_steps;
      if (opt.max_steps > 0) total_steps = std::min(total_steps, opt.max_steps);
      const int64_t test = data.test ? data.test->size() : 0;
      eval_batches = (test + opt.eval_batch_size - 1) / opt.eval_batch_size;
      CAIRN_INFO("data: ", data.train->size(), " training samples (this cluster's shard: ", shard,
                 "), ", test, " test samples; ", total_steps, " steps of ", opt.batch_size,
                 " samples in ", opt.microbatches, " micro-batches");
      if (opt.record_sample_ids && !cfg.sample_ids_path.empty()) {
        sample_ids_out.open(cfg.sample_ids_path,
                            cfg.resume_step >= 0 ? std::ios::app : std::ios::trunc);
        if (!sample_ids_out) CAIRN_THROW(BadInput, cfg.sample_ids_path, ": cannot write");
      }
    } else {
      StagePacket plan = receive(Neighbour::kUpstream, PacketKind::kControl, 0, 0, "plan");
      nlohmann::json j = nlohmann::json::parse(plan.text, nullptr, false);
      if (j.is_discarded() || !j.contains("total_steps"))
        CAIRN_THROW(BadInput, "malformed run plan from upstream: ", plan.text);
      total_steps = j["total_steps"].get<int64_t>();
      steps_per_epoch = j["steps_per_epoch"].get<int64_t>();
      eval_batches = j["eval_batches"].get<int64_t>();
    }
    if (!is_leaf) {
      StagePacket plan;
      plan.kind = PacketKind::kControl;
      plan.tag = "plan";
      plan.text = nlohmann::json{{"total_steps", total_steps},
                                 {"steps_per_epoch", steps_per_epoch},
                                 {"eval_batches", eval_batches}}
                      .dump();
      send(Neighbour::kDownstream, plan);
    }
  }

  // ---- one step -------------------------------------------------------------------------------
  void loadBatch() {
    const int64_t position = step % steps_per_epoch;
    if (epoch_of_order != step / steps_per_epoch) {
      epoch_of_order = step / steps_per_epoch;
      epoch_order = sampler->epochOrder(epoch_of_order);
    }
    std::vector<int64_t> ids(epoch_order.begin() + position * opt.batch_size,
                             epoch_order.begin() + (position + 1) * opt.batch_size);
    if (observer.on_batch) observer.on_batch(step, ids);
    if (sample_ids_out.is_open())
      sample_ids_out << nlohmann::json{{"step", step}, {"ids", ids}}.dump() << '\n' << std::flush;
    checksum = sampleIdChecksum(ids.data(), ids.size());
    Batch batch = data.train->get(ids, /*training=*/true);
    const int64_t terms = lossTermCount(opt.loss, batch.targets);
    torch::Tensor denominator = scalar64(double(std::max<int64_t>(terms, 1)));
    torch::Tensor id_tensor = torch::tensor(ids, torch::kLong);
    const int64_t m = opt.microbatches, base = opt.batch_size / m, extra = opt.batch_size % m;
    int64_t offset = 0;
    for (int64_t k = 0; k < m; ++k) {
      const int64_t size = base + (k < extra ? 1 : 0);
      Microbatch& mb = micro[int(k)];
      mb.inputs = {batch.inputs.narrow(0, offset, size)};
      mb.targets = batch.targets.narrow(0, offset, size);
      mb.ids = id_tensor.narrow(0, offset, size);
      mb.denominator = denominator;
      offset += size;
    }
  }

  // One micro-batch's forward, shared by the sync and async schedules: the Root runs mb.inputs;
  // other stages receive the activation for (step_number, microbatch) from upstream with its
  // targets, ids and denominator. The Leaf computes the micro-batch's loss share (and, when it is
  // not also the Root, adds its sample ids to *id_checksum); other stages send their outputs on.
  // `id` is the executor's micro-batch key.
  void forwardOf(Microbatch& mb, uint64_t id, int64_t step_number, int64_t microbatch,
                 uint64_t* id_checksum) {
    std::vector<torch::Tensor> inputs;
    if (is_root) {
      inputs = mb.inputs;
    } else {
      StagePacket in = receive(Neighbour::kUpstream, PacketKind::kActivation,
                               uint64_t(step_number), uint64_t(microbatch), "");
      const size_t n = cfg.node.inputs.size();
      if (in.tensors.size() < n)
        CAIRN_THROW(BadInput, "activation for step ", step_number, " micro-batch ", microbatch,
                    " has ", in.tensors.size(), " tensors, fewer than the stage's ", n, " inputs");
      for (size_t i = 0; i < n; ++i) inputs.push_back(in.tensors[i].second);
      mb.targets = in.tensor(kTargets);
      mb.ids = in.tensor(kIds);
      mb.denominator = in.tensor(kDenominator);
      readStopAt(in);
    }
    const auto t = Clock::now();
    std::vector<torch::Tensor> outputs = executor->forward(id, inputs);
    if (is_leaf) {
      if (mb.targets.size(0) != mb.ids.size(0))
        CAIRN_THROW(BadInput, "micro-batch ", microbatch, " of step ", step_number, ": ",
                    mb.targets.size(0), " targets for ", mb.ids.size(0), " sample ids");
      mb.loss = microbatchLoss(opt.loss, outputs.at(0), mb.targets, mb.denominator.item<double>());
      compute_s += secondsSince(t);
      if (!is_root) {
        torch::Tensor ids = mb.ids.to(torch::kLong).contiguous();
        *id_checksum += sampleIdChecksum(ids.data_ptr<int64_t>(), size_t(ids.numel()));
      }
      return;
    }
    compute_s += secondsSince(t);
    StagePacket out;
    out.kind = PacketKind::kActivation;
    out.step = uint64_t(step_number);
    out.microbatch = uint64_t(microbatch);
    for (size_t i = 0; i < outputs.size(); ++i)
      out.tensors.emplace_back(cfg.node.outputs[i].name, outputs[i].detach());
    out.tensors.emplace_back(kTargets, mb.targets);
    out.tensors.emplace_back(kIds, mb.ids);
    out.tensors.emplace_back(kDenominator, mb.denominator);
    if (stop_at >= 0) out.tensors.emplace_back(kStopAt, torch::tensor(stop_at, torch::kLong));
    mb.inputs.clear();  // not needed after the forward (the executor keeps what backward needs)
    send(Neighbour::kDownstream, out);
  }

  void forward(int k) { forwardOf(micro[k], uint64_t(k), step, k, &checksum); }

  void readStopAt(const StagePacket& in) {
    if (!in.has(kStopAt)) return;
    const torch::Tensor& t = in.tensor(kStopAt);
    // The stop step must lie after the packet's step and never change once announced.
    const int64_t value = t.numel() == 1 && t.scalar_type() == torch::kLong ? t.item<int64_t>() : -1;
    const int64_t clamped = std::min(value, total_steps);  // past the end: the normal end
    const std::string got = t.numel() == 1 && t.scalar_type() == torch::kLong
                                ? std::to_string(value)
                                : std::string("a ") + c10::toString(t.scalar_type()) +
                                      " tensor of " + std::to_string(t.numel()) + " elements";
    if (value <= int64_t(in.step) || (stop_at >= 0 && clamped != stop_at))
      CAIRN_THROW(BadInput, "activation from upstream for step ", in.step, " micro-batch ",
                  in.microbatch, ": ", kStopAt, " must be one int64 greater than the step",
                  stop_at >= 0 ? " and equal to the announced " + std::to_string(stop_at) : "",
                  " (got ", got, ")");
    stop_at = clamped;
  }

  // One micro-batch's backward, shared by the sync and async schedules: the Leaf starts from its
  // loss; other stages receive the gradient of their outputs for (step, microbatch) from
  // downstream (an empty tensor means "no gradient"). `id` is the executor's micro-batch key.
  // Returns the input gradients; *loss_share gets this micro-batch's share of the step loss.
  std::vector<torch::Tensor> backwardOf(Microbatch& mb, uint64_t id, uint64_t step_number,
                                        uint64_t microbatch, double* loss_share) {
    if (is_leaf) {
      const auto t = Clock::now();
      *loss_share = mb.loss.item<double>();
      auto input_grads = executor->backwardFromLoss(id, mb.loss);
      compute_s += secondsSince(t);
      return input_grads;
    }
    StagePacket in =
        receive(Neighbour::kDownstream, PacketKind::kGradient, step_number, microbatch, "");
    const auto& outputs = executor->outputsOf(id);
    std::vector<torch::Tensor> grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      torch::Tensor g = i < in.tensors.size() ? in.tensors[i].second : torch::Tensor();
      if (g.defined() && g.numel() == 0 && outputs[i].numel() != 0) g = torch::Tensor();
      grads.push_back(g);
    }
    *loss_share = in.tensor(kLoss).item<double>();
    if (in.has(kStop)) stop_flag = true;
    const auto t = Clock::now();
    auto input_grads = executor->backward(id, grads);
    compute_s += secondsSince(t);
    return input_grads;
  }

  // Sends a micro-batch's input gradients upstream (an empty tensor for "no gradient") with its
  // share of the step loss; shared by the sync and async schedules.
  void sendInputGradients(uint64_t step_number, uint64_t microbatch,
                          const std::vector<torch::Tensor>& input_grads, double loss_share) {
    StagePacket out;
    out.kind = PacketKind::kGradient;
    out.step = step_number;
    out.microbatch = microbatch;
    for (size_t i = 0; i < input_grads.size(); ++i)
      out.tensors.emplace_back(cfg.node.inputs[i].name,
                               input_grads[i].defined() ? input_grads[i] : torch::empty({0}));
    out.tensors.emplace_back(kLoss, scalar64(loss_share));
    if (stop_flag) out.tensors.emplace_back(kStop, torch::tensor(int64_t(1), torch::kLong));
    send(Neighbour::kUpstream, out);
  }

  void backward(int k) {
    auto it = micro.find(k);
    CAIRN_ENFORCE(it != micro.end());
    Microbatch& mb = it->second;
    double loss_share = 0;
    std::vector<torch::Tensor> input_grads =
        backwardOf(mb, uint64_t(k), uint64_t(step), uint64_t(k), &loss_share);
    step_loss += loss_share;
    if (!is_root) sendInputGradients(uint64_t(step), uint64_t(k), input_grads, loss_share);
    micro.erase(it);
  }

  // Global gradient norm: partial sums of squares Leaf -> Root, the total back Root -> Leaf.
  void reduceGradNorm() {
    auto t = Clock::now();
    double partial = squaredGradientNorm(optimizer->parameters());
    compute_s += secondsSince(t);
    auto control = [&](const char* tag, double value) {
      StagePacket p;
      p.kind = PacketKind::kControl;
      p.step = uint64_t(step);
      p.tag = tag;
      p.tensors.emplace_back(kNorm, scalar64(value));
      return p;
    };
    if (!is_leaf)
      partial +=
          receive(Neighbour::kDownstream, PacketKind::kControl, uint64_t(step), 0, "norm_partial")
              .tensor(kNorm)
              .item<double>();
    double total = partial;
    if (!is_root) {
      send(Neighbour::kUpstream, control("norm_partial", partial));
      total = receive(Neighbour::kUpstream, PacketKind::kControl, uint64_t(step), 0, "norm_total")
                  .tensor(kNorm)
                  .item<double>();
    }
    if (!is_leaf) send(Neighbour::kDownstream, control("norm_total", total));
    grad_norm = std::sqrt(total);
    t = Clock::now();
    scaleGradientsForClipping(optimizer->parameters(), grad_norm, opt.clip_grad_norm);
    compute_s += secondsSince(t);
  }

  // ---- evaluation -----------------------------------------------------------------------------
  EvalResult evaluate() {
    EvalTally tally;
    int64_t samples = 0;
    for (int64_t b = 0; b < eval_batches; ++b) {
      torch::Tensor targets;
      std::vector<torch::Tensor> outputs;
      if (is_root) {
        const int64_t n = data.test->size();
        std::vector<int64_t> ids;
        for (int64_t i = b * opt.eval_batch_size; i < std::min(n, (b + 1) * opt.eval_batch_size);
             ++i)
          ids.push_back(i);
        Batch batch = data.test->get(ids, /*training=*/false);
        targets = batch.targets;
        outputs = executor->evaluate({batch.inputs});
      } else {
        StagePacket in =
            receive(Neighbour::kUpstream, PacketKind::kEvaluation, uint64_t(step), uint64_t(b), "");
        std::vector<torch::Tensor> inputs;
        for (size_t i = 0; i < cfg.node.inputs.size() && i < in.tensors.size(); ++i)
          inputs.push_back(in.tensors[i].second);
        targets = in.tensor(kTargets);
        outputs = executor->evaluate(inputs);
      }
      if (is_leaf) {
        EvalTally t = evaluationTally(opt.loss, outputs.at(0), targets);
        tally.loss_sum += t.loss_sum;
        tally.terms += t.terms;
        tally.correct += t.correct;
        samples += targets.size(0);
      } else {
        StagePacket out;
        out.kind = PacketKind::kEvaluation;
        out.step = uint64_t(step);
        out.microbatch = uint64_t(b);
        for (size_t i = 0; i < outputs.size(); ++i)
          out.tensors.emplace_back(cfg.node.outputs[i].name, outputs[i]);
        out.tensors.emplace_back(kTargets, targets);
        send(Neighbour::kDownstream, out);
      }
    }
    EvalResult result;
    result.step = step;
    if (is_leaf) {
      result.samples = samples;
      result.loss = tally.terms ? tally.loss_sum / double(tally.terms) : 0;
      if (opt.loss.kind != LossKind::kMse && cfg.data.format != "tokens")
        result.accuracy = tally.terms ? double(tally.correct) / double(tally.terms) : 0;
      if (cfg.data.format == "tokens") {
        result.perplexity = std::exp(result.loss);
        result.accuracy = tally.terms ? double(tally.correct) / double(tally.terms) : 0;
      }
    }
    nlohmann::json j;
    if (!is_leaf) {
      StagePacket in =
          receive(Neighbour::kDownstream, PacketKind::kControl, uint64_t(step), 0, "eval_result");
      j = nlohmann::json::parse(in.text, nullptr, false);
      if (j.is_discarded()) CAIRN_THROW(BadInput, "malformed evaluation result from downstream");
      result.samples = j.value("samples", int64_t(0));
      result.loss = j.value("loss", 0.0);
      result.accuracy = j.value("accuracy", -1.0);
      result.perplexity = j.value("perplexity", -1.0);
    } else {
      j = {{"step", result.step},
           {"samples", result.samples},
           {"loss", result.loss},
           {"accuracy", result.accuracy},
           {"perplexity", result.perplexity}};
    }
    if (!is_root) {
      StagePacket out;
      out.kind = PacketKind::kControl;
      out.step = uint64_t(step);
      out.tag = "eval_result";
      out.text = j.dump();
      send(Neighbour::kUpstream, out);
    }
    metrics.write({{"eval", j}});
    std::string line = "evaluation after step " + std::to_string(step) + ": " +
                       std::to_string(result.samples) + " test samples, loss " +
                       std::to_string(result.loss);
    if (result.accuracy >= 0) {
      char buffer[64];
      std::snprintf(buffer, sizeof buffer, ", accuracy %.2f%%", 100.0 * result.accuracy);
      line += buffer;
    }
    if (result.perplexity >= 0) line += ", perplexity " + std::to_string(result.perplexity);
    CAIRN_INFO(line);
    return result;
  }

  // ---- the run --------------------------------------------------------------------------------
  TrainerResult run() {
    if (opt.schedule == "async") return runAsync();
    const auto start = Clock::now();
    makePlan();
    checkResumedPlan();
    if (cfg.cluster_sync) cfg.cluster_sync->start(executor->module());
    LrSchedule lr_schedule(opt.optimizer.lr, opt.lr_scheduler, total_steps);
    TrainerResult result;
    const int64_t epochs = (total_steps + steps_per_epoch - 1) / steps_per_epoch;
    auto last = Clock::now();
    for (step = start_step; step < total_steps; ++step) {
      // Clean stop (docs/TRAINING.md "Stopping"): the Root's own request ends the run after this
      // step; a request from downstream (a "__stop" on this step's gradients) after the next one,
      // whose activations carry the decision ("__stop_at") to every node.
      pollStop();
      if (is_root && stop_flag && stop_at < 0) stop_at = step + 1;
      step_loss = compute_s = send_s = wait_s = sync_s = 0;
      grad_norm = -1;
      checksum = 0;
      micro.clear();
      if (is_root) {
        const auto t = Clock::now();
        loadBatch();
        compute_s += secondsSince(t);
      }
      const double lr = lr_schedule.at(step);
      bool gradients_synced = false;
      auto syncGradients = [&] {
        if (gradients_synced || !cfg.cluster_sync) return;
        gradients_synced = true;
        const auto t = Clock::now();
        cfg.cluster_sync->beforeOptimizerStep(step, executor->module());
        sync_s += secondsSince(t);
      };
      schedule.begin();
      for (ScheduleAction a = schedule.next(); a.kind != ScheduleAction::Kind::kStepDone;
           a = schedule.next()) {
        switch (a.kind) {
          case ScheduleAction::Kind::kForward:
            forward(a.microbatch);
            break;
          case ScheduleAction::Kind::kBackward:
            backward(a.microbatch);
            break;
          case ScheduleAction::Kind::kReduceGradNorm:
            syncGradients();
            reduceGradNorm();
            break;
          case ScheduleAction::Kind::kOptimizerStep: {
            syncGradients();
            const auto t = Clock::now();
            optimizer->step(lr);
            optimizer->zeroGrad();
            compute_s += secondsSince(t);
            if (cfg.cluster_sync) {
              const auto ts = Clock::now();
              cfg.cluster_sync->afterOptimizerStep(step, executor->module());
              sync_s += secondsSince(ts);
            }
            break;
          }
          case ScheduleAction::Kind::kStepDone:
            break;
        }
        schedule.complete(a);
      }
      CAIRN_ENFORCE(executor->pendingMicrobatches() == 0,
                    "micro-batches left in flight after a step");
      if (is_root && stop_flag && stop_at < 0) stop_at = step + 2;
      const double step_seconds = secondsSince(last);
      last = Clock::now();
      const double samples_per_second = double(opt.batch_size) / std::max(step_seconds, 1e-9);
      if (observer.on_step_loss) observer.on_step_loss(step, step_loss);
      nlohmann::json record = {{"step", step + 1},
                               {"epoch", step / steps_per_epoch},
                               {"loss", step_loss},
                               {"lr", lr},
                               {"samples_per_s", samples_per_second},
                               {"compute_s", compute_s},
                               {"send_s", send_s},
                               {"wait_s", wait_s}};
      if (is_root || is_leaf) record["sample_checksum"] = checksum;
      if (grad_norm >= 0) record["grad_norm"] = grad_norm;
      if (cfg.cluster_sync) record["sync_s"] = sync_s;
      metrics.write(record);
      result.last_loss = step_loss;
      const double elapsed = secondsSince(start);
      progress.update({step / steps_per_epoch, epochs, step + 1, total_steps, step_loss,
                       double((step + 1) * opt.batch_size) / std::max(elapsed, 1e-9), elapsed});
      const bool stopping = stopsAfter(step + 1);
      if (checkpointDue(step + 1) || (stopping && checkpointsOn()))
        saveCheckpoint(step + 1, step + 1, 0);
      if (stopping) {
        progress.finish();
        CAIRN_INFO("stopped cleanly after step ", step + 1, " of ", total_steps);
        result.stopped = true;
        result.steps = step + 1;
        result.seconds = secondsSince(start);
        metrics.write({{"stopped", {{"steps", result.steps}, {"seconds", result.seconds}}}});
        return result;
      }
      const bool last_step = step + 1 == total_steps;
      if (!last_step && opt.eval_every > 0 && (step + 1) % opt.eval_every == 0 &&
          eval_batches > 0) {
        ++step;  // evaluation messages carry the number of steps done
        progress.finish();
        evaluate();
        --step;
      }
    }
    progress.finish();
    if (cfg.cluster_sync) cfg.cluster_sync->finish(total_steps, executor->module());
    result.steps = total_steps;
    const double train_seconds = secondsSince(start);
    result.samples_per_second =
        double(total_steps * opt.batch_size) / std::max(train_seconds, 1e-9);
    step = total_steps;
    if (eval_batches > 0) result.final_eval = evaluate();
    result.seconds = secondsSince(start);
    metrics.write({{"done",
                    {{"steps", result.steps},
                     {"seconds", result.seconds},
                     {"train_samples_per_s", result.samples_per_second}}}});
    return result;
  }

  // ---- schedule "async" (docs/TRAINING.md "Async schedule") ------------------------------------
  // Micro-batch g (0 <= g < total_steps * microbatches) belongs to step g / M as micro-batch
  // g % M; packets keep the sync addressing (step, micro-batch). Each node runs the fixed order
  // F^W (B F)* B^W with W = max(1, K - stage) forwards ahead (the Leaf: 1): deadlock-free because W
  // never grows downstream. The optimizer steps after every `update_frequency` backwards (and after
  // the last one); every forward and its backward use the same weights (StageExecutor stashing).
  struct AsyncStep {
    double loss = 0;
    uint64_t checksum = 0;
  };
  std::map<int64_t, Microbatch> async_micro;
  std::map<int64_t, AsyncStep> async_steps;

  void asyncForward(int64_t g) {
    const int64_t M = opt.microbatches, s = g / M, k = g % M;
    if (is_root && k == 0) {
      const auto t = Clock::now();
      step = s;
      micro.clear();
      loadBatch();
      for (auto& [i, m] : micro) async_micro[s * M + i] = std::move(m);
      micro.clear();
      async_steps[s].checksum = checksum;
      compute_s += secondsSince(t);
    }
    Microbatch& mb = is_root ? async_micro.at(g) : async_micro[g];
    forwardOf(mb, uint64_t(g), s, k, &async_steps[s].checksum);
  }

  void asyncBackward(int64_t g) {
    const int64_t M = opt.microbatches, s = g / M, k = g % M;
    auto it = async_micro.find(g);
    CAIRN_ENFORCE(it != async_micro.end());
    Microbatch& mb = it->second;
    double loss_share = 0;
    std::vector<torch::Tensor> input_grads =
        backwardOf(mb, uint64_t(g), uint64_t(s), uint64_t(k), &loss_share);
    async_steps[s].loss += loss_share;
    if (!is_root) sendInputGradients(uint64_t(s), uint64_t(k), input_grads, loss_share);
    async_micro.erase(it);
  }

  TrainerResult runAsync() {
    const auto start = Clock::now();
    makePlan();
    checkResumedPlan();
    executor->enableWeightStashing();
    if (cfg.cluster_sync) cfg.cluster_sync->start(executor->module());
    LrSchedule lr_schedule(opt.optimizer.lr, opt.lr_scheduler, total_steps);
    TrainerResult result;
    const int64_t M = opt.microbatches, total = total_steps * M;
    const int64_t K = opt.max_in_flight > 0 ? opt.max_in_flight : cfg.node.num_stages;
    const int64_t ahead = is_leaf ? 1 : std::max<int64_t>(1, K - cfg.node.stage);
    const int64_t epochs = (total_steps + steps_per_epoch - 1) / steps_per_epoch;
    int64_t forwards = start_step * M, backwards = start_step * M;
    int64_t updates = resumed_updates, since_update = resumed_since_update;
    auto last = Clock::now();
    compute_s = send_s = wait_s = sync_s = 0;
    // Micro-batches this run goes to: all, or up to the step the cluster stops at (the Root
    // decides it as soon as it learns of a stop request, as the step after the one it is feeding,
    // and tells downstream with "__stop_at" on every activation from then on).
    auto end = [&] { return stop_at >= 0 ? std::min(total, stop_at * M) : total; };
    auto decideStop = [&] {
      if (is_root && stop_flag && stop_at < 0) stop_at = forwards / M + 1;
    };
    pollStop();
    decideStop();
    while (backwards < end()) {
      // A checkpoint must be consistent: before the first forward of a checkpointed step the
      // pipeline drains (every earlier micro-batch finishes its backward; docs/TRAINING.md).
      const bool drain = forwards % M == 0 && checkpointDue(forwards / M) && backwards < forwards;
      if (forwards < end() && forwards - backwards < ahead && !drain) {
        asyncForward(forwards++);
        continue;
      }
      const int64_t g = backwards++;
      asyncBackward(g);
      decideStop();
      const int64_t s = g / M;
      if (++since_update == opt.update_frequency || backwards == total) {
        since_update = 0;
        const double lr = lr_schedule.at(s);
        if (cfg.cluster_sync) {
          const auto t = Clock::now();
          cfg.cluster_sync->beforeOptimizerStep(updates, executor->module());
          sync_s += secondsSince(t);
        }
        const auto t = Clock::now();
        executor->newVersion();  // forwards in flight keep the weights they used
        optimizer->step(lr);
        optimizer->zeroGrad();
        compute_s += secondsSince(t);
        if (cfg.cluster_sync) {
          const auto ts = Clock::now();
          cfg.cluster_sync->afterOptimizerStep(updates, executor->module());
          sync_s += secondsSince(ts);
        }
        ++updates;
      }
      if (g % M != M - 1) continue;
      // Step s is complete on this node: record it.
      step = s;
      const AsyncStep done = async_steps[s];
      async_steps.erase(s);
      const double step_seconds = secondsSince(last);
      last = Clock::now();
      if (observer.on_step_loss) observer.on_step_loss(s, done.loss);
      const auto& stash = executor->stashStats();
      nlohmann::json record = {{"step", s + 1},
                               {"epoch", s / steps_per_epoch},
                               {"loss", done.loss},
                               {"lr", lr_schedule.at(s)},
                               {"samples_per_s", double(opt.batch_size) / std::max(step_seconds, 1e-9)},
                               {"compute_s", compute_s},
                               {"send_s", send_s},
                               {"wait_s", wait_s},
                               {"updates", updates},
                               {"in_flight", forwards - backwards},
                               {"stash_versions", stash.versions},
                               {"stash_bytes", stash.bytes},
                               {"stash_max_versions", stash.max_versions},
                               {"stash_max_bytes", stash.max_bytes}};
      if (is_root || is_leaf) record["sample_checksum"] = done.checksum;
      if (cfg.cluster_sync) record["sync_s"] = sync_s;
      metrics.write(record);
      compute_s = send_s = wait_s = sync_s = 0;
      result.last_loss = done.loss;
      const double elapsed = secondsSince(start);
      progress.update({s / steps_per_epoch, epochs, s + 1, total_steps, done.loss,
                       double((s + 1) * opt.batch_size) / std::max(elapsed, 1e-9), elapsed});
      pollStop();
      decideStop();
      const bool stopping = stopsAfter(s + 1);
      if (checkpointDue(s + 1) || (stopping && checkpointsOn())) {
        CAIRN_ENFORCE(forwards == backwards, "async checkpoint without draining");
        saveCheckpoint(s + 1, updates, since_update);
      }
      if (stopping) {
        progress.finish();
        CAIRN_INFO("stopped cleanly after step ", s + 1, " of ", total_steps);
        result.stopped = true;
        result.steps = s + 1;
        result.seconds = secondsSince(start);
        metrics.write({{"stopped", {{"steps", result.steps}, {"seconds", result.seconds}}}});
        return result;
      }
      if (s + 1 < total_steps && opt.eval_every > 0 && (s + 1) % opt.eval_every == 0 &&
          eval_batches > 0) {
        step = s + 1;  // evaluation messages carry the number of steps done
        progress.finish();
        evaluate();
      }
    }
    CAIRN_ENFORCE(executor->pendingMicrobatches() == 0, "micro-batches left in flight at the end");
    progress.finish();
    if (cfg.cluster_sync) cfg.cluster_sync->finish(updates, executor->module());
    result.steps = total_steps;
    const double train_seconds = secondsSince(start);
    result.samples_per_second =
        double(total_steps * opt.batch_size) / std::max(train_seconds, 1e-9);
    step = total_steps;
    if (eval_batches > 0) result.final_eval = evaluate();
    result.seconds = secondsSince(start);
    const auto& stash = executor->stashStats();
    metrics.write({{"done",
                    {{"steps", result.steps},
                     {"updates", updates},
                     {"seconds", result.seconds},
                     {"train_samples_per_s", result.samples_per_second},
                     {"stash_max_versions", stash.max_versions},
                     {"stash_max_bytes", stash.max_bytes},
                     {"stash_copies", stash.copies}}}});
    return result;
  }
};

StageTrainer::StageTrainer(StageTrainerConfig config, torch::jit::Module stage, StageLink& link,
                           TrainerObserver observer)
    : impl_(
          std::make_unique<Impl>(std::move(config), std::move(stage), link, std::move(observer))) {}
StageTrainer::~StageTrainer() = default;
TrainerResult StageTrainer::run() { return impl_->run(); }
StageExecutor& StageTrainer::executor() { return *impl_->executor; }

}  // namespace cairn
