#include "clusterize/Profiler.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>

#include <torch/csrc/autograd/autograd.h>

#include "clusterize/MemoryMeter.h"
#include "clusterize/StageBuilder.h"
#include "core/Error.h"
#include "core/Log.h"

namespace cairn::clusterize {
namespace {

const std::vector<std::pair<std::string, c10::ScalarType>>& dtypeTable() {
  static const std::vector<std::pair<std::string, c10::ScalarType>> table = {
      {"float32", at::kFloat}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"float64", at::kDouble}, {"int64", at::kLong}, {"int32", at::kInt},
      {"uint8", at::kByte},    {"bool", at::kBool}};
  return table;
}

std::vector<BoundaryValue> describe(const std::string& name, const c10::IValue& value) {
  BoundaryValue b;
  b.name = name;
  if (value.isTensor()) {
    b.type = "tensor";
    b.dtype = dtypeName(value.toTensor().scalar_type());
    b.shape = value.toTensor().sizes().vec();
  } else if (value.isInt()) {
    b.type = "int";
    b.dtype = "int64";
  } else if (value.isDouble()) {
    b.type = "float";
    b.dtype = "float64";
  } else if (value.isBool()) {
    b.type = "bool";
    b.dtype = "bool";
  } else if (value.isIntList()) {
    b.type = "int_list";
    b.dtype = "int64";
    b.shape = {static_cast<int64_t>(value.toIntList().size())};
  } else if (value.isTuple()) {
    std::vector<BoundaryValue> all;
    const auto& elements = value.toTupleRef().elements();
    for (size_t i = 0; i < elements.size(); ++i) {
      auto inner = describe(name + "_" + std::to_string(i), elements[i]);
      all.insert(all.end(), inner.begin(), inner.end());
    }
    return all;
  } else {
    CAIRN_THROW(BadInput, "value ", name, " of type ", value.tagKind(),
                " cannot be described for node.json");
  }
  return {b};
}

// A fresh copy of a boundary value: tensors are cloned from `leaf` so that the copy is not a leaf
// and the autograd graph does not keep it alive unless an op saves it.
c10::IValue freshInput(const c10::IValue& leaf) {
  if (!leaf.isTensor()) return leaf;
  return leaf.toTensor().clone();
}

// `needs_grad`: whether the stage that starts here computes its inputs' gradients. A provider's
// Root does not (its inputs are data: trainer/StageExecutor inputs_need_grad), every other stage
// does, so only atom 0 is timed without them (for a first convolution the input gradient is most
// of its backward: measured 7.6 ms vs 1.5 ms fwd+bwd for the demo CNN's conv1).
c10::IValue makeLeaf(const c10::IValue& value, bool needs_grad) {
  if (!value.isTensor()) return value;
  at::Tensor t = value.toTensor().detach().clone();
  if (needs_grad && t.is_floating_point()) t.requires_grad_(true);
  return t;
}

// While profiling, glibc's malloc keeps freed memory instead of returning it to the kernel. A
// profiling run allocates and frees all its tensors each time; with glibc's defaults a tensor of a
// few MB is mapped fresh (or the heap top trimmed and grown again) on every run, and its page
// faults dominated small atoms: the demo CNN's conv1 (3.2 MB output) took ~10-30 ms per run, 0.7 ms
// with the thresholds below (PyTorch, fwd+bwd, 1 thread), which is what a provider's Root measures
// (~1.5 ms per micro-batch: its many live tensors keep the heap from being trimmed). Hand-written:
// no library here sets allocator policy. Restores glibc's default thresholds afterwards (dynamic
// adjustment stays off, as after any mallopt).
class AllocatorSteadyState {
 public:
  AllocatorSteadyState() {
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest mmap threshold on 64-bit
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
  }
  ~AllocatorSteadyState() {
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 128 << 10);  // glibc's defaults
    mallopt(M_TRIM_THRESHOLD, 128 << 10);
    malloc_trim(0);
#endif
  }
  AllocatorSteadyState(const AllocatorSteadyState&) = delete;
  AllocatorSteadyState& operator=(const AllocatorSteadyState&) = delete;
};

std::vector<at::Tensor> differentiableOutputs(const c10::IValue& out) {
  std::vector<at::Tensor> tensors;
  auto add = [&](const c10::IValue& v) {
    if (v.isTensor() && v.toTensor().requires_grad()) tensors.push_back(v.toTensor());
  };
  if (out.isTuple()) {
    for (const auto& e : out.toTupleRef().elements()) add(e);
  } else {
    add(out);
  }
  return tensors;
}

