#include "clusterize/Rebalance.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>

#include "core/Error.h"
#include "core/JsonReader.h"

namespace cairn::clusterize {
namespace {

const nlohmann::json& need(const nlohmann::json& j, const std::string& key, const std::string& where,
                           const std::string& file) {
  if (!j.is_object() || !j.contains(key))
    CAIRN_THROW(BadInput, file, ": ", where, key, " is missing (is this a clusterize NODE_DATA?)");
  return j.at(key);
}

double number(const nlohmann::json& j, const std::string& key, const std::string& where,
              const std::string& file) {
  const nlohmann::json& v = need(j, key, where, file);
  if (!v.is_number())
    CAIRN_THROW(BadInput, file, ": ", where, key, " must be a number (got ", jsonTypeName(v), ")");
  return v.get<double>();
}

std::pair<int, int> unitRange(const nlohmann::json& j, const std::string& where,
                              const std::string& file) {
  const nlohmann::json& v = need(j, "units", where, file);
  if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer() ||
      v[0].get<int>() > v[1].get<int>())
    CAIRN_THROW(BadInput, file, ": ", where, "units must be [begin, end] unit indices");
  return {v[0].get<int>(), v[1].get<int>()};
}

// plan.json's atoms as the cost model's atoms, and the unit where each begins.
struct PlanAtoms {
  std::vector<AtomCost> costs;
  std::vector<double> boundary{0.0};  // bytes after each atom (cut 0: none counted)
  std::vector<double> profiled;       // the plan's profiled seconds per atom
  std::vector<int> begin_unit;
  int end_unit = 0;                   // where the last atom ends

  // The atom that begins at `unit` (the number of atoms for the end of the model).
  int atomOfUnit(int unit, const std::string& where, const std::string& file) const {
    if (unit == end_unit) return static_cast<int>(begin_unit.size());
    const auto it = std::find(begin_unit.begin(), begin_unit.end(), unit);
    if (it == begin_unit.end())
      CAIRN_THROW(BadInput, file, ": ", where, "units starts at unit ", unit,
                  ", which begins no atom");
    return static_cast<int>(it - begin_unit.begin());
  }
  // The unit where atom `atom` begins (the end of the model past the last atom).
  int unitOfAtom(int atom) const {
    return atom < static_cast<int>(begin_unit.size()) ? begin_unit[atom] : end_unit;
  }
};

PlanAtoms readAtoms(const nlohmann::json& plan, const std::string& file) {
  const nlohmann::json& atoms = need(plan, "atoms", "", file);
  if (!atoms.is_array() || atoms.empty())
    CAIRN_THROW(BadInput, file, ": atoms must be a non-empty array");
  PlanAtoms out;
  for (size_t a = 0; a < atoms.size(); ++a) {
    const std::string where = "atoms[" + std::to_string(a) + "].";
    const auto [b, e] = unitRange(atoms[a], where, file);
    if (b != out.end_unit)
      CAIRN_THROW(BadInput, file, ": ", where, "units must start at ", out.end_unit);
    out.end_unit = e;
    out.begin_unit.push_back(b);
    AtomCost c;
    c.parameter_bytes = number(atoms[a], "parameter_bytes", where, file);
    c.trainable_bytes = c.parameter_bytes;
    c.buffer_bytes = number(atoms[a], "buffer_bytes", where, file);
    c.saved_bytes = number(atoms[a], "saved_bytes", where, file);
    c.seconds = number(atoms[a], "seconds", where, file);
    out.profiled.push_back(c.seconds);
    out.boundary.push_back(number(atoms[a], "output_bytes", where, file));
    out.costs.push_back(c);
  }
  return out;
}

// Cluster r.cluster's stages as plan.json places them and as they measured (metrics.jsonl):
// fills r.nodes, r.old_cuts and r.measured_stage_seconds; `nodes` gets each stage's capacity.
std::vector<MeasuredStage> readMeasuredStages(const nlohmann::json& plan, const std::string& file,
                                              const PlanAtoms& atoms, RebalanceResult& r,
                                              std::vector<PlannerNode>& nodes) {
  const nlohmann::json& clusters = need(plan, "clusters", "", file);
  if (!clusters.is_array() || r.cluster < 0 || r.cluster >= static_cast<int>(clusters.size()))
    CAIRN_THROW(BadInput, file, ": clusters has no cluster ", r.cluster);
  const std::string cwhere = "clusters[" + std::to_string(r.cluster) + "].";
  const nlohmann::json& stages = need(clusters[r.cluster], "stages", cwhere, file);
  if (!stages.is_array() || stages.empty())
    CAIRN_THROW(BadInput, file, ": ", cwhere, "stages must be a non-empty array");
  std::vector<MeasuredStage> measured;
  for (size_t s = 0; s < stages.size(); ++s) {
    const std::string where = cwhere + "stages[" + std::to_string(s) + "].";
    const nlohmann::json& node = need(stages[s], "node", where, file);
    if (!node.is_string()) CAIRN_THROW(BadInput, file, ": ", where, "node must be a string");
    r.nodes.push_back(node.get<std::string>());
    const auto [b, e] = unitRange(stages[s], where, file);
    MeasuredStage m;
    m.begin_atom = atoms.atomOfUnit(b, where, file);
    m.end_atom = atoms.atomOfUnit(e, where, file);
    if (s > 0) r.old_cuts.push_back(b);
    m.seconds = medianComputeSeconds(r.node_data + "/nodes/" + r.nodes.back() + "/metrics.jsonl") /
                r.microbatches;
    r.measured_stage_seconds.push_back(m.seconds);
    measured.push_back(m);
    PlannerNode p;
    p.capacity_bytes = number(stages[s], "capacity_bytes", where, file);
    p.speed = 1;
    p.bandwidth_bytes_per_s = std::numeric_limits<double>::infinity();
    nodes.push_back(p);
  }
  return measured;
}

}  // namespace

