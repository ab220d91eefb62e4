// Grower (--grow) carrying out Growth.h's decisions over a real store and plan folder: what it
// proposes, whom it tells, when it assigns, and when it does nothing. Expected values are written
// out by hand from the fixture's plan.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "coordinator/DialOutPlacement.h"
#include "coordinator/Grower.h"
#include "coordinator/Growth.h"
#include "core/CurveKeys.h"
#include "core/Error.h"
#include "core/JsonReader.h"
#include "tests/coordinator/GrowthNodes.h"

namespace cairn::coordinator {
namespace {

using testing::growthMember;
using testing::twoByTwo;

// Grower (--grow) over a real store and plan folder: one cluster of two stages, two spares.
struct GrowerFixture {
  std::string out;
  std::unique_ptr<CoordinatorStore> store;
  std::vector<std::pair<std::string, size_t>> sent;  // (key, frames) in order
  std::map<std::string, std::string> keys;            // growthMember name -> its Z85 public key

  GrowerFixture() {
    char dir[] = "/tmp/cairn_grower_XXXXXX";
    out = mkdtemp(dir);
    for (const char* name : {"node_0", "node_1", "node_2", "node_3"})
      keys[name] = generateCurveKeyPair().public_key;
    JobSpec job;
    job.job_id = "j";
    job.model = "m.pt";
    job.data.location = "/nowhere";
    job.data.format = "idx";
    job.training = {{"epochs", 10}};
    writeJsonFile(jobSpecPath(out), toJson(job));
    nlohmann::json plan = {{"format", 1}, {"model", "m.pt"}, {"clusters", nlohmann::json::array()},
                           {"rings", nlohmann::json::array()}};
    nlohmann::json cluster = {{"index", 0}, {"chain", {"node_0", "node_1"}}, {"stages", nlohmann::json::array()}};
    store = std::make_unique<CoordinatorStore>(out + "/coordinator.db");
    std::vector<NodeSpec> nodes = twoByTwo();
    nodes.resize(2);  // cluster 0 only
    for (NodeSpec& n : nodes) {
      n.job_id = "j";
      n.role = n.stage == 0 ? StageRole::kRoot : StageRole::kLeaf;
      BoundaryValue in, mid, logits;
      in.name = "x";
      in.shape = {8, 4};
      mid.name = "h";
      mid.shape = {8, 3};
      logits.name = "y";
      logits.shape = {8, 2};
      n.inputs = {n.stage == 0 ? in : mid};
      n.outputs = {n.stage == 0 ? mid : logits};
      if (n.upstream) *n.upstream = PeerRef{"node_0", "127.0.0.1:5000", keys["node_0"]};
      if (n.downstream) *n.downstream = PeerRef{"node_1", "127.0.0.1:5001", keys["node_1"]};
      for (RingSpec& r : n.rings) {
        r.members.resize(1);
        r.members[0] = PeerRef{n.name, n.address, keys[n.name]};
        r.rank = 0;
      }
      std::filesystem::create_directories(nodeDirectory(out, n.name));
      std::ofstream(nodeDirectory(out, n.name) + "/" + n.stage_file) << "stage " << n.stage;
      writeJsonFile(nodeSpecPath(out, n.name), toJson(n));
      cluster["stages"].push_back({{"stage", n.stage}, {"node", n.name}, {"address", n.address}});
      plan["rings"].push_back({{"id", n.rings[0].id}, {"parameters", n.parameters}, {"holders", {n.name}}});
      Member m = growthMember(n.name, MemberState::kAssigned, 8);
      m.public_key = keys[n.name];
      store->putMember(m);
    }
    plan["clusters"].push_back(cluster);
    writeJsonFile(planPath(out), plan);
    for (const char* name : {"node_2", "node_3"}) {
      Member m = growthMember(name, MemberState::kSpare, 8);
      m.public_key = keys[name];
      m.advertise = std::string("127.0.0.1:70") + name[5];
      store->putMember(m);
    }
    store->setMeta("placed", "[\"node_0\",\"node_1\"]");
    store->setMeta("num_clusters", "1");
    store->setMeta("phase", "planned");
  }
  ~GrowerFixture() { std::filesystem::remove_all(out); }
  Grower grower(GrowOptions o = {true, 0, 0, {}, {}}) {
    return Grower(*store, out, o, [this](const std::string& key, const Frames& frames) {
      sent.emplace_back(key, frames.size());
    });
  }
  nlohmann::json growth() const { return nlohmann::json::parse(store->meta("growth").value_or("null")); }
  static nlohmann::json answer(const nlohmann::json& deal, bool accepted, int64_t epoch) {
    return {{"deal", {{"accepted", accepted}, {"deal", deal}, {"epoch", epoch}, {"step", 40}, {"reason", "r"}}}};
  }
};

// A spare not heard lately (MemberReplacer::heardLately: dead, frozen, cut off) joins no cluster.
TEST(Grower, SparesNotHeardLatelyFormNoCluster) {
  GrowerFixture f;
  Grower g = f.grower({true, 0, 0, [](const Member& m) { return m.name != "node_3"; }, {}});
  g.observe("node_1", {{{"step", 30}, {"epoch", 2}}});
  EXPECT_TRUE(g.poll(100).empty());
  EXPECT_TRUE(f.growth().is_null());  // one heard spare cannot hold two stages
  EXPECT_EQ(f.store->memberByName("node_2")->state, MemberState::kSpare);
}
// Dial-out-only spares: turned so in the fixture's store (no address, dial_out_only).
void behindRouters(GrowerFixture& f, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    Member m = *f.store->memberByName(name);
    m.dial_out_only = true;
    m.advertise = "";
    f.store->putMember(m);
  }
}

// A dial-out-only spare forms a new cluster with a reachable one (node_2 at stage 0, node_3 at
// stage 1: reachable spares first) without a relay, since none of its links joins two dial-out-only
// volunteers: its node is placed dial-out only, and its neighbour and ring peer name it so.
TEST(Grower, ADialOutOnlySpareNextToReachableNodesJoinsANewClusterWithoutARelay) {
  GrowerFixture f;
  behindRouters(f, {"node_2"});
  Grower g = f.grower();
  g.observe("node_1", {{{"step", 30}, {"epoch", 2}}});
  EXPECT_TRUE(g.poll(100).empty());
  EXPECT_EQ(f.growth()["spares"], nlohmann::json({"node_3", "node_2"}));  // stage 0, stage 1
  const NodeSpec behind = readNodeSpec(nodeSpecPath(f.out, "node_2"));
  EXPECT_TRUE(behind.dial_out_only);
  EXPECT_EQ(behind.address, "");
  EXPECT_EQ(behind.stage, 1);
  const NodeSpec root = readNodeSpec(nodeSpecPath(f.out, "node_3"));
  EXPECT_FALSE(root.dial_out_only);
  ASSERT_TRUE(root.downstream.has_value());
  EXPECT_TRUE(root.downstream->dial_out_only);
  EXPECT_FALSE(root.downstream->relay.has_value());
  const NodeSpec ring_peer = readNodeSpec(nodeSpecPath(f.out, "node_1"));
  ASSERT_EQ(ring_peer.rings[0].members.size(), 2u);
  EXPECT_EQ(ring_peer.rings[0].members[1].name, "node_2");
  EXPECT_TRUE(ring_peer.rings[0].members[1].dial_out_only);
  EXPECT_EQ(ring_peer.rings[0].members[1].address, "");
}

// Two dial-out-only spares would be pipeline neighbours: without a relay no cluster forms (no
// reachable spares to take instead); with one, their link goes through it.
TEST(Grower, TwoDialOutOnlySparesFormAClusterOnlyThroughARelay) {
  for (const bool relay_offered : {false, true}) {
    SCOPED_TRACE(relay_offered ? "a relay" : "no relay");
    GrowerFixture f;
    behindRouters(f, {"node_2", "node_3"});
    const PeerRef::Relay relay{"relay_0", "127.0.0.1:7100", generateCurveKeyPair().public_key};
    GrowOptions o{true, 0, 0, {}, {}};
    if (relay_offered) o.relays = [&] { return std::vector<PeerRef::Relay>{relay}; };
    Grower g = f.grower(o);
    g.observe("node_1", {{{"step", 30}, {"epoch", 2}}});
    EXPECT_TRUE(g.poll(100).empty());
    if (!relay_offered) {
      EXPECT_TRUE(f.growth().is_null());
      continue;
    }
    ASSERT_EQ(f.growth()["spares"], nlohmann::json({"node_2", "node_3"}));
    const NodeSpec root = readNodeSpec(nodeSpecPath(f.out, "node_2"));
    const NodeSpec leaf = readNodeSpec(nodeSpecPath(f.out, "node_3"));
    EXPECT_TRUE(root.dial_out_only && leaf.dial_out_only);
    ASSERT_TRUE(root.downstream && leaf.upstream);
    EXPECT_EQ(root.downstream->relay, relay);
    EXPECT_EQ(leaf.upstream->relay, relay);
    EXPECT_FALSE(leaf.rings[0].members[0].relay.has_value());  // node_1 is reachable: dialled
  }
}

TEST(Grower, ProposesTellsThePeersAndAssignsOnceTheRootTookTheDeal) {
  GrowerFixture f;
  Grower g = f.grower();
  g.observe("node_1", {{{"step", 30}, {"epoch", 2}}});
  EXPECT_TRUE(g.poll(100).empty());
  const nlohmann::json proposed = f.growth();
  ASSERT_EQ(proposed.value("state", ""), "proposed");
  EXPECT_EQ(proposed["deal"], nlohmann::json::parse(R"([{"from_epoch":0,"clusters":1},{"from_epoch":3,"clusters":2}])"));
  EXPECT_EQ(proposed["spares"], nlohmann::json({"node_2", "node_3"}));
  EXPECT_EQ(f.store->memberByName("node_2")->state, MemberState::kAssigned);  // no replacement takes it
  const NodeSpec told = readNodeSpec(nodeSpecPath(f.out, "node_0"));
  ASSERT_EQ(told.rings[0].members.size(), 2u);
  EXPECT_EQ(told.rings[0].members[1].name, "node_2");
  // Offered to the running nodes; in force for the new cluster.
  EXPECT_EQ(told.extra["offered_deal"], proposed["deal"]);
  EXPECT_FALSE(told.extra.contains("deal"));
  const NodeSpec added = readNodeSpec(nodeSpecPath(f.out, "node_3"));
  EXPECT_EQ(added.cluster, 1);
  EXPECT_EQ(added.stage, 1);
  EXPECT_EQ(added.extra["public_key"], f.keys["node_3"]);
  EXPECT_EQ(added.extra["deal"], proposed["deal"]);
  EXPECT_FALSE(added.extra.contains("offered_deal"));
  // Each existing growthMember gets its update once, on its heartbeat; nobody is assigned yet.
  g.onHeartbeat("node_0");
  g.onHeartbeat("node_0");
  g.onHeartbeat("node_2");
  ASSERT_EQ(f.sent.size(), 1u);
  EXPECT_EQ(f.sent[0].first, f.keys["node_0"]);
  // The Root was already in epoch 3: dealt again from epoch 5 (the first deal again starts 2
  // epochs after the newest reported) and owed again.
  g.observe("node_0", {GrowerFixture::answer(proposed["deal"], false, 3)});
  const nlohmann::json again = f.growth();
  EXPECT_EQ(again["deal"].back()["from_epoch"], 5);
  EXPECT_EQ(readNodeSpec(nodeSpecPath(f.out, "node_3")).extra["deal"], again["deal"]);
  g.onHeartbeat("node_0");
  EXPECT_EQ(f.sent.size(), 2u);
  // An answer to the older offer counts for nothing; the Root taking this one assigns the spares.
  g.observe("node_0", {GrowerFixture::answer(proposed["deal"], true, 3)});
  EXPECT_TRUE(g.poll(200).empty());
  g.observe("node_0", {GrowerFixture::answer(again["deal"], true, 3)});
  const std::vector<NodeSpec> assigned = g.poll(300);
  ASSERT_EQ(assigned.size(), 2u);
  EXPECT_EQ(f.sent.size(), 4u);
  EXPECT_EQ(f.sent[2].first, f.keys["node_2"]);
  EXPECT_EQ(f.store->meta("num_clusters").value_or(""), "2");
  // The running nodes now have the deal in force, and are owed that update.
  for (const char* name : {"node_0", "node_1"}) {
    const NodeSpec now = readNodeSpec(nodeSpecPath(f.out, name));
    EXPECT_EQ(now.extra["deal"], again["deal"]) << name;
    EXPECT_FALSE(now.extra.contains("offered_deal")) << name;
  }
  g.onHeartbeat("node_1");
  ASSERT_EQ(f.sent.size(), 5u);
  EXPECT_EQ(f.sent[4].first, f.keys["node_1"]);
  EXPECT_EQ(nlohmann::json::parse(*f.store->meta("placed")),
            nlohmann::json({"node_0", "node_1", "node_2", "node_3"}));
  EXPECT_EQ(loadDeal(*f.store, 1), (std::vector<DealEntry>{{0, 1}, {5, 2}}));
  const nlohmann::json plan = readJsonFile(planPath(f.out));
  ASSERT_EQ(plan["clusters"].size(), 2u);
  EXPECT_EQ(plan["clusters"][1]["chain"], nlohmann::json({"node_2", "node_3"}));
  EXPECT_EQ(plan["rings"][1]["holders"], nlohmann::json({"node_1", "node_3"}));
  EXPECT_EQ(f.growth().value("state", ""), "done");
}

// Epochs shorter than an update's round trip: the k-th deal again starts 2^k epochs after the
// newest reported epoch, never past the run's last (epoch 9 of 10 here); once that has begun,
// growth is abandoned.
TEST(Grower, EachDealAgainStartsTwiceAsFarAheadUpToTheLastEpoch) {
  GrowerFixture f;
  Grower g = f.grower();
  g.observe("node_1", {{{"step", 30}, {"epoch", 2}}});
  g.poll(100);
  std::vector<int64_t> froms{f.growth()["deal"].back()["from_epoch"].get<int64_t>()};
  for (int64_t reported : {3, 6}) {
    g.observe("node_0", {GrowerFixture::answer(f.growth()["deal"], false, reported)});
    froms.push_back(f.growth()["deal"].back()["from_epoch"].get<int64_t>());
  }
  // 2 + 1; 3 + 2; 6 + 4 = 10 is past the last epoch: 9.
  EXPECT_EQ(froms, (std::vector<int64_t>{3, 5, 9}));
  EXPECT_EQ(f.growth().value("state", ""), "proposed");
  g.observe("node_0", {GrowerFixture::answer(f.growth()["deal"], false, 9)});
  EXPECT_EQ(f.growth().value("state", ""), "abandoned");
  EXPECT_EQ(f.store->memberByName("node_2")->state, MemberState::kSpare);
}

// Served data (ChunkServer.h): the deals chunks are served by follow the proposal from the
// moment it is written (a Root taking it asks for its new chunks at once), the deal taken once
// the cluster formed, and come back the same from coordinator.db after a restart.
TEST(Grower, ServedChunksFollowTheProposedDealAndTheSameAfterARestart) {
  GrowerFixture f;
  using Deal = std::vector<DealEntry>;
  EXPECT_EQ(servedDeals(*f.store), (std::vector<Deal>{{{0, 1}}})) << "the planned deal only";
  {
    Grower g = f.grower();
    g.observe("node_1", {{{"step", 30}, {"epoch", 2}}});
    g.poll(100);
    EXPECT_EQ(servedDeals(*f.store), (std::vector<Deal>{{{0, 1}}, {{0, 1}, {3, 2}}}));
    g.observe("node_0", {GrowerFixture::answer(f.growth()["deal"], true, 2)});
    ASSERT_EQ(g.poll(200).size(), 2u);
    EXPECT_EQ(servedDeals(*f.store), (std::vector<Deal>{{{0, 1}, {3, 2}}, {{0, 1}, {3, 2}}}));
  }
  f.store = std::make_unique<CoordinatorStore>(f.out + "/coordinator.db");  // a restart
  EXPECT_EQ(servedDeals(*f.store), (std::vector<Deal>{{{0, 1}, {3, 2}}, {{0, 1}, {3, 2}}}));
}

TEST(Grower, ARefusalForAnotherReasonAbandonsGrowthAndOffIsOff) {
  GrowerFixture f;
  Grower off = f.grower({false, 0, 0, {}, {}});
  EXPECT_TRUE(off.poll(100).empty());
  EXPECT_TRUE(f.growth().is_null());
  Grower capped = f.grower({true, 1, 0, {}, {}});  // --max-clusters 1
  capped.poll(100);
  EXPECT_TRUE(f.growth().is_null());
  Grower keeping = f.grower({true, 0, 1, {}, {}});  // --keep-spares 1: two spares cannot hold 2 stages + 1
  keeping.poll(100);
  EXPECT_TRUE(f.growth().is_null());
  Grower g = f.grower();
  std::map<std::string, nlohmann::json> before;
  for (const char* name : {"node_0", "node_1"}) before[name] = readJsonFile(nodeSpecPath(f.out, name));
  g.poll(100);
  const nlohmann::json proposed = f.growth();
  ASSERT_EQ(proposed.value("state", ""), "proposed");
  ASSERT_NE(readJsonFile(nodeSpecPath(f.out, "node_0")), before["node_0"]);  // the newcomer, the deal
  g.observe("node_0", {GrowerFixture::answer(proposed["deal"], false, 0)});  // before its epoch
  EXPECT_EQ(f.growth().value("state", ""), "abandoned");
  EXPECT_EQ(f.store->memberByName("node_2")->state, MemberState::kSpare);
  // The existing nodes' node.json files are what they were before the proposal (a replacement
  // gets no growthMember that never comes, no deal nobody took).
  for (const char* name : {"node_0", "node_1"}) {
    const NodeSpec now = readNodeSpec(nodeSpecPath(f.out, name));
    EXPECT_EQ(toJson(now), toJson(parseNodeSpec(before[name], name))) << name;
  }
  // … and each is owed that as its next peers update.
  const size_t sent = f.sent.size();
  g.onHeartbeat("node_1");
  g.onHeartbeat("node_1");
  ASSERT_EQ(f.sent.size(), sent + 1);
  EXPECT_EQ(f.sent.back().first, f.keys["node_1"]);
  EXPECT_TRUE(g.poll(200).empty());
  EXPECT_EQ(f.growth().value("state", ""), "abandoned");
}

}  // namespace
}  // namespace cairn::coordinator