std::vector<c10::IValue> unpackOutputs(const c10::IValue& out, size_t count) {
  if (count == 1) return {out};
  CAIRN_ENFORCE(out.isTuple(), "a stage with several outputs returned ", out.tagKind());
  return out.toTupleRef().elements().vec();
}

c10::IValue detachAll(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().detach();
  if (v.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const auto& e : v.toTupleRef().elements()) elements.push_back(detachAll(e));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return v;
}

using ValueEnv = std::map<const torch::jit::Value*, c10::IValue>;

// The example inputs as the values of the model's inputs (cut 0), checked against the graph.
ValueEnv inputValues(const ModelGraph& graph, const std::vector<c10::IValue>& inputs) {
  const auto& model_inputs = graph.boundary(0);
  if (inputs.size() != model_inputs.size())
    CAIRN_THROW(BadInput, "the model takes ", model_inputs.size(), " input(s) but the example has ",
                inputs.size(), " (give --input-shape once per input, or --example)");
  ValueEnv env;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto kind = valueKindOf(model_inputs[i]->type());
    if (kind == ValueKind::kTensor && !inputs[i].isTensor())
      CAIRN_THROW(BadInput, "model input ", i, " (", graph.valueName(model_inputs[i]),
                  ") is a tensor but the example gives ", inputs[i].tagKind());
    env[model_inputs[i]] = inputs[i];
  }
  return env;
}

// The bytes crossing cut `cut` (appended to boundary_bytes) and, the first time a value is seen,
// its description for node.json.
void recordCut(const ModelGraph& graph, const ValueEnv& env, int cut, ModelProfile& profile) {
  int64_t bytes = 0;
  for (const torch::jit::Value* v : graph.boundary(cut)) {
    const c10::IValue& value = env.at(v);
    bytes += transferBytes(value);
    if (!profile.values.count(v)) profile.values[v] = describe(graph.valueName(v), value);
  }
  profile.boundary_bytes.push_back(bytes);
}

