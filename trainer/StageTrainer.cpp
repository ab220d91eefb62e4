// StageTrainer is a facade: it builds the units one node's run is made of, loads a checkpoint when
// resuming, negotiates the run plan and hands the steps to SyncLoop or AsyncLoop.
//   TrainerContext      what the units share (config, role, executor, optimizer, metrics, plan)
//   RunPlan             total steps, steps per epoch, evaluation batches; sent Root -> Leaf
//   BatchFeeder         the Root's data: sampler -> dataset -> micro-batches
//   MicrobatchPasses    one micro-batch's forward and backward over the link
//   GradNormReducer     the global gradient norm for clipping (sync)
//   StopCoordinator     the in-band clean stop ("__stop" / "__stop_at")
//   TrainerCheckpoints  save/load of the stage state
//   Evaluator           evaluation passes
//   StepRecorder        the end of a step: metrics, progress, checkpoint, stop, evaluation
//   SyncLoop, AsyncLoop the two schedules
#include "trainer/StageTrainer.h"

#include "trainer/AsyncLoop.h"
#include "trainer/BatchFeeder.h"
#include "trainer/ClusterSync.h"
#include "trainer/Dataset.h"
#include "trainer/DealChange.h"
#include "trainer/Device.h"
#include "trainer/Evaluator.h"
#include "trainer/GradNormReducer.h"
#include "trainer/Metrics.h"
#include "trainer/MicrobatchPasses.h"
#include "trainer/Optimizer.h"
#include "trainer/ParamGroups.h"
#include "trainer/RunPlan.h"
#include "trainer/SharedParameters.h"
#include "trainer/StageExecutor.h"
#include "trainer/StepRecorder.h"
#include "trainer/StopCoordinator.h"
#include "trainer/SyncLoop.h"
#include "trainer/SyncSchedule.h"
#include "trainer/TrainerCheckpoints.h"
#include "trainer/TrainerContext.h"

namespace cairn {
namespace {

// The placement the config asks for (the CPU when none), with the module moved there.
std::shared_ptr<const TensorPlacement> placementOf(const StageTrainerConfig& cfg,
                                                  torch::jit::Module& stage) {
  std::shared_ptr<const TensorPlacement> placement =
      cfg.placement ? cfg.placement : makePlacement(torch::kCPU);
  if (!placement->device().is_cpu()) stage.to(placement->device());
  configureDeviceMath(placement->device(), cfg.options.precision);
  return placement;
}

MetricsLog openMetrics(const StageTrainerConfig& cfg) {
  if (cfg.metrics_path.empty()) return MetricsLog();
  return MetricsLog(cfg.metrics_path, /*append=*/cfg.resume_step >= 0);
}

}  // namespace

struct StageTrainer::Impl {
  StageTrainerConfig cfg;
  TrainerObserver observer;
  std::shared_ptr<const TensorPlacement> placement;
  const bool is_root, is_leaf;
  SyncSchedule schedule;
  std::unique_ptr<StageExecutor> executor;
  std::unique_ptr<Optimizer> optimizer;
  MetricsLog metrics;
  DatasetPair data;  // Root only
  RunPlan plan;      // negotiated in run()
  StepTimes times;
  TrainerContext ctx;
  TimedLink link;
  SharedParameters shared;
  StopCoordinator stop;
  TrainerCheckpoints checkpoints;
  BatchFeeder feeder;
  MicrobatchPasses passes;
  GradNormReducer norm;
  Evaluator evaluator;
  StepRecorder recorder;
  DealChange deal_change;

