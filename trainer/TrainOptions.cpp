#include "trainer/TrainOptions.h"

#include <filesystem>
#include <limits>

#include "core/JobFiles.h"
#include "core/JsonReader.h"
#include "trainer/ParamGroups.h"
#include "trainer/ScriptedLoss.h"

namespace cairn {
namespace {

OptimizerOptions parseOptimizer(const JsonReader& r) {
  OptimizerOptions o;
  std::string name;
  if (r.raw().contains("optimizer") && r.raw()["optimizer"].is_string()) {
    name = r.choice("optimizer", {"sgd", "adam", "adamw"});
    o.kind = name == "sgd"    ? OptimizerKind::kSgd
             : name == "adam" ? OptimizerKind::kAdam
                              : OptimizerKind::kAdamW;
    o.weight_decay = o.kind == OptimizerKind::kAdamW ? 0.01 : 0;
    return o;
  }
  auto maybe = r.optionalObject("optimizer");
  if (!maybe) {
    o.weight_decay = 0.01;
    return o;
  }
  const JsonReader& opt = *maybe;
  opt.rejectUnknownKeys({"name", "lr", "weight_decay", "momentum", "dampening", "nesterov", "betas",
                         "eps", "param_groups"});
  name = opt.choiceOr("name", {"sgd", "adam", "adamw"}, "adamw");
  o.kind = name == "sgd"    ? OptimizerKind::kSgd
           : name == "adam" ? OptimizerKind::kAdam
                            : OptimizerKind::kAdamW;
  o.lr = opt.numberOr("lr", o.lr);
  if (!(o.lr >= 0)) opt.fail("lr", "must be a non-negative number");
  o.weight_decay = opt.numberOr("weight_decay", o.kind == OptimizerKind::kAdamW ? 0.01 : 0.0);
  if (!(o.weight_decay >= 0)) opt.fail("weight_decay", "must be a non-negative number");
  if (o.kind == OptimizerKind::kSgd) {
    o.momentum = opt.numberOr("momentum", 0);
    o.dampening = opt.numberOr("dampening", 0);
    o.nesterov = opt.booleanOr("nesterov", false);
    if (!(o.momentum >= 0)) opt.fail("momentum", "must be a non-negative number");
    if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
      opt.fail("nesterov", "requires momentum > 0 and dampening 0 (as in PyTorch)");
    for (const char* key : {"betas", "eps"})
      if (opt.has(key)) opt.fail(key, "is an adam/adamw option, not an sgd one");
  } else {
    if (opt.has("betas")) {
      const auto betas = opt.numberList("betas");
      if (betas.size() != 2 || !(betas[0] >= 0 && betas[0] < 1) || !(betas[1] >= 0 && betas[1] < 1))
        opt.fail("betas", "must be two numbers in [0, 1)");
      o.beta1 = betas[0];
      o.beta2 = betas[1];
    }
    o.eps = opt.numberOr("eps", o.eps);
    if (!(o.eps > 0)) opt.fail("eps", "must be a positive number");
    for (const char* key : {"momentum", "dampening", "nesterov"})
      if (opt.has(key)) opt.fail(key, "is an sgd option, not an adam/adamw one");
  }
  o.param_groups = parseParamGroups(opt);
  return o;
}

SyncOptions parseSync(const JsonReader& r) {
  SyncOptions s;
  const std::vector<std::string> names = {"average", "diloco", "gradients"};
  auto kindOf = [](const std::string& n) {
    return n == "diloco" ? SyncMode::kDiLoCo : n == "gradients" ? SyncMode::kGradients
                                                                : SyncMode::kAverage;
  };
  if (!r.has("sync") || r.raw()["sync"].is_null()) return s;
  if (r.raw()["sync"].is_string()) {
    s.mode = kindOf(r.choice("sync", names));
    return s;
  }
  JsonReader o = r.object("sync");
  o.rejectUnknownKeys({"name", "outer_lr", "outer_momentum", "outer_nesterov", "concurrent_rings",
                       "bucket_bytes", "overlap"});
  s.mode = kindOf(o.choiceOr("name", names, "average"));
  s.outer_lr = o.numberOr("outer_lr", s.outer_lr);
  s.outer_momentum = o.numberOr("outer_momentum", s.outer_momentum);
  s.outer_nesterov = o.booleanOr("outer_nesterov", s.outer_nesterov);
  s.concurrent_rings = o.booleanOr("concurrent_rings", s.concurrent_rings);
  s.bucket_bytes = o.integerOr("bucket_bytes", 1, int64_t(1) << 40, s.bucket_bytes);
  s.overlap = o.booleanOr("overlap", s.overlap);
  if (!(s.outer_lr > 0)) o.fail("outer_lr", "must be a positive number");
  if (!(s.outer_momentum >= 0 && s.outer_momentum < 1)) o.fail("outer_momentum", "must be in [0, 1)");
  if (s.outer_nesterov && s.outer_momentum == 0)
    o.fail("outer_nesterov", "requires outer_momentum > 0 (as in PyTorch)");
  if (s.mode != SyncMode::kDiLoCo)
    for (const char* key : {"outer_lr", "outer_momentum", "outer_nesterov"})
      if (o.has(key)) o.fail(key, "is a diloco option");
  if (s.mode != SyncMode::kGradients)
    for (const char* key : {"bucket_bytes", "overlap"})
      if (o.has(key)) o.fail(key, "is a gradients option");
  return s;
}

LrScheduleOptions parseLrSchedule(const JsonReader& r) {
  LrScheduleOptions s;
  const std::vector<std::string> names = {"constant", "step", "cosine", "warmup_cosine"};
  auto kindOf = [](const std::string& n) {
    return n == "step"            ? LrScheduleKind::kStep
           : n == "cosine"        ? LrScheduleKind::kCosine
           : n == "warmup_cosine" ? LrScheduleKind::kWarmupCosine
                                  : LrScheduleKind::kConstant;
  };
  if (!r.has("lr_scheduler") || r.raw()["lr_scheduler"].is_null()) return s;
  if (r.raw()["lr_scheduler"].is_string()) {
    s.kind = kindOf(r.choice("lr_scheduler", names));
    return s;
  }
  JsonReader l = r.object("lr_scheduler");
  l.rejectUnknownKeys({"name", "step_size", "gamma", "warmup_steps", "min_lr", "total_steps"});
  s.kind = kindOf(l.choice("name", names));
  s.step_size = l.integerOr("step_size", 1, kMaxCount, s.step_size);
  s.gamma = l.numberOr("gamma", s.gamma);
  if (!(s.gamma > 0)) l.fail("gamma", "must be a positive number");
  s.warmup_steps = l.integerOr("warmup_steps", 0, kMaxCount, 0);
  s.min_lr = l.numberOr("min_lr", 0);
  if (!(s.min_lr >= 0)) l.fail("min_lr", "must be a non-negative number");
  s.total_steps = l.integerOr("total_steps", 0, kMaxCount, 0);
  return s;
}

LossOptions parseLoss(const JsonReader& r, const std::string& source) {
  LossOptions l;
  const std::vector<std::string> names = {"cross_entropy", "mse", "nll", "bce_with_logits"};
  auto kindOf = [](const std::string& n) {
    return n == "mse"               ? LossKind::kMse
           : n == "nll"             ? LossKind::kNll
           : n == "bce_with_logits" ? LossKind::kBceWithLogits
                                    : LossKind::kCrossEntropy;
  };
  if (!r.has("loss_fn")) return l;
  if (r.raw()["loss_fn"].is_string()) {
    l.kind = kindOf(r.choice("loss_fn", names));
    return l;
  }
  JsonReader o = r.object("loss_fn");
  if (o.has("torchscript")) {  // {"torchscript": "loss.pt"}: a path relative to job.json's folder
    o.rejectUnknownKeys({"torchscript", "torchscript_base64"});
    const std::string file = o.string("torchscript");
    if (file.empty()) o.fail("torchscript", "must name a TorchScript file");
    const std::filesystem::path path(file);
    l.kind = LossKind::kTorchScript;
    l.torchscript_path =
        path.is_absolute() ? file : (std::filesystem::path(source).parent_path() / path).string();
    if (o.has("torchscript_base64")) {  // embedded by clusterize (core/JobFiles.h)
      const auto bytes = decodeBase64(o.string("torchscript_base64"));
      if (!bytes) o.fail("torchscript_base64", "is not valid base64");
      l.scripted = ScriptedLoss::loadBytes(*bytes, file, source, o.path("torchscript"));
    } else {
      l.scripted = ScriptedLoss::load(l.torchscript_path, source, o.path("torchscript"));
    }
    return l;
  }
  o.rejectUnknownKeys({"name", "ignore_index", "label_smoothing", "pos_weight"});
  l.kind = kindOf(o.choice("name", names));
  const bool classification = l.kind == LossKind::kCrossEntropy || l.kind == LossKind::kNll;
  if (o.has("ignore_index") && !classification)
    o.fail("ignore_index", "applies to cross_entropy and nll only");
  l.ignore_index = o.integerOr("ignore_index", -kMaxCount, kMaxCount, l.ignore_index);
  if (o.has("label_smoothing") && l.kind != LossKind::kCrossEntropy)
    o.fail("label_smoothing", "applies to cross_entropy only");
  l.label_smoothing = o.numberOr("label_smoothing", 0);
  if (!(l.label_smoothing >= 0 && l.label_smoothing < 1))
    o.fail("label_smoothing", "must be in [0, 1)");
  if (o.has("pos_weight")) {
    if (l.kind != LossKind::kBceWithLogits) o.fail("pos_weight", "applies to bce_with_logits only");
    l.pos_weight = o.raw()["pos_weight"].is_number()
                       ? std::vector<double>{o.number("pos_weight")}
                       : o.numberList("pos_weight");
    if (l.pos_weight.empty()) o.fail("pos_weight", "must be a number or a non-empty list");
    for (double w : l.pos_weight)
      if (!(w >= 0)) o.fail("pos_weight", "must hold non-negative numbers");
  }
  return l;
}

// "schedule" with the async options, and "pipeline" (sync only).
void parseSchedule(const JsonReader& r, TrainOptions* o) {
  o->schedule = *parseScheduleKind(
      r.choiceOr("schedule", {"sync", "async"}, toString(ScheduleKind::kSync)));
  if (o->schedule == ScheduleKind::kAsync) {
    o->max_in_flight = r.integerOr("max_in_flight", 0, 1 << 16, 0);
    o->update_frequency = r.integerOr("update_frequency", 1, 1 << 20, 1);
    if (r.has("pipeline"))
      r.fail("pipeline", "applies to schedule \"sync\" only (async runs its own order)");
  } else {
    for (const char* key : {"max_in_flight", "update_frequency"})
      if (r.has(key)) r.fail(key, "applies to schedule \"async\" only");
  }
  o->pipeline = r.choiceOr("pipeline", {"1f1b", "gpipe"}, "1f1b") == "gpipe" ? PipelineOrder::kGPipe
                                                                             : PipelineOrder::k1F1B;
}

WireOptions parseWire(const JsonReader& r) {
  WireOptions wire;
  if (!r.has("wire")) return wire;
  if (!r.raw()["wire"].is_object())
    r.fail("wire", "must be an object {\"activations\": \"fp32\" | \"bf16\" | \"fp16\" | "
                   "\"int8\", \"sync\": \"fp32\" | \"bf16\" | \"int8\"}");
  JsonReader w = r.object("wire");
  w.rejectUnknownKeys({"activations", "sync"});
  wire.activations =
      *parseWireCodec(w.choiceOr("activations", {"fp32", "bf16", "fp16", "int8"}, "fp32"));
  wire.sync = *parseWireCodec(w.choiceOr("sync", {"fp32", "bf16", "int8"}, "fp32"));
  return wire;
}

TimeoutOptions parseTimeouts(const JsonReader& r) {
  TimeoutOptions timeouts;
  auto t = r.optionalObject("timeouts");
  if (!t) return timeouts;
  t->rejectUnknownKeys({"startup_s", "peer_s", "peer_timeout_s", "max_wait_s"});
  timeouts.startup_s = t->numberOr("startup_s", timeouts.startup_s);
  timeouts.peer_s = t->numberOr("peer_s", timeouts.peer_s);
  timeouts.peer_timeout_s = t->numberOr("peer_timeout_s", timeouts.peer_timeout_s);
  timeouts.max_wait_s = t->numberOr("max_wait_s", timeouts.max_wait_s);
  if (!(timeouts.startup_s > 0)) t->fail("startup_s", "must be a positive number of seconds");
  if (!(timeouts.peer_s > 0)) t->fail("peer_s", "must be a positive number of seconds");
  if (!(timeouts.peer_timeout_s > 0))
    t->fail("peer_timeout_s", "must be a positive number of seconds");
  if (!(timeouts.max_wait_s >= 0))
    t->fail("max_wait_s", "must be a non-negative number of seconds");
  return timeouts;
}

}  // namespace

std::string toString(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kAdamW:
      return "adamw";
  }
  return "?";
}

