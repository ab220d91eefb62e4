#include "clusterize/Clusterize.h"

#include <cstdio>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>

#include "clusterize/ExampleInputs.h"
#include "clusterize/InitialWeights.h"
#include "clusterize/StageBuilder.h"
#include "core/ComputeThreads.h"
#include "core/Error.h"
#include "core/JobFiles.h"
#include "core/JsonReader.h"
#include "core/Log.h"

namespace cairn::clusterize {
namespace {

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

// What the planner and the profile take from --job, with the flags' overrides.
struct TrainingChoices {
  int microbatches = 4;
  int threads = 1;  // a provider's torch intra-op threads (training_definition.threads, default 1)
  std::string optimizer = "adam";
  bool async = false;  // training_definition.schedule "async": shared parameters stay in one stage
};

TrainingChoices trainingChoices(const ClusterizeOptions& options,
                                const std::optional<JobSpec>& given_job) {
  TrainingChoices chosen;
  if (given_job) {
    JsonReader training(given_job->training, options.job_path, "training_definition");
    chosen.microbatches =
        static_cast<int>(training.integerOr("microbatches", 1, 1 << 16, chosen.microbatches));
    chosen.threads = static_cast<int>(training.integerOr("threads", 1, 1024, chosen.threads));
    chosen.async = training.has("schedule") && given_job->training["schedule"] == "async";
    if (training.has("optimizer")) {
      const auto& opt = given_job->training["optimizer"];
      if (opt.is_string()) {
        chosen.optimizer = opt.get<std::string>();
      } else {
        chosen.optimizer = training.object("optimizer").string("name");
      }
    }
  }
  if (options.microbatches) chosen.microbatches = *options.microbatches;
  if (options.optimizer) chosen.optimizer = *options.optimizer;
  if (chosen.microbatches < 1)
    CAIRN_THROW(BadInput, "--microbatches must be at least 1 (got ", chosen.microbatches, ")");
  return chosen;
}

// The model file, with --weights loaded into it.
torch::jit::Module loadModel(const ClusterizeOptions& options) {
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
  return model;
}

// The example inputs (--example, or made from --input-shape and --input-dtype); `shapes` gets the
// input shapes (from --example: its first tensor's).
std::vector<c10::IValue> exampleInputs(const ClusterizeOptions& options,
                                       std::vector<std::vector<int64_t>>& shapes) {
  for (const auto& text : options.input_shapes) shapes.push_back(parseShape(text, "--input-shape"));
  if (options.example_path.empty()) return makeExampleInputs(shapes, options.input_dtypes, options.seed);
  if (!shapes.empty()) CAIRN_THROW(BadInput, "give either --example or --input-shape, not both");
  std::vector<c10::IValue> inputs = loadExampleInputs(options.example_path);
  for (const auto& v : inputs)
    if (v.isTensor()) {
      shapes.push_back(v.toTensor().sizes().vec());
      break;
    }
  return inputs;
}

// Time the atoms with the intra-op threads a provider will use: with libtorch's default (all
// cores) small operators paid thread start-up and, on a busy machine, waits for a second core
// (the demo CNN's conv1 profiled at ~28 ms per micro-batch, its Root measured ~5 ms).
ModelProfile profileWithThreads(const ModelGraph& graph, const std::vector<c10::IValue>& inputs,
                                const ProfileOptions& options, int threads) {
  ScopedComputeThreads scoped(threads);  // and one BLAS thread, as a provider
  return profileModel(graph, inputs, options);
}

PlanSettings planSettings(const ClusterizeOptions& options, const TrainingChoices& chosen,
                          OptimizerKind optimizer_kind,
                          const std::vector<std::vector<int64_t>>& shapes) {
  PlanSettings settings;
  settings.model_path = options.model_path;
  settings.granularity = options.granularity;
  settings.cost.optimizer = optimizer_kind;
  settings.cost.microbatches = chosen.microbatches;
  settings.clusters = options.clusters;
  settings.seed = options.seed;
  settings.cuts = options.cuts;
  settings.tolerance = options.plan_tolerance;
  if (options.host_gflops && !(*options.host_gflops > 0))
    CAIRN_THROW(BadInput, "--host-gflops must be positive (got ", *options.host_gflops, ")");
  settings.host_gflops = options.host_gflops;
  settings.profile_threads = chosen.threads;
  if (!shapes.empty() && !shapes[0].empty()) settings.profiled_microbatch_size = shapes[0][0];
  return settings;
}

}  // namespace

ClusterizeResult clusterize(const ClusterizeOptions& options) {
  const auto configs = readNodeConfigs(options.nodes_path);  // validated first: cheap, clear errors
  if (configs.empty()) CAIRN_THROW(BadInput, options.nodes_path, ": lists no nodes");
  return planNodes(prepareModel(options), configs, options.nodes_path);
}

PreparedModel prepareModel(const ClusterizeOptions& options) {
  if (options.model_path.empty()) CAIRN_THROW(BadInput, "--model is required");
  std::optional<JobSpec> given_job;
  if (!options.job_path.empty()) given_job = readJobSpec(options.job_path);
  const TrainingChoices chosen = trainingChoices(options, given_job);
  const OptimizerKind optimizer_kind = parseOptimizer(chosen.optimizer);

  PreparedModel prepared;
  prepared.model = loadModel(options);
  prepared.graph = std::make_shared<const ModelGraph>(prepared.model, options.granularity,
                                                    /*split_shared=*/!chosen.async);
  const ModelGraph& graph = *prepared.graph;
  CAIRN_INFO("clusterize: ", options.model_path, ": ", graph.numUnits(), " units, ",
             graph.atomCuts().size() - 1, " atoms between valid cuts");
  std::vector<std::vector<int64_t>> shapes;
  const std::vector<c10::IValue> inputs = exampleInputs(options, shapes);
  prepared.profile = profileWithThreads(graph, inputs, options.profile, chosen.threads);

  JobSpec& job = prepared.job;
  job = given_job ? *given_job : jobFromOptions(options, shapes, chosen.microbatches, chosen.optimizer);
  // A TorchScript loss named in --job travels inside job.json to every node (core/JobFiles.h).
  if (given_job && embedJobFiles(&job.training, options.job_path))
    CAIRN_INFO("clusterize: ", job.training["loss_fn"]["torchscript"].get<std::string>(),
               " embedded in job.json (training_definition.loss_fn.torchscript_base64)");
  if (job.model.empty()) job.model = options.model_path;
  prepared.settings = planSettings(options, chosen, optimizer_kind, shapes);
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

namespace {

// "12.3 samples/s" (or micro-batches/s when the micro-batch size is unknown).
std::string rate(double microbatches_per_s, double samples_per_microbatch) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(2);
  if (samples_per_microbatch > 0) {
    out << microbatches_per_s * samples_per_microbatch << " samples/s";
  } else {
    out << microbatches_per_s << " micro-batches/s";
  }
  return out.str();
}

// With GPU nodes: the yardstick and which plan was chosen over which, with both estimates.
void printGpuChoice(const GpuPlanChoice& g, std::ostream& out) {
  out << "GPU nodes: speeds are node GFLOPS / this host's " << std::fixed << std::setprecision(1)
      << g.host_gflops << " GFLOPS (" << (g.host_gflops_measured ? "measured" : "--host-gflops")
      << "), GPUs at their " << g.precision << " TFLOP/s\n";
  const std::string cut = rate(g.cut_microbatches_per_s, g.samples_per_microbatch);
  if (g.whole_microbatches_per_s <= 0) {
    out << "plan: cut (est. " << cut << " for the whole run); " << g.note << "\n";
    return;
  }
  const std::string whole = rate(g.whole_microbatches_per_s, g.samples_per_microbatch);
  if (g.whole_microbatches_per_s == g.cut_microbatches_per_s) {
    out << "plan: whole model per GPU (est. " << whole << " for the whole run; the cut plan did "
        << "not cut either)\n";
  } else if (g.chosen == "whole_model_per_gpu") {
    out << "plan: whole model per GPU (est. " << whole << " for the whole run) over cutting (est. "
        << cut << ")\n";
  } else {
    out << "plan: cut (est. " << cut << " for the whole run) over whole model per GPU (est. "
        << whole << ")\n";
  }
}

}  // namespace

void printReport(const PartitionPlan& plan, std::ostream& out) {
  out << "clusterize: " << plan.model << ": " << plan.units.size() << " units, "
      << plan.atoms.size() << " places to cut, optimizer " << plan.optimizer << ", "
      << plan.microbatches << " micro-batches in flight\n";
  if (plan.gpu.present) printGpuChoice(plan.gpu, out);
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
