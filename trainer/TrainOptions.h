// TrainOptions: everything job.json says about how to train, validated in ONE place
// (parseTrainOptions; its "data" object: parseDataOptions, trainer/DataOptions.h). Every field
// has its default written next to it; docs/TRAINING.md and docs/NODE_DATA.md ("## job.json")
// describe the same fields for users.
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

// The data part of job.json (DataOptions, parseDataOptions), included so that users of the
// training part have both.
#include "trainer/DataOptions.h"

namespace cairn {

enum class PipelineOrder { k1F1B, kGPipe };
enum class OptimizerKind { kSgd, kAdam, kAdamW };
enum class LrScheduleKind { kConstant, kStep, kCosine, kWarmupCosine };
// "loss_fn": the built-ins, or a TorchScript module (docs/TRAINING.md "Loss").
enum class LossKind { kCrossEntropy, kMse, kNll, kBceWithLogits, kTorchScript };
enum class SyncMode { kAverage, kDiLoCo, kGradients };
// "precision": "fp32", "fp32-strict" (as fp32; on CUDA also no TF32 matmuls), or "bf16": stage
// forwards under autocast to bfloat16 (CPU or CUDA) with float32 master weights, gradients and
// optimizer state (trainer/Precision.h, docs/TRAINING.md "Precision").
enum class Precision { kFp32, kFp32Strict, kBf16 };
// "schedule": how a node orders its micro-batches (docs/TRAINING.md "Schedules").
enum class ScheduleKind { kSync, kAsync };
// "wire": how float tensors travel between stages ("activations": activations and their
// gradients) and between ring members ("sync": averages, DiLoCo pseudo-gradients). fp32: exact, as
// before; bf16/fp16: 2 bytes per value (round to nearest even); int8: 1 byte per value plus one
// fp32 scale per row (core/WireCompression.h, docs/PROTOCOL.md "Compressed tensors").
enum class WireCodec { kFp32, kBf16, kFp16, kInt8 };
struct WireOptions {
  WireCodec activations = WireCodec::kFp32;  // "activations": "fp32" | "bf16" | "fp16" | "int8"
  WireCodec sync = WireCodec::kFp32;         // "sync": "fp32" | "bf16" | "int8" (fp32 accumulation)
};
// "nonfinite": what a node does with received activations/gradients holding NaN or Inf.
enum class NonFiniteAction { kDrop, kStop };

// The job.json names ("sync" | "async", "drop" | "stop") and back; parse gives nullopt for any
// other name (parseTrainOptions reports those, naming the key and the choices).
std::string toString(ScheduleKind kind);
std::optional<ScheduleKind> parseScheduleKind(const std::string& name);
std::string toString(NonFiniteAction action);
std::optional<NonFiniteAction> parseNonFiniteAction(const std::string& name);
std::string toString(WireCodec codec);
std::optional<WireCodec> parseWireCodec(const std::string& name);

// "optimizer.param_groups[i]": a rule that puts parameters in a group of their own, as
// torch.optim's parameter groups do. A parameter joins the FIRST rule that selects it by any of its
// selectors; parameters no rule selects keep the optimizer's settings (docs/TRAINING.md).
struct ParamGroupRule {
  std::vector<std::string> names;  // "names": globs over dotted parameter names ("*.bias", "head.*")
  bool biases = false;             // "biases": parameters named "bias" (last name component)
  bool norm_layers = false;        // "norm_layers": parameters of a module whose class name has
                                   // "Norm" in it (BatchNorm2d, LayerNorm, GroupNorm, RMSNorm, ...)
  int64_t max_dim = -1;            // "max_dim": tensors of at most this many dimensions (-1: unused)
  double weight_decay = -1;        // "weight_decay": this group's (< 0: the optimizer's)
  double lr_scale = 1;             // "lr_scale": the group's lr = the scheduled lr times this
};

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdamW;  // "name": "sgd" | "adam" | "adamw" (default adamw)
  double lr = 1e-3;                            // base learning rate
  double weight_decay = -1;  // < 0 until parsed: sgd/adam default 0, adamw default 0.01
  double momentum = 0;       // sgd
  double dampening = 0;      // sgd
  bool nesterov = false;     // sgd (needs momentum > 0 and dampening 0, as in PyTorch)
  double beta1 = 0.9;        // adam/adamw "betas": [0.9, 0.999]
  double beta2 = 0.999;
  double eps = 1e-8;  // adam/adamw
  std::vector<ParamGroupRule> param_groups;  // "param_groups": [] (one group: every parameter)
};