std::string toString(LossKind kind) {
  switch (kind) {
    case LossKind::kCrossEntropy:
      return "cross_entropy";
    case LossKind::kMse:
      return "mse";
    case LossKind::kNll:
      return "nll";
    case LossKind::kBceWithLogits:
      return "bce_with_logits";
    case LossKind::kTorchScript:
      return "torchscript";
  }
  return "?";
}

std::string toString(Precision precision) {
  switch (precision) {
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp32Strict:
      return "fp32-strict";
    case Precision::kFp32:
      break;
  }
  return "fp32";
}

std::string toString(ScheduleKind kind) {
  return kind == ScheduleKind::kAsync ? "async" : "sync";
}

std::optional<ScheduleKind> parseScheduleKind(const std::string& name) {
  if (name == "sync") return ScheduleKind::kSync;
  if (name == "async") return ScheduleKind::kAsync;
  return std::nullopt;
}

std::string toString(NonFiniteAction action) {
  return action == NonFiniteAction::kStop ? "stop" : "drop";
}

std::optional<NonFiniteAction> parseNonFiniteAction(const std::string& name) {
  if (name == "drop") return NonFiniteAction::kDrop;
  if (name == "stop") return NonFiniteAction::kStop;
  return std::nullopt;
}

std::string toString(WireCodec codec) {
  switch (codec) {
    case WireCodec::kFp32:
      return "fp32";
    case WireCodec::kBf16:
      return "bf16";
    case WireCodec::kFp16:
      return "fp16";
    case WireCodec::kInt8:
      return "int8";
  }
  return "?";
}

