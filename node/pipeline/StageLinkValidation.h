// StageLinkValidation: what a received pipeline message may look like, and the check every one
// passes before the trainer sees it (MailboxStageLink drops and counts what fails). A pipeline
// message comes from a peer over the network: this is the validation of hostile input — sender and
// direction, job id, step window, the planned boundary (tensor count, names, dtypes, shapes), the
// int8 wire form, a byte limit and finite values — each failure named by the reason it is counted
// under (LinkStats) and a detail for the log.
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/NodeData.h"
#include "node/transport/WireCodec.h"

namespace cairn {

// What a received pipeline message may look like; the provider fills it from job.json.
struct LinkChecks {
  // Activations/gradients: a planned tensor's batch dimension (BoundaryValue::batch_dim) at most
  // this (0: any); a tensor without one has exactly its planned shape.
  int64_t max_microbatch_rows = 0;
  int64_t max_eval_rows = 0;  // evaluation batches: the batch dimension at most this (0: any)
  uint64_t step_window = 8;         // |message step - awaited step| at most this
  size_t max_extra_tensors = 4;     // tensors beyond the planned boundary ("__"-named, bookkeeping)
  uint64_t max_message_bytes = 0;   // all tensor bytes of one message (0: from the plan, see below)
  bool stop_on_nonfinite = false;   // NaN/Inf: false = drop and count, true = throw BadInput
  // training_definition.wire.activations: planned float32 boundary tensors of activation, gradient
  // and evaluation messages travel in this dtype (kFloat: as they are; kBFloat16 / kHalf: rounded
  // to nearest even by torch's cast, and cast back to float32 on receipt; kChar: int8 rows with
  // one fp32 scale each, sent as uint8 in trainer/Int8Boundary.h's wire form — tensors of fewer than
  // 2 dimensions stay float32 — and decoded on receipt). A received planned float32 tensor in any
  // other dtype is dropped as "dtype", an int8 one with a bad scale or value as "encoding".
  // Bookkeeping ("__") tensors, integer and bool tensors are never compressed.
  torch::ScalarType wire_float = torch::kFloat;
};

// LinkChecks::wire_float for training_definition.wire.activations "fp32" | "bf16" | "fp16" |
// "int8" (kChar); anything else: BadInput naming the key.
torch::ScalarType stageWireDtype(const std::string& codec, const std::string& source);

// The largest pipeline message the plan allows: the bigger boundary (inputs or outputs) at the
// larger of the two row limits, plus 1 MiB for bookkeeping tensors; 0 when no row limit is set.
uint64_t plannedMessageBytes(const NodeSpec& node, const LinkChecks& checks);

// The shape a received int8 wire form (trainer/Int8Boundary.h) of planned float32 boundary
// value `v` stands for: the plan's shape with the batch dimension's size read off the wire (a
// tensor without one: the plan's shape); nullopt when `wire` is no such form.
std::optional<std::vector<int64_t>> int8PlannedShape(const BoundaryValue& v, at::IntArrayRef wire);

// True for the kinds that carry pipeline tensors: activations, gradients, evaluation batches.
bool carriesTensors(MessageKind kind);

// What a message is checked against: this node's plan (neighbours, job, boundaries), the link's
// checks and the byte limit in force. Borrowed for the duration of one check.
struct PipelineExpectations {
  const NodeSpec& node;
  const LinkChecks& checks;
  uint64_t max_message_bytes;
};

// Why `m` may not be used (nullopt: it may), as the reason it is counted under; *detail (when
// given) says what was wrong. `awaited_step` is the step being worked on; `deep` adds the
// per-tensor checks (boundary, bytes, finite values).
std::optional<std::string> rejectPipelineMessage(const Message& m,
                                                 const PipelineExpectations& expected,
                                                 uint64_t awaited_step, bool deep,
                                                 std::string* detail);

}  // namespace cairn
