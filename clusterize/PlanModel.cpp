#include "clusterize/PlanModel.h"

#include <algorithm>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include "clusterize/ClusterFormer.h"
#include "core/MatmulSpeed.h"
#include "clusterize/PartitionPlanner.h"
#include "clusterize/RingGroups.h"
#include "clusterize/WholeModelChoice.h"
#include "core/Error.h"
#include "core/Log.h"
#include "core/WireCompression.h"

namespace cairn::clusterize {
namespace {

constexpr double kBytesPerGb = 1e9;

std::string gb(double bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(bytes < 1e8 ? 4 : 2) << bytes / kBytesPerGb << " GB";
  return out.str();
}

std::string atomLabel(const ModelGraph& graph, int begin_unit, int end_unit) {
  std::string label = "unit" + std::string(end_unit - begin_unit > 1 ? "s " : " ") +
                      std::to_string(begin_unit) +
                      (end_unit - begin_unit > 1 ? ".." + std::to_string(end_unit - 1) : "") + " (";
  for (int u = begin_unit; u < end_unit && u < begin_unit + 3; ++u)
    label += (u > begin_unit ? ", " : "") + graph.units()[u].label;
  if (end_unit - begin_unit > 3) label += ", ...";
  return label + ")";
}

// The atoms the planner chooses among. Without fixed cuts: the profile's atoms. With them: the
// profile's atoms merged between consecutive fixed cuts, so that each merged atom is one stage.
// `first_atom[k]` is the profile atom where merged atom k begins (one extra entry at the end).
struct PlanningAtoms {
  std::vector<AtomCost> atoms;
  std::vector<double> boundary_bytes;
  std::vector<int> first_atom;
  // Unit where planning atom k begins (k = atoms.size(): the end of the model).
  std::vector<int> first_unit;
};

// Where the planning atoms begin: every profile atom, or with --cuts the profile atoms at the
// fixed cuts (each checked).
std::vector<int> firstAtoms(const ModelGraph& graph, const ModelProfile& profile,
                            const std::vector<int>& fixed_cuts) {
  const int fine = static_cast<int>(profile.atoms.size());
  std::vector<int> first_atom;
  if (fixed_cuts.empty()) {
    for (int a = 0; a <= fine; ++a) first_atom.push_back(a);
    return first_atom;
  }
  first_atom.push_back(0);
  int previous = 0;
  for (int unit : fixed_cuts) {
    if (unit <= previous || unit >= graph.numUnits())
      CAIRN_THROW(BadInput, "--cuts ", unit, ": cuts must be strictly increasing unit indices in 1..",
                  graph.numUnits() - 1, " (the model has ", graph.numUnits(), " units)");
    const auto at = std::find(profile.cuts.begin(), profile.cuts.end(), unit);
    if (at == profile.cuts.end())
      CAIRN_THROW(BadInput, "--cuts ", unit, ": the model cannot be cut before unit ", unit, " (",
                  graph.units()[unit].label, "): ",
                  graph.isValidCut(unit) ? std::string("not a cut at this granularity")
                                         : graph.whyInvalid(unit));
    first_atom.push_back(static_cast<int>(at - profile.cuts.begin()));
    previous = unit;
  }
  first_atom.push_back(fine);
  return first_atom;
}

PlanningAtoms planningAtoms(const ModelGraph& graph, const ModelProfile& profile,
                            const std::vector<int>& fixed_cuts) {
  PlanningAtoms out;
  out.first_atom = firstAtoms(graph, profile, fixed_cuts);
  const std::vector<int>& first_atom = out.first_atom;
  for (size_t k = 0; k + 1 < first_atom.size(); ++k) {
    AtomCost merged;
    for (int a = first_atom[k]; a < first_atom[k + 1]; ++a) {
      const AtomProfile& p = profile.atoms[a];
      merged.parameter_bytes += static_cast<double>(p.parameter_bytes);
      merged.trainable_bytes += static_cast<double>(p.trainable_bytes);
      merged.buffer_bytes += static_cast<double>(p.buffer_bytes);
      merged.saved_bytes += static_cast<double>(p.saved_bytes);
      merged.seconds += p.seconds;
    }
    out.atoms.push_back(merged);
  }
  for (int a : first_atom) out.boundary_bytes.push_back(static_cast<double>(profile.boundary_bytes[a]));
  for (int a : first_atom) out.first_unit.push_back(profile.cuts[a]);
  return out;
}

// training_definition.wire.activations as the providers will use it (the job is validated with
// the rest of training_definition; anything unreadable here counts as the default, fp32).
std::string wireActivations(const JobSpec& job) {
  const auto w = job.training.find("wire");
  if (w == job.training.end() || !w->is_object()) return "fp32";
  const auto a = w->find("activations");
  return a != w->end() && a->is_string() ? a->get<std::string>() : "fp32";
}

int64_t parameterBytes(const ModelGraph& graph, const std::string& name) {
  const at::Tensor t = attributeAt(graph.model(), name).toTensor();
  return t.numel() * static_cast<int64_t>(t.element_size());
}

// The shared parameters as the cost model counts them: the planning atom of each profiled atom
// whose parameters name one (so a stage holding several of those atoms counts it once).
std::vector<SharedCost> sharedCosts(const ModelGraph& graph, const ModelProfile& profile,
                                    const PlanningAtoms& planning) {
  std::vector<SharedCost> out;
  for (const SharedParameter& shared : graph.sharedParameters()) {
    SharedCost cost;
    const at::Tensor t = attributeAt(graph.model(), shared.name).toTensor();
    cost.parameter_bytes = double(parameterBytes(graph, shared.name));
    cost.trainable_bytes = t.requires_grad() ? cost.parameter_bytes : 0;
    for (int a = 0; a < int(profile.atoms.size()); ++a)
      for (const auto& name : profile.atoms[a].parameters)
        if (std::count(shared.names.begin(), shared.names.end(), name)) {
          const auto k = std::upper_bound(planning.first_atom.begin(), planning.first_atom.end(), a);
          cost.atoms.push_back(int(k - planning.first_atom.begin()) - 1);
          break;
        }
    out.push_back(std::move(cost));
  }
  return out;
}

// What each planning cut sends per micro-batch in `codec`: its profiled bytes with every float32
// tensor counted in the form it travels (core/WireCompression.h float32WireBytes).
std::vector<double> wireBytes(const ModelGraph& graph, const ModelProfile& profile,
                              const PlanningAtoms& planning, const std::string& codec,
                              double microbatches) {
  microbatches = std::max(1.0, microbatches);
  std::vector<double> out;
  for (size_t k = 0; k < planning.first_atom.size(); ++k) {
    double bytes = planning.boundary_bytes[k];
    if (codec != "fp32" && k > 0 && k + 1 < planning.first_atom.size())
      for (const BoundaryValue& v : profile.describeCut(graph, profile.cuts[planning.first_atom[k]]))
        if (v.type == "tensor" && v.dtype == "float32")
          bytes += static_cast<double>(wire::float32WireBytes(v.shape, codec) -
                                       wire::float32WireBytes(v.shape, "fp32"));
    // The shared parameters whose holders this cut separates: once per step their gradients go up
    // and the totals come back down through it (trainer/SharedParameters.h).
    if (k > 0 && k + 1 < planning.first_atom.size()) {
      const int unit = profile.cuts[planning.first_atom[k]];
      for (const SharedParameter& shared : graph.sharedParameters())
        if (shared.units.front() < unit && unit <= shared.units.back())
          bytes += 2.0 * static_cast<double>(parameterBytes(graph, shared.name)) / microbatches;
    }
    out.push_back(bytes);
  }
  return out;
}

// The nodes as the planner sees them (PlannerNodes.h). With a GPU node, `gpu` gets the yardstick:
// --host-gflops, else this host measured with the threads the atoms were profiled with.
std::vector<PlannerNode> nodesFor(const std::vector<NodeConfig>& configs, const JobSpec& job,
                                  const PlanSettings& settings, GpuPlanChoice* gpu) {
  SpeedBasis basis;
  basis.bf16 = trainsInBf16(job.training);
  gpu->present = anyGpu(configs);
  if (gpu->present) {
    gpu->precision = basis.bf16 ? "bf16" : "fp32";
    gpu->host_gflops_measured = !settings.host_gflops.has_value();
    basis.host_gflops = settings.host_gflops ? *settings.host_gflops
                                             : measureMatmulGflops(settings.profile_threads);
    gpu->host_gflops = basis.host_gflops;
    gpu->samples_per_microbatch = static_cast<double>(settings.profiled_microbatch_size);
    if (gpu->host_gflops_measured)
      CAIRN_INFO("clusterize: this host measures ", basis.host_gflops, " GFLOPS (float32 sgemm, ",
                 settings.profile_threads, " thread(s)); GPU nodes' speeds are scaled by it "
                 "(--host-gflops fixes it)");
  }
  return plannerNodes(configs, basis);
}

// The clusters: ClusterFormer's, or with a GPU node the better of that and a whole model per GPU
// (WholeModelChoice.h), the choice recorded in `gpu`.
ClusterFormation formedClusters(const CostModel& cost, const std::vector<PlannerNode>& nodes,
                                const JobSpec& job, const PlanSettings& settings,
                                GpuPlanChoice* gpu) {
  ClusterFormerOptions former;
  former.clusters = settings.clusters;
  former.seed = settings.seed;
  former.max_atoms_per_stage = settings.cuts.empty() ? 0 : 1;
  former.tolerance = settings.tolerance;
  if (!gpu->present) return formClusters(cost, nodes, former);
  std::string why_not;
  if (!settings.cuts.empty()) why_not = "--cuts fixes the stages";
  if (settings.clusters > 0) why_not = "--clusters fixes the number of clusters";
  return chooseFormation(cost, nodes, former,
                         runShapeOf(job.training, settings.cost.microbatches), why_not, gpu);
}

// Infeasible inputs, with the reason: more fixed stages than nodes, an atom no node can hold, a
// model larger than all nodes together.
void checkFits(const ModelGraph& graph, const PlanningAtoms& planning, const CostModel& cost,
               const std::vector<NodeConfig>& configs, const std::vector<PlannerNode>& nodes,
               const PlanSettings& settings) {
  const int fixed_stages = settings.cuts.empty() ? 0 : static_cast<int>(settings.cuts.size()) + 1;
  if (fixed_stages > 0) {
    const int wanted_clusters = std::max(settings.clusters, 1);
    if (fixed_stages * wanted_clusters > static_cast<int>(configs.size()))
      CAIRN_THROW(BadInput, "--cuts makes ", fixed_stages, " stages per cluster, so ",
                  wanted_clusters, " cluster(s) need ", fixed_stages * wanted_clusters, " nodes, but ",
                  settings.nodes_source, " lists ", configs.size());
  }
  size_t largest = 0;
  double total = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    total += nodes[i].capacity_bytes;
    if (nodes[i].capacity_bytes > nodes[largest].capacity_bytes) largest = i;
  }
  for (int a = 0; a < cost.numAtoms(); ++a) {
    const double need = cost.memoryBytes(a, a + 1);
    if (need > nodes[largest].capacity_bytes)
      CAIRN_THROW(BadInput, atomLabel(graph, planning.first_unit[a], planning.first_unit[a + 1]),
                  " needs ", gb(need), " as a stage of its own but the largest node (",
                  configs[largest].name, ") has ", gb(nodes[largest].capacity_bytes));
  }
  const double model_need = cost.memoryLowerBound(0, cost.numAtoms());
  if (model_need > total)
    CAIRN_THROW(BadInput, "the model needs at least ", gb(model_need),
                " (parameters, gradients, optimizer state and activations for ",
                settings.cost.microbatches, " micro-batches) but all ", configs.size(),
                " nodes together have ", gb(total), ": short by ", gb(model_need - total));
}

// plan.json's description of the run and the model, before any placement.
PartitionPlan describedPlan(const ModelGraph& graph, const ModelProfile& profile,
                            const JobSpec& job, const PlanSettings& settings,
                            const std::string& wire_activations) {
  PartitionPlan plan;
  plan.job_id = job.job_id;
  plan.model = settings.model_path;
  plan.granularity = toString(settings.granularity);
  plan.optimizer = toString(settings.cost.optimizer);
  plan.microbatches = settings.cost.microbatches;
  plan.wire_activations = wire_activations;
  plan.seed = settings.seed;
  for (int u = 0; u < graph.numUnits(); ++u)
    plan.units.push_back({graph.units()[u].label, graph.isValidCut(u), graph.whyInvalid(u)});
  for (const auto& a : profile.atoms)
    plan.atoms.push_back({a.begin_unit, a.end_unit, double(a.parameter_bytes), double(a.buffer_bytes),
                          double(a.saved_bytes), double(a.output_bytes), a.seconds});
  plan.notes = graph.notes();
  return plan;
}

// The model's parameters then buffers in model order (the rings' numbering), and each
// parameter's element count.
struct ModelState {
  std::vector<std::string> names;
  std::map<std::string, size_t> index;
  std::map<std::string, int64_t> elements;

