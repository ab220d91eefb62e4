// Growth: whether the spares can hold one more pipeline, checked against a brute force over every
// assignment of spares to stages.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>
#include <string>

#include "coordinator/Growth.h"
#include "core/Error.h"

namespace cairn::coordinator {
namespace {

Member member(const std::string& name, MemberState state, double ram) {
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
      members.push_back(member("node_" + std::to_string(i), states[rng() % 4], double(rng() % 5)));
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
      member("a", MemberState::kAssigned, 8), member("b", MemberState::kSpare, 8),
      member("c", MemberState::kSpare, 8), member("d", MemberState::kSpare, 8)};
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
  const std::vector<Member> mixed = {member("x", MemberState::kSpare, 2),
                                     member("y", MemberState::kSpare, 16)};
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
  Member a = member("node_7", MemberState::kSpare, 8), b = member("node_9", MemberState::kSpare, 8);
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

}  // namespace
}  // namespace cairn::coordinator
