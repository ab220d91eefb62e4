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
