// ModelGraph: the top-level forward graph of a TorchScript model seen as an ordered list of units,
// the values that cross each cut between units (the boundary), and which cuts are valid.
//
// A unit is one node of the top-level block of `forward` (a child-module call, an op, an `if`
// with its nested blocks). Constants and attribute reads on `self` (prim::GetAttr chains) are not
// units: every stage that needs them re-creates them. Cut c lies before unit c (0..U); cut 0 is the
// model's inputs, cut U its outputs. A cut is valid when every value crossing it is a tensor, int,
// float, bool or int list, and no buffer is used on both sides of it. A parameter used on both
// sides (a tied embedding and head) does not stop a cut: it is a SharedParameter, copied into every
// stage that uses it and kept equal by the trainer (docs/CLUSTERIZE.md "Shared parameters"). Calls of methods on `self` are inlined; with Granularity::kExpandContainers calls of
// child nn.Sequential containers are inlined too, so their elements become units.
//
// Owns a copy of the model's forward graph; the model itself is shared (torch::jit::Module is a
// handle). Not thread-safe; build once, then read.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/script.h>

namespace cairn::clusterize {

enum class Granularity { kTop, kExpandContainers };
Granularity parseGranularity(const std::string& text);  // "top" | "expand-containers"
std::string toString(Granularity granularity);

struct Unit {
  torch::jit::Node* node = nullptr;
  std::string label;  // "features.0 (Conv2d)", "aten::add"
  // Attribute paths on self that the unit uses as a whole ("features.0", "scale"), sorted.
  std::vector<std::string> state_paths;
  std::vector<std::string> parameters;  // dotted names of the parameters it uses
  std::vector<std::string> buffers;     // dotted names of the buffers it uses
};

// A parameter that several units use (under one name or several, as a tied embedding and head).
struct SharedParameter {
  std::string name;                // the name the first unit uses it by (the smallest, if several)
  std::vector<std::string> names;  // every name units use it by, sorted
  std::vector<int> units;          // the units using it, ascending (two or more)
};

// What kind of value crosses a cut; kUnsupported values make the cut invalid.
enum class ValueKind { kTensor, kInt, kFloat, kBool, kIntList, kUnsupported };
ValueKind valueKindOf(const c10::TypePtr& type);
// "tensor", "int", "float", "bool", "int_list" (core/NodeData.h BoundaryValue::type).
std::string toString(ValueKind kind);

class ModelGraph {
 public:
  // `split_shared` false (the async schedule): a parameter used on both sides of a cut makes it
  // invalid too, as a buffer does.
  ModelGraph(torch::jit::Module model, Granularity granularity, bool split_shared = true);

  const torch::jit::Module& model() const { return model_; }
  const std::shared_ptr<torch::jit::Graph>& graph() const { return graph_; }
  torch::jit::Value* self() const { return graph_->inputs()[0]; }
  const std::vector<Unit>& units() const { return units_; }
  int numUnits() const { return static_cast<int>(units_.size()); }

  // Values live across cut `cut` (0..numUnits()), in definition order. Cut 0: the model inputs;
  // cut numUnits(): the model outputs.
  const std::vector<torch::jit::Value*>& boundary(int cut) const { return boundaries_.at(cut); }
  // Interior cuts (1..U-1) only; cut 0 and U are always allowed.
  bool isValidCut(int cut) const;
  // Why an interior cut is not valid ("" if it is).
  const std::string& whyInvalid(int cut) const { return why_invalid_.at(cut); }
  // 0, every valid interior cut, U: the atoms of partitioning lie between consecutive entries.
  std::vector<int> atomCuts() const;

  // A stable, readable name for a value ("x.1" → "x_1", unnamed → "v12").
  std::string valueName(const torch::jit::Value* value) const;
  // Attribute path of a GetAttr chain on self ("" for self); nullopt for other values.
  std::optional<std::string> attributePath(const torch::jit::Value* value) const;
  // Whether the node is re-created per stage (constant or GetAttr chain on self).
  bool isRematerialized(const torch::jit::Node* node) const;

  // Messages about tensors several units use (for the report).
  const std::vector<std::string>& notes() const { return notes_; }
  // The parameters several units use, ordered by their units.
  const std::vector<SharedParameter>& sharedParameters() const { return shared_; }

 private:
  void inlineCalls(Granularity granularity);
  void collectUnits();
  void resolveState(Unit* unit, std::map<const c10::TensorImpl*, std::vector<std::pair<int, std::string>>>* users);
  void computeBoundaries();

  torch::jit::Module model_;
  std::shared_ptr<torch::jit::Graph> graph_;
  std::vector<Unit> units_;
  std::vector<std::vector<torch::jit::Value*>> boundaries_;
  std::vector<std::string> why_invalid_;
  std::vector<std::string> notes_;
  std::vector<SharedParameter> shared_;
  bool split_shared_ = true;
  std::map<const torch::jit::Value*, int> definition_order_;
};

// Resolves an attribute path ("features.0.weight") on a module; throws InternalError if absent.
c10::IValue attributeAt(const torch::jit::Module& model, const std::string& path);

}  // namespace cairn::clusterize
