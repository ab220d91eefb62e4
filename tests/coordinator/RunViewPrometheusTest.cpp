// RunView's Prometheus text (coordinator/RunView.h), parsed by a small parser of its own and
// checked against the snapshot's figures, with a hostile node name (kEvil) raw in the JSON and
// escaped per the exposition format in the labels; the relays' and links' figures; and the
// terminal view (coordinator/TerminalView.h) without control characters from volunteers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "coordinator/CoordinatorStore.h"
#include "coordinator/RunView.h"
#include "coordinator/TerminalView.h"
#include "tests/coordinator/RunViewFeed.h"

// The feed (RunViewFeed.h) is cairn::coordinator::testing's: so are these tests.
namespace cairn::coordinator::testing {
namespace {


struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value;
};
std::vector<Sample> parsePrometheus(const std::string& text, std::map<std::string, std::string>* types) {
  std::vector<Sample> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      (*types)[name] = type;
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0) continue;
    EXPECT_NE(line[0], '#') << line;
    Sample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') s.name.push_back(line[i++]);
    if (line[i] == '{') {
      ++i;
      while (line[i] != '}') {
        std::string key, value;
        while (line[i] != '=') key.push_back(line[i++]);
        i += 2;  // ="
        while (line[i] != '"') {
          if (line[i] == '\\') {
            const char e = line[++i];
            value.push_back(e == 'n' ? '\n' : e);
            EXPECT_TRUE(e == 'n' || e == '\\' || e == '"') << "bad escape in " << line;
          } else {
            EXPECT_NE(line[i], '\n');
            value.push_back(line[i]);
          }
          ++i;
        }
        ++i;  // closing quote
        if (line[i] == ',') ++i;
        s.labels[key] = value;
      }
      ++i;
    }
    EXPECT_EQ(line[i], ' ') << line;
    s.value = std::stod(line.substr(i + 1));
    EXPECT_TRUE(types->count(s.name)) << "no # TYPE before " << s.name;
    out.push_back(s);
  }
  return out;
}

TEST(RunView, PrometheusTextParsesToTheSnapshotFiguresWithHostileLabelsEscaped) {
  RunView view("");
  setUp(view);
  feed(view);
  const json snap = view.snapshot(1012.5);
  const std::string text = view.prometheus(1012.5);
  EXPECT_NE(text.find("node=\"evil\\\"\\n<script>alert(1)</script>\\\\x\""), std::string::npos) << text;
  std::map<std::string, std::string> types;
  const auto samples = parsePrometheus(text, &types);
  EXPECT_EQ(types["cairn_records_total"], "counter");
  EXPECT_EQ(types["cairn_cluster_loss"], "gauge");
  auto find = [&](const std::string& name, const std::map<std::string, std::string>& labels) -> const Sample* {
    for (const auto& s : samples)
      if (s.name == name && s.labels == labels) return &s;
    return nullptr;
  };
  ASSERT_TRUE(find("cairn_records_total", {}));
  EXPECT_EQ(find("cairn_records_total", {})->value, snap["run"]["records"].get<double>());
  EXPECT_EQ(find("cairn_records_dropped_total", {})->value, 7);
  for (const auto& c : snap["clusters"]) {
    const std::map<std::string, std::string> l = {{"cluster", std::to_string(c["id"].get<int>())}};
    ASSERT_TRUE(find("cairn_cluster_step", l));
    EXPECT_EQ(find("cairn_cluster_step", l)->value, c["step"].get<double>());
    EXPECT_DOUBLE_EQ(find("cairn_cluster_loss", l)->value, c["loss"].get<double>());
    EXPECT_DOUBLE_EQ(find("cairn_cluster_samples_per_second", l)->value, c["samples_per_s"].get<double>());
    EXPECT_DOUBLE_EQ(find("cairn_cluster_eta_seconds", l)->value, c["eta_s"].get<double>());
  }
  for (const auto& n : snap["nodes"]) {
    const std::string cluster = n["cluster"].is_null() ? "" : std::to_string(n["cluster"].get<int>());
    const std::map<std::string, std::string> l = {{"node", n["name"]}, {"cluster", cluster}};
    ASSERT_TRUE(find("cairn_node_step", l)) << n.dump();
    EXPECT_EQ(find("cairn_node_step", l)->value, n["step"].get<double>());
    if (n["compute_s"].is_number())
      EXPECT_DOUBLE_EQ(find("cairn_node_compute_seconds", l)->value, n["compute_s"].get<double>());
    else
      EXPECT_FALSE(find("cairn_node_compute_seconds", l)) << "a figure not known has no sample";
  }
  EXPECT_TRUE(find("cairn_node_heartbeat_age_seconds", {{"node", "node_2"}, {"cluster", "0"}}));
  EXPECT_EQ(find("cairn_node_heartbeat_age_seconds", {{"node", "node_2"}, {"cluster", "0"}})->value, 2.5);
}

// Prometheus text's samples by "name label=value …" (labels in order), for lookups by key.
std::map<std::string, double> samplesByKey(const std::string& text, std::map<std::string, std::string>* types) {
  std::map<std::string, double> got;
  for (const auto& s : parsePrometheus(text, types)) {
    std::string key = s.name;
    for (const auto& [k, v] : s.labels) key += " " + k + "=" + v;
    got[key] = s.value;
  }
  return got;
}

