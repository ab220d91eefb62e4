// Growth: whether the spares can hold one more pipeline, checked against a brute force over every
// assignment of spares to stages.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>

#include "coordinator/DialOutPlacement.h"
#include "coordinator/Growth.h"
#include "core/Error.h"

namespace cairn::coordinator {
namespace {

Member growthMember(const std::string& name, MemberState state, double ram) {
  Member m;
  m.name = name;
  m.state = state;
  m.probe_json = "{\"ram_gb\":" + std::to_string(ram) + ",\"cores\":2}";
  return m;
}

// True when some injective spares -> stages assignment gives every stage enough RAM and leaves
// keep spares over.
bool bruteForceFeasible(const std::vector<Member>& members, const std::vector<double>& need,
                        int keep) {
  std::vector<double> rams;
  for (const Member& m : members)
    if (m.state == MemberState::kSpare) rams.push_back(probedRamGb(m));
  if (rams.size() < need.size() + size_t(keep)) return false;
  std::vector<size_t> idx(rams.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  do {  // every ordering of spares; the first need.size() take the stages in order
    bool ok = true;
    for (size_t s = 0; s < need.size() && ok; ++s) ok = rams[idx[s]] >= need[s];
    if (ok) return true;
  } while (std::next_permutation(idx.begin(), idx.end()));
  return false;
}

TEST(Growth, ChoosesAPipelineExactlyWhenOneExists) {
  std::mt19937 rng(11);
  const MemberState states[] = {MemberState::kSpare, MemberState::kAssigned, MemberState::kSpare,
                                MemberState::kDone};
  int feasible = 0, infeasible = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<Member> members;
    const int n = int(rng() % 7);
    for (int i = 0; i < n; ++i)
      members.push_back(growthMember("node_" + std::to_string(i), states[rng() % 4], double(rng() % 5)));
    std::vector<double> need(1 + rng() % 3);
    for (double& r : need) r = double(rng() % 5);
    const int keep = int(rng() % 2);
    const auto chosen = chooseGrowth(members, need, keep);
    const bool expect = bruteForceFeasible(members, need, keep);
    ASSERT_EQ(chosen.has_value(), expect) << "trial " << trial;
    if (!chosen) {
      ++infeasible;
      continue;
    }
    ++feasible;
    std::set<std::string> names;
    for (size_t s = 0; s < need.size(); ++s) {
      EXPECT_EQ((*chosen)[s].state, MemberState::kSpare);
      EXPECT_GE(probedRamGb((*chosen)[s]), need[s]);
      names.insert((*chosen)[s].name);
    }
    EXPECT_EQ(names.size(), need.size()) << "a spare holds two stages";
  }
  EXPECT_GT(feasible, 20);
  EXPECT_GT(infeasible, 20);
}

TEST(Growth, KeepsTheSparesMeantForReplacementAndPrefersTheEarliest) {
  const std::vector<Member> members = {
      growthMember("a", MemberState::kAssigned, 8), growthMember("b", MemberState::kSpare, 8),
      growthMember("c", MemberState::kSpare, 8), growthMember("d", MemberState::kSpare, 8)};
  EXPECT_FALSE(chooseGrowth(members, {4, 4, 4}, 1));  // would consume the replacement spare
  const auto chosen = chooseGrowth(members, {4, 4, 4}, 0);
  ASSERT_TRUE(chosen);
  EXPECT_EQ((*chosen)[0].name, "b");
  EXPECT_EQ((*chosen)[2].name, "d");
  const auto two = chooseGrowth(members, {4, 4}, 1);
  ASSERT_TRUE(two);
  EXPECT_EQ((*two)[0].name, "b");
  EXPECT_EQ((*two)[1].name, "c");
  // The big stage takes the only spare with enough RAM, wherever it stands.
  const std::vector<Member> mixed = {growthMember("x", MemberState::kSpare, 2),
                                     growthMember("y", MemberState::kSpare, 16)};
  const auto fit = chooseGrowth(mixed, {1, 12}, 0);
  ASSERT_TRUE(fit);
  EXPECT_EQ((*fit)[0].name, "x");
  EXPECT_EQ((*fit)[1].name, "y");
  EXPECT_FALSE(chooseGrowth(mixed, {12, 12}, 0));
}

}  // namespace
}  // namespace cairn::coordinator

