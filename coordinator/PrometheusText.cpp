#include "coordinator/PrometheusText.h"

#include <charconv>
#include <cmath>
#include <initializer_list>

namespace cairn::coordinator {
namespace {

std::string formatNumber(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  auto r = std::to_chars(buffer, buffer + sizeof buffer, v);
  return std::string(buffer, r.ptr);
}

std::string label(const char* key, const std::string& value) {
  return std::string(key) + "=\"" + escapePrometheusLabel(value) + "\"";
}

// The exposition being written: a family's HELP and TYPE lines, then its samples.
struct Exposition {
  std::string text;

  void family(const char* name, const char* type, const char* help) {
    text += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(const char* name, const std::string& labels, const nlohmann::json& v) {
    if (!v.is_number()) return;  // not known (yet): no sample
    text += std::string(name) + (labels.empty() ? "" : "{" + labels + "}") + " " +
            formatNumber(v.get<double>()) + "\n";
  }
};

// A family of one figure per cluster, node or credit row: the snapshot's `key`.
struct Figure {
  const char* metric;
  const char* key;
  const char* type;
  const char* help;
};

// Each figure's family, with one sample per row of `rows` labelled by `labels(row)`.
template <typename Labels>
void figureFamilies(std::initializer_list<Figure> figures, const nlohmann::json& rows,
                    const Labels& labels, Exposition* out) {
  for (const Figure& f : figures) {
    out->family(f.metric, f.type, f.help);
    for (const auto& row : rows) out->sample(f.metric, labels(row), row[f.key]);
  }
}

void runFamilies(const nlohmann::json& run, Exposition* out) {
  out->family("cairn_records_total", "counter",
              "Metrics records the coordinator took from volunteers.");
  out->sample("cairn_records_total", "", run["records"]);
  out->family("cairn_records_dropped_total", "counter",
              "Records the volunteers' queues dropped (full while the coordinator was away).");
  out->sample("cairn_records_dropped_total", "", run["dropped"]);
  out->family("cairn_members", "gauge", "Volunteers known to the coordinator.");
  out->sample("cairn_members", "", run["members"]);
  out->family("cairn_clusters", "gauge", "Clusters of the plan.");
  out->sample("cairn_clusters", "", run["num_clusters"]);
}

void clusterFamilies(const nlohmann::json& clusters, Exposition* out) {
  figureFamilies({
      {"cairn_cluster_step", "step", "gauge",
       "Steps done by the cluster (its Leaf's last record)."},
      {"cairn_cluster_max_steps", "max_steps", "gauge", "Steps of the whole run (the plan)."},
      {"cairn_cluster_loss", "loss", "gauge", "Training loss of the cluster's last step."},
      {"cairn_cluster_samples_per_second", "samples_per_s", "gauge",
       "Mean samples per second over the cluster's last 20 steps."},
      {"cairn_cluster_eta_seconds", "eta_s", "gauge",
       "Estimated seconds until the run's last step."}},
      clusters, [](const nlohmann::json& c) { return label("cluster", std::to_string(c["id"].get<int>())); },
      out);
}

std::string nodeLabels(const nlohmann::json& n) {
  return label("node", n["name"].get<std::string>()) + "," +
         label("cluster", n["cluster"].is_number() ? std::to_string(n["cluster"].get<int>()) : "");
}

void nodeFamilies(const nlohmann::json& nodes, Exposition* out) {
  figureFamilies({
      {"cairn_node_step", "step", "gauge", "The node's last step."},
      {"cairn_node_compute_seconds", "compute_s", "gauge",
       "Mean compute seconds per step (last 20)."},
      {"cairn_node_send_seconds", "send_s", "gauge", "Mean send seconds per step (last 20)."},
      {"cairn_node_wait_seconds", "wait_s", "gauge",
       "Mean receive-wait seconds per step (last 20)."},
      {"cairn_node_heartbeat_age_seconds", "heartbeat_age_s", "gauge",
       "Seconds since the node's last heartbeat."}},
      nodes, nodeLabels, out);
  out->family("cairn_node_info", "gauge", "1 per node, with its role, stage and state as labels.");
  for (const auto& n : nodes) {
    const std::string stage =
        n["stage"].is_number() ? std::to_string(n["stage"].get<int>()) : "";
    out->sample("cairn_node_info",
                nodeLabels(n) + "," + label("role", n["role"].get<std::string>()) + "," +
                    label("stage", stage) + "," + label("state", n["state"].get<std::string>()),
                1);
  }
}

// Credit (coordinator/Credit.h): one sample per (volunteer key, node) of each figure.
void creditFamilies(const nlohmann::json& credit, Exposition* out) {
  figureFamilies({
      {"cairn_credit_steps", "steps", "gauge", "Kept steps of the node trained by the volunteer."},
      {"cairn_credit_samples", "samples", "gauge",
       "Samples those steps carried through the volunteer's stage."},
      {"cairn_credit_compute_seconds", "compute_s", "gauge", "Compute seconds of those steps."},
      {"cairn_credit_sent_bytes", "sent_bytes", "gauge", "Tensor bytes sent in those steps."}},
      credit,
      [](const nlohmann::json& c) {
        return label("volunteer", c["volunteer"].get<std::string>()) + "," +
               label("key", c["key"].get<std::string>()) + "," + label("node", c["node"].get<std::string>());
      },
      out);
}

// The coordinator's relay (--relay; CoordinatorRelay.h): what it forwarded, per link and in all,
// what it refused by reason, what waits.
void relayFamilies(const nlohmann::json& relay, Exposition* out) {
  out->family("cairn_relay_messages_forwarded_total", "counter",
              "Messages the coordinator's relay forwarded between dial-out-only volunteers.");
  out->sample("cairn_relay_messages_forwarded_total", "", relay["messages_forwarded"]);
  out->family("cairn_relay_bytes_forwarded_total", "counter",
              "Payload bytes (sealed end to end) the coordinator's relay forwarded.");
  out->sample("cairn_relay_bytes_forwarded_total", "", relay["bytes_forwarded"]);
  out->family("cairn_relay_link_bytes_forwarded_total", "counter",
              "Payload bytes the coordinator's relay forwarded, per link (from, to).");
  for (const auto& link : relay["links"])
    out->sample("cairn_relay_link_bytes_forwarded_total",
                label("from", link["from"].get<std::string>()) + "," +
                    label("to", link["to"].get<std::string>()),
                link["bytes"]);
  out->family("cairn_relay_refused_total", "counter",
              "Messages the coordinator's relay did not forward, by reason.");
  for (const auto& [reason, count] : relay["refused"].items())
    out->sample("cairn_relay_refused_total", label("reason", reason), count);
  out->family("cairn_relay_bytes_waiting", "gauge",
              "Payload bytes waiting at the coordinator's relay for their destination.");
  out->sample("cairn_relay_bytes_waiting", "", relay["bytes_waiting"]);
}

// The plan's links by how they are made, and the volunteers' relays (VolunteerRelays.h).
void linkFamilies(const nlohmann::json& links, const nlohmann::json& relays, Exposition* out) {
  if (links.is_object() && links.contains("direct")) {
    out->family("cairn_links", "gauge", "Links of the plan (pipeline neighbours, ring members) by "
                "how they are made: direct, opened by a dial-out-only end, or through a relay.");
    out->sample("cairn_links", label("via", "direct"), links["direct"]);
    out->sample("cairn_links", label("via", "dial_out"), links["dial_out"]);
    out->sample("cairn_links", label("via", "relayed"), links["relayed"]);
  }
  if (!relays.is_array() || relays.empty()) return;
  const std::pair<const char*, const char*> families[] = {
      {"bytes_forwarded", "Payload bytes a volunteer's relay forwarded (its heartbeats)."},
      {"messages_forwarded", "Messages a volunteer's relay forwarded (its heartbeats)."},
      {"refused", "Messages a volunteer's relay refused or dropped, every reason."}};
  for (const auto& [key, help] : families) {
    const std::string name = std::string("cairn_volunteer_relay_") + key + "_total";
    out->family(name.c_str(), "counter", help);
    for (const auto& r : relays)
      out->sample(name.c_str(), label("relay", r["name"].get<std::string>()), r[key]);
  }
  out->family("cairn_volunteer_relay_links", "gauge", "Links a volunteer's relay carries in the plan.");
  for (const auto& r : relays)
    out->sample("cairn_volunteer_relay_links", label("relay", r["name"].get<std::string>()), r["links"]);
  out->family("cairn_volunteer_relay_alive", "gauge", "1 while a volunteer's relay is heard, 0 once it is lost.");
  for (const auto& r : relays)
    out->sample("cairn_volunteer_relay_alive", label("relay", r["name"].get<std::string>()),
                r["alive"].get<bool>() ? 1 : 0);
}

}  // namespace

std::string prometheusText(const nlohmann::json& snapshot) {
  Exposition out;
  runFamilies(snapshot["run"], &out);
  clusterFamilies(snapshot["clusters"], &out);
  nodeFamilies(snapshot["nodes"], &out);
  if (snapshot.contains("credit")) creditFamilies(snapshot["credit"], &out);
  if (snapshot.contains("relay") && snapshot["relay"].is_object()) relayFamilies(snapshot["relay"], &out);
  linkFamilies(snapshot.value("links", nlohmann::json::object()),
               snapshot.value("relays", nlohmann::json::array()), &out);
  return out.text;
}

std::string escapePrometheusLabel(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out.push_back(c);
  }
  return out;
}

}  // namespace cairn::coordinator
