#include "clusterize/Clusterize.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <set>
#include <sstream>

#include "clusterize/ClusterFormer.h"
#include "clusterize/ExampleInputs.h"
#include "clusterize/InitialWeights.h"
#include "clusterize/PartitionPlanner.h"
#include "clusterize/RingGroups.h"
#include "clusterize/StageBuilder.h"
#include "core/Error.h"
#include "core/JobFiles.h"
#include "core/JsonReader.h"
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

JobSpec jobFromOptions(const ClusterizeOptions& o, const std::vector<std::vector<int64_t>>& shapes,
                       int microbatches, const std::string& optimizer) {
  JobSpec job;
  job.job_id = o.job_id;
  job.model = o.model_path;
  job.data.location = o.data_location;
  job.data.format = o.data_format;
  nlohmann::json training;
  training["loss_fn"] = o.loss;
  training["optimizer"] = {{"name", optimizer}, {"lr", o.learning_rate}};
  training["lr_scheduler"] = {{"name", "constant"}};
  training["local_steps"] = o.local_steps;
  training["microbatches"] = microbatches;
  if (!shapes.empty() && !shapes[0].empty()) {
    training["microbatch_size"] = shapes[0][0];
    training["batch_size"] = shapes[0][0] * microbatches;
  }
  job.training = training;
  return job;
}

// The atoms the planner chooses among. Without fixed cuts: the profile's atoms. With them: the
// profile's atoms merged between consecutive fixed cuts, so that each merged atom is one stage.
// `first_atom[k]` is the profile atom where merged atom k begins (one extra entry at the end).
struct PlanningAtoms {
  std::vector<AtomCost> atoms;
  std::vector<double> boundary_bytes;
  std::vector<int> first_atom;
};

PlanningAtoms planningAtoms(const ModelGraph& graph, const ModelProfile& profile,
                            const std::vector<int>& fixed_cuts) {
  const int fine = static_cast<int>(profile.atoms.size());
  std::vector<int> first_atom;
  if (fixed_cuts.empty()) {
    for (int a = 0; a <= fine; ++a) first_atom.push_back(a);
  } else {
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
  }
  PlanningAtoms out;
  out.first_atom = first_atom;
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

// What each planning cut sends per micro-batch in `codec`: its profiled bytes with every float32
// tensor counted in the form it travels (core/WireCompression.h float32WireBytes).
std::vector<double> wireBytes(const ModelGraph& graph, const ModelProfile& profile,
                              const PlanningAtoms& planning, const std::string& codec) {
  std::vector<double> out;
  for (size_t k = 0; k < planning.first_atom.size(); ++k) {
    double bytes = planning.boundary_bytes[k];
    if (codec != "fp32" && k > 0 && k + 1 < planning.first_atom.size())
      for (const BoundaryValue& v : profile.describeCut(graph, profile.cuts[planning.first_atom[k]]))
        if (v.type == "tensor" && v.dtype == "float32")
          bytes += static_cast<double>(wire::float32WireBytes(v.shape, codec) -
                                       wire::float32WireBytes(v.shape, "fp32"));
    out.push_back(bytes);
  }
  return out;
}

}  // namespace

std::string formatBytes(double bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(bytes >= 1e9 ? 2 : 1);
  if (bytes >= 1e9) {
    out << bytes / 1e9 << " GB";
  } else if (bytes >= 1e6) {
    out << bytes / 1e6 << " MB";
  } else if (bytes >= 1e3) {
    out << bytes / 1e3 << " kB";
  } else {
    out << std::setprecision(0) << bytes << " B";
  }
  return out.str();
}

std::vector<double> relativeSpeeds(const std::vector<NodeConfig>& nodes) {
  double sum = 0;
  int count = 0;
  for (const auto& n : nodes)
    if (n.compute) {
      sum += *n.compute;
      ++count;
    }
  const double mean = count > 0 ? sum / count : 1.0;
  std::vector<double> speeds;
  for (const auto& n : nodes) speeds.push_back(n.compute ? *n.compute / mean : 1.0);
  return speeds;
}