struct LrScheduleOptions {
  LrScheduleKind kind = LrScheduleKind::kConstant;  // "name": constant|step|cosine|warmup_cosine
  int64_t step_size = 1000;  // step: multiply by gamma every step_size optimizer steps
  double gamma = 0.1;        // step
  int64_t warmup_steps = 0;  // warmup_cosine: linear ramp from lr/warmup_steps to lr
  double min_lr = 0;         // cosine, warmup_cosine: the floor reached at the last step
  int64_t total_steps = 0;   // cosine horizon; 0 = the run's total optimizer steps
};

class ScriptedLoss;  // trainer/ScriptedLoss.h

struct LossOptions {
  // "loss_fn": "cross_entropy" | "mse" | "nll" | "bce_with_logits", {name, ...}, or
  // {"torchscript": "loss.pt"} (a path relative to job.json's folder, or absolute).
  LossKind kind = LossKind::kCrossEntropy;
  int64_t ignore_index = -100;      // cross_entropy/nll: targets equal to this are left out
  double label_smoothing = 0;       // cross_entropy: in [0, 1), as torch's label_smoothing
  std::vector<double> pos_weight;   // bce_with_logits: one weight, or one per class (last dim)
  std::string torchscript_path;     // torchscript: the file, resolved against job.json's folder
  std::shared_ptr<ScriptedLoss> scripted;  // torchscript: loaded and checked by parseTrainOptions
};

struct TimeoutOptions {
  double startup_s = 60;  // "startup_s": how long to wait for every neighbour to say hello
  double peer_s = 120;    // "peer_s": longest wait for one message from a neighbour mid-run
  // "peer_timeout_s": a pipeline neighbour whose connection has been down (or silent to
  // heartbeats) this long is declared lost; 1 s at most on a node that shares rings with other
  // clusters (their syncs wait for it), and a ring member so after 1 s (docs/OPERATIONS.md
  // "Failures while training").
  double peer_timeout_s = 10;
  // "max_wait_s": how long the rest of a cluster waits, paused, for a lost node to come back with
  // --resume before it gives up with a message naming the node and how to resume.
  double max_wait_s = 600;
};

// How clusters that hold the same parameters bring them together (docs/TRAINING.md "Across
// clusters"). "sync": "average" | "diloco" | "gradients", or {name, outer_lr, outer_momentum,
// outer_nesterov}. With one cluster every ring has one member and nothing is exchanged.
struct SyncOptions {
  SyncMode mode = SyncMode::kAverage;  // "name" (default "average")
  double outer_lr = 0.7;               // diloco: outer SGD learning rate
  double outer_momentum = 0.9;         // diloco: outer SGD momentum
  bool outer_nesterov = true;          // diloco: Nesterov momentum
  // A node in several rings (clusters cut differently) runs them at once, one thread per ring;
  // false: one after another in ring id order (less memory: one ring's restore copy at a time).
  bool concurrent_rings = true;
  // gradients: the rings' gradients travel in buckets of at most this many bytes (a tensor larger
  // than that is a bucket of its own), cut from the last parameter back (the order backward
  // produces them), as DDP's buckets. Overlapped or not, the same buckets reduce the same way.
  int64_t bucket_bytes = int64_t(1) << 20;  // "bucket_bytes" (1 MiB, like DDP's first bucket)
  // gradients: start a bucket's all-reduce as soon as the step's last backward has produced all of
  // its gradients, while backward goes on (RingClusterSync; docs/TRAINING.md "Overlap").
  bool overlap = true;  // "overlap"
  // training_definition.wire.sync (TrainOptions::wire, copied here by parseTrainOptions): how the
  // rings' float32 averages travel — "fp32", "bf16" or "int8" (ProcessGroupOptions::codec).
  WireCodec wire = WireCodec::kFp32;
};

