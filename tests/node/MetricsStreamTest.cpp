// The volunteer's metrics stream (node/volunteer/MetricsQueue.h, node/volunteer/VolunteerMetrics.h) and its messages
// (`metrics` / `metrics_ack`, node/protocol/Coordination.h):
//   - decode refuses each malformed field with a reason naming it; encode → decode round-trips;
//   - the queue drops the oldest when full and counts it, numbers records 0, 1, 2, …, removes
//     only acknowledged ones;
//   - against a fake coordinator (a CurveZMQ ROUTER): every record arrives once, in order, as the
//     line pushed; an unacknowledged batch is sent again; a coordinator that is down gets nothing
//     queued in ZeroMQ, and once it is up gets exactly the newest `capacity` records with the
//     dropped count.
#include <gtest/gtest.h>

#include <thread>

#include "node/volunteer/CoordinationSocket.h"
#include "node/transport/CurveSecurity.h"
#include "node/volunteer/MetricsQueue.h"
#include "node/volunteer/VolunteerMetrics.h"
#include "node/protocol/Coordination.h"
#include "tests/common/FakeCoordinator.h"
#include "tests/common/LoopbackPorts.h"

namespace cairn {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// A metrics header with `patch` applied (null values remove the key).
Frames metricsFrames(const json& patch) {
  json h = {{"protocol", kCoordinationProtocol}, {"type", "metrics"}, {"name", "node_1"},
            {"stream", "ab12"}, {"seq", 0}, {"records", json::array({{{"step", 1}, {"loss", 0.5}}})},
            {"dropped", 0}};
  h.merge_patch(patch);
  return {h.dump()};
}

std::string refused(const Frames& f) {
  std::string why;
  const auto m = decodeToCoordinator(f, 1 << 20, &why);
  EXPECT_FALSE(m.has_value()) << f[0];
  return why;
}

TEST(MetricsMessages, RoundTrip) {
  MetricsBatch b{"node_3", "0f1e", 17, {{{"step", 5}, {"loss", nullptr}}, {{"state", "paused"}, {"message", "x"}}}, 4};
  std::string why;
  const auto m = decodeToCoordinator(encode(b), 1 << 20, &why);
  ASSERT_TRUE(m.has_value()) << why;
  const auto& got = std::get<MetricsBatch>(*m);
  EXPECT_EQ(got.name, "node_3");
  EXPECT_EQ(got.stream, "0f1e");
  EXPECT_EQ(got.seq, 17);
  EXPECT_EQ(got.dropped, 4);
  EXPECT_EQ(json(got.records), json(b.records));
  const auto ack = decodeToVolunteer(encode(MetricsAck{"node_3", "0f1e", 19}), 1 << 20, &why);
  ASSERT_TRUE(ack.has_value()) << why;
  EXPECT_EQ(std::get<MetricsAck>(*ack).seq, 19);
  EXPECT_EQ(std::get<MetricsAck>(*ack).stream, "0f1e");
}

TEST(MetricsMessages, MalformedFieldsAreRefusedWithTheirReason) {
  EXPECT_EQ(refused(metricsFrames({{"name", nullptr}})), "metrics: \"name\" must be a string");
  EXPECT_EQ(refused(metricsFrames({{"seq", -1}})),
            "metrics: \"seq\" must be an integer in [0, " + std::to_string(INT64_MAX / 2) + "]");
  EXPECT_EQ(refused(metricsFrames({{"dropped", "3"}})), "metrics: \"dropped\" must be an integer");
  EXPECT_EQ(refused(metricsFrames({{"stream", "AB"}})),
            "metrics: \"stream\" must be 1 to 64 characters 0-9 and a-z");
  EXPECT_EQ(refused(metricsFrames({{"stream", ""}})), "metrics: \"stream\" must be a non-empty string");
  EXPECT_EQ(refused(metricsFrames({{"records", json::object()}})),
            "metrics: \"records\" must be an array of at most 4096 records");
  EXPECT_EQ(refused(metricsFrames({{"records", json::array({json::object(), 3})}})),
            "metrics: records[1] must be a JSON object");
  EXPECT_EQ(refused(metricsFrames({{"records", json::array({{{"step", -2}}})}})),
            "metrics: records[0] \"step\" must be a non-negative integer");
  EXPECT_EQ(refused(metricsFrames({{"records", json::array({{{"step", 1.5}}})}})),
            "metrics: records[0] \"step\" must be a non-negative integer");
  EXPECT_EQ(refused(metricsFrames({{"records", json::array({{{"state", 7}}})}})),
            "metrics: records[0] \"state\" must be a string of 1 to 64 bytes");
  EXPECT_EQ(refused(metricsFrames({{"records", json::array({{{"node", "node_9"}}})}})),
            "metrics: records[0] has the key \"node\", which the coordinator adds");
  json many = json::array();
  for (int i = 0; i < 4097; ++i) many.push_back(json::object());
  EXPECT_EQ(refused(metricsFrames({{"records", many}})),
            "metrics: \"records\" must be an array of at most 4096 records");
  Frames with_attachment = metricsFrames(json::object());
  with_attachment.push_back("x");
  EXPECT_EQ(refused(with_attachment), "metrics: 1 attachments, expected 0");
  std::string why;
  json ack = {{"protocol", kCoordinationProtocol}, {"type", "metrics_ack"}, {"name", "n"}, {"stream", "a"}};
  EXPECT_FALSE(decodeToVolunteer({ack.dump()}, 1 << 20, &why).has_value());
  EXPECT_EQ(why, "metrics_ack: \"seq\" must be an integer");
}

TEST(MetricsQueue, DropsTheOldestWhenFullAndCountsIt) {
  MetricsQueue q(3, 10);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(q.push("r" + std::to_string(i)), i);
  EXPECT_EQ(q.size(), 3u);
  EXPECT_EQ(q.dropped(), 2);
  auto front = q.peek(10, 1000);
  ASSERT_EQ(front.size(), 3u);
  EXPECT_EQ(front[0].seq, 2);
  EXPECT_EQ(front[0].line, "r2");
  EXPECT_EQ(front[2].seq, 4);
  EXPECT_EQ(q.peek(2, 1000).size(), 2u);
  EXPECT_EQ(q.peek(10, 3).size(), 1u);  // at least one, then within the byte limit
  EXPECT_EQ(q.size(), 3u) << "peek removes nothing";
  q.acknowledge(4);
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q.frontSeq(), 4);
  EXPECT_EQ(q.push(std::string(11, 'x')), 5);  // over max_line_bytes: dropped, counted
  EXPECT_EQ(q.dropped(), 3);
  EXPECT_EQ(q.size(), 1u);
  q.acknowledge(100);
  EXPECT_EQ(q.size(), 0u);
  EXPECT_EQ(q.frontSeq(), 6);
}

