// StageTrainer: one node's whole training run, independent of sockets. It walks the sync schedule
// for every optimizer step, running its StageExecutor and talking to its neighbours through a
// StageLink; it evaluates, writes metrics.jsonl and reports progress.
//
// One step, as data (docs/TRAINING.md): the Root takes the step's sample ids from its ShardSampler,
// loads inputs and targets, cuts them into micro-batches and sends each micro-batch's boundary
// tensors downstream together with "__targets", "__ids" and "__denominator" (the number of loss
// terms in the whole batch), so the Leaf never needs a data loader of its own. Gradients flow back
// with "__loss" (each micro-batch's share of the batch loss) so every node knows the step loss.
//
// Before the first step the Root sends the run plan (total steps, steps per epoch, evaluation
// batches) downstream; other nodes learn it from there (only the Root has the data).
//
// Checkpoints, resume and the clean stop (docs/OPERATIONS.md "Checkpoints and resume",
// docs/TRAINING.md "Stopping"): every `checkpoint_every` steps (async: after draining the pipeline)
// each node writes trainer/Checkpoint files; a resumed trainer loads one in its constructor and
// continues bit-identically; a stop request anywhere in the cluster travels upstream as "__stop" on
// gradients, the Root fixes the step and sends it downstream as "__stop_at" on activations.
// Ownership: owns the executor, optimizer and datasets; borrows the link. Thread-safety: one
// thread.
#pragma once

#include <torch/script.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/NodeData.h"
#include "trainer/StageLink.h"
#include "trainer/TrainOptions.h"

namespace cairn {

class StageExecutor;
class Optimizer;
class ClusterSync;
class TensorPlacement;  // trainer/Device.h
class ChunkSource;  // trainer/data/ServedDataset.h

struct EvalResult {
  int64_t step = 0;  // optimizer steps done when it ran
  int64_t samples = 0;
  double loss = 0;         // mean loss per term
  double accuracy = -1;    // top-1 (classification), -1 otherwise
  double perplexity = -1;  // exp(loss) for token streams, -1 otherwise
};

struct TrainerResult {
  int64_t steps = 0;
  double last_loss = 0;
  std::optional<EvalResult> final_eval;
  double seconds = 0;
  double samples_per_second = 0;  // over the whole run
  // Stopped early because StageTrainerConfig::stop_requested asked (a checkpoint of step `steps`
  // was written when checkpoints are on); false when the run went to its end.
  bool stopped = false;
  // With stopped: the stop was a hand-over (StageTrainerConfig::stop_hands_over): the nodes that
  // asked leave, the others wait for their replacement; and whether this node asked.
  bool hand_over = false;
  bool stop_asked_here = false;
};

// Hooks for tests and tools (all optional, called on the trainer thread).
struct TrainerObserver {
  std::function<void(int64_t step, const std::vector<int64_t>& sample_ids)> on_batch;  // Root
  std::function<void(int64_t step, double loss)> on_step_loss;
  // Every record written to metrics.jsonl, and its line (MetricsLog::setTee).
  std::function<void(const nlohmann::json& record, const std::string& line)> on_metrics_record;
  // The run plan, once negotiated (before the first step).
  std::function<void(int64_t total_steps, int64_t steps_per_epoch)> on_plan;
};

struct StageTrainerConfig {
  NodeSpec node;
  TrainOptions options;
  DataOptions data;
  int num_clusters = 1;
  std::string metrics_path;     // "" = no metrics.jsonl
  std::string sample_ids_path;  // used when options.record_sample_ids
  bool show_progress = true;
  // Where the stage trains (trainer/Device.h, provider --device); null: the CPU. The module,
  // optimizer state and loss live there; packets, rings and checkpoint files on the host.
  std::shared_ptr<const TensorPlacement> placement;
  // Cross-cluster sync (borrowed, may be null: no sync). See trainer/ClusterSync.h.
  ClusterSync* cluster_sync = nullptr;
  // Checkpoints (trainer/Checkpoint.h, docs/OPERATIONS.md): written every
  // options.checkpoint_every steps into this folder ("" = none), newest options.keep_checkpoints
  // kept.
  std::string checkpoint_dir;
  // May be empty. Asked at every checkpoint: also keep every checkpoint of a step >= the answer
  // (-1: only the newest keep_checkpoints). provider --join: the coordinator's keep_from
  // (node/volunteer/VolunteerCheckpoints.h), so the neighbours of a lost node still hold the step of the
  // checkpoint its spare is given.
  std::function<int64_t()> keep_checkpoints_from;
  // >= 0: start from the checkpoint of this step in checkpoint_dir (it must exist and verify);
  // the run continues as if it had never stopped (same data order, RNG, optimizer state).
  int64_t resume_step = -1;
  // Polled between steps (may be empty): when it returns true the cluster stops cleanly at a step
  // boundary, every node of the cluster at the same step, writes a checkpoint of it (when
  // checkpoint_dir is set) and run() returns with TrainerResult::stopped.
  std::function<bool()> stop_requested;
  // A stop this node asks for is a hand-over (provider --join): this node leaves and the rest of
  // the cluster, stopped at the same step with a checkpoint, waits for its replacement (NodeRunner)
  // instead of stopping; false: the whole cluster stops (provider --name).
  bool stop_hands_over = false;
  // data.source "coordinator": where the Root's chunk files come from (node/volunteer/ServedChunks.h, made
  // by provider --join); null otherwise.
  std::shared_ptr<ChunkSource> chunk_source;
  // Root, polled between steps (may be empty): the newest node.json extra.deal a live peers update
  // brought (the coordinator grows the run; trainer/DealChange.h), or from the start the offer or
  // the grown deal in force node.json holds (the latter is proposed as taken), nullopt when none.
  // Called on the trainer's thread; the provider makes it thread-safe.
  std::function<std::optional<nlohmann::json>()> offered_deal;
};

class StageTrainer {
 public:
  StageTrainer(StageTrainerConfig config, torch::jit::Module stage, StageLink& link,
               TrainerObserver observer = {});
  ~StageTrainer();
  TrainerResult run();
  StageExecutor& executor();
  Optimizer& optimizer();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cairn
