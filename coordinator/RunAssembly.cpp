#include "coordinator/RunAssembly.h"

#include "coordinator/ChunkServer.h"
#include "coordinator/DialOutPlacement.h"
#include "coordinator/RelayedPlacement.h"

#include <fstream>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include "clusterize/ModelMerge.h"
#include "clusterize/NodeDataWriter.h"
#include "core/CurveKeys.h"
#include "core/Error.h"
#include "core/JsonReader.h"
#include "core/GpuFigures.h"
#include "core/NodeConfigs.h"
#include "core/NodeData.h"

namespace cairn::coordinator {

std::vector<NodeConfig> volunteerConfigs(const std::vector<Member>& volunteers) {
  std::vector<NodeConfig> configs;
  for (const Member& m : volunteers) {
    NodeConfig c;
    c.name = m.name;
    c.id = m.name.rfind("node_", 0) == 0 ? m.name.substr(5) : m.name;
    if (m.dial_out_only) {  // no address: a placeholder the plan's node.json loses again
      c.host = "dial-out-only-" + c.id + ".invalid";
      c.port = 1;
    } else {
      parseHostPort(m.advertise, "coordinator.db: member " + m.name, "advertise", &c.host, &c.port);
    }
    const nlohmann::json probe = nlohmann::json::parse(m.probe_json);
    JsonReader p(probe, "coordinator.db: member " + m.name, "probe");
    c.ram_gb = p.positiveNumber("ram_gb");
    c.bandwidth_mbps = p.positiveNumber("bandwidth_mbps");
    c.compute = p.positiveNumber("compute_gflops");
    // The join's GPUs (validated when it was decoded): the planner places a GPU node by gpus[0].
    if (p.has("gpus"))
      c.gpus = parseGpuFigures(probe["gpus"], "coordinator.db: member " + m.name + ": probe.gpus");
    configs.push_back(c);
  }
  return configs;
}

// The planner's placement with every link having a reachable side (DialOutPlacement.h): as
// planned, or planned again with volunteers of equal figures swapped. BadInput when it cannot be.
clusterize::ClusterizeResult planReachable(const clusterize::PreparedModel& prepared,
                                           const std::vector<Member>& volunteers,
                                           bool relays_offered) {
  std::vector<NodeConfig> configs = volunteerConfigs(volunteers);
  clusterize::ClusterizeResult result =
      clusterize::planNodes(prepared, configs, "the volunteers that joined");
  std::set<std::string> dial_out_only;
  for (const Member& m : volunteers)
    if (m.dial_out_only) dial_out_only.insert(m.name);
  if (!dialOutOnlyLink(result.nodes, dial_out_only)) return result;
  auto planWith = [&](const std::vector<size_t>& slots) {
    const std::vector<NodeConfig> named = configs;
    for (size_t i = 0; i < configs.size(); ++i) {  // slot i's figures, its new holder's name
      const NodeConfig& holder = named[slots[i]];
      configs[i].name = holder.name;
      configs[i].id = holder.id;
      configs[i].host = holder.host;
      configs[i].port = holder.port;
    }
    result = clusterize::planNodes(prepared, configs, "the volunteers that joined");
  };
  if (const auto slots = reachableNeighbourSlots(result.nodes, volunteers)) {
    planWith(*slots);
  } else if (relays_offered) {  // relayed links unavoidable: where they carry the fewest bytes
    const std::vector<size_t> cheapest =
        cheapestRelayedSlots(linkBytesPerStep(result.plan, result.job), volunteers);
    for (size_t i = 0; i < cheapest.size(); ++i)
      if (cheapest[i] != i) {
        planWith(cheapest);
        break;
      }
  }
  if (const auto both = dialOutOnlyLink(result.nodes, dial_out_only); both && !relays_offered)
    CAIRN_THROW(BadInput, "the plan links ", both->first, " and ", both->second,
                ", both dial-out only (behind a router: nobody can dial either), and no swap with "
                "a reachable volunteer of the same memory avoids it; such a link needs a relay, "
                "and none is offered (the coordinator's --relay): more reachable volunteers are "
                "needed");
  return result;  // what still links two dial-out-only volunteers goes through a relay
}

PlannedRun planVolunteers(const clusterize::PreparedModel& prepared,
                          const std::vector<Member>& volunteers, const std::string& out,
                          const std::vector<PeerRef::Relay>& relays) {
  if (!prepared.graph) CAIRN_THROW(BadInput, "no profiled model to plan (the coordinator was made without one)");
  clusterize::ClusterizeResult result = planReachable(prepared, volunteers, !relays.empty());
  std::map<std::string, std::string> keys;
  for (const Member& m : volunteers) keys[m.name] = m.public_key;
  std::vector<NodeSpec> placed = result.nodes;
  // Only the placed nodes need keys; applyPublicKeys checks each has one.
  applyPublicKeys(placed, keys);
  std::set<std::string> dial_out_only;
  for (const Member& m : volunteers)
    if (m.dial_out_only) dial_out_only.insert(m.name);
  markDialOutOnly(placed, dial_out_only);
  PlannedRun run;
  run.relayed_links = assignRelays(placed, relays);
  std::ostringstream report;
  clusterize::printReport(result.plan, report);
  if (run.relayed_links > 0) {
    const double mb = relayedBytesPerStep(linkBytesPerStep(result.plan, result.job),
                                          {dial_out_only.begin(), dial_out_only.end()}) / 1e6;
    report << "relayed: " << run.relayed_links << " link(s) between dial-out-only volunteers, about "
           << std::fixed << std::setprecision(mb < 10 ? 2 : 0) << mb
           << " MB per step through the relays (each byte crosses a relay's link twice: in and out)\n";
  }
  run.report = report.str();
  run.num_clusters = static_cast<int>(result.plan.clusters.size());
  for (NodeSpec& node : placed) node.extra["num_clusters"] = run.num_clusters;
  addServedChunkTable(result.job);  // data.source "coordinator": data.shards into job.json
  clusterize::NodeDataWriter(out, clusterize::NodeDataWriter::KeysGiven{})
      .write(result.plan, result.job, placed, result.stages);
  const nlohmann::json job = toJson(result.job);
  std::set<std::string> placed_names;
  for (const NodeSpec& node : placed) {
    Assignment a;
    a.name = node.name;
    a.node = toJson(node);
    a.job = job;
    a.num_clusters = run.num_clusters;
    a.stage = readFileBytes(nodeDirectory(out, node.name) + "/" + node.stage_file);
    run.assignments.push_back(std::move(a));
    placed_names.insert(node.name);
  }
  for (const Member& m : volunteers)
    if (!placed_names.count(m.name)) run.unplaced.push_back(m.name);
  return run;
}

std::string readFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) CAIRN_THROW(InternalError, path, ": cannot read");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

