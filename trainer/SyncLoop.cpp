#include "trainer/SyncLoop.h"

#include "core/Error.h"
#include "trainer/LrSchedule.h"
#include "trainer/RunPlan.h"
#include "trainer/SharedParameters.h"
#include "trainer/StageExecutor.h"

namespace cairn {

void SyncLoop::forward(int k) { passes_.forward(micro_[k], uint64_t(k), step_, k, &checksum_); }

void SyncLoop::backward(int k) {
  auto it = micro_.find(k);
  CAIRN_ENFORCE(it != micro_.end());
  if (k == last_backward_) ctx_.shared->receivePartials(step_);
  syncBeforeBackward(ctx_, step_, k == last_backward_);
  step_loss_ += passes_.backward(it->second, uint64_t(k), uint64_t(step_), uint64_t(k));
  micro_.erase(it);
}

double SyncLoop::walkSchedule(double lr) {
  double grad_norm = -1;
  bool gradients_synced = false;
  auto syncGradients = [&] {
    if (gradients_synced) return;
    gradients_synced = true;
    passes_.flush();  // the last backward's gradients leave before any wait for a ring
    ctx_.shared->sendPartials(step_);
    syncBeforeOptimizerStep(ctx_, step_);
    ctx_.shared->shareTotals(step_);
  };
  schedule_.begin();
  last_backward_ = -1;  // the step's last backward: its gradients are final after it
  for (const ScheduleAction& a : schedule_.actions())
    if (a.kind == ScheduleAction::Kind::kBackward) last_backward_ = a.microbatch;
  for (ScheduleAction a = schedule_.next(); a.kind != ScheduleAction::Kind::kStepDone;
       a = schedule_.next()) {
    switch (a.kind) {
      case ScheduleAction::Kind::kForward:
        forward(a.microbatch);
        break;
      case ScheduleAction::Kind::kBackward:
        backward(a.microbatch);
        break;
      case ScheduleAction::Kind::kReduceGradNorm:
        syncGradients();
        grad_norm = norm_.reduceAndClip(step_);
        break;
      case ScheduleAction::Kind::kOptimizerStep:
        syncGradients();
        optimizerStep(ctx_, lr, step_, /*new_version=*/false);
        break;
      case ScheduleAction::Kind::kStepDone:
        break;
    }
    schedule_.complete(a);
  }
  CAIRN_ENFORCE(ctx_.executor.pendingMicrobatches() == 0,
                "micro-batches left in flight after a step");
  passes_.flush();  // nothing is left to send between steps
  return grad_norm;
}

TrainerResult SyncLoop::run(int64_t start_step, TrainerClock::time_point run_start) {
  const RunPlan& plan = ctx_.plan;
  LrSchedule lr_schedule(ctx_.opt.optimizer.lr, ctx_.opt.lr_scheduler, plan.total_steps);
  int64_t lr_total = plan.total_steps;  // a new deal changes the run's length (DealChange.h)
  TrainerResult result;
  recorder_.begin(run_start);
  for (step_ = start_step; step_ < plan.total_steps; ++step_) {
    // Clean stop (docs/TRAINING.md "Stopping"): the Root's own request ends the run after this
    // step; a request from downstream (a "__stop" on this step's gradients) after the next one,
    // whose activations carry the decision ("__stop_at") to every node.
    const auto bookkeeping = TrainerClock::now();
    stop_.poll();
    stop_.decide(step_ + 1);
    ctx_.times.reset();
    step_loss_ = 0;
    checksum_ = 0;
    micro_.clear();
    // The learning rate first: a deal the Root takes now changes the schedule from the next step
    // on, as on the nodes downstream that learn it during this step.
    if (plan.total_steps != lr_total) {
      lr_total = plan.total_steps;
      lr_schedule = LrSchedule(ctx_.opt.optimizer.lr, ctx_.opt.lr_scheduler, lr_total);
    }
    const double lr = lr_schedule.at(step_);
    if (deal_ && ctx_.is_root) deal_->atStep(step_);
    recorder_.addBookkeeping(secondsSince(bookkeeping));
    if (ctx_.is_root) {
      const auto t = TrainerClock::now();
      checksum_ = feeder_.load(step_, &micro_);
      ctx_.times.compute_s += secondsSince(t);
    }
    const double grad_norm = walkSchedule(lr);
    step_loss_ += passes_.takeLosses(step_);  // a whole-model stage's, after its optimizer step
    stop_.decide(step_ + 2);
    StepRecord record;
    record.step = step_;
    record.loss = step_loss_;
    record.lr = lr;
    record.sample_checksum = checksum_;
    record.grad_norm = grad_norm;
    recorder_.record(record, &result);
    if (recorder_.atBoundary(step_ + 1, step_ + 1, 0, /*drained=*/true, &result)) return result;
  }
  recorder_.finishRun(plan.total_steps, {}, &result);
  return result;
}

}  // namespace cairn
