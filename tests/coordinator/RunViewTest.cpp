// RunView (coordinator/RunView.h): the run as the coordinator sees it, fed by hand with members,
// placement, heartbeats and metrics batches, checked against figures computed here from the same
// records: the snapshot's schema and values, the whole-run metrics.jsonl (every record once, as
// sent, tagged), a restarted view reading it back (same figures, resent records not taken twice,
// a cut last line dropped), the run's phase as a user reads it (gathering, planned, training once
// placed volunteers send steps, done) and thinned histories. The Prometheus text and the
// terminal view: RunViewPrometheusTest.cpp.
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

}  // namespace
}  // namespace cairn::coordinator::testing