ClusterizeResult planModel(const ModelGraph& graph, const ModelProfile& profile,
                           const std::vector<NodeConfig>& configs, const JobSpec& job,
                           const PlanSettings& settings) {
  if (configs.empty()) CAIRN_THROW(BadInput, settings.nodes_source, ": lists no nodes");
  const PlanningAtoms planning = planningAtoms(graph, profile, settings.cuts);
  const std::string wire_activations = wireActivations(job);
  const CostModel cost(planning.atoms, planning.boundary_bytes, settings.cost,
                       wireBytes(graph, profile, planning, wire_activations));
  // Unit where planning atom k begins (k = numAtoms: the end of the model).
  auto unitOf = [&](int planning_atom) { return profile.cuts[planning.first_atom[planning_atom]]; };
  const int fixed_stages = settings.cuts.empty() ? 0 : static_cast<int>(settings.cuts.size()) + 1;
  if (fixed_stages > 0) {
    const int wanted_clusters = std::max(settings.clusters, 1);
    if (fixed_stages * wanted_clusters > static_cast<int>(configs.size()))
      CAIRN_THROW(BadInput, "--cuts makes ", fixed_stages, " stages per cluster, so ",
                  wanted_clusters, " cluster(s) need ", fixed_stages * wanted_clusters, " nodes, but ",
                  settings.nodes_source, " lists ", configs.size());
  }

  const auto speeds = relativeSpeeds(configs);
  std::vector<PlannerNode> nodes;
  size_t largest = 0;
  double total = 0;
  for (size_t i = 0; i < configs.size(); ++i) {
    nodes.push_back({configs[i].ram_gb * kBytesPerGb, speeds[i], configs[i].bandwidth_mbps * 1e6 / 8});
    total += nodes.back().capacity_bytes;
    if (nodes[i].capacity_bytes > nodes[largest].capacity_bytes) largest = i;
  }
  // Infeasible inputs, with the reason.
  for (int a = 0; a < cost.numAtoms(); ++a) {
    const double need = cost.memoryBytes(a, a + 1);
    if (need > nodes[largest].capacity_bytes)
      CAIRN_THROW(BadInput, atomLabel(graph, unitOf(a), unitOf(a + 1)), " needs ",
                  gb(need), " as a stage of its own but the largest node (", configs[largest].name,
                  ") has ", gb(nodes[largest].capacity_bytes));
  }
  const double model_need = cost.memoryLowerBound(0, cost.numAtoms());
  if (model_need > total)
    CAIRN_THROW(BadInput, "the model needs at least ", gb(model_need),
                " (parameters, gradients, optimizer state and activations for ",
                settings.cost.microbatches, " micro-batches) but all ", configs.size(),
                " nodes together have ", gb(total), ": short by ", gb(model_need - total));

  ClusterFormerOptions former;
  former.clusters = settings.clusters;
  former.seed = settings.seed;
  former.max_atoms_per_stage = fixed_stages > 0 ? 1 : 0;
  former.tolerance = settings.tolerance;
  const ClusterFormation formation = formClusters(cost, nodes, former);

  ClusterizeResult result;
  result.job = job;
  PartitionPlan& plan = result.plan;
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

  std::map<std::string, int64_t> elements;
  for (const auto& p : graph.model().named_parameters(true)) elements[p.name] = p.value.numel();
  // Model order of parameters then buffers, for ring numbering.
  std::vector<std::string> state_names;
  for (const auto& p : graph.model().named_parameters(true)) state_names.push_back(p.name);
  for (const auto& b : graph.model().named_buffers(true)) state_names.push_back(b.name);
  std::map<std::string, size_t> state_index;
  for (size_t i = 0; i < state_names.size(); ++i) state_index.emplace(state_names[i], i);

  std::vector<std::vector<std::string>> holder_of;
  for (const auto& formed : formation.clusters) {
    PlannedCluster cluster;
    cluster.seconds_per_microbatch = formed.partition.bottleneck_seconds;
    std::vector<std::string> holders(state_names.size());
    for (const auto& placement : formed.partition.stages) {
      const int node_index = formed.nodes[placement.node];
      const NodeConfig& config = configs[node_index];
      PlannedStage stage;
      stage.node = config.name;
      stage.address = config.address();
      stage.begin_unit = unitOf(placement.begin_atom);
      stage.end_unit = unitOf(placement.end_atom);
      std::set<std::string> params, buffers;
      for (int a = planning.first_atom[placement.begin_atom];
           a < planning.first_atom[placement.end_atom]; ++a) {
        params.insert(profile.atoms[a].parameters.begin(), profile.atoms[a].parameters.end());
        buffers.insert(profile.atoms[a].buffers.begin(), profile.atoms[a].buffers.end());
      }
      for (int u = stage.begin_unit; u < stage.end_unit; ++u) stage.units.push_back(graph.units()[u].label);
      auto byModelOrder = [&](const std::set<std::string>& names) {
        std::vector<std::string> out(names.begin(), names.end());
        std::sort(out.begin(), out.end(), [&](const std::string& x, const std::string& y) {
          return state_index.at(x) < state_index.at(y);
        });
        return out;
      };
      stage.parameters = byModelOrder(params);
      stage.buffers = byModelOrder(buffers);
      for (const auto& p : stage.parameters) stage.parameter_count += elements.at(p);
      for (const auto& name : stage.parameters) holders[state_index.at(name)] = config.name;
      for (const auto& name : stage.buffers) holders[state_index.at(name)] = config.name;
      stage.inputs = profile.describeCut(graph, stage.begin_unit);
      stage.outputs = profile.describeCut(graph, stage.end_unit);
      stage.memory_bytes = placement.memory_bytes;
      stage.capacity_bytes = nodes[node_index].capacity_bytes;
      stage.seconds = placement.seconds;
      stage.sent_bytes = cost.transferBytes(placement.begin_atom, placement.end_atom);
      cluster.stages.push_back(std::move(stage));
    }
    // State no unit uses (never read by forward) has no holder; it is not trained or reduced.
    holder_of.push_back(std::move(holders));
    plan.clusters.push_back(std::move(cluster));
  }
  {
    std::vector<std::string> used;
    std::vector<std::vector<std::string>> used_holders(holder_of.size());
    for (size_t p = 0; p < state_names.size(); ++p) {
      if (holder_of[0][p].empty()) continue;
      used.push_back(state_names[p]);
      for (size_t c = 0; c < holder_of.size(); ++c) used_holders[c].push_back(holder_of[c][p]);
    }
    plan.rings = groupRings(used, used_holders);
  }
  for (int spare : formation.spare) plan.spare_nodes.push_back(configs[spare].name);

  // node.json for every placed node.
  std::map<std::string, std::string> address_of;
  for (const auto& c : configs) address_of[c.name] = c.address();
  for (size_t c = 0; c < plan.clusters.size(); ++c) {
    const auto& stages = plan.clusters[c].stages;
    const int count = static_cast<int>(stages.size());
    for (int s = 0; s < count; ++s) {
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
      node.estimated_memory_bytes = st.memory_bytes;
      node.estimated_seconds_per_microbatch = st.seconds;
      node.extra = {{"units", {st.begin_unit, st.end_unit}},
                    {"unit_labels", st.units},
                    {"capacity_bytes", st.capacity_bytes},
                    {"microbatches", plan.microbatches},
                    {"optimizer", plan.optimizer}};
      result.nodes.push_back(std::move(node));
    }
  }
  return result;
}

