#include "clusterize/PartitionPlan.h"

namespace cairn::clusterize {
namespace {

nlohmann::json boundaryJson(const std::vector<BoundaryValue>& values) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& b : values)
    out.push_back(boundaryToJson(b));
  return out;
}

nlohmann::json estimateJson(double microbatches_per_s, double samples_per_microbatch) {
  nlohmann::json out = {{"microbatches_per_s", microbatches_per_s}};
  if (samples_per_microbatch > 0) out["samples_per_s"] = microbatches_per_s * samples_per_microbatch;
  return out;
}

nlohmann::json gpuPlanJson(const GpuPlanChoice& g) {
  nlohmann::json out = {{"host_gflops", g.host_gflops},
                        {"host_gflops_source", g.host_gflops_measured ? "measured" : "--host-gflops"},
                        {"precision", g.precision},
                        {"chosen", g.chosen},
                        {"cut", estimateJson(g.cut_microbatches_per_s, g.samples_per_microbatch)}};
  out["whole_model_per_gpu"] =
      g.whole_microbatches_per_s > 0
          ? estimateJson(g.whole_microbatches_per_s, g.samples_per_microbatch)
          : nlohmann::json(nullptr);
  if (!g.note.empty()) out["note"] = g.note;
  return out;
}

}  // namespace

nlohmann::json toJson(const PartitionPlan& plan) {
  nlohmann::json j;
  j["format"] = kNodeDataFormat;
  j["job_id"] = plan.job_id;
  j["model"] = plan.model;
  j["granularity"] = plan.granularity;
  j["optimizer"] = plan.optimizer;
  j["microbatches"] = plan.microbatches;
  j["wire_activations"] = plan.wire_activations;
  j["seed"] = plan.seed;
  j["units"] = nlohmann::json::array();
  for (size_t i = 0; i < plan.units.size(); ++i) {
    nlohmann::json u = {{"index", i}, {"label", plan.units[i].label},
                        {"cut_before_allowed", plan.units[i].cut_before_allowed}};
    if (!plan.units[i].why_not.empty()) u["why_not"] = plan.units[i].why_not;
    j["units"].push_back(u);
  }
  j["atoms"] = nlohmann::json::array();
  for (const auto& a : plan.atoms)
    j["atoms"].push_back({{"units", {a.begin_unit, a.end_unit}},
                          {"parameter_bytes", a.parameter_bytes},
                          {"buffer_bytes", a.buffer_bytes},
                          {"saved_bytes", a.saved_bytes},
                          {"output_bytes", a.output_bytes},
                          {"seconds", a.seconds}});
  j["clusters"] = nlohmann::json::array();
  for (size_t c = 0; c < plan.clusters.size(); ++c) {
    const PlannedCluster& cluster = plan.clusters[c];
    nlohmann::json cj = {{"index", c}, {"seconds_per_microbatch", cluster.seconds_per_microbatch}};
    cj["chain"] = nlohmann::json::array();
    cj["stages"] = nlohmann::json::array();
    const int count = static_cast<int>(cluster.stages.size());
    for (int s = 0; s < count; ++s) {
      const PlannedStage& st = cluster.stages[s];
      cj["chain"].push_back(st.node);
      cj["stages"].push_back({{"stage", s},
                              {"node", st.node},
                              {"address", st.address},
                              {"role", toString(roleForStage(s, count))},
                              {"units", {st.begin_unit, st.end_unit}},
                              {"unit_labels", st.units},
                              {"parameters", st.parameters},
                              {"buffers", st.buffers},
                              {"parameter_count", st.parameter_count},
                              {"inputs", boundaryJson(st.inputs)},
                              {"outputs", boundaryJson(st.outputs)},
                              {"memory_bytes", st.memory_bytes},
                              {"capacity_bytes", st.capacity_bytes},
                              {"seconds_per_microbatch", st.seconds},
                              {"sent_bytes_per_microbatch", st.sent_bytes}});
    }
    for (int s = 0; s < count; ++s)
      if (!cluster.stages[s].gpu.empty()) cj["stages"][s]["gpu"] = cluster.stages[s].gpu;
    cj["shared_parameters"] = nlohmann::json::array();
    for (const PlannedShared& shared : cluster.shared)
      cj["shared_parameters"].push_back({{"name", shared.name},
                                         {"names", shared.names},
                                         {"stages", shared.stages},
                                         {"holders", shared.holders},
                                         {"local_names", shared.local_names}});
    j["clusters"].push_back(cj);
  }
  j["spare_nodes"] = plan.spare_nodes;
  j["rings"] = nlohmann::json::array();
  for (const auto& r : plan.rings)
    j["rings"].push_back({{"id", r.id}, {"parameters", r.parameters}, {"holders", r.holders}});
  j["shared_parameters"] = nlohmann::json::array();
  for (const auto& [name, names] : plan.shared_names)
    j["shared_parameters"].push_back({{"name", name}, {"names", names}});
  j["notes"] = plan.notes;
  if (plan.gpu.present) j["gpu_plan"] = gpuPlanJson(plan.gpu);
  return j;
}

}  // namespace cairn::clusterize
