// RunView (coordinator/RunView.h): the run as the coordinator sees it, fed by hand with members,
// placement, heartbeats and metrics batches, checked against figures computed here from the same
// records: the snapshot's schema and values, the whole-run metrics.jsonl (every record once, as
// sent, tagged), a restarted view reading it back (same figures, resent records not taken twice,
// a cut last line dropped), the run's phase as a user reads it (gathering, planned, training once
// placed volunteers send steps, done), thinned histories, and the Prometheus text parsed by a
// small parser of its own — with a hostile node name (quotes, newline, backslash, <script>) raw in
// the JSON and escaped per the exposition format in the labels.
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

namespace cairn::coordinator {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kEvil = "evil\"\n<script>alert(1)</script>\\x";

struct TempDir {
  std::string path;
  TempDir() {
    path = (fs::temp_directory_path() /
            ("cairn_runview_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}())))
               .string();
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

Member runViewMember(const std::string& name, const std::string& address, MemberState state) {
  Member m;
  m.name = name;
  m.advertise = address;
  m.state = state;
  return m;
}

json stepRecord(int64_t step, double loss, double sps, double compute, double send, double wait) {
  return {{"step", step}, {"epoch", 0}, {"loss", loss}, {"lr", 0.1}, {"samples_per_s", sps},
          {"compute_s", compute}, {"send_s", send}, {"wait_s", wait}};
}

std::vector<json> readLines(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

// Two clusters of two stages: node_1 > node_2 and node_3 > <evil>; node_5 a spare.
void setUp(RunView& view) {
  view.syncMembers({runViewMember("node_1", "10.0.0.1:1", MemberState::kAssigned),
                    runViewMember("node_2", "10.0.0.2:1", MemberState::kAssigned),
                    runViewMember("node_3", "10.0.0.3:1", MemberState::kAssigned),
                    runViewMember(kEvil, "<b>x</b>:1", MemberState::kAssigned),
                    runViewMember("node_5", "10.0.0.5:1", MemberState::kSpare)},
                   1000);
  view.place({"node_1", 0, 0, 2});
  view.place({"node_2", 0, 1, 2});
  view.place({"node_3", 1, 0, 2});
  view.place({kEvil, 1, 1, 2});
  view.setNumClusters(2);
  view.setPhase("planned");
}

struct Fed {
  std::vector<MetricsBatch> batches;
};

// The batches of the run: plans from the Roots, 30 steps on every node, an evaluation, a state.
Fed feed(RunView& view) {
  Fed fed;
  for (const std::string root : {"node_1", "node_3"})
    fed.batches.push_back({root, "s" + std::to_string(root.back()), 0,
                           {{{"plan", {{"total_steps", 100}, {"steps_per_epoch", 50}, {"batch_size", 32}}}, {"t", 1001.0}}},
                           0});
  const std::vector<std::string> names = {"node_1", "node_2", "node_3", kEvil};
  for (size_t k = 0; k < names.size(); ++k) {
    MetricsBatch b{names[k], "t" + std::to_string(k), 0, {}, 0};
    for (int64_t step = 1; step <= 30; ++step)
      b.records.push_back(stepRecord(step, 2.0 / double(step) + double(k), 100.0 * double(step) + double(k),
                                     0.01 * double(step), 0.001 * double(k + 1), 0.002 * double(step % 3)));
    if (k == 1) b.records.push_back({{"eval", {{"step", 30}, {"samples", 10}, {"loss", 0.7}, {"accuracy", 0.8}, {"perplexity", -1}}}});
    if (k == 3) b.records.push_back({{"state", "paused"}, {"message", "<img src=x onerror=alert(1)>"}, {"t", 1002.0}});
    b.dropped = k == 3 ? 7 : 0;
    fed.batches.push_back(b);
  }
  for (const auto& b : fed.batches) view.ingest(b, 1003);
  view.heartbeat("node_2", "training", 30, 1010);
  return fed;
}

double meanLast(const std::function<double(int64_t)>& f, int64_t last, int64_t count) {
  double sum = 0;
  for (int64_t s = last - count + 1; s <= last; ++s) sum += f(s);
  return sum / double(count);
}

TEST(RunView, SnapshotHasTheSchemaAndTheFiguresOfTheRecords) {
  TempDir dir;
  RunView view(dir.path);
  setUp(view);
  feed(view);
  const json snap = view.snapshot(1012.5);
  EXPECT_EQ(snap["run"]["phase"], "training") << "planned, and the placed volunteers sent steps";
  EXPECT_EQ(snap["run"]["now"], 1012.5);
  EXPECT_EQ(snap["run"]["num_clusters"], 2);
  EXPECT_EQ(snap["run"]["members"], 5);
  EXPECT_EQ(snap["run"]["records"], 2 + 4 * 30 + 2);
  EXPECT_EQ(snap["run"]["dropped"], 7);
  ASSERT_EQ(snap["clusters"].size(), 2u);
  const json& c0 = snap["clusters"][0];
  EXPECT_EQ(c0["id"], 0);
  EXPECT_EQ(c0["nodes"], json::array({"node_1", "node_2"}));
  EXPECT_EQ(c0["step"], 30);
  EXPECT_EQ(c0["max_steps"], 100);
  // The Leaf (node_2, k = 1) decides the cluster's loss and rate.
  EXPECT_DOUBLE_EQ(c0["loss"].get<double>(), 2.0 / 30 + 1);
  const double rate = meanLast([](int64_t s) { return 100.0 * double(s) + 1; }, 30, 20);
  EXPECT_DOUBLE_EQ(c0["samples_per_s"].get<double>(), rate);
  EXPECT_NEAR(c0["eta_s"].get<double>(), 70.0 * 32.0 / rate, 1e-9);
  ASSERT_EQ(c0["loss_history"].size(), 30u);
  EXPECT_EQ(c0["loss_history"][0], json::array({1, 3.0}));
  EXPECT_EQ(c0["throughput_history"][29], json::array({30, 3001.0}));
  EXPECT_EQ(c0["eval_history"], json::parse(R"([[30, "loss", 0.7], [30, "accuracy", 0.8]])"));
  const json& c1 = snap["clusters"][1];
  EXPECT_EQ(c1["nodes"], json::array({"node_3", kEvil}));
  EXPECT_DOUBLE_EQ(c1["loss"].get<double>(), 2.0 / 30 + 3);
  EXPECT_TRUE(c1["eval_history"].empty());
  std::map<std::string, json> nodes;
  for (const auto& n : snap["nodes"]) nodes[n["name"].get<std::string>()] = n;
  ASSERT_EQ(nodes.size(), 5u);
  EXPECT_EQ(nodes["node_1"]["role"], "root");
  EXPECT_EQ(nodes["node_2"]["role"], "leaf");
  EXPECT_EQ(nodes["node_5"]["role"], "spare");
  EXPECT_TRUE(nodes["node_5"]["cluster"].is_null());
  EXPECT_TRUE(nodes["node_5"]["stage"].is_null());
  EXPECT_TRUE(nodes["node_5"]["compute_s"].is_null());
  EXPECT_TRUE(nodes["node_5"]["heartbeat_age_s"].is_null());
  EXPECT_EQ(nodes["node_5"]["state"], "spare");
  EXPECT_DOUBLE_EQ(nodes["node_2"]["heartbeat_age_s"].get<double>(), 2.5);
  EXPECT_EQ(nodes["node_2"]["state"], "training");
  EXPECT_EQ(nodes["node_3"]["step"], 30);
  EXPECT_DOUBLE_EQ(nodes["node_3"]["compute_s"].get<double>(),
                   meanLast([](int64_t s) { return 0.01 * double(s); }, 30, 20));
  EXPECT_NEAR(nodes["node_3"]["send_s"].get<double>(), 0.003, 1e-15);
  EXPECT_DOUBLE_EQ(nodes["node_3"]["wait_s"].get<double>(),
                   meanLast([](int64_t s) { return 0.002 * double(s % 3); }, 30, 20));
  // Volunteer text stays raw in the JSON.
  EXPECT_EQ(nodes[kEvil]["state"], "paused");
  EXPECT_EQ(nodes[kEvil]["address"], "<b>x</b>:1");
  bool found = false;
  for (const auto& e : snap["events"])
    if (e["node"] == kEvil && e["kind"] == "paused") {
      EXPECT_EQ(e["message"], "<img src=x onerror=alert(1)>");
      EXPECT_EQ(e["t"], 1002.0);
      found = true;
    }
  EXPECT_TRUE(found) << snap["events"].dump();
  EXPECT_LE(snap["events"].size(), 200u);
}

TEST(RunView, ThePhaseMovesFromGatheringToPlannedToTrainingAsTheStateSays) {
  TempDir dir;
  const std::vector<Placement> placement = {
      {"node_1", 0, 0, 2}, {"node_2", 0, 1, 2}, {"node_3", 1, 0, 2}, {kEvil, 1, 1, 2}};
  auto phase = [](const RunView& v) { return v.snapshot(1010)["run"]["phase"].get<std::string>(); };
  {
    RunView view(dir.path);
    EXPECT_EQ(phase(view), "gathering") << "no plan yet";
    // A step record of a node not placed (yet) is not the run training.
    view.syncMembers({runViewMember("node_1", "10.0.0.1:1", MemberState::kSpare)}, 1000);
    view.ingest({"node_1", "early", 0, {stepRecord(1, 2.0, 100, 0.01, 0.001, 0.002)}, 0}, 1000);
    EXPECT_EQ(phase(view), "gathering");
    setUp(view);  // placed, and the coordinator says planned
    EXPECT_EQ(phase(view), "planned") << "a step of a node before it was placed does not count";
    // The Roots' plans, state changes and heartbeats are not steps.
    const json plan = {{"plan", {{"total_steps", 100}, {"steps_per_epoch", 50}, {"batch_size", 32}}}};
    const json state = {{"state", "training"}, {"message", "started"}, {"t", 1001.0}};
    view.ingest({"node_1", "s1", 0, {plan, state}, 0}, 1001);
    view.heartbeat("node_2", "training", 0, 1001);
    EXPECT_EQ(phase(view), "planned");
    view.ingest({"node_3", "t3", 0, {stepRecord(1, 2.0, 100, 0.01, 0.001, 0.002)}, 0}, 1002);
    EXPECT_EQ(phase(view), "training") << "a placed volunteer's step record: its cluster trains";
    EXPECT_EQ(view.snapshot(1010)["clusters"][1]["step"], 0) << "a Root's step, not yet its Leaf's";
    const std::string plain = renderRunView(view.snapshot(1010), /*tty=*/false);
    EXPECT_EQ(plain.rfind("run training: ", 0), 0u) << plain;
    view.setPhase("done");
    EXPECT_EQ(phase(view), "done") << "the results are merged";
  }
  // A restarted coordinator: the step records read back say the planned run trains.
  RunView again(dir.path, placement);
  EXPECT_EQ(phase(again), "gathering") << "until the coordinator sets its phase";
  again.setPhase("planned");
  EXPECT_EQ(phase(again), "training");
}

TEST(RunView, MetricsJsonlHoldsEveryRecordOnceTaggedAndARestartContinues) {
  TempDir dir;
  Fed fed;
  json before;
  {
    RunView view(dir.path);
    setUp(view);
    fed = feed(view);
    before = view.snapshot(2000);
  }
  const auto lines = readLines(dir.path + "/metrics.jsonl");
  size_t expected = 0;
  for (const auto& b : fed.batches) expected += b.records.size();
  ASSERT_EQ(lines.size(), expected);
  std::map<std::pair<std::string, int64_t>, json> by_key;  // (stream, seq) → line
  for (const auto& l : lines) by_key[{l["stream"].get<std::string>(), l["seq"].get<int64_t>()}] = l;
  ASSERT_EQ(by_key.size(), expected);
  for (const auto& b : fed.batches)
    for (size_t i = 0; i < b.records.size(); ++i) {
      json line = by_key.at({b.stream, b.seq + int64_t(i)});
      EXPECT_EQ(line["node"], b.name);
      const int cluster = b.name == "node_1" || b.name == "node_2" ? 0 : 1;
      EXPECT_EQ(line["cluster"], cluster);
      for (const char* tag : {"node", "cluster", "stream", "seq"}) line.erase(tag);
      EXPECT_EQ(line, b.records[i]);
    }
  // A restarted coordinator: the same figures, and a resent batch adds nothing.
  {
    std::ofstream cut(dir.path + "/metrics.jsonl", std::ios::app);
    cut << R"({"step": 31, "loss")";  // the coordinator died in the middle of a line
  }
  RunView again(dir.path, {{"node_1", 0, 0, 2}, {"node_2", 0, 1, 2}, {"node_3", 1, 0, 2}, {kEvil, 1, 1, 2}});
  setUp(again);
  json after = again.snapshot(2000);
  EXPECT_EQ(after["clusters"], before["clusters"]);
  EXPECT_EQ(after["run"]["records"], before["run"]["records"]);
  EXPECT_EQ(after["run"]["dropped"], 0) << "known again with each stream's next batch";
  again.ingest(fed.batches.back(), 2000);  // <evil>'s batch again: nothing new but its count
  EXPECT_EQ(again.snapshot(2000)["run"]["dropped"], 7);
  const MetricsBatch& leaf = fed.batches[3];  // node_2, the Leaf of cluster 0
  ASSERT_EQ(leaf.name, "node_2");
  const MetricsAck ack = again.ingest(leaf, 2001);
  EXPECT_EQ(ack.seq, int64_t(leaf.records.size()));
  EXPECT_EQ(ack.stream, leaf.stream);
  EXPECT_EQ(readLines(dir.path + "/metrics.jsonl").size(), expected) << "a resend was taken twice";
  MetricsBatch more{"node_2", leaf.stream, ack.seq - 1,
                    {stepRecord(30, 9, 1, 0, 0, 0), stepRecord(31, 0.5, 1, 0, 0, 0)}, 0};
  EXPECT_EQ(again.ingest(more, 2002).seq, ack.seq + 1) << "only the new record is taken";
  EXPECT_EQ(readLines(dir.path + "/metrics.jsonl").size(), expected + 1);
  EXPECT_EQ(again.snapshot(2003)["clusters"][0]["step"], 31);
}

TEST(RunView, ASpareTakingALostNodeOverIsAReplacementAndTheLostRowAnEvent) {
  RunView view("");
  setUp(view);
  // As CoordinatorStore::takeOver leaves the rows: node_5 (the spare) now holds node_3's name.
  view.syncMembers({runViewMember("node_1", "10.0.0.1:1", MemberState::kAssigned),
                    runViewMember("node_2", "10.0.0.2:1", MemberState::kAssigned),
                    runViewMember("node_3", "10.0.0.5:1", MemberState::kAssigned),
                    runViewMember(kEvil, "<b>x</b>:1", MemberState::kAssigned),
                    runViewMember("node_3-lost-1", "10.0.0.3:1", MemberState::kLost)},
                   1100);
  const json snap = view.snapshot(1100);
  std::map<std::string, json> nodes;
  for (const auto& n : snap["nodes"]) nodes[n["name"].get<std::string>()] = n;
  EXPECT_EQ(nodes.count("node_5"), 0u) << "the spare's old name is gone";
  EXPECT_EQ(nodes["node_3"]["address"], "10.0.0.5:1");
  EXPECT_EQ(nodes["node_3"]["cluster"], 1) << "the node keeps its place";
  EXPECT_EQ(nodes["node_3-lost-1"]["state"], "lost");
  EXPECT_EQ(nodes["node_3-lost-1"]["role"], "spare");
  std::map<std::string, json> last_event;
  for (const auto& e : snap["events"]) last_event[e["node"].get<std::string>()] = e;
  EXPECT_EQ(last_event["node_3"]["kind"], "replaced");
  EXPECT_EQ(last_event["node_3"]["message"], "now at 10.0.0.5:1 (was 10.0.0.3:1)");
  EXPECT_EQ(last_event["node_3-lost-1"]["kind"], "lost");
  EXPECT_EQ(snap["clusters"][1]["nodes"], json::array({"node_3", kEvil}));
}

TEST(RunView, LongVolunteerMessagesAreClippedWithoutCuttingACharacter) {
  RunView view("");
  std::string message(510, 'a');
  for (int i = 0; i < 1000; ++i) message += "\xc3\xa9";  // é, 2 bytes each
  view.ingest({"n", "s", 0, {{{"state", "failed"}, {"message", message}}}, 0}, 5);
  const json e = view.snapshot(5)["events"].back();
  const std::string got = e["message"].get<std::string>();
  EXPECT_EQ(got, std::string(510, 'a') + "\xc3\xa9" + "…") << "cut before the character that crosses 512 bytes";
  EXPECT_NO_THROW(view.snapshot(5).dump()) << "valid UTF-8";
  EXPECT_EQ(e["kind"], "failed");
}

// The coordinator's thread writes while other threads (the web server's, the terminal view's)
// read: every snapshot is whole (its record count never goes back, its Leaf step matches the
// count) and the last one sees everything. tools/tsan.sh-style runs check the locking.
TEST(RunView, ReadersOnOtherThreadsSeeWholeSnapshotsWhileTheCoordinatorWrites) {
  RunView view("");
  view.place({"a", 0, 0, 1});
  std::atomic<bool> done{false};
  std::vector<std::thread> readers;
  std::atomic<int> bad{0};
  for (int r = 0; r < 3; ++r)
    readers.emplace_back([&] {
      uint64_t last = 0;
      while (!done) {
        const json snap = view.snapshot(1);
        const uint64_t records = snap["run"]["records"].get<uint64_t>();
        if (records < last || snap["clusters"][0]["step"].get<uint64_t>() != records) ++bad;
        last = records;
        if (view.prometheus(1).find("cairn_cluster_step{cluster=\"0\"} " + std::to_string(records)) ==
            std::string::npos && view.snapshot(1)["run"]["records"] == records)
          ++bad;
      }
    });
  for (int64_t step = 1; step <= 2000; ++step)
    view.ingest({"a", "s", step - 1, {stepRecord(step, 1, 1, 0, 0, 0)}, 0}, 0);
  done = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(view.snapshot(1)["run"]["records"], 2000);
}

TEST(RunView, HistoriesAreThinnedToAtMost500PointsKeepingTheFirstAndTheNewest) {
  RunView view("");
  view.place({"a", 0, 0, 1});
  for (int64_t step = 1; step <= 2345; ++step)
    view.ingest({"a", "s", step - 1, {stepRecord(step, 1.0 / double(step), double(step), 0, 0, 0)}, 0}, 0);
  const json c = view.snapshot(0)["clusters"][0];
  EXPECT_EQ(c["nodes"], json::array({"a"}));
  EXPECT_EQ(view.snapshot(0)["nodes"][0]["role"], "whole");
  for (const char* key : {"loss_history", "throughput_history"}) {
    const json& h = c[key];
    EXPECT_LE(h.size(), 500u);
    EXPECT_GE(h.size(), 250u);
    EXPECT_EQ(h.front()[0], 1);
    EXPECT_EQ(h.back()[0], 2345);
    for (size_t i = 1; i < h.size(); ++i) EXPECT_LT(h[i - 1][0].get<int64_t>(), h[i][0].get<int64_t>());
  }
  EXPECT_DOUBLE_EQ(c["loss_history"].back()[1].get<double>(), 1.0 / 2345);
}

// An independent reader of the exposition format: `name{k="v",…} value` lines, label values
// unescaped (\\, \", \n); # lines checked for HELP/TYPE before the family's samples.
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
}  // namespace cairn::coordinator