ClusterizeResult clusterize(const ClusterizeOptions& options) {
  const auto configs = readNodeConfigs(options.nodes_path);  // validated first: cheap, clear errors
  if (configs.empty()) CAIRN_THROW(BadInput, options.nodes_path, ": lists no nodes");
  return planNodes(prepareModel(options), configs, options.nodes_path);
}

PreparedModel prepareModel(const ClusterizeOptions& options) {
  if (options.model_path.empty()) CAIRN_THROW(BadInput, "--model is required");

  std::optional<JobSpec> given_job;
  if (!options.job_path.empty()) given_job = readJobSpec(options.job_path);
  int microbatches = 4;
  int threads = 1;  // a provider's torch intra-op threads (training_definition.threads, default 1)
  std::string optimizer = "adam";
  if (given_job) {
    JsonReader training(given_job->training, options.job_path, "training_definition");
    microbatches = static_cast<int>(training.integerOr("microbatches", 1, 1 << 16, microbatches));
    threads = static_cast<int>(training.integerOr("threads", 1, 1024, threads));
    if (training.has("optimizer")) {
      const auto& opt = given_job->training["optimizer"];
      if (opt.is_string()) {
        optimizer = opt.get<std::string>();
      } else {
        optimizer = training.object("optimizer").string("name");
      }
    }
  }
  if (options.microbatches) microbatches = *options.microbatches;
  if (options.optimizer) optimizer = *options.optimizer;
  if (microbatches < 1) CAIRN_THROW(BadInput, "--microbatches must be at least 1 (got ", microbatches, ")");
  const OptimizerKind optimizer_kind = parseOptimizer(optimizer);

  torch::jit::Module model;
  try {
    model = torch::jit::load(options.model_path);
  } catch (const c10::Error& e) {
    CAIRN_THROW(BadInput, options.model_path, ": cannot load as a TorchScript model: ",
                e.what_without_backtrace());
  }
  if (!options.weights_path.empty()) {
    loadInitialWeights(model, options.weights_path, options.model_path);
    CAIRN_INFO("clusterize: initial weights from ", options.weights_path);
  }
  PreparedModel prepared;
  prepared.model = model;
  prepared.graph = std::make_shared<const ModelGraph>(model, options.granularity);
  const ModelGraph& graph = *prepared.graph;
  CAIRN_INFO("clusterize: ", options.model_path, ": ", graph.numUnits(), " units, ",
             graph.atomCuts().size() - 1, " atoms between valid cuts");

  std::vector<std::vector<int64_t>> shapes;
  for (const auto& text : options.input_shapes) shapes.push_back(parseShape(text, "--input-shape"));
  std::vector<c10::IValue> inputs;
  if (!options.example_path.empty()) {
    if (!shapes.empty()) CAIRN_THROW(BadInput, "give either --example or --input-shape, not both");
    inputs = loadExampleInputs(options.example_path);
    for (const auto& v : inputs)
      if (v.isTensor()) {
        shapes.push_back(v.toTensor().sizes().vec());
        break;
      }
  } else {
    inputs = makeExampleInputs(shapes, options.input_dtypes, options.seed);
  }
  {
    // Time the atoms with the intra-op threads a provider will use: with libtorch's default (all
    // cores) small operators paid thread start-up and, on a busy machine, waits for a second core
    // (the demo CNN's conv1 profiled at ~28 ms per micro-batch, its Root measured ~5 ms).
    const int previous_threads = at::get_num_threads();
    at::set_num_threads(threads);
    struct Restore {
      int n;
      ~Restore() { at::set_num_threads(n); }
    } restore{previous_threads};
    prepared.profile = profileModel(graph, inputs, options.profile);
  }

  JobSpec& job = prepared.job;
  job = given_job ? *given_job : jobFromOptions(options, shapes, microbatches, optimizer);
  // A TorchScript loss named in --job travels inside job.json to every node (core/JobFiles.h).
  if (given_job && embedJobFiles(&job.training, options.job_path))
    CAIRN_INFO("clusterize: ", job.training["loss_fn"]["torchscript"].get<std::string>(),
               " embedded in job.json (training_definition.loss_fn.torchscript_base64)");
  if (job.model.empty()) job.model = options.model_path;
  PlanSettings& settings = prepared.settings;
  settings.model_path = options.model_path;
  settings.granularity = options.granularity;
  settings.cost.optimizer = optimizer_kind;
  settings.cost.microbatches = microbatches;
  settings.clusters = options.clusters;
  settings.seed = options.seed;
  settings.cuts = options.cuts;
  settings.tolerance = options.plan_tolerance;
  return prepared;
}

