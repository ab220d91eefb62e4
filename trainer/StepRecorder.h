// StepRecorder: what happens when a step ends, the same for the sync and the async loop: the
// observer's callback, the step's metrics.jsonl line and the progress line; then, at the step
// boundary, the checkpoint (every `checkpoint_every` steps, and when stopping), the clean stop,
// and the evaluation every `eval_every` steps; at the end of the run the final evaluation and
// the "done" record (docs/TRAINING.md "Metrics", docs/OPERATIONS.md "Checkpoints and resume").
// Ownership: owns the progress line; borrows the context and the units it calls.
// Thread-safety: one thread (the node's trainer thread).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <nlohmann/json.hpp>

#include "trainer/Evaluator.h"
#include "trainer/Metrics.h"
#include "trainer/StopCoordinator.h"
#include "trainer/TrainerCheckpoints.h"
#include "trainer/TrainerContext.h"

namespace cairn {

// One finished step, as recorded.
struct StepRecord {
  int64_t step = 0;  // 0-based
  double loss = 0;
  double lr = 0;
  uint64_t sample_checksum = 0;                     // recorded by the Root and the Leaf
  double grad_norm = -1;                            // recorded when >= 0 (clip_grad_norm)
  nlohmann::json extra = nlohmann::json::object();  // the loop's own fields (async: stash, ...)
};

class StepRecorder {
 public:
  // `link`: asked for the bytes sent (StageLink::bytesSent) at each step's record.
  StepRecorder(TrainerContext& ctx, StopCoordinator& stop, TrainerCheckpoints& checkpoints,
               Evaluator& evaluator, const StageLink& link);

  // The run (its first step) starts now: times per step and in total count from here.
  void begin(TrainerClock::time_point run_start);
  // Observer, metrics line, progress; result->last_loss.
  void record(const StepRecord& step, TrainerResult* result);
  // At the boundary after `steps_done` steps: checkpoint (with the async `updates` /
  // `since_update` counters; `drained`: no micro-batch in flight), clean stop, or evaluation.
  // Returns true when the run stops here (*result says so).
  bool atBoundary(int64_t steps_done, int64_t updates, int64_t since_update, bool drained,
                  TrainerResult* result);
  // Per-step bookkeeping (issue [I] part 3: it must cost well under 1% of a step): the time of
  // every record() (observer, metrics line, progress) and what the loops add (stop polling, the
  // Root's deal check), reported in the "done" record as "bookkeeping_s" (total) beside
  // "seconds". Not in it: checkpoints and evaluations (their own records), packet validation
  // (inside the receive, counted as wait_s).
  void addBookkeeping(double seconds) { bookkeeping_s_ += seconds; }
  // After the last step: ClusterSync::finish(sync_steps), the final evaluation and the "done"
  // record, to which `add_done_fields` (may be empty) adds the loop's own fields.
  void finishRun(int64_t sync_steps, const std::function<void(nlohmann::json&)>& add_done_fields,
                 TrainerResult* result);

 private:
  // The evaluation after the last step. Training is over by then (every step done, the final
  // sync and checkpoint behind): a neighbour gone meanwhile — its connection down, or silent for
  // the peer timeout (PeerLost, cause disconnected or silent) — may have finished and exited with
  // the evaluation's result lost on a link cut at that moment, and would never come back to
  // evaluate again; pausing for it (NodeRunner) would end this node with a failure after
  // max_wait_s though its work is done. So the node finishes without the evaluation's figures
  // (nullopt) — when it holds a checkpoint of the last step (every node does: they checkpoint at
  // the same steps), or keeps none. Otherwise, and for a neighbour that restarted, left, or was
  // given to another volunteer, the run still pauses: the neighbour comes back, from an older
  // checkpoint the cluster trains the last steps again, and evaluates again.
  std::optional<EvalResult> finalEvaluation();

  TrainerContext& ctx_;
  StopCoordinator& stop_;
  TrainerCheckpoints& checkpoints_;
  Evaluator& evaluator_;
  const StageLink& link_;
  uint64_t sent_before_ = 0;  // link_.bytesSent() at the previous step's record
  ProgressLine progress_;
  TrainerClock::time_point start_, last_;
  double bookkeeping_s_ = 0;
};

}  // namespace cairn
