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
#include "tests/coordinator/GrowthNodes.h"

namespace cairn::coordinator {
namespace {

using testing::growthMember;
using testing::twoByTwo;

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

// A dial-out-only spare's node in the new cluster is placed dial-out only: no address, named so
// by its neighbours and ring peers. At stage 0 all its peers are reachable; at stage 1 its ring
// peer node_3 (cluster 1's Leaf) dials out only too, so that link, and only that one (its
// neighbour node_9 is reachable), goes through the relay, named in both ends' entries; without a
// relay the plan is refused, and needsRelay says so first.
TEST(GrowthPlan, ADialOutOnlySparesNodeIsDialOutOnlyAndRelayedWhereItsPeerDialsOutToo) {
  std::vector<NodeSpec> nodes = twoByTwo();
  markDialOutOnly(nodes, {"node_3"});
  Member a = growthMember("node_7", MemberState::kSpare, 8), b = growthMember("node_9", MemberState::kSpare, 8);
  a.dial_out_only = true;
  b.advertise = "127.0.0.1:6009";
  EXPECT_FALSE(needsRelay(nodes, {a, b}));  // node_7 at stage 0: node_0, node_2 and node_9 reachable
  const NodeSpec root = planGrowth(nodes, {a, b}, 2).added[0];
  EXPECT_TRUE(root.dial_out_only);
  EXPECT_EQ(root.address, "");
  const PeerRef::Relay relay{"relay_0", "127.0.0.1:7100", "R"};
  EXPECT_TRUE(needsRelay(nodes, {b, a}));  // node_7 at stage 1, in ring_1 with node_3
  EXPECT_THROW(planGrowth(nodes, {b, a}, 2), BadInput);
  const GrowthPlan plan = planGrowth(nodes, {b, a}, 2, {relay});
  const NodeSpec& leaf = plan.added[1];
  EXPECT_EQ(leaf.name, "node_7");
  EXPECT_TRUE(leaf.dial_out_only);
  EXPECT_EQ(leaf.address, "");
  ASSERT_EQ(leaf.rings[0].members.size(), 3u);
  EXPECT_FALSE(leaf.rings[0].members[0].relay.has_value());  // node_1: reachable, dialled
  EXPECT_EQ(leaf.rings[0].members[1].relay, relay);          // node_3: both dial out
  EXPECT_TRUE(plan.added[0].downstream->dial_out_only);
  EXPECT_FALSE(plan.added[0].downstream->relay.has_value());
  for (const NodeSpec& told : plan.told) {
    if (told.stage != 1) continue;
    const PeerRef& newcomer = told.rings[0].members[2];
    EXPECT_EQ(newcomer.name, "node_7");
    EXPECT_TRUE(newcomer.dial_out_only);
    EXPECT_EQ(newcomer.relay.has_value(), told.name == "node_3") << told.name;
  }
}

}  // namespace
}  // namespace cairn::coordinator