ClusterizeResult planNodes(const PreparedModel& prepared, const std::vector<NodeConfig>& configs,
                           const std::string& nodes_source) {
  PlanSettings settings = prepared.settings;
  settings.nodes_source = nodes_source;
  ClusterizeResult result = planModel(*prepared.graph, prepared.profile, configs, prepared.job, settings);

  StageBuilder builder(*prepared.graph);
  std::map<std::pair<int, int>, torch::jit::Module> built;
  for (size_t c = 0; c < result.plan.clusters.size(); ++c) {
    const auto& stages = result.plan.clusters[c].stages;
    for (size_t s = 0; s < stages.size(); ++s) {
      const auto key = std::make_pair(stages[s].begin_unit, stages[s].end_unit);
      if (!built.count(key))
        built[key] = builder.build(key.first, key.second, "Stage_" + std::to_string(key.first) + "_" +
                                                              std::to_string(key.second)).module;
      result.stages[stages[s].node] = built[key];
    }
  }
  return result;
}

void printReport(const PartitionPlan& plan, std::ostream& out) {
  out << "clusterize: " << plan.model << ": " << plan.units.size() << " units, "
      << plan.atoms.size() << " places to cut, optimizer " << plan.optimizer << ", "
      << plan.microbatches << " micro-batches in flight\n";
  for (size_t c = 0; c < plan.clusters.size(); ++c) {
    const auto& cluster = plan.clusters[c];
    out << "\ncluster " << c << " (slowest stage " << std::fixed << std::setprecision(2)
        << cluster.seconds_per_microbatch * 1e3 << " ms per micro-batch)\n";
    char line[512];
    std::snprintf(line, sizeof line, "  %-10s %-9s %-28s %12s %23s %12s\n", "node", "role", "layers",
                  "parameters", "est. memory / capacity", "est. time");
    out << line;
    const int count = static_cast<int>(cluster.stages.size());
    for (int s = 0; s < count; ++s) {
      const auto& st = cluster.stages[s];
      std::string layers = std::to_string(st.begin_unit) + "-" + std::to_string(st.end_unit - 1) + " ";
      layers += st.units.front();
      if (st.units.size() > 1) layers += " .. " + st.units.back();
      if (layers.size() > 28) layers = layers.substr(0, 25) + "...";
      const std::string memory = formatBytes(st.memory_bytes) + " / " + formatBytes(st.capacity_bytes);
      std::ostringstream time;
      time << std::fixed << std::setprecision(2) << st.seconds * 1e3 << " ms";
      std::snprintf(line, sizeof line, "  %-10s %-9s %-28s %12lld %23s %12s\n", st.node.c_str(),
                    toString(roleForStage(s, count)).c_str(), layers.c_str(),
                    static_cast<long long>(st.parameter_count), memory.c_str(), time.str().c_str());
      out << line;
    }
  }
  out << "\n";
  for (size_t c = 0; c < plan.clusters.size(); ++c) {
    out << "cluster " << c << ": ";
    for (size_t s = 0; s < plan.clusters[c].stages.size(); ++s)
      out << (s ? " \u2192 " : "") << plan.clusters[c].stages[s].node;
    out << "\n";
  }
  if (!plan.spare_nodes.empty()) {
    out << "spare (not needed by any cluster):";
    for (const auto& n : plan.spare_nodes) out << " " << n;
    out << "\n";
  }
  out << plan.rings.size() << " ring group(s) across " << plan.clusters.size() << " cluster(s)\n";
  for (const auto& note : plan.notes) out << "note: " << note << "\n";
}

}  // namespace cairn::clusterize