// The coordinator's relay (--relay) in /metrics: nothing without one; its figures, per link and by
// reason, as set, with the volunteers' names escaped like every label.
TEST(RunView, TheRelaysFiguresAppearInPrometheusTextOnlyWithARelay) {
  RunView view("");
  setUp(view);
  std::map<std::string, std::string> types;
  for (const auto& s : parsePrometheus(view.prometheus(1000), &types))
    EXPECT_EQ(s.name.rfind("cairn_relay_", 0), std::string::npos) << s.name << " without a relay";
  view.setRelay({{"messages_forwarded", 12},
                 {"bytes_forwarded", 4096},
                 {"bytes_waiting", 100},
                 {"links", json::array({{{"from", "node_1"}, {"to", "node\"3"}, {"bytes", 4000}},
                                        {{"from", "node_3"}, {"to", "node_1"}, {"bytes", 96}}})},
                 {"refused", {{"unplanned", 2}, {"over_budget", 0}}}});
  EXPECT_EQ(view.snapshot(1000)["relay"]["messages_forwarded"], 12);
  std::map<std::string, double> got = samplesByKey(view.prometheus(1000), &types);
  EXPECT_EQ(got["cairn_relay_messages_forwarded_total"], 12);
  EXPECT_EQ(got["cairn_relay_bytes_forwarded_total"], 4096);
  EXPECT_EQ(got["cairn_relay_bytes_waiting"], 100);
  EXPECT_EQ(got["cairn_relay_link_bytes_forwarded_total from=node_1 to=node\"3"], 4000);
  EXPECT_EQ(got["cairn_relay_link_bytes_forwarded_total from=node_3 to=node_1"], 96);
  EXPECT_EQ(got["cairn_relay_refused_total reason=unplanned"], 2);
  EXPECT_EQ(got.count("cairn_relay_refused_total reason=over_budget"), 1u);
  EXPECT_EQ(types["cairn_relay_bytes_forwarded_total"], "counter");
  EXPECT_EQ(types["cairn_relay_bytes_waiting"], "gauge");
}

// The plan's links by how they are made and the volunteers' relays (VolunteerRelays.h) in the
// snapshot and /metrics, as set: counts per kind, each relay's figures labelled by its name.
TEST(RunView, LinksByKindAndTheVolunteersRelaysAppearInSnapshotAndPrometheusText) {
  RunView view("");
  setUp(view);
  std::map<std::string, std::string> types;
  for (const auto& s : parsePrometheus(view.prometheus(1000), &types)) {
    EXPECT_EQ(s.name.rfind("cairn_volunteer_relay_", 0), std::string::npos) << s.name << " without relays";
    EXPECT_NE(s.name, "cairn_links") << "links before a plan";
  }
  const json links = {{"direct", 3}, {"dial_out", 2}, {"relayed", 1},
                      {"not_direct", json::array({{{"a", "node_1"}, {"b", "node_2"}, {"via", "node_5"}}})}};
  view.setLinks(links);
  view.setRelays(json::array({{{"name", "node_5"}, {"address", "10.0.0.5:7300"}, {"alive", false},
                               {"links", 1}, {"messages_forwarded", 7}, {"bytes_forwarded", 9000},
                               {"bytes_waiting", 0}, {"refused", 2}}}));
  EXPECT_EQ(view.snapshot(1000)["links"], links);
  EXPECT_EQ(view.snapshot(1000)["relays"][0]["name"], "node_5");
  std::map<std::string, double> got = samplesByKey(view.prometheus(1000), &types);
  EXPECT_EQ(got["cairn_links via=direct"], 3);
  EXPECT_EQ(got["cairn_links via=dial_out"], 2);
  EXPECT_EQ(got["cairn_links via=relayed"], 1);
  EXPECT_EQ(got["cairn_volunteer_relay_bytes_forwarded_total relay=node_5"], 9000);
  EXPECT_EQ(got["cairn_volunteer_relay_messages_forwarded_total relay=node_5"], 7);
  EXPECT_EQ(got["cairn_volunteer_relay_refused_total relay=node_5"], 2);
  EXPECT_EQ(got["cairn_volunteer_relay_links relay=node_5"], 1);
  EXPECT_EQ(got.count("cairn_volunteer_relay_alive relay=node_5"), 1u);
  EXPECT_EQ(got["cairn_volunteer_relay_alive relay=node_5"], 0);
  EXPECT_EQ(types["cairn_links"], "gauge");
  EXPECT_EQ(types["cairn_volunteer_relay_bytes_forwarded_total"], "counter");
}

TEST(TerminalView, RendersClustersNodesAndEventsWithoutControlCharactersFromVolunteers) {
  RunView view("");
  setUp(view);
  feed(view);
  const json snap = view.snapshot(1012.5);
  const std::string plain = renderRunView(snap, /*tty=*/false);
  EXPECT_NE(plain.find("cluster 0: step 30/100  loss 1.0667"), std::string::npos) << plain;
  EXPECT_NE(plain.find("evil\"?<script>"), std::string::npos) << "the newline is replaced";
  EXPECT_EQ(plain.find('\033'), std::string::npos);
  // Lines: the run, 2 clusters, 5 nodes, then events.
  EXPECT_EQ(plain.substr(0, plain.find('\n')), "run training: 5 volunteers, 2 cluster(s), 124 records (7 dropped by volunteers)");
  EXPECT_NE(plain.find(" paused: <img src=x onerror=alert(1)>"), std::string::npos) << plain;
  const std::string later = renderRunView(snap, false, 1002.0);
  EXPECT_EQ(later.find(" paused: <img"), std::string::npos) << "events up to 1002 were printed already";
  EXPECT_EQ(printable("a\033[2Jb\x7f"), "a?[2Jb?");
}

}  // namespace
}  // namespace cairn::coordinator::testing