// The fake coordinator (tests/common/FakeCoordinator.h) reading metrics batches.
struct MetricsStreamFakeCoordinator : testing::FakeCoordinator {
  explicit MetricsStreamFakeCoordinator(int port = 0, CurveKeyPair k = generateCurveKeyPair())
      : testing::FakeCoordinator(1 << 20, port, std::move(k)) {}
  std::optional<std::pair<Routed, MetricsBatch>> batch(std::chrono::milliseconds wait) {
    return next<MetricsBatch>(wait, "metrics");
  }
  void ack(const Routed& to, const MetricsBatch& b) {
    answer(to, MetricsAck{b.name, b.stream, b.seq + int64_t(b.records.size())});
  }
};

MetricsStreamOptions metricsStreamFast(size_t capacity = 1000) {
  MetricsStreamOptions o;
  o.capacity = capacity;
  o.interval = 20ms;
  o.ack_timeout = 300ms;
  o.batch_records = 16;
  return o;
}

json stepRecord(int step) { return {{"step", step}, {"loss", 1.0 / (step + 1)}, {"compute_s", 0.01}}; }

TEST(VolunteerMetrics, EveryRecordArrivesOnceInOrderAndProgressFollowsTheSteps) {
  MetricsStreamFakeCoordinator coordinator;
  zmq::context_t context;
  VolunteerMetrics metrics(context, generateCurveKeyPair(), coordinator.invite(), "node_2", metricsStreamFast());
  EXPECT_EQ(metrics.progress(), std::make_pair(std::string("training"), int64_t(-1)));
  std::vector<std::string> lines;
  for (int step = 1; step <= 40; ++step) {
    const json r = stepRecord(step);
    lines.push_back(r.dump());
    metrics.record(r, lines.back());
  }
  metrics.event({{"state", "paused"}, {"message", "neighbour node_1 lost"}});
  EXPECT_EQ(metrics.progress(), std::make_pair(std::string("paused"), int64_t(40)));
  std::vector<json> got;
  std::thread finisher;
  while (got.size() < 41) {
    auto b = coordinator.batch(10s);
    ASSERT_TRUE(b.has_value()) << "only " << got.size() << " records arrived";
    EXPECT_EQ(b->second.name, "node_2");
    EXPECT_EQ(b->second.stream, metrics.stream());
    ASSERT_EQ(b->second.seq, int64_t(got.size())) << "records out of order or repeated";
    EXPECT_LE(b->second.records.size(), 16u);
    for (auto& r : b->second.records) got.push_back(r);
    coordinator.ack(b->first, b->second);
  }
  for (int i = 0; i < 40; ++i) EXPECT_EQ(got[size_t(i)].dump(), lines[size_t(i)]) << i;
  EXPECT_EQ(got[40]["state"], "paused");
  EXPECT_EQ(got[40]["message"], "neighbour node_1 lost");
  EXPECT_TRUE(got[40]["t"].is_number());
  EXPECT_TRUE(metrics.finish(5s)) << "everything was acknowledged";
  EXPECT_EQ(metrics.acknowledged(), 41);
}

