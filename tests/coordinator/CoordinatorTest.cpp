// The coordinator's own parts (its SQLite store: CoordinatorStoreTest.cpp): the join policy
// against each bad join (libtorch versions and GPU bounds included) and plan.json's libtorch
// record. A live coordinator on loopback: LiveCoordinatorTest.cpp (the whole flow with real
// providers is tests/integration/volunteer_test.py).
#include <gtest/gtest.h>

#include <future>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "clusterize/NodeDataWriter.h"
#include "coordinator/Coordinator.h"
#include "coordinator/CoordinatorStore.h"
#include "tests/coordinator/MemberRows.h"
#include "coordinator/JoinPolicy.h"
#include "coordinator/RunAssembly.h"
#include "core/CurveKeys.h"
#include "core/Error.h"
#include "core/GpuFigures.h"
#include "core/JsonReader.h"
#include "core/NodeData.h"
#include "core/TorchCompat.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/transport/CurveSecurity.h"
#include "node/transport/Relay.h"
#include "tests/common/LoopbackPorts.h"
#include "tests/coordinator/LiveCoordinatorHarness.h"

// The harness (LiveCoordinatorHarness.h) is cairn::coordinator::testing's: so are these tests.
namespace cairn::coordinator::testing {
namespace {

using test_rows::memberRow;

TEST(JoinPolicy, EachBadJoinIsRefusedWithItsReason) {
  const std::string key = generateCurveKeyPair().public_key, other = generateCurveKeyPair().public_key;
  const std::vector<Member> members = {
      memberRow("node_0", other, "127.0.0.1:7001", MemberState::kAssigned),
      memberRow("node_1", generateCurveKeyPair().public_key, "127.0.0.1:7009", MemberState::kLost)};
  auto reason = [&](JoinAsk ask, const std::set<std::string>& allowed = {},
                    const std::string& k = "") {
    const JoinDecision d = decideJoin(ask, k.empty() ? key : k, kToken, allowed, members, "1.13.0");
    EXPECT_EQ(d.kind, JoinDecision::Kind::kRefused) << "accepted: " << ask.advertise;
    return d.reason;
  };
  JoinAsk ask = goodAsk("127.0.0.1:7100");
  ask.token = "ffff" + kToken.substr(4);
  EXPECT_EQ(reason(ask), "wrong invite token");
  EXPECT_NE(reason(goodAsk("127.0.0.1:7100"), {other}).find("not on the coordinator's allowlist"),
            std::string::npos);
  ask = goodAsk("127.0.0.1:7100");
  ask.probe.ram_gb = -1;
  EXPECT_NE(reason(ask).find("probe.ram_gb"), std::string::npos);
  ask = goodAsk("127.0.0.1:7100");
  ask.probe.cores = 0;
  EXPECT_NE(reason(ask).find("probe.cores"), std::string::npos);
  ask = goodAsk("127.0.0.1:7100");
  ask.probe.compute_gflops = 1e12;
  EXPECT_NE(reason(ask).find("probe.compute_gflops"), std::string::npos);
  ask = goodAsk("127.0.0.1:7100");
  ask.probe.bandwidth_mbps = 0;
  EXPECT_NE(reason(ask).find("probe.bandwidth_mbps"), std::string::npos);
  EXPECT_NE(reason(goodAsk("0.0.0.0:7100")).find("not an address peers can dial"), std::string::npos);
  EXPECT_NE(reason(goodAsk("127.0.0.1")).find("host:port"), std::string::npos);
  EXPECT_NE(reason(goodAsk("127.0.0.1:7001")).find("already taken by node_0"), std::string::npos);
  ask = goodAsk("127.0.0.1:7100");
  ask.name = "node_0";
  EXPECT_NE(reason(ask).find("belongs to another key"), std::string::npos);
  ask.name = "node_7";
  EXPECT_NE(reason(ask).find("no member is called node_7"), std::string::npos);
  // The volunteer that was lost cannot come back under its key asking for its old name (it comes
  // back without it: Replacement.AVolunteerThatLeftOrWasLostComesBackWithoutItsName).
  ask = goodAsk("127.0.0.1:7100");
  ask.name = "node_1";
  EXPECT_NE(reason(ask, {}, members[1].public_key).find("node_1 is lost in this run and cannot come back"),
            std::string::npos);
  EXPECT_NE(reason(goodAsk("127.0.0.1:7100"), {}, "not a key").find("no CURVE key"), std::string::npos);

  // No address (dial-out only): let in, and two such volunteers never share "an address".
  std::vector<Member> behind = members;
  behind.push_back(memberRow("node_5", "k5", "", MemberState::kSpare));
  EXPECT_EQ(decideJoin(goodAsk(""), key, kToken, {}, behind, "1.13.0").kind, JoinDecision::Kind::kNew);

  // And the two good cases.
  EXPECT_EQ(decideJoin(goodAsk("127.0.0.1:7100"), key, kToken, {}, members, "1.13.0").kind,
            JoinDecision::Kind::kNew);
  ask = goodAsk("127.0.0.1:7002");  // node_0 back at a new address, under its own key
  ask.name = "node_0";
  const JoinDecision back = decideJoin(ask, other, kToken, {key, other}, members, "1.13.0");
  EXPECT_EQ(back.kind, JoinDecision::Kind::kReturning);
  ASSERT_TRUE(back.member.has_value());
  EXPECT_EQ(back.member->name, "node_0");
}

// A relay (provider --relay): must give an address; loads no stage file, so its libtorch is not
// compared; a member that relays cannot come back training, nor a training one as a relay.
TEST(JoinPolicy, ARelayNeedsAnAddressAndStaysARelay) {
  const std::string key = generateCurveKeyPair().public_key, relay_key = generateCurveKeyPair().public_key;
  const std::vector<Member> members = {
      memberRow("node_0", key, "127.0.0.1:7001", MemberState::kSpare),
      memberRow("node_1", relay_key, "127.0.0.1:7301", MemberState::kRelaying)};
  JoinAsk relay = goodAsk("");
  relay.relay_mbps = 100;
  JoinDecision d = decideJoin(relay, generateCurveKeyPair().public_key, kToken, {}, {}, "1.13.0");
  EXPECT_EQ(d.kind, JoinDecision::Kind::kRefused);
  EXPECT_NE(d.reason.find("a relay must be reachable"), std::string::npos) << d.reason;
  relay.advertise = "127.0.0.1:7300";
  relay.probe.libtorch = "1.12.0";  // older than the stage files: no matter for a relay
  EXPECT_EQ(decideJoin(relay, generateCurveKeyPair().public_key, kToken, {}, {}, "2.11.0").kind,
            JoinDecision::Kind::kNew);
  relay.probe.libtorch = "1.13.0";
  d = decideJoin(relay, key, kToken, {}, members, "1.13.0");  // node_0 trains
  EXPECT_EQ(d.kind, JoinDecision::Kind::kRefused);
  EXPECT_NE(d.reason.find("node_0 is a training volunteer in this run (spare): join again without --relay"),
            std::string::npos) << d.reason;
  d = decideJoin(goodAsk("127.0.0.1:7301"), relay_key, kToken, {}, members, "1.13.0");
  EXPECT_EQ(d.kind, JoinDecision::Kind::kRefused);
  EXPECT_NE(d.reason.find("node_1 relays in this run: join again with --relay"), std::string::npos) << d.reason;
  relay.advertise = "127.0.0.1:7301";  // node_1 restarted: back as the relay it was
  d = decideJoin(relay, relay_key, kToken, {}, members, "1.13.0");
  EXPECT_EQ(d.kind, JoinDecision::Kind::kReturning);
  EXPECT_EQ(d.member->name, "node_1");
}

// Stage files written by libtorch 1.13 load under 2.11; the other direction is not checked, so a
// volunteer older (major.minor) than the libtorch that wrote the plan's stage files is refused
// with a sentence naming both versions, and an equal or newer one (any patch level) is let in.
TEST(JoinPolicy, AVolunteerWhoseLibtorchIsOlderThanTheStageFilesIsRefusedWithBothVersions) {
  const std::string key = generateCurveKeyPair().public_key;
  auto decide = [&](const std::string& volunteer, const std::string& writer,
                    const std::string& name = "") {
    JoinAsk ask = goodAsk("127.0.0.1:7100");
    ask.probe.libtorch = volunteer;
    ask.name = name;
    return decideJoin(ask, key, kToken, {}, {}, writer);
  };
  JoinDecision d = decide("1.13.0", "2.11.0", "node_3");
  EXPECT_EQ(d.kind, JoinDecision::Kind::kRefused);
  EXPECT_EQ(d.reason,
            "node_3's libtorch 1.13.0 cannot load stage files written by libtorch 2.11.0; install "
            "cairn built against libtorch ≥ 2.11");
  d = decide("2.10.9", "2.11.0");
  EXPECT_EQ(d.kind, JoinDecision::Kind::kRefused);
  EXPECT_EQ(d.reason,
            "this volunteer's libtorch 2.10.9 cannot load stage files written by libtorch 2.11.0; "
            "install cairn built against libtorch ≥ 2.11");
  EXPECT_EQ(decide("1.9.0", "1.13.0").kind, JoinDecision::Kind::kRefused);  // 9 < 13, not "9" > "1"
  for (const auto& [volunteer, writer] : std::vector<std::pair<std::string, std::string>>{
           {"2.11.0", "2.11.0"}, {"2.11.0", "2.11.7"}, {"2.11.3", "2.11.0"}, {"2.12.0", "2.11.0"},
           {"3.0.0", "2.11.0"}, {"2.11.0", "1.13.0"}, {"1.13.0", "1.13.0"}, {"1.13.1", "1.13.0"}})
    EXPECT_EQ(decide(volunteer, writer).kind, JoinDecision::Kind::kNew)
        << volunteer << " refused for stage files of " << writer << ": " << decide(volunteer, writer).reason;
  d = decide("2.11", "2.11.0");  // a JoinAsk made in-process, never decoded
  EXPECT_EQ(d.kind, JoinDecision::Kind::kRefused);
  EXPECT_EQ(d.reason, "probe.libtorch \"2.11\" is not a libtorch version (major.minor.patch)");
}

TEST(JoinPolicy, GpuFiguresBeyondTheirBoundsAreRefusedNamingTheBound) {
  const std::string key = generateCurveKeyPair().public_key;
  JoinAsk ask = goodAsk("127.0.0.1:7100");
  ask.probe.gpus = {{"NVIDIA H100 80GB HBM3", 79.1, 51.0, 600.0, 25.0, 24.0}};
  EXPECT_EQ(decideJoin(ask, key, kToken, {}, {}, "1.13.0").kind, JoinDecision::Kind::kNew);
  ask.probe.gpus[0].bf16_tflops = 5000;
  JoinDecision d = decideJoin(ask, key, kToken, {}, {}, "1.13.0");
  EXPECT_EQ(d.kind, JoinDecision::Kind::kRefused);
  EXPECT_NE(d.reason.find("probe.gpus[0]: bf16_tflops must be at most 2000 TFLOP/s"), std::string::npos)
      << d.reason;
  ask.probe.gpus[0].bf16_tflops = 600;
  ask.probe.gpus[0].memory_gb = 500;
  d = decideJoin(ask, key, kToken, {}, {}, "1.13.0");
  EXPECT_NE(d.reason.find("memory_gb must be at most 400 GB"), std::string::npos) << d.reason;
}

TEST(JoinPolicy, TokenComparisonNeedsEveryCharacter) {
  EXPECT_TRUE(sameSecret(kToken, kToken));
  EXPECT_FALSE(sameSecret(kToken, kToken.substr(0, 31)));
  EXPECT_FALSE(sameSecret(kToken + "0", kToken));
  EXPECT_FALSE(sameSecret("", kToken));
  std::string last = kToken;
  last.back() = 'e';
  EXPECT_FALSE(sameSecret(last, kToken));
}

// plan.json records the libtorch that saved the stage files; a plan without it (written before
// the key) reads as 1.13.0; a broken value is BadInput naming the file and the key.
TEST(NodeDataWriter, PlanJsonRecordsTheLibtorchThatWroteTheStageFiles) {
  const std::string out = freshDir("plan_libtorch");
  EXPECT_FALSE(clusterize::NodeDataWriter::stageFilesLibtorch(out).has_value());  // no plan yet
  JobSpec job;
  job.job_id = "job";
  job.data.location = "/data";
  job.data.format = "idx";
  clusterize::NodeDataWriter(out, clusterize::NodeDataWriter::KeysGiven{})
      .write(clusterize::PartitionPlan{}, job, {}, {});
  nlohmann::json plan = readJsonFile(planPath(out));
  EXPECT_EQ(plan["libtorch"], libtorchVersion());
  EXPECT_EQ(clusterize::NodeDataWriter::stageFilesLibtorch(out).value_or(""), libtorchVersion());

  plan.erase("libtorch");  // an older plan
  writeJsonFile(planPath(out), plan);
  EXPECT_EQ(clusterize::NodeDataWriter::stageFilesLibtorch(out).value_or(""), "1.13.0");
  plan["libtorch"] = "2.11.0";
  writeJsonFile(planPath(out), plan);
  EXPECT_EQ(clusterize::NodeDataWriter::stageFilesLibtorch(out).value_or(""), "2.11.0");
  plan["libtorch"] = "2.11";
  writeJsonFile(planPath(out), plan);
  try {
    clusterize::NodeDataWriter::stageFilesLibtorch(out);
    FAIL() << "a plan.json with libtorch \"2.11\" was read";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("plan.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("libtorch must be"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cairn::coordinator::testing