namespace cairn::coordinator {
namespace {

TEST(GrowthDeal, TheNewClusterStartsTheEpochAfterTheNewestReported) {
  EXPECT_EQ(grownDeal({{0, 1}}, 3), (std::vector<DealEntry>{{0, 1}, {4, 2}}));
  EXPECT_EQ(grownDeal({{0, 2}}, -1), (std::vector<DealEntry>{{0, 2}, {1, 3}}));
  EXPECT_EQ(grownDeal({{0, 1}, {4, 2}}, 2), (std::vector<DealEntry>{{0, 1}, {4, 2}, {5, 3}}));
  EXPECT_THROW(grownDeal({}, 0), BadInput);
}

TEST(GrowthDeal, BadDealTextIsRefusedNamingTheField) {
  auto message = [](const std::string& text) {
    try {
      parseDeal(text, "coordinator.db");
    } catch (const BadInput& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message("{}").find("not a JSON array"), std::string::npos);
  EXPECT_NE(message("[{\"from_epoch\":0}]").find("deal[0].clusters"), std::string::npos);
  EXPECT_NE(message("[{\"from_epoch\":0,\"clusters\":1},{\"from_epoch\":\"2\",\"clusters\":2}]")
                .find("deal[1].from_epoch"),
            std::string::npos);
  EXPECT_NE(message("[{\"from_epoch\":0,\"clusters\":0}]").find("deal[0].clusters"),
            std::string::npos);
  EXPECT_NE(message("[{\"from_epoch\":0,\"clusters\":1},{\"from_epoch\":0,\"clusters\":2}]")
                .find("deal[1].from_epoch"),
            std::string::npos);
  EXPECT_EQ(parseDeal(dealJson({{0, 1}, {3, 2}}), "x"), (std::vector<DealEntry>{{0, 1}, {3, 2}}));
}

TEST(GrowthDeal, TheStoreKeepsTheDealAcrossARestart) {
  char dir[] = "/tmp/cairn_growth_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/coordinator.db";
  {
    CoordinatorStore store(path);
    EXPECT_EQ(loadDeal(store, 2), (std::vector<DealEntry>{{0, 2}}));  // nothing grown yet
    saveDeal(store, grownDeal(loadDeal(store, 2), 6));
  }
  {
    CoordinatorStore reopened(path);
    EXPECT_EQ(loadDeal(reopened, 2), (std::vector<DealEntry>{{0, 2}, {7, 3}}));
    reopened.setMeta("deal", "[{\"from_epoch\":1,\"clusters\":1}]");
    EXPECT_THROW(loadDeal(reopened, 2), BadInput);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cairn::coordinator

namespace cairn::coordinator {
namespace {

// Two clusters x two stages, as planVolunteers writes them: ring_s joins stage s of each cluster.
std::vector<NodeSpec> twoByTwo() {
  std::vector<NodeSpec> nodes;
  for (int c = 0; c < 2; ++c)
    for (int s = 0; s < 2; ++s) {
      NodeSpec n;
      n.name = "node_" + std::to_string(c * 2 + s);
      n.address = "127.0.0.1:" + std::to_string(5000 + c * 2 + s);
      n.cluster = c;
      n.stage = s;
      n.num_stages = 2;
      n.stage_file = "stage_" + std::to_string(s) + ".pt";
      n.parameters = {"p" + std::to_string(s)};
      if (s == 1) n.upstream = PeerRef{"node_" + std::to_string(c * 2), "", "k"};
      if (s == 0) n.downstream = PeerRef{"node_" + std::to_string(c * 2 + 1), "", "k"};
      RingSpec ring;
      ring.id = "ring_" + std::to_string(s);
      ring.parameters = n.parameters;
      for (int o = 0; o < 2; ++o) ring.members.push_back({"node_" + std::to_string(o * 2 + s), "a", "k"});
      ring.rank = c;
      n.rings.push_back(ring);
      nodes.push_back(n);
    }
  return nodes;
}

TEST(GrowthPlan, TheNewClusterCopiesTheStagesAndJoinsEveryRingLast) {
  Member a = growthMember("node_7", MemberState::kSpare, 8), b = growthMember("node_9", MemberState::kSpare, 8);
  a.advertise = "127.0.0.1:6007";
  b.advertise = "127.0.0.1:6009";
  a.public_key = "A";
  b.public_key = "B";
  const GrowthPlan plan = planGrowth(twoByTwo(), {a, b}, 2);
  ASSERT_EQ(plan.added.size(), 2u);
  const NodeSpec& root = plan.added[0];
  const NodeSpec& leaf = plan.added[1];
  EXPECT_EQ(root.name, "node_7");
  EXPECT_EQ(root.address, "127.0.0.1:6007");
  EXPECT_EQ(root.cluster, 2);
  EXPECT_EQ(root.stage_file, "stage_0.pt");
  EXPECT_EQ(root.parameters, std::vector<std::string>{"p0"});
  EXPECT_FALSE(root.upstream);
  ASSERT_TRUE(root.downstream);
  EXPECT_EQ(root.downstream->name, "node_9");
  EXPECT_EQ(root.downstream->public_key, "B");
  ASSERT_TRUE(leaf.upstream);
  EXPECT_EQ(leaf.upstream->name, "node_7");
  ASSERT_EQ(leaf.rings.size(), 1u);
  EXPECT_EQ(leaf.rings[0].id, "ring_1");
  ASSERT_EQ(leaf.rings[0].members.size(), 3u);
  EXPECT_EQ(leaf.rings[0].members[0].name, "node_1");
  EXPECT_EQ(leaf.rings[0].members[1].name, "node_3");
  EXPECT_EQ(leaf.rings[0].members[2].name, "node_9");
  EXPECT_EQ(leaf.rings[0].rank, 2);
  ASSERT_EQ(plan.told.size(), 4u);
  for (const NodeSpec& told : plan.told) {
    ASSERT_EQ(told.rings[0].members.size(), 3u);
    EXPECT_EQ(told.rings[0].members[2].name, told.stage == 0 ? "node_7" : "node_9");
    EXPECT_EQ(told.rings[0].rank, told.cluster);  // unchanged
  }
  EXPECT_THROW(planGrowth(twoByTwo(), {a, b}, 1), BadInput);  // cluster taken
  EXPECT_THROW(planGrowth(twoByTwo(), {a}, 2), BadInput);     // not a whole pipeline
}

// A plan whose lowest cluster holds dial-out-only volunteers: node_1 (cluster 0's Leaf) and node_3
// (cluster 1's) are dial-out only, their ring link through a relay. The new cluster's Leaf, held
// by a reachable spare, listens (it is not dial-out only like its template) and reaches node_1
// and node_3 without the template's relay: they dial it.
TEST(GrowthPlan, ANewNodeIsReachableWhateverItsTemplatesHolderWas) {
  std::vector<NodeSpec> nodes = twoByTwo();
  const PeerRef::Relay relay{"relay_0", "127.0.0.1:7100", "R"};
  // As the coordinator places them (DialOutPlacement.h): the link of the two through the relay.
  markDialOutOnly(nodes, {"node_1", "node_3"});
  ASSERT_EQ(assignRelays(nodes, {relay}), 1u);
  Member a = growthMember("node_7", MemberState::kSpare, 8), b = growthMember("node_9", MemberState::kSpare, 8);
  a.advertise = "127.0.0.1:6007";
  b.advertise = "127.0.0.1:6009";
  const GrowthPlan plan = planGrowth(nodes, {a, b}, 2);
  const NodeSpec& leaf = plan.added[1];
  EXPECT_FALSE(leaf.dial_out_only);
  EXPECT_EQ(leaf.address, "127.0.0.1:6009");
  ASSERT_EQ(leaf.rings[0].members.size(), 3u);
  for (const PeerRef& m : leaf.rings[0].members) {
    EXPECT_FALSE(m.relay.has_value()) << m.name;
    EXPECT_EQ(m.dial_out_only, m.name != "node_9") << m.name;  // node_1, node_3 dial it
  }
  // The existing holders keep their own view: node_3 still reaches node_1 through the relay, and
  // the new member is reachable at its address.
  const auto told3 = std::find_if(plan.told.begin(), plan.told.end(),
                                  [](const NodeSpec& n) { return n.name == "node_3"; });
  ASSERT_NE(told3, plan.told.end());
  EXPECT_TRUE(told3->dial_out_only);
  EXPECT_EQ(told3->rings[0].members[0].relay, relay);
  EXPECT_EQ(told3->rings[0].members[2].address, "127.0.0.1:6009");
  EXPECT_FALSE(told3->rings[0].members[2].dial_out_only);
}

}  // namespace
}  // namespace cairn::coordinator

#include "coordinator/Grower.h"
#include "core/CurveKeys.h"
#include "core/JsonReader.h"

namespace cairn::coordinator {
namespace {

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
  Grower grower(GrowOptions o = {true, 0, 0, {}}) {
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
  Grower g = f.grower({true, 0, 0, [](const Member& m) { return m.name != "node_3"; }});
  g.observe("node_1", {{{"step", 30}, {"epoch", 2}}});
  EXPECT_TRUE(g.poll(100).empty());
  EXPECT_TRUE(f.growth().is_null());  // one heard spare cannot hold two stages
  EXPECT_EQ(f.store->memberByName("node_2")->state, MemberState::kSpare);
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
  Grower off = f.grower({false, 0, 0, {}});
  EXPECT_TRUE(off.poll(100).empty());
  EXPECT_TRUE(f.growth().is_null());
  Grower capped = f.grower({true, 1, 0, {}});  // --max-clusters 1
  capped.poll(100);
  EXPECT_TRUE(f.growth().is_null());
  Grower keeping = f.grower({true, 0, 1, {}});  // --keep-spares 1: two spares cannot hold 2 stages + 1
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