  explicit ModelState(const torch::jit::Module& model) {
    for (const auto& p : model.named_parameters(true)) elements[p.name] = p.value.numel();
    for (const auto& p : model.named_parameters(true)) names.push_back(p.name);
    for (const auto& b : model.named_buffers(true)) names.push_back(b.name);
    for (size_t i = 0; i < names.size(); ++i) index.emplace(names[i], i);
  }
  std::vector<std::string> byModelOrder(const std::set<std::string>& some) const {
    std::vector<std::string> out(some.begin(), some.end());
    std::sort(out.begin(), out.end(), [&](const std::string& x, const std::string& y) {
      return index.at(x) < index.at(y);
    });
    return out;
  }
};

// What stays the same for every stage placed in one plan.
struct PlacementContext {
  const ModelGraph& graph;
  const ModelProfile& profile;
  const PlanningAtoms& planning;
  const CostModel& cost;
  const ModelState& state;
};

PlannedStage plannedStage(const PlacementContext& ctx, const StagePlacement& placement,
                          const NodeConfig& config, const PlannerNode& node) {
  PlannedStage stage;
  stage.node = config.name;
  stage.address = config.address();
  stage.begin_unit = ctx.planning.first_unit[placement.begin_atom];
  stage.end_unit = ctx.planning.first_unit[placement.end_atom];
  std::set<std::string> params, buffers;
  for (int a = ctx.planning.first_atom[placement.begin_atom];
       a < ctx.planning.first_atom[placement.end_atom]; ++a) {
    params.insert(ctx.profile.atoms[a].parameters.begin(), ctx.profile.atoms[a].parameters.end());
    buffers.insert(ctx.profile.atoms[a].buffers.begin(), ctx.profile.atoms[a].buffers.end());
  }
  for (int u = stage.begin_unit; u < stage.end_unit; ++u)
    stage.units.push_back(ctx.graph.units()[u].label);
  stage.parameters = ctx.state.byModelOrder(params);
  stage.buffers = ctx.state.byModelOrder(buffers);
  std::set<const c10::TensorImpl*> counted;  // a tensor tied under several names counts once
  for (const auto& p : stage.parameters)
    if (counted.insert(attributeAt(ctx.graph.model(), p).toTensor().unsafeGetTensorImpl()).second)
      stage.parameter_count += ctx.state.elements.at(p);
  stage.inputs = ctx.profile.describeCut(ctx.graph, stage.begin_unit);
  stage.outputs = ctx.profile.describeCut(ctx.graph, stage.end_unit);
  stage.memory_bytes = placement.memory_bytes;
  stage.capacity_bytes = node.capacity_bytes;
  stage.seconds = placement.seconds;
  stage.sent_bytes = ctx.cost.transferBytes(placement.begin_atom, placement.end_atom);
  if (!config.gpus.empty()) stage.gpu = config.gpus.front().name;
  return stage;
}

// The rings: the state some stage holds, grouped by its holder in every cluster. holder_of[c][i]
// is the node of cluster c holding state entry i. State no unit uses (never read by forward) has
// no holder; it is not trained or reduced.
std::vector<RingGroup> ringsOf(const ModelState& state,
                               const std::vector<std::vector<std::string>>& holder_of) {
  std::vector<std::string> used;
  std::vector<std::vector<std::string>> used_holders(holder_of.size());
  for (size_t p = 0; p < state.names.size(); ++p) {
    if (holder_of[0][p].empty()) continue;
    used.push_back(state.names[p]);
    for (size_t c = 0; c < holder_of.size(); ++c) used_holders[c].push_back(holder_of[c][p]);
  }
  return groupRings(used, used_holders);
}

// The parameters several stages of `stages` hold (ModelGraph::sharedParameters): each with the
// stages that hold a copy, in stage order.
std::vector<PlannedShared> sharedOf(const ModelGraph& graph,
                                    const std::vector<PlannedStage>& stages) {
  std::vector<PlannedShared> out;
  for (const SharedParameter& shared : graph.sharedParameters()) {
    PlannedShared planned;
    planned.name = shared.name;
    planned.names = shared.names;
    for (int s = 0; s < static_cast<int>(stages.size()); ++s) {
      std::string local;  // the name the stage's first unit using it gives it
      for (int u : shared.units) {
        if (u < stages[s].begin_unit || u >= stages[s].end_unit) continue;
        for (const auto& n : graph.units()[u].parameters)
          if (std::find(shared.names.begin(), shared.names.end(), n) != shared.names.end()) {
            local = n;
            break;
          }
        break;
      }
      if (local.empty()) continue;
      planned.stages.push_back(s);
      planned.holders.push_back(stages[s].node);
      planned.local_names.push_back(local);
    }
    if (planned.stages.size() > 1) out.push_back(std::move(planned));
  }
  return out;
}

// A shared parameter joins the rings once, under its first name, from the stage holding its first
// user (its copies elsewhere take that copy's result: trainer/SharedParameters.h). The same in
// every cluster, however each is cut, so the rings match.
void ringSharedOnce(const PlacementContext& ctx, const PlannedCluster& cluster,
                    std::vector<std::string>* holders) {
  for (const SharedParameter& shared : ctx.graph.sharedParameters()) {
    std::string first_holder;
    for (const auto& stage : cluster.stages)
      if (shared.units.front() >= stage.begin_unit && shared.units.front() < stage.end_unit)
        first_holder = stage.node;
    for (const auto& name : shared.names) (*holders)[ctx.state.index.at(name)].clear();
    (*holders)[ctx.state.index.at(shared.name)] = first_holder;
  }
}

// Stages, rings and spares of the formed clusters, into `plan`.
void placeClusters(const PlacementContext& ctx, const ClusterFormation& formation,
                   const std::vector<NodeConfig>& configs, const std::vector<PlannerNode>& nodes,
                   PartitionPlan& plan) {
  std::vector<std::vector<std::string>> holder_of;
  for (const auto& formed : formation.clusters) {
    PlannedCluster cluster;
    cluster.seconds_per_microbatch = formed.partition.bottleneck_seconds;
    std::vector<std::string> holders(ctx.state.names.size());
    for (const auto& placement : formed.partition.stages) {
      const int node_index = formed.nodes[placement.node];
      PlannedStage stage = plannedStage(ctx, placement, configs[node_index], nodes[node_index]);
      for (const auto& name : stage.parameters) holders[ctx.state.index.at(name)] = stage.node;
      for (const auto& name : stage.buffers) holders[ctx.state.index.at(name)] = stage.node;
      cluster.stages.push_back(std::move(stage));
    }
    cluster.shared = sharedOf(ctx.graph, cluster.stages);
    ringSharedOnce(ctx, cluster, &holders);
    holder_of.push_back(std::move(holders));
    plan.clusters.push_back(std::move(cluster));
  }
  plan.rings = ringsOf(ctx.state, holder_of);
  for (int spare : formation.spare) plan.spare_nodes.push_back(configs[spare].name);
}

// node.json of the node holding stage `s` of cluster `c`.
NodeSpec nodeSpecOf(const PartitionPlan& plan, size_t c, int s, const JobSpec& job,
                    const std::map<std::string, std::string>& address_of) {
  const auto& stages = plan.clusters[c].stages;
  const int count = static_cast<int>(stages.size());
  const PlannedStage& st = stages[s];
  NodeSpec node;
  node.name = st.node;
  node.job_id = job.job_id;
  node.address = st.address;
  node.cluster = static_cast<int>(c);
  node.stage = s;
  node.num_stages = count;
  node.role = roleForStage(s, count);
  if (s > 0) node.upstream = PeerRef{stages[s - 1].node, stages[s - 1].address, ""};
  if (s + 1 < count) node.downstream = PeerRef{stages[s + 1].node, stages[s + 1].address, ""};
  node.inputs = st.inputs;
  node.outputs = st.outputs;
  node.parameters = st.parameters;
  node.buffers = st.buffers;
  for (const auto& group : plan.rings) {
    if (group.holders[c] != st.node) continue;
    RingSpec ring;
    ring.id = group.id;
    ring.parameters = group.parameters;
    for (const auto& holder : group.holders) ring.members.push_back({holder, address_of.at(holder), ""});
    ring.rank = static_cast<int>(c);
    node.rings.push_back(std::move(ring));
  }
  for (const auto& shared : plan.clusters[c].shared) {
    if (s < shared.stages.front() || s > shared.stages.back()) continue;
    SharedParameterSpec spec{shared.name, shared.stages, ""};
    for (size_t h = 0; h < shared.stages.size(); ++h)
      if (shared.stages[h] == s) spec.local_name = shared.local_names[h];
    node.shared_parameters.push_back(std::move(spec));
  }
  node.estimated_memory_bytes = st.memory_bytes;
  node.estimated_seconds_per_microbatch = st.seconds;
  node.extra = {{"units", {st.begin_unit, st.end_unit}},
                {"unit_labels", st.units},
                {"capacity_bytes", st.capacity_bytes},
                {"microbatches", plan.microbatches},
                {"optimizer", plan.optimizer}};
  return node;
}

}  // namespace

