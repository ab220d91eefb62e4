#include "node/pipeline/StageLinkValidation.h"

#include <algorithm>
#include <vector>

#include "core/Error.h"
#include "core/WireCompression.h"
#include "trainer/Int8Boundary.h"
#include "trainer/ReservedTensors.h"
#include "trainer/StageLink.h"

namespace cairn {
namespace {

// A message that may not be used: the reason it is counted under and what was wrong.
struct Rejection {
  std::string reason;
  std::string detail;
};
using Verdict = std::optional<Rejection>;

Verdict reject(const char* reason, std::string detail) {
  return Rejection{reason, std::move(detail)};
}

// The dtype a planned float32 tensor travels in for LinkChecks::wire_float (int8: uint8 bytes).
torch::ScalarType wireDtype(torch::ScalarType wire_float) {
  return wire_float == torch::kChar ? torch::kByte : wire_float;
}

std::string shapeText(at::IntArrayRef shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
  return text + "]";
}

// Bytes of one boundary value at `rows` rows (its batch dimension; a batch-free tensor as
// planned), as planned; with int8 on the wire, the larger of the float32 and the int8 form (a row
// of fewer than 2 values grows).
uint64_t plannedBytes(const std::vector<BoundaryValue>& values, int64_t rows, bool int8_wire) {
  uint64_t total = 0;
  for (const BoundaryValue& v : values) {
    if (v.type != "tensor") {
      total += 4096 * 8;
      continue;
    }
    auto type = scalarTypeForName(v.dtype);
    uint64_t n = type ? c10::elementSize(*type) : 8;
    std::vector<int64_t> shape;
    for (size_t d = 0; d < v.shape.size(); ++d)
      shape.push_back(v.batch_dim && int64_t(d) == *v.batch_dim ? rows
                                                                 : std::max<int64_t>(v.shape[d], 1));
    for (int64_t d : shape) n *= uint64_t(d);
    if (int8_wire && type == torch::kFloat)
      n = std::max(n, uint64_t(wire::float32WireBytes(shape, "int8")));
    total += n;
  }
  return total;
}

// Who sent it and may it send this kind, its job, and for tensor kinds its step: the checks made
// before a message is taken out of the mailbox.
Verdict checkEnvelope(const Message& m, const PipelineExpectations& expected, uint64_t awaited_step) {
  const NodeSpec& node = expected.node;
  const bool from_upstream = node.upstream && m.sender == node.upstream->name;
  const bool from_downstream = node.downstream && m.sender == node.downstream->name;
  if (!from_upstream && !from_downstream)
    return reject("unknown_peer", "\"" + m.sender + "\" is neither upstream nor downstream of " +
                                      node.name);
  const bool allowed = m.kind == MessageKind::kControl ||
                       ((m.kind == MessageKind::kActivation || m.kind == MessageKind::kEvaluation)
                            ? from_upstream
                            : m.kind == MessageKind::kGradient && from_downstream);
  if (!allowed)
    return reject("kind_not_allowed", std::string(toString(m.kind)) + " messages may not come from " +
                                          (from_upstream ? "upstream" : "downstream"));
  if (m.job_id != node.job_id)
    return reject("job_id", "job \"" + m.job_id + "\", this node runs \"" + node.job_id + "\"");
  if (!carriesTensors(m.kind)) return std::nullopt;
  const uint64_t distance = m.step > awaited_step ? m.step - awaited_step : awaited_step - m.step;
  if (distance > expected.checks.step_window)
    return reject("step_window", "step " + std::to_string(m.step) + " while working on step " +
                                     std::to_string(awaited_step) + " (window " +
                                     std::to_string(expected.checks.step_window) + ")");
  return std::nullopt;
}

// A tensor beyond the planned boundary: a small bookkeeping ("__") tensor.
Verdict checkExtraTensor(const NamedTensor& t, int64_t rows) {
  if (!isReservedTensorName(t.name))
    return reject("tensor_name", "extra tensor \"" + t.name + "\" is not a bookkeeping (__) tensor");
  if (t.tensor.dim() > 2 || t.tensor.numel() > std::max<int64_t>(rows, 1) * 64)
    return reject("shape", "bookkeeping tensor \"" + t.name + "\" has shape " +
                               shapeText(t.tensor.sizes()));
  return std::nullopt;
}

// The dtype the plan's `planned_type` arrives in (compressed on the wire for planned float32).
Verdict checkDtype(const NamedTensor& t, const BoundaryValue& v,
                   std::optional<torch::ScalarType> planned_type, bool int8_form,
                   torch::ScalarType wire_float) {
  auto type = planned_type;
  const torch::ScalarType wire_type = wireDtype(wire_float);
  if (type && *type == torch::kFloat && (wire_float != torch::kChar || int8_form))
    type = wire_type;
  if (!type || t.tensor.scalar_type() != *type)
    return reject("dtype", "\"" + t.name + "\" is " + dtypeName(t.tensor.scalar_type()) +
                               "; the plan says " + v.dtype +
                               (type && *type != torch::kFloat && v.dtype == "float32"
                                    ? " sent as " + dtypeName(wire_type) +
                                          (int8_form ? " (int8 rows with scales)" : "") +
                                          " (training_definition.wire.activations)"
                                    : std::string()));
  return std::nullopt;
}

// The plan's shape (or its int8 wire form) with the batch dimension 1..rows (0: any); a tensor
// without a batch dimension (BoundaryValue::batch_dim) exactly the plan's shape.
Verdict checkShape(const NamedTensor& t, const BoundaryValue& v, bool int8_form, int64_t rows) {
  const at::IntArrayRef shape = t.tensor.sizes();
  std::optional<std::vector<int64_t>> seen;  // the tensor's shape (int8: the shape it stands for)
  if (int8_form)
    seen = int8PlannedShape(v, shape);
  else if (shape.size() == v.shape.size())
    seen = shape.vec();
  bool same = seen.has_value();
  for (size_t d = 0; same && d < seen->size(); ++d) {
    const int64_t n = (*seen)[d];
    same = v.batch_dim && int64_t(d) == *v.batch_dim ? n >= 1 && (rows <= 0 || n <= rows)
                                                     : n == v.shape[d];
  }
  if (!same)
    return reject("shape", "\"" + t.name + "\" has shape " + shapeText(shape) + "; the plan says " +
                               shapeText(v.shape) +
                               (int8_form ? " (int8 wire form " + shapeText(int8WireShape(v.shape)) + ")"
                                          : std::string()) +
                               (v.batch_dim ? " with dimension " + std::to_string(*v.batch_dim) +
                                                  " (the batch) 1.." +
                                                  (rows > 0 ? std::to_string(rows) : std::string("any"))
                                            : std::string(" exactly (no batch dimension)")));
  return std::nullopt;
}

// An int8 wire form's scales and values (trainer/Int8Boundary.h).
Verdict checkInt8Encoding(const NamedTensor& t) {
  bool nonfinite = false;
  const std::string bad = checkInt8Boundary(t.tensor, &nonfinite);
  if (!bad.empty()) return reject("encoding", "\"" + t.name + "\": " + bad);
  if (nonfinite) return reject("nonfinite", "\"" + t.name + "\" holds NaN or Inf (a NaN int8 scale)");
  return std::nullopt;
}

// Tensor `i` of the planned boundary against its BoundaryValue `v`.
Verdict checkPlannedTensor(const NamedTensor& t, size_t i, const BoundaryValue& v, bool gradient,
                           int64_t rows, const LinkChecks& checks) {
  if (t.name != v.name)
    return reject("tensor_name", "tensor " + std::to_string(i) + " is \"" + t.name +
                                     "\"; the plan says \"" + v.name + "\"");
  if (gradient && t.tensor.numel() == 0) return std::nullopt;  // "no gradient" for this output
  if (v.type != "tensor") {
    if (t.tensor.numel() > 4096)
      return reject("shape", "\"" + t.name + "\" (" + v.type + ") has " +
                                 std::to_string(t.tensor.numel()) + " elements");
    return std::nullopt;
  }
  const std::optional<torch::ScalarType> type = scalarTypeForName(v.dtype);
  // Compressed on the wire (training_definition.wire.activations): planned float32 arrives in
  // the wire dtype (int8: as uint8 rows with scales, trainer/Int8Boundary.h).
  const bool int8_form = type == torch::kFloat && checks.wire_float == torch::kChar &&
                         int8Carries(int64_t(v.shape.size()));
  if (Verdict bad = checkDtype(t, v, type, int8_form, checks.wire_float)) return bad;
  if (Verdict bad = checkShape(t, v, int8_form, rows)) return bad;
  if (int8_form) return checkInt8Encoding(t);
  return std::nullopt;
}

Verdict checkFinite(const Message& m) {
  for (const NamedTensor& t : m.tensors)
    if (at::isFloatingType(t.tensor.scalar_type()) && t.tensor.numel() > 0 &&
        !torch::isfinite(t.tensor).all().item<bool>())
      return reject("nonfinite", "\"" + t.name + "\" holds NaN or Inf");
  return std::nullopt;
}

// The per-tensor checks of a tensor-carrying message: the planned boundary, then the byte limit,
// then finite values.
Verdict checkTensors(const Message& m, const PipelineExpectations& expected) {
  const LinkChecks& checks = expected.checks;
  const bool gradient = m.kind == MessageKind::kGradient;
  const std::vector<BoundaryValue>& planned = gradient ? expected.node.outputs : expected.node.inputs;
  const int64_t rows =
      m.kind == MessageKind::kEvaluation ? checks.max_eval_rows : checks.max_microbatch_rows;
  if (m.tensors.size() < planned.size() || m.tensors.size() > planned.size() + checks.max_extra_tensors)
    return reject("tensor_count", std::to_string(m.tensors.size()) + " tensors; the plan has " +
                                      std::to_string(planned.size()) + " (+ at most " +
                                      std::to_string(checks.max_extra_tensors) + " bookkeeping)");
  uint64_t bytes = 0;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const NamedTensor& t = m.tensors[i];
    bytes += t.tensor.defined() ? uint64_t(t.tensor.nbytes()) : 0;
    if (!t.tensor.defined()) return reject("shape", "tensor \"" + t.name + "\" is undefined");
    const Verdict bad = i >= planned.size()
                            ? checkExtraTensor(t, rows)
                            : checkPlannedTensor(t, i, planned[i], gradient, rows, checks);
    if (bad) return bad;
  }
  if (bytes > expected.max_message_bytes)
    return reject("bytes", std::to_string(bytes) + " tensor bytes; the limit is " +
                               std::to_string(expected.max_message_bytes));
  return checkFinite(m);
}

}  // namespace