struct TrainOptions {
  int64_t batch_size = 64;   // samples per optimizer step (per cluster)
  int64_t microbatches = 4;  // the batch is cut into this many micro-batches (≤ batch_size)
  int64_t epochs = 1;        // passes over this cluster's shard
  int64_t max_steps = 0;     // > 0: stop after this many optimizer steps (whichever ends first)
  ScheduleKind schedule = ScheduleKind::kSync;  // "schedule": "sync" | "async" (docs/TRAINING.md)
  int64_t max_in_flight = 0;     // async: micro-batches the Root keeps in flight (0: #stages)
  int64_t update_frequency = 1;  // async: optimizer step every this many backwards (accumulating)
  PipelineOrder pipeline = PipelineOrder::k1F1B;  // "pipeline": "1f1b" | "gpipe"
  uint64_t seed = 0;                              // shuffling and dropout
  OptimizerOptions optimizer;                     // "optimizer": "adamw" or {name, lr, ...}
  LrScheduleOptions lr_scheduler;                 // "lr_scheduler": "constant" or {name, ...}
  LossOptions loss;               // "loss_fn": "cross_entropy", {name, ...} or {torchscript}
  Precision precision = Precision::kFp32;  // "precision": "fp32" | "fp32-strict" | "bf16"
  WireOptions wire;  // "wire": {"activations": "fp32", "sync": "fp32"} (default: uncompressed)
  double clip_grad_norm = 0;      // > 0: clip gradients to this GLOBAL norm (all stages together)
  int64_t eval_every = 0;         // > 0: evaluate every this many steps (always at the end)
  int64_t eval_batch_size = 500;  // samples per evaluation batch
  int64_t local_steps = 1;  // optimizer steps between cross-cluster syncs (average, diloco);
                            // gradients: steps between buffer averages (gradients every step)
  SyncOptions sync;         // "sync": "average" (default) | "diloco" | "gradients" | {name, ...}
  TimeoutOptions timeouts;  // "timeouts": {startup_s, peer_s}
  int threads = 1;          // torch intra-op threads per provider
  double log_every_s = 10;  // plain progress lines when stderr is not a terminal
  bool record_sample_ids = false;  // write sample_ids.jsonl at the Root (tests, audits)
  // Received activations/gradients holding NaN or Inf: "drop" the message (counted, the sender's
  // next copy or the peer timeout decides) or "stop" the node with a message naming the peer.
  NonFiniteAction nonfinite = NonFiniteAction::kDrop;
  // Pipeline messages more than this many steps away from the step being worked on are dropped.
  int64_t step_window = 8;
  // Checkpoints (docs/OPERATIONS.md "Checkpoints and resume"): every this many optimizer steps each
  // node writes its stage state to nodes/<name>/checkpoints/ (0: never); the newest
  // `keep_checkpoints` are kept.
  int64_t checkpoint_every = 0;
  int64_t keep_checkpoints = 3;
};

// `source` names job.json in errors ("node_data/job.json: training_definition.optimizer.lr ...").
TrainOptions parseTrainOptions(const nlohmann::json& training_definition,
                               const std::string& source);

std::string toString(OptimizerKind kind);
std::string toString(LossKind kind);
std::string toString(Precision precision);
std::string toString(SyncMode mode);

}  // namespace cairn