  Impl(StageTrainerConfig c, torch::jit::Module stage, StageLink& l, TrainerObserver o)
      : cfg(std::move(c)),
        observer(std::move(o)),
        placement(placementOf(cfg, stage)),
        is_root(cfg.node.stage == 0),
        is_leaf(cfg.node.stage == cfg.node.num_stages - 1),
        schedule(cfg.node.stage, cfg.node.num_stages, int(cfg.options.microbatches),
                 cfg.options.pipeline, cfg.options.clip_grad_norm > 0),
        executor(std::make_unique<StageExecutor>(std::move(stage), cfg.node.inputs,
                                                 cfg.node.outputs,
                                                 /*inputs_need_grad=*/!is_root)),
        optimizer(makeStageOptimizer(executor->module(), cfg.options.optimizer)),
        metrics(openMetrics(cfg)),
        ctx{cfg,  cfg.options, is_root, is_leaf,  *executor, *optimizer,
            metrics, plan,      times,   observer, *placement},
        link(l, times, *placement, cfg.options.wire.activations),
        shared(ctx, link),
        stop(cfg, is_root),
        checkpoints(ctx, data),
        feeder(ctx, data),
        passes(ctx, link, stop),
        norm(ctx, link),
        evaluator(ctx, link, data),
        recorder(ctx, stop, checkpoints, evaluator, l),
        deal_change(ctx, plan, feeder) {
    ctx.shared = &shared;
    passes.setDealChange(&deal_change);
    if (is_root) checkpoints.setDeal([this]() -> const std::vector<DealEntry>& { return feeder.deal(); });
    if (observer.on_metrics_record) metrics.setTee(observer.on_metrics_record);
    const TrainOptions& opt = cfg.options;
    torch::manual_seed(opt.seed * 1000003u + uint64_t(cfg.node.cluster) * 7919u +
                       uint64_t(cfg.node.stage));
    executor->setPrecision(opt.precision);
    executor->setPlacement(placement);
    announcePrecision(opt.precision, placement->device().type());
    if (cfg.resume_step >= 0) checkpoints.load();
  }

  // Only the Root has the data: it computes the plan; the others learn it from upstream; every
  // node but the Leaf passes it downstream before the first step.
  void negotiatePlan() {
    plan = is_root ? feeder.open() : RunPlan::receiveFromUpstream(link);
    if (!is_leaf) plan.sendDownstream(link);
  }

  TrainerResult run() {
    makeCurrentDevice(placement->device());  // the thread that trains: its current device
    const auto start = TrainerClock::now();
    negotiatePlan();
    if (observer.on_plan) observer.on_plan(plan.total_steps, plan.steps_per_epoch);
    checkpoints.checkResumedPlan();
    const bool async = cfg.options.schedule == ScheduleKind::kAsync;
    if (async) executor->enableWeightStashing();
    // A cluster the deal adds mid-run starts at plan.first_step with its ring peers' weights
    // (docs/TRAINING.md "the deal"); a resumed one from its checkpoint, as always.
    ResumePoint from = checkpoints.resumePoint();
    const bool joins = cfg.resume_step < 0 && plan.first_step > 0;
    if (joins) from = ResumePoint{plan.first_step, 0, 0};
    if (cfg.cluster_sync) {
      cfg.cluster_sync->setPlacement(placement);
      if (joins) cfg.cluster_sync->setJoining(true);
      cfg.cluster_sync->setResumedFromAnotherProcess(from.another_process);
      // Joiners admitted at the same sync in every ring: the Root decides, the activations carry
      // it down (ClusterSync::gateAdmissions; the sync schedule, where every stage syncs after
      // the same steps).
      if (!async) cfg.cluster_sync->gateAdmissions(is_root);
      cfg.cluster_sync->start(executor->module());
    }
    // Copies of a shared parameter start from the first holder's (which the rings may have set).
    shared.shareWeights(from.start_step, "shared_weights_start", /*always=*/true);
    if (async) return AsyncLoop(ctx, feeder, passes, stop, checkpoints, recorder).run(from, start);
    return SyncLoop(ctx, schedule, feeder, passes, norm, stop, recorder, &deal_change)
        .run(from.start_step, start);
  }
};

StageTrainer::StageTrainer(StageTrainerConfig config, torch::jit::Module stage, StageLink& link,
                           TrainerObserver observer)
    : impl_(
          std::make_unique<Impl>(std::move(config), std::move(stage), link, std::move(observer))) {}
StageTrainer::~StageTrainer() = default;
TrainerResult StageTrainer::run() { return impl_->run(); }
StageExecutor& StageTrainer::executor() { return *impl_->executor; }
Optimizer& StageTrainer::optimizer() { return *impl_->optimizer; }

}  // namespace cairn
