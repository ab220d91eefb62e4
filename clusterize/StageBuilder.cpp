#include "clusterize/StageBuilder.h"

#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include <torch/csrc/jit/ir/ir.h>

#include "core/Error.h"
#include "core/TorchCompat.h"

namespace cairn::clusterize {

using torch::jit::Node;
using torch::jit::Value;
namespace prim = c10::prim;

namespace {

std::string sanitize(const std::string& text) {
  std::string out;
  for (char c : text) out += (std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  return out;
}

// Resets the output type of every GetAttr from the object's (possibly new) class.
void refreshGetAttrTypes(torch::jit::Block* block) {
  for (Node* n : block->nodes()) {
    if (n->kind() == prim::GetAttr) {
      if (auto cls = n->input(0)->type()->cast<c10::ClassType>())
        n->output()->setType(cls->getAttribute(n->s(c10::attr::name)));
    }
    for (torch::jit::Block* inner : n->blocks()) refreshGetAttrTypes(inner);
  }
}

bool trainingFlag(const c10::IValue& object) {
  auto obj = object.toObject();
  return obj->type()->hasAttribute("training") ? obj->getAttr("training").toBool() : false;
}

// Attribute paths units [begin, end) need whole, without those inside another needed path.
std::vector<std::string> wholePaths(const ModelGraph& source, int begin, int end) {
  std::set<std::string> wanted;
  for (int u = begin; u < end; ++u)
    wanted.insert(source.units()[u].state_paths.begin(), source.units()[u].state_paths.end());
  std::vector<std::string> whole;
  for (const auto& path : wanted) {
    bool inside = false;
    for (const auto& other : wanted)
      if (path.size() > other.size() && path.compare(0, other.size() + 1, other + ".") == 0)
        inside = true;
    if (!inside) whole.push_back(path);
  }
  return whole;
}

// The stage's partial modules by path ("" is the stage itself), all in one compilation unit.
struct PartialModules {
  const torch::jit::Module& model;
  std::string base;  // qualified name of the stage's class
  std::shared_ptr<torch::jit::CompilationUnit> cu;
  std::map<std::string, torch::jit::Module> by_path;
};

// Makes the partial modules along `path` (one per prefix that ends at a dot) not made yet.
void makeHolders(PartialModules& partial, const std::string& path) {
  std::string prefix;
  size_t start = 0;
  for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', start)) {
    const std::string part = path.substr(start, dot - start);
    const std::string next = prefix.empty() ? part : prefix + "." + part;
    if (!partial.by_path.count(next)) {
      torch::jit::Module holder(c10::QualifiedName(partial.base + "_" + sanitize(next)), partial.cu,
                                true);
      holder.register_attribute("training", c10::BoolType::get(),
                                trainingFlag(attributeAt(partial.model, next)));
      partial.by_path.at(prefix).register_module(part, holder);
      partial.by_path.emplace(next, holder);
    }
    prefix = next;
    start = dot + 1;
  }
}

// Deep copies of the state at `whole` paths into the stage (partial.by_path[""]), under the same
// paths; tensors tied inside the stage stay tied.
void copyState(PartialModules& partial, const std::vector<std::string>& whole) {
  IValueCopyMemo memo;  // keeps tensors tied inside the stage tied
  torch::NoGradGuard no_grad;  // copies of parameters must be leaves, not clone() results
  for (const auto& path : whole) {
    makeHolders(partial, path);
    const size_t dot = path.rfind('.');
    const std::string prefix = dot == std::string::npos ? std::string() : path.substr(0, dot);
    const std::string field = dot == std::string::npos ? path : path.substr(dot + 1);
    torch::jit::Module& holder = partial.by_path.at(prefix);
    auto original_parent = attributeAt(partial.model, prefix).toObject();
    const c10::IValue value = original_parent->getAttr(field);
    const c10::IValue copy = deepcopyIValue(value, memo);
    if (value.isObject() && value.toObject()->type()->is_module()) {
      holder.register_module(field, torch::jit::Module(copy.toObject()));
    } else {
      const auto parent_type = original_parent->type();
      const size_t slot = *parent_type->findAttributeSlot(field);
      holder.register_attribute(field, parent_type->getAttribute(slot), copy,
                                parent_type->is_parameter(slot), parent_type->is_buffer(slot));
    }
  }
}

// Parameters keep their original requires_grad (deepcopy under no_grad cleared it).
void restoreRequiresGrad(const torch::jit::Module& model, const torch::jit::Module& stage) {
  std::map<std::string, bool> requires;
  for (const auto& p : model.named_parameters(true)) requires[p.name] = p.value.requires_grad();
  for (const auto& p : stage.named_parameters(true)) {
    auto it = requires.find(p.name);
    p.value.requires_grad_(it == requires.end() ? true : it->second);
  }
}

// The stage's forward graph: the boundary inputs, then the unit range with constants and
// attribute reads re-created, returning the boundary outputs (several as a tuple).
std::shared_ptr<torch::jit::Graph> forwardGraph(const ModelGraph& source,
                                                const torch::jit::Module& stage,
                                                const StageModule& range, const std::string& tag) {
  auto graph = std::make_shared<torch::jit::Graph>();
  Value* self = graph->addInput("self")->setType(stage.type());
  std::unordered_map<const Value*, Value*> env;
  for (Value* in : range.inputs) {
    if (env.count(in)) continue;
    Value* added = graph->addInput(source.valueName(in))->setType(in->type());
    env[in] = added;
  }
  std::function<Value*(Value*)> lookup = [&](Value* v) -> Value* {
    auto it = env.find(v);
    if (it != env.end()) return it->second;
    if (v == source.self()) return self;
    Node* def = v->node();
    CAIRN_ENFORCE(source.isRematerialized(def), "stage ", tag, " uses value ", source.valueName(v),
                  " that is neither a boundary input nor re-creatable");
    Value* made = nullptr;
    if (def->kind() == prim::Constant) {
      Node* clone = graph->insertNode(graph->createClone(def, lookup));
      made = clone->output();
    } else {
      made = graph->insertGetAttr(lookup(def->input(0)), def->s(c10::attr::name));
    }
    if (v->hasDebugName()) made->setDebugName(v->debugName());
    env[v] = made;
    return made;
  };
  const auto& units = source.units();
  for (int u = range.begin; u < range.end; ++u) {
    Node* original = units[u].node;
    for (Value* in : original->inputs()) lookup(in);  // re-create attribute reads before the node
    Node* clone = graph->insertNode(graph->createClone(original, lookup));
    for (size_t i = 0; i < original->outputs().size(); ++i) env[original->output(i)] = clone->output(i);
  }
  std::vector<Value*> outs;
  for (Value* out : range.outputs) outs.push_back(lookup(out));
  if (outs.size() == 1) {
    graph->registerOutput(outs[0]);
  } else {
    graph->registerOutput(graph->insertNode(graph->createTuple(outs))->output());
  }
  refreshGetAttrTypes(graph->block());
  return graph;
}

}  // namespace

StageModule StageBuilder::build(int begin, int end, const std::string& tag) const {
  CAIRN_ENFORCE(0 <= begin && begin < end && end <= graph_.numUnits(), "bad unit range ", begin,
                "..", end);
  CAIRN_ENFORCE(graph_.isValidCut(begin) && graph_.isValidCut(end), "range ", begin, "..", end,
                " does not start and end at valid cuts");
  const torch::jit::Module& model = graph_.model();
  const std::vector<std::string> whole = wholePaths(graph_, begin, end);

  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  const std::string base = "__torch__.cairn." + sanitize(tag);
  torch::jit::Module stage(c10::QualifiedName(base), cu, /*shouldMangle=*/true);
  stage.register_attribute("training", c10::BoolType::get(), trainingFlag(model._ivalue()));
  PartialModules partial{model, base, cu, {{"", stage}}};
  copyState(partial, whole);
  restoreRequiresGrad(model, stage);

  StageModule result;
  result.begin = begin;
  result.end = end;
  result.inputs = graph_.boundary(begin);
  result.outputs = graph_.boundary(end);
  auto fn = cu->create_function(c10::QualifiedName(*stage.type()->name(), "forward"),
                                forwardGraph(graph_, stage, result, tag));
  stage.type()->addMethod(fn);
  result.module = stage;
  return result;
}

}  // namespace cairn::clusterize