std::optional<WireCodec> parseWireCodec(const std::string& name) {
  if (name == "fp32") return WireCodec::kFp32;
  if (name == "bf16") return WireCodec::kBf16;
  if (name == "fp16") return WireCodec::kFp16;
  if (name == "int8") return WireCodec::kInt8;
  return std::nullopt;
}

std::string toString(SyncMode mode) {
  switch (mode) {
    case SyncMode::kAverage:
      return "average";
    case SyncMode::kDiLoCo:
      return "diloco";
    case SyncMode::kGradients:
      return "gradients";
  }
  return "?";
}

TrainOptions parseTrainOptions(const nlohmann::json& training_definition,
                               const std::string& source) {
  JsonReader r(training_definition, source, "training_definition");
  r.rejectUnknownKeys({"batch_size", "microbatches", "epochs", "max_steps", "schedule", "pipeline",
                       "seed", "optimizer", "lr_scheduler", "loss_fn", "clip_grad_norm",
                       "eval_every", "eval_batch_size", "local_steps", "timeouts", "threads",
                       "log_every_s", "record_sample_ids", "accelerate_config", "sync",
                       "nonfinite", "step_window", "max_in_flight", "update_frequency",
                       "checkpoint_every", "keep_checkpoints", "precision", "wire"});
  TrainOptions o;
  o.batch_size = r.integerOr("batch_size", 1, 1 << 24, o.batch_size);
  o.microbatches = r.integerOr("microbatches", 1, 1 << 16, o.microbatches);
  if (o.microbatches > o.batch_size)
    r.fail("microbatches", "(" + std::to_string(o.microbatches) + ") must not exceed batch_size (" +
                               std::to_string(o.batch_size) + ")");
  o.epochs = r.integerOr("epochs", 0, 1 << 20, o.epochs);
  o.max_steps = r.integerOr("max_steps", 0, kMaxCount, o.max_steps);
  if (o.epochs == 0 && o.max_steps == 0)
    r.fail("epochs", "and max_steps are both 0: nothing to train");
  parseSchedule(r, &o);
  o.seed = static_cast<uint64_t>(r.integerOr("seed", 0, kMaxCount, 0));
  o.optimizer = parseOptimizer(r);
  o.lr_scheduler = parseLrSchedule(r);
  o.loss = parseLoss(r, source);
  const std::string precision = r.choiceOr("precision", {"fp32", "fp32-strict", "bf16"}, "fp32");
  o.precision = precision == "bf16"          ? Precision::kBf16
                : precision == "fp32-strict" ? Precision::kFp32Strict
                                             : Precision::kFp32;
  o.wire = parseWire(r);
  o.clip_grad_norm = r.numberOr("clip_grad_norm", 0);
  if (!(o.clip_grad_norm >= 0)) r.fail("clip_grad_norm", "must be a non-negative number (0: off)");
  if (o.schedule == ScheduleKind::kAsync && o.clip_grad_norm > 0)
    r.fail("clip_grad_norm", "is not supported with schedule \"async\" (a global norm would need a "
                             "barrier per optimizer step)");
  o.eval_every = r.integerOr("eval_every", 0, kMaxCount, 0);
  o.eval_batch_size = r.integerOr("eval_batch_size", 1, 1 << 24, o.eval_batch_size);
  o.local_steps = r.integerOr("local_steps", 1, kMaxCount, 1);
  o.sync = parseSync(r);
  o.sync.wire = o.wire.sync;
  o.timeouts = parseTimeouts(r);
  o.threads = static_cast<int>(r.integerOr("threads", 1, 1024, 1));
  o.log_every_s = r.numberOr("log_every_s", o.log_every_s);
  if (!(o.log_every_s > 0)) r.fail("log_every_s", "must be a positive number of seconds");
  o.record_sample_ids = r.booleanOr("record_sample_ids", false);
  o.nonfinite =
      *parseNonFiniteAction(r.choiceOr("nonfinite", {"drop", "stop"}, toString(o.nonfinite)));
  o.step_window = r.integerOr("step_window", 1, 1 << 20, o.step_window);
  o.checkpoint_every = r.integerOr("checkpoint_every", 0, kMaxCount, o.checkpoint_every);
  o.keep_checkpoints = r.integerOr("keep_checkpoints", 1, 1 << 20, o.keep_checkpoints);
  return o;
}

}  // namespace cairn