FinishedRun finishRun(const std::string& out, const std::vector<StoredResult>& results,
                      const nlohmann::json& credit) {
  clusterize::MergeOptions options;
  options.node_data = out;
  const clusterize::MergedModel merged = clusterize::mergeTrainedStages(options);
  const std::string pt = out + "/trained.pt", st = out + "/trained.safetensors";
  clusterize::saveMergedModel(merged, pt, clusterize::MergeFormat::kTorchScript);
  clusterize::saveMergedModel(merged, st, clusterize::MergeFormat::kSafetensors);
  FinishedRun f;
  std::ostringstream lines;
  nlohmann::json clusters = nlohmann::json::array();
  for (const StoredResult& r : results) {
    const NodeSpec node = readNodeSpec(nodeSpecPath(out, r.name));
    if (node.role != StageRole::kLeaf && node.role != StageRole::kRootLeaf) continue;
    const nlohmann::json summary = nlohmann::json::parse(r.summary_json);
    nlohmann::json entry = {{"cluster", node.cluster}, {"leaf", node.name}};
    if (summary.contains("steps")) entry["steps"] = summary["steps"];
    if (summary.contains("last_loss")) entry["last_loss"] = summary["last_loss"];
    lines << "cluster " << node.cluster << " (" << node.name << "): "
          << (summary.contains("steps") ? summary["steps"].dump() : "?") << " steps";
    if (summary.contains("eval") && summary["eval"].is_object()) {
      entry["eval"] = summary["eval"];
      const auto& e = summary["eval"];
      lines << std::fixed << std::setprecision(4);
      if (e.contains("loss") && e["loss"].is_number()) lines << ", eval loss " << e["loss"].get<double>();
      if (e.contains("accuracy") && e["accuracy"].is_number())
        lines << ", eval accuracy " << e["accuracy"].get<double>();
      if (e.contains("samples") && e["samples"].is_number())
        lines << " on " << e["samples"].get<int64_t>() << " samples";
    }
    lines << "\n";
    clusters.push_back(entry);
  }
  lines << "merged " << merged.state.size() << " parameters and buffers from "
        << merged.clusters.size() << " cluster(s) into " << pt << " and " << st << "\n";
  for (const auto& c : credit)
    lines << "credit: " << c["volunteer"].get<std::string>() << " trained " << c["node"].get<std::string>()
          << ": " << c["steps"].get<int64_t>() << " kept steps, " << c["samples"].get<int64_t>()
          << " samples, " << std::fixed << std::setprecision(1) << c["compute_s"].get<double>() << " compute s, "
          << std::setprecision(1) << double(c["sent_bytes"].get<int64_t>()) / 1e6 << " MB sent\n";
  f.summary = {{"clusters", clusters}, {"trained_torchscript", pt}, {"trained_safetensors", st},
               {"merged_clusters", merged.clusters}, {"credit", credit}};
  writeJsonFile(out + "/run_result.json", f.summary);
  f.lines = lines.str();
  return f;
}

}  // namespace cairn::coordinator
