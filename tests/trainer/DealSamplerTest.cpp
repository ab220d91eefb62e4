// DealSampler: the per-epoch deal of listed chunks over a changing number of clusters.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/Error.h"
#include "trainer/DealSampler.h"
#include "trainer/Sampler.h"

namespace cairn {
namespace {

TEST(DealSampler, OneEntryGivesExactlyShardSamplersOrder) {
  const std::vector<int64_t> sizes = ShardSampler::equalChunks(997, 6, 3);
  for (const std::vector<int64_t>& ids : {std::vector<int64_t>{}, std::vector<int64_t>{5, 0, 3}})
    for (int clusters = 1; clusters <= 3; ++clusters)
      for (int c = 0; c < clusters; ++c) {
        const ShardSampler today(sizes, c, clusters, ids, 1234);
        const DealSampler dealt(sizes, c, {{0, clusters}}, ids, 1234);
        EXPECT_EQ(dealt.shard(0), today.shard());
        for (int64_t e = 0; e < 5; ++e) EXPECT_EQ(dealt.epochOrder(e), today.epochOrder(e));
      }
}

TEST(DealSampler, EveryEpochTheClustersShardsAreDisjointAndCoverTheListedChunks) {
  const std::vector<int64_t> sizes = ShardSampler::equalChunks(600, 6, 1);
  const std::vector<int64_t> listed = {0, 2, 3, 5};
  std::set<int64_t> expected;
  for (int64_t c : listed)
    for (int64_t id = c * 100; id < (c + 1) * 100; ++id) expected.insert(id);
  const std::vector<DealEntry> deal = {{0, 1}, {2, 2}, {4, 3}};
  for (int64_t epoch = 0; epoch < 6; ++epoch) {
    const int clusters = epoch < 2 ? 1 : epoch < 4 ? 2 : 3;
    std::multiset<int64_t> seen;
    for (int c = 0; c < 3; ++c) {
      const DealSampler s(sizes, c, deal, listed, 7);
      EXPECT_EQ(s.entryAt(epoch).clusters, clusters);
      const std::vector<int64_t> order = s.epochOrder(epoch);
      if (c >= clusters) {
        EXPECT_TRUE(order.empty()) << "cluster " << c << " epoch " << epoch;
      }
      // Same ids as the shard, in a shuffled order.
      std::vector<int64_t> sorted = order;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(sorted, s.shard(epoch));
      seen.insert(order.begin(), order.end());
    }
    EXPECT_EQ(seen.size(), expected.size()) << "epoch " << epoch;  // disjoint
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()), expected) << "epoch " << epoch;
  }
  // Cluster 0 after the change trains on a strict subset of what it trained before.
  const DealSampler c0(sizes, 0, deal, listed, 7);
  EXPECT_EQ(c0.shard(0).size(), 400u);
  EXPECT_EQ(c0.shard(2).size(), 200u);
}

TEST(DealSampler, BadDealsAreRefusedNamingTheEntry) {
  auto message = [](const std::vector<DealEntry>& deal) {
    try {
      validateDeal(deal, "deal");
    } catch (const BadInput& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({}).find("at least one entry"), std::string::npos);
  EXPECT_NE(message({{1, 1}}).find("deal[0].from_epoch"), std::string::npos);
  EXPECT_NE(message({{0, 1}, {0, 2}}).find("deal[1].from_epoch"), std::string::npos);
  EXPECT_NE(message({{0, 1}, {3, 0}}).find("deal[1].clusters"), std::string::npos);
  EXPECT_EQ(message({{0, 1}, {3, 2}}), "");
  // More clusters than listed chunks: ShardSampler's own refusal.
  EXPECT_THROW(DealSampler(ShardSampler::equalChunks(10, 2, 1), 0, {{0, 1}, {1, 3}}, {}, 1),
               BadInput);
}

}  // namespace
}  // namespace cairn