std::optional<std::vector<int64_t>> int8PlannedShape(const BoundaryValue& v, at::IntArrayRef wire) {
  std::vector<int64_t> shape = v.shape;
  if (!int8Carries(int64_t(shape.size()))) return std::nullopt;
  if (v.batch_dim && *v.batch_dim < int64_t(shape.size())) {
    const size_t batch = size_t(*v.batch_dim);
    const size_t kept = shape.size() == 2 ? 1 : 2;  // int8WireShape keeps these dimensions
    if (batch < kept) {
      if (wire.size() <= batch) return std::nullopt;
      shape[batch] = wire[batch];
    } else {  // folded into the row: the row length is a multiple of the one at batch size 1
      shape[batch] = 1;
      const int64_t unit = int8WireShape(shape).back() - 4;
      if (wire.empty() || unit <= 0 || wire.back() < 4 || (wire.back() - 4) % unit != 0)
        return std::nullopt;
      shape[batch] = (wire.back() - 4) / unit;
    }
  }
  if (at::IntArrayRef(int8WireShape(shape)) != wire) return std::nullopt;
  return shape;
}

torch::ScalarType stageWireDtype(const std::string& codec, const std::string& source) {
  if (const std::optional<WireCodec> wire = parseWireCodec(codec)) return wireFloat(*wire);
  CAIRN_THROW(BadInput, source, ": training_definition.wire.activations \"", codec,
              "\" (expected \"fp32\", \"bf16\", \"fp16\" or \"int8\")");
}

uint64_t plannedMessageBytes(const NodeSpec& node, const LinkChecks& checks) {
  const int64_t rows = std::max(checks.max_microbatch_rows, checks.max_eval_rows);
  if (rows <= 0) return 0;
  const bool int8_wire = checks.wire_float == torch::kChar;
  return std::max(plannedBytes(node.inputs, rows, int8_wire),
                  plannedBytes(node.outputs, rows, int8_wire)) +
         (1u << 20);
}

bool carriesTensors(MessageKind k) {
  return k == MessageKind::kActivation || k == MessageKind::kGradient ||
         k == MessageKind::kEvaluation;
}

std::optional<std::string> rejectPipelineMessage(const Message& m,
                                                 const PipelineExpectations& expected,
                                                 uint64_t awaited_step, bool deep,
                                                 std::string* detail) {
  Verdict verdict = checkEnvelope(m, expected, awaited_step);
  if (!verdict && deep && carriesTensors(m.kind)) verdict = checkTensors(m, expected);
  if (!verdict) return std::nullopt;
  if (detail) *detail = std::move(verdict->detail);
  return std::move(verdict->reason);
}

}  // namespace cairn
