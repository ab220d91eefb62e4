// Which volunteers' connections to the coordinator have all closed (coordinator/ConnectionWatch.h),
// and the rule that makes such a placed volunteer lost before --lost-after-s (Replacement.h
// GoneRule, findLost). Expected values are written out by hand. The coordinator feeding the watch
// from its real ROUTER (ZMQ_SRCFD, the monitor's closed connections): tests/integration/
// volunteer_replace_test.py spare_replaces_lost, where --lost-after-s is too long to replace the
// killed volunteer within the test; a frozen volunteer (connections open) is still lost only by
// its silence: volunteer_churn_test.py frozen_replaced.
#include <gtest/gtest.h>

#include <map>

#include "coordinator/ConnectionWatch.h"
#include "coordinator/Replacement.h"
#include "tests/coordinator/ReplacementNodes.h"

namespace cairn::coordinator {
namespace {

using testing::replacementMember;

TEST(ConnectionWatch, AKeyIsGoneOnlyWhenEveryConnectionItSpokeOnClosedAndItSaidNothingSince) {
  ConnectionWatch watch;
  EXPECT_FALSE(watch.goneSince("a").has_value());  // never heard
  watch.heard("a", 10);  // its heartbeats
  watch.heard("a", 11);  // its metrics stream
  watch.heard("b", 12);
  watch.closed(10, 2.0);
  EXPECT_FALSE(watch.goneSince("a").has_value());  // 11 is open
  watch.closed(99, 2.1);                           // nobody's connection: nothing changes
  watch.closed(11, 3.0);
  ASSERT_TRUE(watch.goneSince("a").has_value());
  EXPECT_DOUBLE_EQ(*watch.goneSince("a"), 3.0);
  EXPECT_FALSE(watch.goneSince("b").has_value());
  // Back (a new connection, the kernel reusing descriptor 10): no longer gone.
  watch.heard("a", 10);
  EXPECT_FALSE(watch.goneSince("a").has_value());
  watch.closed(10, 5.0);
  EXPECT_DOUBLE_EQ(*watch.goneSince("a"), 5.0);
  // A message of unknown origin (fd -1) says nothing about connections; it is not "back" either.
  watch.heard("a", -1);
  EXPECT_DOUBLE_EQ(*watch.goneSince("a"), 5.0);
  EXPECT_EQ(watch.openConnections(), 1u);  // b's
  EXPECT_EQ(watch.trackedKeys(), 2u);
}

TEST(ConnectionWatch, ADescriptorTakenOverByAnotherKeyNoLongerCountsForTheFirst) {
  ConnectionWatch watch;
  watch.heard("a", 7);
  watch.heard("a", 8);
  watch.heard("b", 7);  // a's close of 7 never reported: 7 is b's now
  watch.closed(8, 3.0);
  ASSERT_TRUE(watch.goneSince("a").has_value());  // a spoke on 7 and 8; 7 is not a's any more
  EXPECT_DOUBLE_EQ(*watch.goneSince("a"), 3.0);
  watch.closed(7, 4.0);
  EXPECT_DOUBLE_EQ(*watch.goneSince("b"), 4.0);
}

// GoneRule over a map of key → since, as the coordinator answers it from its ConnectionWatch.
GoneRule goneRule(const std::map<std::string, double>& since, double after) {
  return {[since](const std::string& key) -> std::optional<double> {
            const auto it = since.find(key);
            return it == since.end() ? std::nullopt : std::optional<double>(it->second);
          },
          after};
}

TEST(Replacement, AHolderWhoseConnectionsAllClosedIsLostAfterTheGoneTimeNotTheSilenceTimeout) {
  const std::vector<Member> members = {
      replacementMember("node_0", MemberState::kAssigned, 128),  // heard 2 s ago, gone 3.5 s ago
      replacementMember("node_1", MemberState::kAssigned, 128),  // gone only 2 s ago
      replacementMember("node_2", MemberState::kAssigned, 128),  // connections open
      replacementMember("node_3", MemberState::kDone, 100),      // result in: never lost
  };
  const std::vector<std::string> placed = {"node_0", "node_1", "node_2", "node_3"};
  const GoneRule rule = goneRule({{members[0].public_key, 126.5}, {members[1].public_key, 128.0},
                                  {members[3].public_key, 101.0}},
                                 3);
  const auto lost = findLost(members, placed, 130, /*heard_since=*/0, /*lost_after_s=*/15, rule);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].name, "node_0");
  EXPECT_TRUE(lost[0].newly);
  EXPECT_NE(lost[0].why.find("its connections to the coordinator closed 3.5 s ago"), std::string::npos)
      << lost[0].why;
  // Exactly at the gone time: not yet. Rule off (0, or nothing to ask): only silence counts.
  EXPECT_TRUE(findLost(members, placed, 129.5, 0, 15, rule).empty());
  EXPECT_TRUE(findLost(members, placed, 130, 0, 15, goneRule({{members[0].public_key, 126.5}}, 0)).empty());
  EXPECT_TRUE(findLost(members, placed, 130, 0, 15, GoneRule{{}, 3}).empty());
  // Silent past --lost-after-s: lost by silence, whatever its connections.
  const auto silent = findLost(members, placed, 144, 0, 15, rule);
  ASSERT_EQ(silent.size(), 3u);
  EXPECT_NE(silent[2].why.find("no heartbeat for 16.0 s"), std::string::npos) << silent[2].why;
}

// A spare that is not heard lately — its connections all closed, or silent past --lost-after-s (a
// frozen or cut-off one) — takes no node over and is not planned (Gathering.h).
TEST(Replacement, ASpareGoneOrSilentIsPassedOver) {
  std::vector<Member> members = {replacementMember("node_4", MemberState::kSpare, 100, 8, 1),
                                 replacementMember("node_5", MemberState::kSpare, 100, 8, 2),
                                 replacementMember("node_6", MemberState::kAssigned, 100, 8, 3)};
  const GoneRule rule = goneRule({{members[0].public_key, 10}, {members[2].public_key, 10}}, 3);
  const std::vector<Member> left = withoutAwaySpares(members, 20, 0, 600, rule);
  ASSERT_EQ(left.size(), 2u);  // node_4 gone; node_6 is no spare (findLost's to judge)
  EXPECT_EQ(left[0].name, "node_5");
  EXPECT_EQ(left[1].name, "node_6");
  EXPECT_EQ(chooseSpare(left, 4)->name, "node_5");
  EXPECT_EQ(withoutAwaySpares(members, 12, 0, 600, rule).size(), 3u);  // gone 2 s only
  // At 116 all three were heard 16 s ago: past --lost-after-s 15 both spares are passed over (the
  // holder is findLost's to judge); counted from a coordinator's start at 110, they are not.
  const std::vector<Member> silent = withoutAwaySpares(members, 116, 0, 15, GoneRule{});
  ASSERT_EQ(silent.size(), 1u);
  EXPECT_EQ(silent[0].name, "node_6");
  EXPECT_EQ(withoutAwaySpares(members, 116, 110, 15, GoneRule{}).size(), 3u);
  EXPECT_FALSE(heardLately(members[1], 116, 0, 15, GoneRule{}));
  EXPECT_TRUE(heardLately(members[1], 115, 0, 15, GoneRule{}));  // exactly at the bound: heard
}

}  // namespace
}  // namespace cairn::coordinator
