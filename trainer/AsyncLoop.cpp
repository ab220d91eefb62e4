#include "trainer/AsyncLoop.h"

#include <algorithm>

#include "core/Error.h"
#include "trainer/LrSchedule.h"
#include "trainer/RunPlan.h"
#include "trainer/StageExecutor.h"

namespace cairn {

void AsyncLoop::forward(int64_t g) {
  const int64_t M = ctx_.opt.microbatches, s = g / M, k = g % M;
  if (ctx_.is_root && k == 0) {
    passes_.flush();  // the last activations leave before the data is loaded, not after
    const auto t = TrainerClock::now();
    std::map<int, Microbatch> batch;
    steps_[s].checksum = feeder_.load(s, &batch);
    for (auto& [i, m] : batch) micro_[s * M + i] = std::move(m);
    ctx_.times.compute_s += secondsSince(t);
  }
  Microbatch& mb = ctx_.is_root ? micro_.at(g) : micro_[g];
  passes_.forward(mb, uint64_t(g), s, k, &steps_[s].checksum);
}

void AsyncLoop::backward(int64_t g) {
  const int64_t M = ctx_.opt.microbatches, s = g / M, k = g % M;
  auto it = micro_.find(g);
  CAIRN_ENFORCE(it != micro_.end());
  steps_[s].loss += passes_.backward(it->second, uint64_t(g), uint64_t(s), uint64_t(k));
  micro_.erase(it);
}

void AsyncLoop::recordStep(int64_t s, double lr, int64_t updates, int64_t in_flight,
                           TrainerResult* result) {
  const StepTally done = steps_[s];
  steps_.erase(s);
  const auto& stash = ctx_.executor.stashStats();
  StepRecord record;
  record.step = s;
  record.loss = done.loss + passes_.takeLosses(s);  // a whole-model stage's (MicrobatchPasses.h)
  record.lr = lr;
  record.sample_checksum = done.checksum;
  record.extra = {{"updates", updates},
                  {"in_flight", in_flight},
                  {"stash_versions", stash.versions},
                  {"stash_bytes", stash.bytes},
                  {"stash_max_versions", stash.max_versions},
                  {"stash_max_bytes", stash.max_bytes}};
  recorder_.record(record, result);
}

TrainerResult AsyncLoop::run(const ResumePoint& resume, TrainerClock::time_point run_start) {
  const RunPlan& plan = ctx_.plan;
  const TrainOptions& opt = ctx_.opt;
  StageExecutor& executor = ctx_.executor;
  LrSchedule lr_schedule(opt.optimizer.lr, opt.lr_scheduler, plan.total_steps);
  TrainerResult result;
  const int64_t M = opt.microbatches, total = plan.total_steps * M;
  const int64_t K = opt.max_in_flight > 0 ? opt.max_in_flight : ctx_.cfg.node.num_stages;
  const int64_t ahead = ctx_.is_leaf ? 1 : std::max<int64_t>(1, K - ctx_.cfg.node.stage);
  int64_t forwards = resume.start_step * M, backwards = resume.start_step * M;
  int64_t updates = resume.updates, since_update = resume.since_update;
  recorder_.begin(run_start);
  ctx_.times.reset();
  // Micro-batches this run goes to: all, or up to the step the cluster stops at (the Root decides
  // it as soon as it learns of a stop request, as the step after the one it is feeding, and tells
  // downstream with "__stop_at" on every activation from then on).
  auto end = [&] { return stop_.stopAt() >= 0 ? std::min(total, stop_.stopAt() * M) : total; };
  auto decideStop = [&] { stop_.decide(forwards / M + 1); };
  stop_.poll();
  decideStop();
  while (backwards < end()) {
    // A checkpoint must be consistent: before the first forward of a checkpointed step the
    // pipeline drains (every earlier micro-batch finishes its backward; docs/TRAINING.md).
    const bool drain = forwards % M == 0 && checkpoints_.due(forwards / M) && backwards < forwards;
    if (forwards < end() && forwards - backwards < ahead && !drain) {
      forward(forwards++);
      continue;
    }
    const int64_t g = backwards++;
    backward(g);
    decideStop();
    const int64_t s = g / M;
    const bool update = ++since_update == opt.update_frequency || backwards == total;
    // The last backward's gradients leave before a wait outside the link (a ring, a checkpoint).
    if (update || g % M == M - 1) passes_.flush();
    if (update) {
      since_update = 0;
      syncBeforeOptimizerStep(ctx_, updates);
      optimizerStep(ctx_, lr_schedule.at(s), updates, /*new_version=*/true);
      ++updates;
    }
    if (g % M != M - 1) continue;
    // Step s is complete on this node: record it.
    recordStep(s, lr_schedule.at(s), updates, forwards - backwards, &result);
    ctx_.times.reset();
    stop_.poll();
    decideStop();
    if (recorder_.atBoundary(s + 1, updates, since_update, forwards == backwards, &result))
      return result;
  }
  CAIRN_ENFORCE(executor.pendingMicrobatches() == 0, "micro-batches left in flight at the end");
  recorder_.finishRun(
      updates,
      [&](nlohmann::json& done) {
        const auto& stash = executor.stashStats();
        done["updates"] = updates;
        done["stash_max_versions"] = stash.max_versions;
        done["stash_max_bytes"] = stash.max_bytes;
        done["stash_copies"] = stash.copies;
      },
      &result);
  return result;
}

}  // namespace cairn
