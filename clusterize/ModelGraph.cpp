#include "clusterize/ModelGraph.h"

#include <algorithm>
#include <functional>
#include <set>

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>

#include "core/Error.h"

namespace cairn::clusterize {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;
namespace prim = c10::prim;

Granularity parseGranularity(const std::string& text) {
  if (text == "top") return Granularity::kTop;
  if (text == "expand-containers") return Granularity::kExpandContainers;
  CAIRN_THROW(BadInput, "--granularity must be top or expand-containers (got \"", text, "\")");
}

std::string toString(Granularity granularity) {
  return granularity == Granularity::kTop ? "top" : "expand-containers";
}

ValueKind valueKindOf(const c10::TypePtr& type) {
  if (type->cast<c10::TensorType>()) return ValueKind::kTensor;
  if (type->kind() == c10::TypeKind::IntType) return ValueKind::kInt;
  if (type->kind() == c10::TypeKind::FloatType) return ValueKind::kFloat;
  if (type->kind() == c10::TypeKind::BoolType) return ValueKind::kBool;
  if (auto list = type->cast<c10::ListType>()) {
    if (list->getElementType()->kind() == c10::TypeKind::IntType) return ValueKind::kIntList;
  }
  return ValueKind::kUnsupported;
}

std::string toString(ValueKind kind) {
  switch (kind) {
    case ValueKind::kTensor:
      return "tensor";
    case ValueKind::kInt:
      return "int";
    case ValueKind::kFloat:
      return "float";
    case ValueKind::kBool:
      return "bool";
    case ValueKind::kIntList:
      return "int_list";
    case ValueKind::kUnsupported:
      return "unsupported";
  }
  return "?";
}

namespace {

std::vector<std::string> splitPath(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = path.find('.', start);
    const size_t end = dot == std::string::npos ? path.size() : dot;
    parts.push_back(path.substr(start, end - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

std::string joinPath(const std::string& a, const std::string& b) { return a.empty() ? b : a + "." + b; }

bool isSequentialType(const c10::TypePtr& type) {
  auto cls = type->cast<c10::ClassType>();
  if (!cls || !cls->name()) return false;
  const std::string name = cls->name()->qualifiedName();
  return name.find("torch.nn.modules.container.") != std::string::npos &&
         name.size() >= 10 && name.compare(name.size() - 10, 10, "Sequential") == 0;
}

std::string shortClassName(const c10::TypePtr& type) {
  auto cls = type->cast<c10::ClassType>();
  if (!cls || !cls->name()) return type->str();
  return cls->name()->name();
}

// Calls f on every node of the block, recursing into nested blocks, and on each block's return.
void forEachNode(Block* block, const std::function<void(Node*)>& f) {
  for (Node* n : block->nodes()) {
    f(n);
    for (Block* inner : n->blocks()) forEachNode(inner, f);
  }
  f(block->return_node());
}

void forEachNodeOf(Node* unit, const std::function<void(Node*)>& f) {
  f(unit);
  for (Block* inner : unit->blocks()) forEachNode(inner, f);
}

}  // namespace

c10::IValue attributeAt(const torch::jit::Module& model, const std::string& path) {
  c10::IValue current = model._ivalue();
  if (path.empty()) return current;
  for (const auto& part : splitPath(path)) {
    CAIRN_ENFORCE(current.isObject(), "attribute path ", path, " goes through a non-object");
    auto object = current.toObject();
    CAIRN_ENFORCE(object->type()->hasAttribute(part), "no attribute ", part, " in path ", path);
    current = object->getAttr(part);
  }
  return current;
}

ModelGraph::ModelGraph(torch::jit::Module model, Granularity granularity, bool split_shared)
    : model_(std::move(model)), split_shared_(split_shared) {
  if (!model_.find_method("forward"))
    CAIRN_THROW(BadInput, "the model has no forward method");
  graph_ = model_.get_method("forward").graph()->copy();
  inlineCalls(granularity);
  for (size_t i = 1; i < graph_->inputs().size(); ++i) {
    Value* input = graph_->inputs()[i];
    if (valueKindOf(input->type()) == ValueKind::kUnsupported)
      CAIRN_THROW(BadInput, "model input ", i - 1, " (", input->debugName(), ") has type ",
                  input->type()->str(), "; clusterize handles tensor, int, float, bool and int[] inputs");
  }
  collectUnits();
  if (units_.empty()) CAIRN_THROW(BadInput, "the model's forward does no work (no units)");
  computeBoundaries();
}

std::optional<std::string> ModelGraph::attributePath(const Value* value) const {
  if (value == self()) return std::string();
  const Node* node = value->node();
  if (node->kind() != prim::GetAttr) return std::nullopt;
  auto parent = attributePath(node->input(0));
  if (!parent) return std::nullopt;
  return joinPath(*parent, node->s(c10::attr::name));
}

bool ModelGraph::isRematerialized(const Node* node) const {
  if (node->owningBlock() != graph_->block()) return false;
  if (node->kind() == prim::Constant) return true;
  return node->kind() == prim::GetAttr && attributePath(node->output()).has_value();
}

void ModelGraph::inlineCalls(Granularity granularity) {
  for (bool changed = true; changed;) {
    changed = false;
    std::vector<Node*> calls;
    forEachNode(graph_->block(), [&](Node* n) {
      if (n->kind() == prim::CallMethod) calls.push_back(n);
    });
    for (Node* call : calls) {
      auto path = attributePath(call->input(0));
      if (!path) continue;
      const bool on_self = path->empty();
      const bool container = granularity == Granularity::kExpandContainers &&
                             call->owningBlock() == graph_->block() &&
                             call->s(c10::attr::name) == "forward" &&
                             isSequentialType(call->input(0)->type());
      if (!on_self && !container) continue;
      auto cls = call->input(0)->type()->expect<c10::ClassType>();
      torch::jit::Function& method = cls->getMethod(call->s(c10::attr::name));
      torch::jit::inlineCallTo(call, &torch::jit::toGraphFunction(method), /*use_graph=*/false);
      changed = true;
      break;  // the node list changed; collect again
    }
  }
}

void ModelGraph::collectUnits() {
  std::map<const c10::TensorImpl*, std::vector<std::pair<int, std::string>>> users;
  for (size_t i = 1; i < graph_->inputs().size(); ++i)
    definition_order_[graph_->inputs()[i]] = static_cast<int>(definition_order_.size());
  for (Node* n : graph_->block()->nodes()) {
    forEachNodeOf(n, [&](Node* inner) {
      if (inner->kind() == prim::SetAttr && attributePath(inner->input(0)))
        CAIRN_THROW(BadInput, "forward assigns attribute ", inner->s(c10::attr::name),
                    " of the model; clusterize cannot cut a forward that mutates module attributes");
    });
    if (isRematerialized(n)) continue;
    Unit unit;
    unit.node = n;
    if (n->kind() == prim::CallMethod && attributePath(n->input(0))) {
      const std::string method = n->s(c10::attr::name);
      unit.label = *attributePath(n->input(0)) + (method == "forward" ? "" : "." + method) + " (" +
                   shortClassName(n->input(0)->type()) + ")";
    } else {
      unit.label = n->kind().toQualString();
    }
    for (Value* out : n->outputs()) definition_order_[out] = static_cast<int>(definition_order_.size());
    units_.push_back(std::move(unit));
    resolveState(&units_.back(), &users);
  }
  // Tensors used by several units. A parameter is kept in every stage that uses it and its copies
  // are kept equal (SharedParameter); a buffer (running statistics a unit may update) cannot be:
  // no cut between its first and its last user.
  why_invalid_.assign(units_.size() + 1, "");
  for (const auto& [impl, list] : users) {
    std::set<int> unit_set;
    std::set<std::string> names;
    for (const auto& [unit, name] : list) unit_set.insert(unit), names.insert(name);
    const int first = *unit_set.begin(), last = *unit_set.rbegin();
    if (first == last) continue;
    std::string joined;
    for (const auto& name : names) joined += (joined.empty() ? "" : " = ") + name;
    const std::string users_text = "units " + std::to_string(first) + " (" +
                                   units_[first].label + ") and " + std::to_string(last) + " (" +
                                   units_[last].label + ")";
    const auto& first_params = units_[first].parameters;
    const std::string first_name = list.front().second;
    const bool parameter =
        std::find(first_params.begin(), first_params.end(), first_name) != first_params.end();
    if (parameter && split_shared_) {
      SharedParameter shared;
      shared.units.assign(unit_set.begin(), unit_set.end());
      shared.names.assign(names.begin(), names.end());
      for (const auto& [unit, name] : list)
        if (unit == first && (shared.name.empty() || name < shared.name)) shared.name = name;
      notes_.push_back("parameter " + joined + " is used by " + users_text +
                       "; a stage holding either keeps a copy, kept equal every step");
      shared_.push_back(std::move(shared));
      continue;
    }
    const std::string why =
        (parameter ? "parameter " : "buffer ") + joined + " is used by " + users_text +
        (parameter ? ", so they stay in one stage (the async schedule cannot keep copies equal)"
                   : ", so they stay in one stage");
    notes_.push_back(why);
    for (int c = first + 1; c <= last; ++c)
      if (why_invalid_[c].empty()) why_invalid_[c] = why;
  }
  std::sort(shared_.begin(), shared_.end(),
            [](const SharedParameter& a, const SharedParameter& b) { return a.units < b.units; });
}

void ModelGraph::resolveState(
    Unit* unit, std::map<const c10::TensorImpl*, std::vector<std::pair<int, std::string>>>* users) {
  const int index = static_cast<int>(units_.size()) - 1;
  std::set<std::string> paths;
  forEachNodeOf(unit->node, [&](Node* user) {
    if (user->kind() == prim::GetAttr) return;  // a step along a path, not a use of the object
    for (Value* input : user->inputs()) {
      auto path = attributePath(input);
      if (!path) continue;
      if (path->empty())
        CAIRN_THROW(BadInput, "forward uses the model object itself as a value (in ",
                    user->kind().toQualString(), "); clusterize cannot cut such a forward");
      paths.insert(*path);
    }
  });
  std::set<std::string> parameters, buffers;
  auto note = [&](const at::Tensor& t, const std::string& name, bool is_parameter) {
    (is_parameter ? parameters : buffers).insert(name);
    (*users)[t.unsafeGetTensorImpl()].emplace_back(index, name);
  };
  for (const auto& path : paths) {
    const c10::IValue value = attributeAt(model_, path);
    if (value.isObject() && value.toObject()->type()->is_module()) {
      torch::jit::Module child(value.toObject());
      for (const auto& p : child.named_parameters(true)) note(p.value, joinPath(path, p.name), true);
      for (const auto& b : child.named_buffers(true)) note(b.value, joinPath(path, b.name), false);
    } else if (value.isTensor()) {
      const size_t dot = path.rfind('.');
      const std::string parent_path = dot == std::string::npos ? "" : path.substr(0, dot);
      const std::string field = dot == std::string::npos ? path : path.substr(dot + 1);
      auto parent_type = attributeAt(model_, parent_path).toObject()->type();
      const size_t slot = *parent_type->findAttributeSlot(field);
      if (parent_type->is_parameter(slot) || parent_type->is_buffer(slot))
        note(value.toTensor(), path, parent_type->is_parameter(slot));
    }
  }
  unit->state_paths.assign(paths.begin(), paths.end());
  unit->parameters.assign(parameters.begin(), parameters.end());
  unit->buffers.assign(buffers.begin(), buffers.end());
}

void ModelGraph::computeBoundaries() {
  const int count = numUnits();
  std::map<const Node*, int> unit_index;
  for (int i = 0; i < count; ++i) unit_index[units_[i].node] = i;
  // For every value that can cross: the unit defining it (-1: a model input) and its last user.
  struct Span {
    Value* value;
    int defined;
    int last_use;
  };
  std::vector<Span> spans;
  auto topLevelUser = [&](Node* user) -> int {
    while (user->owningBlock() != graph_->block()) user = user->owningBlock()->owningNode();
    if (user == graph_->return_node()) return count;
    auto it = unit_index.find(user);
    return it == unit_index.end() ? -1 : it->second;
  };
  auto addSpan = [&](Value* v, int defined) {
    int last = defined;
    for (const auto& use : v->uses()) last = std::max(last, topLevelUser(use.user));
    spans.push_back({v, defined, last});
  };
  for (size_t i = 1; i < graph_->inputs().size(); ++i) addSpan(graph_->inputs()[i], -1);
  for (int i = 0; i < count; ++i)
    for (Value* out : units_[i].node->outputs()) addSpan(out, i);

  boundaries_.assign(count + 1, {});
  for (size_t i = 1; i < graph_->inputs().size(); ++i) boundaries_[0].push_back(graph_->inputs()[i]);
  for (Value* out : graph_->outputs()) boundaries_[count].push_back(out);
  for (int c = 1; c < count; ++c) {
    for (const auto& span : spans)
      if (span.defined < c && c <= span.last_use) boundaries_[c].push_back(span.value);
    std::sort(boundaries_[c].begin(), boundaries_[c].end(), [&](const Value* a, const Value* b) {
      return definition_order_.at(a) < definition_order_.at(b);
    });
    if (!why_invalid_[c].empty()) continue;
    for (Value* v : boundaries_[c]) {
      if (valueKindOf(v->type()) == ValueKind::kUnsupported) {
        why_invalid_[c] = "value " + valueName(v) + " of type " + v->type()->str() + " would cross it";
        break;
      }
    }
  }
}

bool ModelGraph::isValidCut(int cut) const {
  if (cut <= 0 || cut >= numUnits()) return true;
  return why_invalid_.at(cut).empty();
}

std::vector<int> ModelGraph::atomCuts() const {
  std::vector<int> cuts = {0};
  for (int c = 1; c < numUnits(); ++c)
    if (isValidCut(c)) cuts.push_back(c);
  cuts.push_back(numUnits());
  return cuts;
}

std::string ModelGraph::valueName(const Value* value) const {
  if (!value->hasDebugName()) return "v" + std::to_string(value->unique());
  std::string name = value->debugName();
  std::replace(name.begin(), name.end(), '.', '_');
  return name;
}

}  // namespace cairn::clusterize