ClusterizeResult planModel(const ModelGraph& graph, const ModelProfile& profile,
                           const std::vector<NodeConfig>& configs, const JobSpec& job,
                           const PlanSettings& settings) {
  if (configs.empty()) CAIRN_THROW(BadInput, settings.nodes_source, ": lists no nodes");
  const PlanningAtoms planning = planningAtoms(graph, profile, settings.cuts);
  const std::string wire_activations = wireActivations(job);
  const CostModel cost(planning.atoms, planning.boundary_bytes, settings.cost,
                       wireBytes(graph, profile, planning, wire_activations,
                                 double(settings.cost.microbatches)),
                       sharedCosts(graph, profile, planning));
  GpuPlanChoice gpu;
  const std::vector<PlannerNode> nodes = nodesFor(configs, job, settings, &gpu);
  checkFits(graph, planning, cost, configs, nodes, settings);
  const ClusterFormation formation = formedClusters(cost, nodes, job, settings, &gpu);

  ClusterizeResult result;
  result.job = job;
  result.plan = describedPlan(graph, profile, job, settings, wire_activations);
  result.plan.gpu = gpu;
  for (const SharedParameter& shared : graph.sharedParameters())
    result.plan.shared_names.emplace_back(shared.name, shared.names);
  const ModelState state(graph.model());
  placeClusters({graph, profile, planning, cost, state}, formation, configs, nodes, result.plan);

  // node.json for every placed node.
  std::map<std::string, std::string> address_of;
  for (const auto& c : configs) address_of[c.name] = c.address();
  for (size_t c = 0; c < result.plan.clusters.size(); ++c)
    for (int s = 0; s < static_cast<int>(result.plan.clusters[c].stages.size()); ++s)
      result.nodes.push_back(nodeSpecOf(result.plan, c, s, job, address_of));
  return result;
}

}  // namespace cairn::clusterize
