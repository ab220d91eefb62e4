#include "clusterize/ModelMerge.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "core/Error.h"
#include "core/JsonReader.h"
#include "core/NodeData.h"
#include "core/TensorText.h"

namespace cairn::clusterize {
namespace {

namespace fs = std::filesystem;


struct PlanStage {
  std::string node;
  std::vector<std::string> parameters;
  std::vector<std::string> buffers;
};

struct PlanForMerge {
  std::string model;
  std::vector<std::vector<PlanStage>> clusters;
  std::map<std::string, std::vector<std::string>> ring_holders;  // tensor → holder per cluster
  // A shared parameter's other names → its first name (plan.json "shared_parameters", format 3):
  // the ring holder's copy under the first name is the value; the model's tied names follow it.
  std::map<std::string, std::string> alias_of;
  std::set<std::string> shared;  // the first names
};

PlanForMerge readPlan(const std::string& node_data) {
  const std::string path = planPath(node_data);
  const nlohmann::json document = readJsonFile(path);
  const JsonReader plan(document, path);
  const int64_t format = plan.integer("format", 0, 1 << 30);
  if (format < kOldestNodeDataFormat || format > kNodeDataFormat)
    CAIRN_THROW(BadInput, path, ": format ", format, " is not ", kOldestNodeDataFormat, "..",
                kNodeDataFormat, " (re-run clusterize)");
  PlanForMerge out;
  out.model = plan.string("model");
  for (const JsonReader& cluster : plan.objectList("clusters")) {
    std::vector<PlanStage> stages;
    for (const JsonReader& stage : cluster.objectList("stages"))
      stages.push_back(
          {stage.string("node"), stage.stringList("parameters"), stage.stringList("buffers")});
    out.clusters.push_back(std::move(stages));
  }
  if (out.clusters.empty()) CAIRN_THROW(BadInput, path, ": lists no clusters");
  for (const JsonReader& ring : plan.objectList("rings")) {
    const auto holders = ring.stringList("holders");
    if (holders.size() != out.clusters.size())
      ring.fail("holders",
                "must name one node per cluster (" + std::to_string(out.clusters.size()) + ")");
    for (const auto& name : ring.stringList("parameters")) out.ring_holders[name] = holders;
  }
  if (plan.has("shared_parameters"))
    for (const JsonReader& shared : plan.objectList("shared_parameters")) {
      const std::string first = shared.string("name");
      out.shared.insert(first);
      for (const auto& name : shared.stringList("names"))
        if (name != first) out.alias_of[name] = first;
    }
  return out;
}

torch::jit::Module loadModule(const std::string& path, const std::string& what) {
  try {
    return torch::jit::load(path, torch::kCPU);  // a stage trained on a GPU merges on the CPU
  } catch (const c10::Error& e) {
    CAIRN_THROW(BadInput, path, ": cannot load ", what,
                " as a TorchScript module: ", e.what_without_backtrace());
  }
}

// Named tensors of a module: parameters then buffers, in module order.
struct ModuleState {
  std::vector<std::string> order;
  std::map<std::string, torch::Tensor> tensors;
  std::set<std::string> buffers;
};

ModuleState stateOf(const torch::jit::Module& module) {
  ModuleState state;
  for (const auto& p : module.named_parameters(true)) {
    state.order.push_back(p.name);
    state.tensors[p.name] = p.value;
  }
  for (const auto& b : module.named_buffers(true)) {
    state.order.push_back(b.name);
    state.tensors[b.name] = b.value;
    state.buffers.insert(b.name);
  }
  return state;
}

// One cluster's trained values, checked against the plan and the model.
std::map<std::string, torch::Tensor> readCluster(const std::string& node_data,
                                                 const PlanForMerge& plan, int cluster,
                                                 const ModuleState& model,
                                                 const std::string& model_path) {
  const std::string plan_file = planPath(node_data);
  std::map<std::string, torch::Tensor> values;
  std::map<std::string, std::string> holder;
  for (size_t s = 0; s < plan.clusters[cluster].size(); ++s) {
    const PlanStage& stage = plan.clusters[cluster][s];
    const std::string where = "node " + stage.node + " (cluster " + std::to_string(cluster) +
                              ", stage " + std::to_string(s) + ")";
    const std::string file = nodeDirectory(node_data, stage.node) + "/" + kTrainedStageFile;
    if (!fs::exists(file))
      CAIRN_THROW(BadInput, file, ": missing: ", where,
                  " has no trained weights (run its provider "
                  "to the end, or merge one --cluster that finished)");
    const ModuleState trained = stateOf(loadModule(file, "trained stage"));

    std::set<std::string> expected;
    auto expect = [&](const std::vector<std::string>& names, bool buffers) {
      const char* kind = buffers ? "buffer" : "parameter";
      for (const auto& name : names) {
        expected.insert(name);
        const auto in_model = model.tensors.find(name);
        if (in_model == model.tensors.end() || model.buffers.count(name) != size_t(buffers))
          CAIRN_THROW(BadInput, plan_file, ": ", where, " lists ", kind, " ", inQuotes(name),
                      " that ", model_path, " does not have (wrong --model?)");
        const auto it = trained.tensors.find(name);
        if (it == trained.tensors.end() || trained.buffers.count(name) != size_t(buffers))
          CAIRN_THROW(BadInput, file, ": ", where, ": ", kind, " ", inQuotes(name), " is missing");
        const torch::Tensor& t = it->second;
        if (t.sizes() != in_model->second.sizes() ||
            t.scalar_type() != in_model->second.scalar_type())
          CAIRN_THROW(BadInput, file, ": ", where, ": ", kind, " ", inQuotes(name), " is ",
                      describeTensor(t), " but the model's is ", describeTensor(in_model->second));
        // A shared parameter's copies: every holder has one (equal by training), the ring
        // holder's is taken; its other names are the same tensor in the model.
        if (plan.alias_of.count(name)) continue;
        if (plan.shared.count(name)) {
          const auto ring = plan.ring_holders.find(name);
          if (ring != plan.ring_holders.end() && ring->second[cluster] == stage.node)
            values[name] = t;
          continue;
        }
        const auto [previous, added] = holder.emplace(name, stage.node);
        if (!added)
          CAIRN_THROW(BadInput, plan_file, ": cluster ", cluster, ": ", inQuotes(name),
                      " is held by both ", previous->second, " and ", stage.node);
        const auto ring = plan.ring_holders.find(name);
        if (ring == plan.ring_holders.end() || ring->second[cluster] != stage.node)
          CAIRN_THROW(BadInput, plan_file, ": ", where, " holds ", inQuotes(name), " but rings[] ",
                      ring == plan.ring_holders.end() ? "do not list it"
                                                      : "give it to " + ring->second[cluster]);
        values[name] = t;
      }
    };
    expect(stage.parameters, false);
    expect(stage.buffers, true);
    for (const auto& name : trained.order)
      if (!expected.count(name))
        CAIRN_THROW(BadInput, file, ": ", where, ": tensor ", inQuotes(name),
                    " is not one of the stage's parameters or buffers in plan.json");
  }
  for (const auto& [name, holders] : plan.ring_holders)
    if (!values.count(name))
      CAIRN_THROW(BadInput, plan_file, ": cluster ", cluster, ": no stage holds ", inQuotes(name),
                  " (rings[] give it to ", holders[cluster], ")");
  return values;
}

torch::Tensor combine(const std::vector<torch::Tensor>& values) {
  if (values.size() == 1) return values[0];
  if (c10::isFloatingType(values[0].scalar_type())) {
    torch::Tensor sum = values[0].to(torch::kDouble);
    for (size_t i = 1; i < values.size(); ++i) sum += values[i].to(torch::kDouble);
    return (sum / static_cast<double>(values.size())).to(values[0].scalar_type());
  }
  torch::Tensor most = values[0];
  for (size_t i = 1; i < values.size(); ++i) most = torch::maximum(most, values[i]);
  return most;
}

}  // namespace

MergeFormat parseMergeFormat(const std::string& text) {
  if (text == "torchscript") return MergeFormat::kTorchScript;
  if (text == "safetensors") return MergeFormat::kSafetensors;
  CAIRN_THROW(BadInput, "--format must be torchscript or safetensors (got ", inQuotes(text), ")");
}

MergedModel mergeTrainedStages(const MergeOptions& options) {
  const PlanForMerge plan = readPlan(options.node_data);
  const std::string model_path = options.model_path.empty() ? plan.model : options.model_path;
  if (!fs::exists(model_path))
    CAIRN_THROW(BadInput, model_path, ": the original model is missing (",
                options.model_path.empty() ? "plan.json's \"model\"; give --model" : "--model",
                ")");

  MergedModel merged;
  merged.model = loadModule(model_path, "the original model");
  const ModuleState model = stateOf(merged.model);
  const int count = static_cast<int>(plan.clusters.size());
  if (options.cluster) {
    if (*options.cluster < 0 || *options.cluster >= count)
      CAIRN_THROW(BadInput, "--cluster ", *options.cluster, ": ", planPath(options.node_data),
                  " has clusters 0..", count - 1);
    merged.clusters = {*options.cluster};
  } else {
    for (int c = 0; c < count; ++c) merged.clusters.push_back(c);
  }

  std::vector<std::map<std::string, torch::Tensor>> per_cluster;
  for (int c : merged.clusters)
    per_cluster.push_back(readCluster(options.node_data, plan, c, model, model_path));

  torch::NoGradGuard no_grad;
  for (const auto& name : model.order) {
    if (plan.alias_of.count(name)) continue;  // tied to its first name, written with it
    if (!plan.ring_holders.count(name)) {
      merged.untouched.push_back(name);
      continue;
    }
    std::vector<torch::Tensor> values;
    for (const auto& cluster : per_cluster) values.push_back(cluster.at(name));
    // In place: the model's own tensor, so tensors tied in the model stay tied.
    model.tensors.at(name).copy_(combine(values));
  }
  for (const auto& name : model.order) merged.state.emplace_back(name, model.tensors.at(name));
  return merged;
}

void saveMergedModel(const MergedModel& merged, const std::string& path, MergeFormat format) {
  if (format == MergeFormat::kSafetensors) {
    writeSafetensors(path, merged.state, {{"format", "pt"}});
    return;
  }
  const std::string temporary = path + ".tmp";
  try {
    merged.model.save(temporary);
  } catch (const c10::Error& e) {
    CAIRN_THROW(BadInput, temporary, ": cannot write: ", e.what_without_backtrace());
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0)
    CAIRN_THROW(BadInput, path, ": cannot rename ", temporary, " into place");
}

}  // namespace cairn::clusterize