TEST(VolunteerMetrics, AnUnacknowledgedBatchIsSentAgain) {
  MetricsStreamFakeCoordinator coordinator;
  zmq::context_t context;
  VolunteerMetrics metrics(context, generateCurveKeyPair(), coordinator.invite(), "node_4", metricsStreamFast());
  for (int step = 1; step <= 5; ++step) metrics.record(stepRecord(step), stepRecord(step).dump());
  auto first = coordinator.batch(10s);
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ(first->second.seq, 0);
  ASSERT_EQ(first->second.records.size(), 5u);
  // No ack (the coordinator died with it): after ack_timeout the same records come again.
  auto again = coordinator.batch(10s);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->second.seq, 0);
  EXPECT_EQ(json(again->second.records), json(first->second.records));
  coordinator.ack(again->first, again->second);
  EXPECT_TRUE(metrics.finish(5s));
}

TEST(VolunteerMetrics, ACoordinatorThatIsDownGetsTheNewestRecordsUpToTheBoundOnceUp) {
  const int port = testutil::freeLoopbackPorts(1)[0];
  const CurveKeyPair coordinator_keys = generateCurveKeyPair();
  Invite invite;
  invite.host = "127.0.0.1";
  invite.port = port;
  invite.coordinator_key = coordinator_keys.public_key;
  invite.token = "00112233445566778899aabbccddeeff";
  zmq::context_t context;
  VolunteerMetrics metrics(context, generateCurveKeyPair(), invite, "node_5", metricsStreamFast(/*capacity=*/20));
  for (int step = 1; step <= 50; ++step) metrics.record(stepRecord(step), stepRecord(step).dump());
  EXPECT_EQ(metrics.queue().dropped(), 30);
  EXPECT_EQ(metrics.queue().size(), 20u);
  std::this_thread::sleep_for(200ms);  // ~10 send attempts; not a synchronisation: none may go out
  EXPECT_EQ(metrics.batchesSent(), 0u) << "a send to a coordinator that is down was queued";
  MetricsStreamFakeCoordinator coordinator(port, coordinator_keys);  // the coordinator comes up
  std::vector<int64_t> steps;
  while (steps.size() < 20) {
    auto b = coordinator.batch(20s);
    ASSERT_TRUE(b.has_value()) << "only " << steps.size() << " records after the coordinator came up";
    EXPECT_EQ(b->second.dropped, 30);
    EXPECT_EQ(b->second.seq, 30 + int64_t(steps.size()));
    for (auto& r : b->second.records) steps.push_back(r["step"].get<int64_t>());
    coordinator.ack(b->first, b->second);
  }
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(steps[i], int64_t(31 + i)) << "the newest 20 steps";
  EXPECT_TRUE(metrics.finish(5s));
}

}  // namespace
}  // namespace cairn