// Forward + backward of one atom on fresh copies of its inputs. With `saved_bytes`: only the
// forward, and the bytes its autograd graph keeps are written there instead of timing.
double runOnce(StageModule& stage, const std::vector<c10::IValue>& leaves, int64_t* saved_bytes) {
  std::vector<c10::IValue> args;
  std::optional<MemoryMeter> meter;
  int64_t before = 0;
  if (saved_bytes) {
    meter.emplace();
    before = meter->liveBytes();
  }
  const auto start = std::chrono::steady_clock::now();
  for (const auto& leaf : leaves) args.push_back(freshInput(leaf));
  c10::IValue out = stage.module.forward(args);
  auto grads_for = differentiableOutputs(out);
  if (saved_bytes) {
    // Keep only what autograd keeps: drop our handles to inputs and outputs.
    std::vector<std::shared_ptr<torch::autograd::Node>> graphs;
    for (const auto& t : grads_for) graphs.push_back(t.grad_fn());
    args.clear();
    out = c10::IValue();
    grads_for.clear();
    *saved_bytes = std::max<int64_t>(0, meter->liveBytes() - before);
    meter.reset();
    return 0;
  }
  if (!grads_for.empty()) {
    std::vector<at::Tensor> ones;
    for (const auto& t : grads_for) ones.push_back(torch::ones_like(t));
    torch::autograd::backward(grads_for, ones);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The atom's parameter and buffer names and bytes; a tensor tied under several names counts once.
void countState(const ModelGraph& graph, const std::map<std::string, at::Tensor>& tensors,
                AtomProfile& atom) {
  std::set<std::string> params, buffers;
  for (int u = atom.begin_unit; u < atom.end_unit; ++u) {
    params.insert(graph.units()[u].parameters.begin(), graph.units()[u].parameters.end());
    buffers.insert(graph.units()[u].buffers.begin(), graph.units()[u].buffers.end());
  }
  atom.parameters.assign(params.begin(), params.end());
  atom.buffers.assign(buffers.begin(), buffers.end());
  std::set<const c10::TensorImpl*> counted;
  for (const auto& name : atom.parameters) {
    const at::Tensor& t = tensors.at(name);
    if (!counted.insert(t.unsafeGetTensorImpl()).second) continue;
    atom.parameter_bytes += t.numel() * t.element_size();
    if (t.requires_grad()) atom.trainable_bytes += t.numel() * t.element_size();
  }
  for (const auto& name : atom.buffers) {
    const at::Tensor& t = tensors.at(name);
    if (counted.insert(t.unsafeGetTensorImpl()).second)
      atom.buffer_bytes += t.numel() * t.element_size();
  }
}

// An atom measured in pass 1, waiting for pass 2 to time it.
struct PendingAtom {
  AtomProfile atom;
  StageModule stage;
  std::vector<c10::IValue> leaves;
};

// Pass 1 for atom `a`: its sizes, the memory autograd keeps, its outputs (the next atom's inputs,
// put into `env` and recorded at its end cut) and the warm-up runs.
PendingAtom measureAtom(const ModelGraph& graph, const StageBuilder& builder,
                        const std::map<std::string, at::Tensor>& tensors, size_t a,
                        const ProfileOptions& options, ValueEnv& env, ModelProfile& profile) {
  AtomProfile atom;
  atom.begin_unit = profile.cuts[a];
  atom.end_unit = profile.cuts[a + 1];
  StageModule stage = builder.build(atom.begin_unit, atom.end_unit, "Atom" + std::to_string(a));
  stage.module.train();
  countState(graph, tensors, atom);

  std::vector<c10::IValue> leaves;
  for (const torch::jit::Value* v : stage.inputs) leaves.push_back(makeLeaf(env.at(v), a > 0));
  atom.inputs_need_grad = a > 0;
  c10::IValue output;
  runOnce(stage, leaves, &atom.saved_bytes);
  {
    torch::NoGradGuard no_grad;
    std::vector<c10::IValue> args;
    for (const auto& leaf : leaves) args.push_back(freshInput(leaf));
    output = detachAll(stage.module.forward(args));
  }
  for (int i = 0; i < options.warmup_runs; ++i) runOnce(stage, leaves, nullptr);

  const auto outs = unpackOutputs(output, stage.outputs.size());
  for (size_t i = 0; i < outs.size(); ++i) env[stage.outputs[i]] = outs[i];
  recordCut(graph, env, atom.end_unit, profile);
  atom.output_bytes = profile.boundary_bytes.back();
  return {std::move(atom), std::move(stage), std::move(leaves)};
}

// Values as describe() lists them: a tuple's elements (recursively), anything else itself.
void flatten(const c10::IValue& value, std::vector<c10::IValue>& out) {
  if (!value.isTuple()) {
    out.push_back(value);
    return;
  }
  for (const auto& e : value.toTupleRef().elements()) flatten(e, out);
}

// The dimension of a tensor seen at two batch sizes whose size differs (the first such), or none.
std::optional<int64_t> batchDimOf(const c10::IValue& first, const c10::IValue& second) {
  if (!first.isTensor() || !second.isTensor()) return std::nullopt;
  const auto a = first.toTensor().sizes(), b = second.toTensor().sizes();
  if (a.size() != b.size()) return std::nullopt;
  for (size_t d = 0; d < a.size(); ++d)
    if (a[d] != b[d]) return int64_t(d);
  return std::nullopt;
}

// The example inputs one sample longer (the first sample repeated at the end of dimension 0).
std::vector<c10::IValue> oneMoreSample(const std::vector<c10::IValue>& inputs) {
  std::vector<c10::IValue> out;
  for (const auto& v : inputs) {
    if (!v.isTensor() || v.toTensor().dim() == 0) {
      out.push_back(v);
      continue;
    }
    const at::Tensor& t = v.toTensor();
    out.emplace_back(at::cat({t, t.narrow(0, 0, 1)}, 0));
  }
  return out;
}

// Pass 3: the model again, forward only, on the example inputs one sample longer; a boundary
// tensor's batch dimension is the one whose size changed (none: the batch does not size it, as
// positions from torch.arange(T)). A model that cannot run at the other batch size keeps every
// tensor's first dimension as its batch dimension, with a warning.
void detectBatchDims(const ModelGraph& graph, const std::vector<c10::IValue>& inputs,
                     std::vector<PendingAtom>& pending, const ValueEnv& env,
                     ModelProfile& profile) {
  ValueEnv longer;
  try {
    torch::NoGradGuard no_grad;
    longer = inputValues(graph, oneMoreSample(inputs));
    for (PendingAtom& p : pending) {
      std::vector<c10::IValue> args;
      for (const torch::jit::Value* v : p.stage.inputs) args.push_back(longer.at(v));
      p.stage.module.eval();
      c10::IValue out = p.stage.module.forward(args);
      p.stage.module.train();
      const auto outs = unpackOutputs(out, p.stage.outputs.size());
      for (size_t i = 0; i < outs.size(); ++i) longer[p.stage.outputs[i]] = outs[i];
    }
  } catch (const std::exception& e) {
    for (PendingAtom& p : pending) p.stage.module.train();
    CAIRN_WARN("clusterize: the model did not run at a second batch size (", e.what(),
               "); every tensor crossing a cut is taken to be batched along its first dimension");
    return;
  }
  for (auto& [value, described] : profile.values) {
    std::vector<c10::IValue> a, b;
    flatten(env.at(value), a);
    flatten(longer.at(value), b);
    for (size_t i = 0; i < described.size() && i < a.size() && i < b.size(); ++i)
      described[i].batch_dim = batchDimOf(a[i], b[i]);
  }
}

}  // namespace

std::string dtypeName(c10::ScalarType type) {
  for (const auto& [name, t] : dtypeTable())
    if (t == type) return name;
  CAIRN_THROW(BadInput, "tensors of dtype ", c10::toString(type),
              " cannot cross a stage boundary (the wire carries float32, float16, bfloat16, "
              "float64, int64, int32, uint8, bool)");
}

c10::ScalarType parseDtype(const std::string& name) {
  for (const auto& [n, t] : dtypeTable())
    if (n == name) return t;
  CAIRN_THROW(BadInput, "--input-dtype must be one of float32, float16, bfloat16, float64, int64, "
                        "int32, uint8, bool (got \"", name, "\")");
}

int64_t transferBytes(const c10::IValue& value) {
  if (value.isTensor()) return value.toTensor().numel() * value.toTensor().element_size();
  if (value.isIntList()) return 8 * static_cast<int64_t>(value.toIntList().size());
  if (value.isTuple()) {
    int64_t sum = 0;
    for (const auto& e : value.toTupleRef().elements()) sum += transferBytes(e);
    return sum;
  }
  return 8;
}

std::vector<BoundaryValue> ModelProfile::describeCut(const ModelGraph& graph, int cut) const {
  std::vector<BoundaryValue> out;
  for (const torch::jit::Value* v : graph.boundary(cut)) {
    auto it = values.find(v);
    CAIRN_ENFORCE(it != values.end(), "value ", graph.valueName(v), " at cut ", cut,
                  " was not profiled");
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

ModelProfile profileModel(const ModelGraph& graph, const std::vector<c10::IValue>& inputs,
                          const ProfileOptions& options) {
  ValueEnv env = inputValues(graph, inputs);
  ModelProfile profile;
  profile.cuts = graph.atomCuts();
  std::map<std::string, at::Tensor> tensors;
  for (const auto& p : graph.model().named_parameters(true)) tensors[p.name] = p.value;
  for (const auto& b : graph.model().named_buffers(true)) tensors[b.name] = b.value;

  StageBuilder builder(graph);
  const size_t atom_count = profile.cuts.size() - 1;
  recordCut(graph, env, 0, profile);
  const AllocatorSteadyState steady_state;
  // Pass 1, atom by atom: sizes, the memory autograd keeps, the outputs (the next atom's inputs)
  // and the warm-up runs. Pass 2 times every atom, once every atom has run.
  std::vector<PendingAtom> pending;
  pending.reserve(atom_count);
  for (size_t a = 0; a < atom_count; ++a)
    pending.push_back(measureAtom(graph, builder, tensors, a, options, env, profile));
  detectBatchDims(graph, inputs, pending, env, profile);
  for (PendingAtom& p : pending) {
    runOnce(p.stage, p.leaves, nullptr);  // caches warm for this atom again
    std::vector<double> times;
    for (int i = 0; i < std::max(1, options.timed_runs); ++i)
      times.push_back(runOnce(p.stage, p.leaves, nullptr));
    p.atom.seconds = *std::min_element(times.begin(), times.end());
    profile.atoms.push_back(std::move(p.atom));
  }
  return profile;
}

}  // namespace cairn::clusterize
