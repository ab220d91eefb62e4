#include "trainer/StepRecorder.h"

#include <algorithm>

#include "core/Error.h"
#include "core/Log.h"
#include "trainer/ClusterSync.h"
#include "trainer/RunPlan.h"
#include "trainer/SharedParameters.h"
#include "trainer/StageExecutor.h"

namespace cairn {

StepRecorder::StepRecorder(TrainerContext& ctx, StopCoordinator& stop,
                           TrainerCheckpoints& checkpoints, Evaluator& evaluator,
                           const StageLink& link)
    : ctx_(ctx),
      stop_(stop),
      checkpoints_(checkpoints),
      evaluator_(evaluator),
      link_(link),
      progress_(ctx.is_leaf && ctx.cfg.show_progress, ctx.opt.log_every_s) {}

void StepRecorder::begin(TrainerClock::time_point run_start) {
  start_ = run_start;
  sent_before_ = link_.bytesSent();
  last_ = TrainerClock::now();
}

void StepRecorder::record(const StepRecord& s, TrainerResult* result) {
  const RunPlan& plan = ctx_.plan;
  const TrainOptions& opt = ctx_.opt;
  const double step_seconds = secondsSince(last_);
  last_ = TrainerClock::now();
  const TrainerClock::time_point began = last_;
  if (ctx_.observer.on_step_loss) ctx_.observer.on_step_loss(s.step, s.loss);
  nlohmann::json line = {{"step", s.step + 1},
                         {"epoch", plan.epochOf(s.step)},
                         {"loss", s.loss},
                         {"lr", s.lr},
                         {"samples_per_s", double(opt.batch_size) / std::max(step_seconds, 1e-9)},
                         {"compute_s", ctx_.times.compute_s},
                         {"send_s", ctx_.times.send_s},
                         {"wait_s", ctx_.times.wait_s},
                         {"samples", opt.batch_size}};
  // The bytes this node sent during the step (credit, docs/OPERATIONS.md "Credit").
  const uint64_t sent = link_.bytesSent();
  line["sent_bytes"] = sent >= sent_before_ ? sent - sent_before_ : 0;
  sent_before_ = sent;
  for (const auto& [key, value] : s.extra.items()) line[key] = value;
  if (ctx_.is_root || ctx_.is_leaf) line["sample_checksum"] = s.sample_checksum;
  if (s.grad_norm >= 0) line["grad_norm"] = s.grad_norm;
  if (ctx_.cfg.cluster_sync) line["sync_s"] = ctx_.times.sync_s;
  if (ctx_.placement.copiesLater()) {  // a GPU's (docs/TRAINING.md "Sending later")
    line["later_sends"] = ctx_.times.later_sends;
    line["held_through_receives"] = ctx_.times.held_through_receives;
  }
  ctx_.metrics.write(line);
  result->last_loss = s.loss;
  const double elapsed = secondsSince(start_);
  progress_.update({plan.epochOf(s.step), plan.epochs(), s.step + 1, plan.total_steps,
                    s.loss, double((s.step + 1) * opt.batch_size) / std::max(elapsed, 1e-9),
                    elapsed});
  bookkeeping_s_ += secondsSince(began);
}

bool StepRecorder::atBoundary(int64_t steps_done, int64_t updates, int64_t since_update,
                              bool drained, TrainerResult* result) {
  const RunPlan& plan = ctx_.plan;
  const TrainOptions& opt = ctx_.opt;
  const bool stopping = stop_.stopsAfter(steps_done, plan.total_steps);
  if (checkpoints_.due(steps_done) || (stopping && checkpoints_.on())) {
    CAIRN_ENFORCE(drained, "async checkpoint without draining");
    checkpoints_.save(steps_done, updates, since_update);
  }
  if (stopping) {
    progress_.finish();
    CAIRN_INFO("stopped cleanly after step ", steps_done, " of ", plan.total_steps);
    result->stopped = true;
    result->hand_over = stop_.handsOver();
    result->stop_asked_here = stop_.askedHere();
    result->steps = steps_done;
    result->seconds = secondsSince(start_);
    ctx_.metrics.write({{"stopped", {{"steps", result->steps}, {"seconds", result->seconds}}}});
    return true;
  }
  if (steps_done < plan.total_steps && opt.eval_every > 0 && steps_done % opt.eval_every == 0 &&
      plan.eval_batches > 0) {
    progress_.finish();
    evaluator_.evaluate(steps_done);  // evaluation messages carry the number of steps done
  }
  return false;
}

void StepRecorder::finishRun(int64_t sync_steps,
                             const std::function<void(nlohmann::json&)>& add_done_fields,
                             TrainerResult* result) {
  const RunPlan& plan = ctx_.plan;
  progress_.finish();
  if (ctx_.cfg.cluster_sync) ctx_.cfg.cluster_sync->finish(sync_steps, ctx_.executor.module());
  if (ctx_.shared) ctx_.shared->shareWeights(sync_steps, "shared_weights_end", /*always=*/false);
  result->steps = plan.total_steps;
  const double train_seconds = secondsSince(start_);
  result->samples_per_second =
      double(plan.total_steps * ctx_.opt.batch_size) / std::max(train_seconds, 1e-9);
  if (plan.eval_batches > 0) result->final_eval = finalEvaluation();
  result->seconds = secondsSince(start_);
  nlohmann::json done = {{"steps", result->steps},
                         {"seconds", result->seconds},
                         {"train_samples_per_s", result->samples_per_second},
                         {"train_seconds", train_seconds},
                         {"bookkeeping_s", bookkeeping_s_}};
  if (add_done_fields) add_done_fields(done);
  ctx_.metrics.write({{"done", done}});
}

std::optional<EvalResult> StepRecorder::finalEvaluation() {
  try {
    return evaluator_.evaluate(ctx_.plan.total_steps);
  } catch (const PeerLost& e) {
    const std::optional<PeerLoss>& loss = e.loss();
    // With checkpoints but none of the last step, a lost neighbour's replacement resumes from an
    // older one and needs this node to train the last steps again: it pauses as before.
    const bool final_checkpoint = !checkpoints_.on() || checkpoints_.due(ctx_.plan.total_steps);
    if (!loss || !loss->reason.empty() || !final_checkpoint ||
        (loss->cause != LossCause::kDisconnected && loss->cause != LossCause::kSilent))
      throw;
    CAIRN_WARN("neighbour ", loss->peer, " went away during the final evaluation (",
               std::string(e.what()), "); every step is trained, so this node finishes without "
               "the evaluation's figures");
    return std::nullopt;
  }
}

}  // namespace cairn
