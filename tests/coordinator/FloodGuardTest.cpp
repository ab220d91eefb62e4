// FloodGuard (coordinator/FloodGuard.h): each key's message and byte budgets, the one answer per
// episode, the block after `drop_after` drops in one episode, and bounded memory; against counts worked
// out by hand from the limits (the clock is the caller's, so nothing here depends on timing).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "coordinator/FloodGuard.h"

namespace cairn::coordinator {
namespace {

using Verdict = FloodGuard::Verdict;

FloodLimits smallLimits() {
  FloodLimits l;
  l.messages_per_s = 2;
  l.message_burst = 5;
  l.bytes_per_s = 1000;
  l.byte_burst = 4000;
  l.drop_after = 4;
  l.quiet_s = 3;
  l.block_s = 60;
  return l;
}

TEST(FloodGuard, ABurstPassesThenTheRateAndEachKeyHasItsOwnBudget) {
  FloodGuard guard(smallLimits(), 1 << 20);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(guard.check("a", 10, 0.0), Verdict::kTake) << i;
  EXPECT_EQ(guard.check("a", 10, 0.0), Verdict::kDropTell);  // the 6th at once: told, once
  EXPECT_EQ(guard.check("a", 10, 0.0), Verdict::kDrop);
  EXPECT_EQ(guard.check("b", 10, 0.0), Verdict::kTake);  // another key is not charged for it
  EXPECT_EQ(guard.check("a", 10, 0.5), Verdict::kTake);  // 0.5 s at 2 a second: one more token
  EXPECT_EQ(guard.check("a", 10, 0.5), Verdict::kDrop);  // the same episode: not told again
  // 3.5 s without a drop (more than quiet_s): the next drop begins a new episode, told again.
  for (int i = 0; i < 5; ++i) EXPECT_EQ(guard.check("a", 10, 4.0), Verdict::kTake) << i;
  EXPECT_EQ(guard.check("a", 10, 4.0), Verdict::kDropTell);
  EXPECT_EQ(guard.dropped(), 4u);
}

TEST(FloodGuard, BytesAreBudgetedLikeMessagesAndTheLargestMessageAlwaysFits) {
  FloodGuard guard(smallLimits(), 1 << 20);
  EXPECT_EQ(guard.check("a", 3000, 0.0), Verdict::kTake);
  EXPECT_EQ(guard.check("a", 3000, 0.0), Verdict::kDropTell);  // 1000 bytes left
  EXPECT_EQ(guard.check("a", 3000, 2.0), Verdict::kTake);      // 2 s refill 2000: 3000 left
  // byte_burst 0 derives from the attachment limit: one message of that size passes.
  FloodLimits derived = smallLimits();
  derived.byte_burst = 0;
  FloodGuard big(derived, 1 << 20);
  EXPECT_EQ(big.check("a", (1 << 20) + 1000, 0.0), Verdict::kTake);
  EXPECT_EQ(big.check("a", 1 << 20, 0.0), Verdict::kDropTell);
}

TEST(FloodGuard, AKeyThatKeepsFloodingIsBlockedForItsTimeThenStartsAfresh) {
  FloodGuard guard(smallLimits(), 1 << 20);
  for (int i = 0; i < 5; ++i) guard.check("a", 1, 0.0);
  EXPECT_EQ(guard.check("a", 1, 0.0), Verdict::kDropTell);
  EXPECT_EQ(guard.check("a", 1, 0.0), Verdict::kDrop);
  EXPECT_EQ(guard.check("a", 1, 0.0), Verdict::kDrop);
  EXPECT_EQ(guard.check("a", 1, 0.0), Verdict::kBlockNow);  // the 4th of the episode
  EXPECT_EQ(guard.blockedKeys(), 1u);
  EXPECT_EQ(guard.check("a", 1, 59.9), Verdict::kBlocked);  // refilled long ago, still blocked
  EXPECT_EQ(guard.check("b", 1, 59.9), Verdict::kTake);
  EXPECT_EQ(guard.check("a", 1, 60.0), Verdict::kTake);  // served: a full budget again
  for (int i = 0; i < 4; ++i) EXPECT_EQ(guard.check("a", 1, 60.0), Verdict::kTake) << i;
  EXPECT_EQ(guard.check("a", 1, 60.0), Verdict::kDropTell);
}

// A steady flooder: over its rate, a message is taken whenever a token has refilled, the rest are
// dropped. Those takes do not end the episode (before, only drops in a row counted, and such a
// flooder was never blocked); a key whose drops stop for quiet_s starts a new one.
TEST(FloodGuard, AKeyOverItsRateIsBlockedThoughSomeOfItsMessagesAreTaken) {
  FloodGuard guard(smallLimits(), 1 << 20);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(guard.check("a", 1, 0.0), Verdict::kTake) << i;
  EXPECT_EQ(guard.check("a", 1, 0.0), Verdict::kDropTell);  // drop 1
  EXPECT_EQ(guard.check("a", 1, 0.5), Verdict::kTake);      // a refilled token
  EXPECT_EQ(guard.check("a", 1, 0.5), Verdict::kDrop);      // drop 2
  EXPECT_EQ(guard.check("a", 1, 1.0), Verdict::kTake);
  EXPECT_EQ(guard.check("a", 1, 1.0), Verdict::kDrop);      // drop 3
  EXPECT_EQ(guard.check("a", 1, 1.5), Verdict::kTake);
  EXPECT_EQ(guard.check("a", 1, 1.5), Verdict::kBlockNow);  // drop 4: blocked
  EXPECT_EQ(guard.check("a", 1, 2.0), Verdict::kBlocked);
  // Another key drops 3, goes quiet for 3.5 s, then drops again: a new episode, not blocked.
  for (int i = 0; i < 5; ++i) guard.check("b", 1, 0.0);
  EXPECT_EQ(guard.check("b", 1, 0.0), Verdict::kDropTell);
  EXPECT_EQ(guard.check("b", 1, 0.0), Verdict::kDrop);
  EXPECT_EQ(guard.check("b", 1, 0.0), Verdict::kDrop);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(guard.check("b", 1, 3.5), Verdict::kTake) << i;
  EXPECT_EQ(guard.check("b", 1, 3.5), Verdict::kDropTell);
  EXPECT_EQ(guard.blockedKeys(), 1u);
}

TEST(FloodGuard, ManyKeysAreForgottenOnceRefilledButNotWhileBlockedOrDraining) {
  FloodLimits l = smallLimits();
  l.max_keys = 10;
  FloodGuard guard(l, 1 << 20);
  for (int i = 0; i < 5; ++i) guard.check("drained", 1, 0.0);
  for (int i = 0; i < 9; ++i) guard.check("blocked", 1, 0.0);  // 5 taken, 4 dropped: blocked
  for (int i = 0; i < 8; ++i) EXPECT_EQ(guard.check("k" + std::to_string(i), 1, 0.0), Verdict::kTake);
  EXPECT_EQ(guard.trackedKeys(), 10u);
  // At 1 s the eight keys that sent one message have refilled (forgotten); "drained" (2 tokens
  // back of 5) and "blocked" are kept.
  EXPECT_EQ(guard.check("new", 1, 1.0), Verdict::kTake);
  EXPECT_EQ(guard.trackedKeys(), 3u);
  EXPECT_EQ(guard.check("blocked", 1, 1.0), Verdict::kBlocked);
  EXPECT_EQ(guard.check("drained", 1, 1.0), Verdict::kTake);   // 2 refilled, 1 used
  EXPECT_EQ(guard.check("drained", 1, 1.0), Verdict::kTake);
  EXPECT_EQ(guard.check("drained", 1, 1.0), Verdict::kDropTell);  // a fresh entry would take it
}

TEST(FloodGuard, OnlyTheFirstDropAndTheBlockAreAnsweredNamingTheLimits) {
  const FloodLimits l = smallLimits();
  EXPECT_FALSE(floodAnswer(Verdict::kTake, l, "k"));
  EXPECT_FALSE(floodAnswer(Verdict::kDrop, l, "k"));
  EXPECT_FALSE(floodAnswer(Verdict::kBlocked, l, "k"));
  const auto told = floodAnswer(Verdict::kDropTell, l, "k");
  ASSERT_TRUE(told);
  EXPECT_NE(told->reason.find("at most 2 messages (5 at once)"), std::string::npos) << told->reason;
  const auto blocked = floodAnswer(Verdict::kBlockNow, l, "k");
  ASSERT_TRUE(blocked);
  EXPECT_NE(blocked->reason.find("blocked for 60 s after 4 messages dropped in one flood (no 3 s without a drop"),
            std::string::npos)
      << blocked->reason;
}

}  // namespace
}  // namespace cairn::coordinator