double medianComputeSeconds(const std::string& metrics_path) {
  std::ifstream in(metrics_path);
  if (!in)
    CAIRN_THROW(BadInput, metrics_path, ": cannot read the provider's metrics (has the stage "
                "trained? metrics.jsonl is written next to node.json)");
  std::vector<double> values;
  std::string line;
  int number_of_line = 0;
  while (std::getline(in, line)) {
    ++number_of_line;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      CAIRN_THROW(BadInput, metrics_path, ": line ", number_of_line, " is not JSON: ", e.what());
    }
    if (!record.is_object() || !record.contains("step")) continue;  // eval, checkpoint, done
    if (!record.contains("compute_s"))
      CAIRN_THROW(BadInput, metrics_path, ": line ", number_of_line,
                  ": step record without compute_s");
    const nlohmann::json& c = record["compute_s"];
    if (!c.is_number() || c.get<double>() < 0 || !std::isfinite(c.get<double>()))
      CAIRN_THROW(BadInput, metrics_path, ": line ", number_of_line,
                  ": compute_s must be a non-negative number");
    values.push_back(c.get<double>());
  }
  if (values.empty())
    CAIRN_THROW(BadInput, metrics_path, ": no step record with compute_s (train some steps first)");
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::vector<double> measuredAtomSeconds(const std::vector<double>& profiled,
                                        const std::vector<MeasuredStage>& stages) {
  std::vector<double> out(profiled.size(), 0.0);
  int expected = 0;
  for (const MeasuredStage& s : stages) {
    if (s.begin_atom != expected || s.end_atom < s.begin_atom ||
        s.end_atom > static_cast<int>(profiled.size()))
      CAIRN_THROW(BadInput, "measured stages must tile the atoms in order (stage [", s.begin_atom,
                  ", ", s.end_atom, ") after atom ", expected, ")");
    expected = s.end_atom;
    const int count = s.end_atom - s.begin_atom;
    if (count == 0) continue;
    double sum = 0;
    for (int a = s.begin_atom; a < s.end_atom; ++a) sum += profiled[a];
    for (int a = s.begin_atom; a < s.end_atom; ++a)
      out[a] = sum > 0 ? s.seconds * profiled[a] / sum : s.seconds / count;
  }
  if (expected != static_cast<int>(profiled.size()))
    CAIRN_THROW(BadInput, "measured stages end at atom ", expected, " of ", profiled.size());
  return out;
}

RebalanceResult rebalanceFromNodeData(const std::string& node_data, int cluster, double tolerance) {
  const std::string file = node_data + "/plan.json";
  const nlohmann::json plan = readJsonFile(file);
  RebalanceResult r;
  r.node_data = node_data;
  r.cluster = cluster;
  r.microbatches = static_cast<int>(number(plan, "microbatches", "", file));
  if (r.microbatches < 1) CAIRN_THROW(BadInput, file, ": microbatches must be at least 1");
  PlanAtoms atoms = readAtoms(plan, file);
  std::vector<PlannerNode> nodes;
  const std::vector<MeasuredStage> measured = readMeasuredStages(plan, file, atoms, r, nodes);
  r.atom_seconds = measuredAtomSeconds(atoms.profiled, measured);
  for (size_t a = 0; a < atoms.costs.size(); ++a) atoms.costs[a].seconds = r.atom_seconds[a];
  CostOptions options;
  options.microbatches = r.microbatches;
  if (plan.contains("optimizer") && plan["optimizer"].is_string())
    options.optimizer = parseOptimizer(plan["optimizer"].get<std::string>());
  const CostModel model(atoms.costs, atoms.boundary, options);
  r.partition = partitionCluster(model, nodes, 0, tolerance);
  if (!r.partition.feasible)
    CAIRN_THROW(BadInput, file, ": no cut of clusters[", cluster,
                "].stages fits the nodes' capacity_bytes");
  for (size_t s = 0; s < r.partition.stages.size(); ++s) {
    const StagePlacement& p = r.partition.stages[s];
    if (s > 0) r.new_cuts.push_back(atoms.unitOfAtom(p.begin_atom));
    r.predicted_stage_seconds.push_back(model.computeSeconds(p.begin_atom, p.end_atom));
  }
  return r;
}

nlohmann::json RebalanceResult::toJson() const {
  nlohmann::json j;
  j["node_data"] = node_data;
  j["cluster"] = cluster;
  j["microbatches"] = microbatches;
  j["nodes"] = nodes;
  j["old_cuts"] = old_cuts;
  j["new_cuts"] = new_cuts;
  j["measured_stage_seconds_per_microbatch"] = measured_stage_seconds;
  j["predicted_stage_seconds_per_microbatch"] = predicted_stage_seconds;
  j["measured_atom_seconds"] = atom_seconds;
  nlohmann::json placed = nlohmann::json::array();
  for (const StagePlacement& p : partition.stages)
    placed.push_back({{"node", nodes.at(p.node)}, {"atoms", {p.begin_atom, p.end_atom}}});
  j["new_stages"] = placed;
  auto ratio = [](const std::vector<double>& v) {
    if (v.empty()) return 0.0;
    double sum = 0, mx = 0;
    for (double x : v) { sum += x; mx = std::max(mx, x); }
    return sum > 0 ? mx / (sum / v.size()) : 0.0;
  };
  j["measured_max_over_mean"] = ratio(measured_stage_seconds);
  j["predicted_max_over_mean"] = ratio(predicted_stage_seconds);
  return j;
}

}  // namespace cairn::clusterize

