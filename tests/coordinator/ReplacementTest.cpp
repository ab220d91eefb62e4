// The coordinator's replacement decisions for a lost volunteer (coordinator/Replacement.h). Expected
// values are written out by hand from the plan each test builds. MemberReplacer carrying them out
// against a real store and node_data folder: MemberReplacerTest.cpp.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "coordinator/CoordinatorStore.h"
#include "coordinator/DialOutPlacement.h"
#include "coordinator/Growth.h"
#include "coordinator/JoinPolicy.h"
#include "coordinator/MemberReplacer.h"
#include "coordinator/NodeHeaders.h"
#include "coordinator/Replacement.h"
#include "core/CurveKeys.h"
#include "core/Error.h"
#include "core/JsonReader.h"
#include "core/NodeData.h"
#include "tests/coordinator/ReplacementNodes.h"

namespace cairn::coordinator {
namespace {

namespace fs = std::filesystem;
using testing::peerRef;
using testing::replacementMember;
using testing::twoByThree;

TEST(Replacement, FindLostCountsSilenceFromTheCoordinatorsStartAndTakesLeftAndUnreplacedNodes) {
  const std::vector<Member> members = {
      replacementMember("node_0", MemberState::kAssigned, 100),  // silent for 30 s
      replacementMember("node_1", MemberState::kAssigned, 125),  // heard 5 s ago
      replacementMember("node_2", MemberState::kLeft, 129),      // said it leaves
      replacementMember("node_3", MemberState::kDone, 10),       // result in: never lost
      replacementMember("node_4", MemberState::kLost, 10),       // lost earlier, no spare yet
      replacementMember("node_5", MemberState::kSpare, 10),      // not placed
  };
  const std::vector<std::string> placed = {"node_0", "node_1", "node_2", "node_3", "node_4"};
  auto lost = findLost(members, placed, 130, /*heard_since=*/0, /*lost_after_s=*/15);
  ASSERT_EQ(lost.size(), 3u);
  EXPECT_EQ(lost[0].name, "node_0");
  EXPECT_TRUE(lost[0].newly);
  EXPECT_NE(lost[0].why.find("no heartbeat for 30.0 s"), std::string::npos) << lost[0].why;
  EXPECT_EQ(lost[1].name, "node_2");
  EXPECT_FALSE(lost[1].newly);
  EXPECT_EQ(lost[2].name, "node_4");
  EXPECT_FALSE(lost[2].newly);
  // A coordinator that started at 120 (restarted) has heard nobody for only 10 s.
  lost = findLost(members, placed, 130, /*heard_since=*/120, /*lost_after_s=*/15);
  ASSERT_EQ(lost.size(), 2u);
  EXPECT_EQ(lost[0].name, "node_2");
  // Exactly at the threshold is not yet lost.
  EXPECT_TRUE(findLost({replacementMember("node_0", MemberState::kAssigned, 100)}, {"node_0"}, 115, 0, 15).empty());
}

// The coordinator calls findLost every 200 ms with every member (tools/bench/coordinator_load: 5,000
// volunteers), so it looks each placed node up once (a search per placed node was 2 x 10^8 name
// comparisons at 20,000: 0.7 s at -O2, measured by the benchmark, not here). Against the rule:
// among 5,000 members placed in the other order, exactly the one silent past --lost-after-s and
// the placed name no member holds are lost, in placed order.
TEST(Replacement, FindLostAmongManyMembersNamesTheSilentAndTheMissing) {
  constexpr int kNodes = 5000;
  std::vector<Member> members;
  std::vector<std::string> placed;
  for (int i = 0; i < kNodes; ++i) {
    members.push_back(replacementMember("node_" + std::to_string(i), MemberState::kAssigned,
                                        i == kNodes - 1 ? 0 : 125));
    placed.push_back("node_" + std::to_string(kNodes - 1 - i));  // the other order: no early hits
  }
  placed.push_back("node_missing");
  const auto lost = findLost(members, placed, 130, 0, 15);
  ASSERT_EQ(lost.size(), 2u);
  EXPECT_EQ(lost[0].name, "node_" + std::to_string(kNodes - 1));  // silent for 130 s
  EXPECT_EQ(lost[1].name, "node_missing");
}

TEST(Replacement, ChoosesTheEarliestSpareWhoseRamHoldsTheStagesEstimate) {
  const Member lost = replacementMember("node_1", MemberState::kLost, 0, /*ram_gb=*/8);
  std::vector<Member> members = {
      replacementMember("node_0", MemberState::kAssigned, 0, 64, 1),
      lost,
      replacementMember("node_6", MemberState::kSpare, 0, 4, 2),   // too small for 5 GB
      replacementMember("node_7", MemberState::kSpare, 0, 6, 3),
      replacementMember("node_8", MemberState::kSpare, 0, 32, 4),
  };
  NodeSpec node;
  node.name = "node_1";
  node.estimated_memory_bytes = 5e9;
  EXPECT_DOUBLE_EQ(neededGb(node, lost), 5.0);  // the stage's estimate, not the lost one's 8 GB
  auto spare = chooseSpare(members, neededGb(node, lost));
  ASSERT_TRUE(spare.has_value());
  EXPECT_EQ(spare->name, "node_7");
  node.estimated_memory_bytes = 0;  // no estimate: what the lost volunteer had
  EXPECT_EQ(chooseSpare(members, neededGb(node, lost))->name, "node_8");
  members[3].state = MemberState::kAssigned;
  members[4].state = MemberState::kLeft;
  EXPECT_FALSE(chooseSpare(members, 5.0).has_value());
  EXPECT_EQ(tooSmallNote(members[2], "node_1", 5.0),
            "node_1 needs a new holder, but its stage needs an estimated 5.00 GB and this volunteer "
            "gives 4.00 GB; it stays a spare");
  EXPECT_EQ(unlikeReachNote("node_1"),
            "node_1 needs a new holder its peers can dial, as they dialled its lost holder, and this "
            "volunteer joined as dial-out only; it stays a spare");
}

// Who may hold a node: one placed reachable only a reachable volunteer (its peers dial it); one
// placed dial-out only anyone (it dials its peers), the spares of its own kind tried first.
TEST(Replacement, ANodePlacedDialOutOnlyTakesAReachableSpareAfterTheDialOutOnlyOnes) {
  Member reachable = replacementMember("node_3", MemberState::kSpare, 0, 8, 1);
  Member behind = replacementMember("node_4", MemberState::kSpare, 0, 8, 2);
  behind.dial_out_only = true;
  EXPECT_TRUE(canHold(reachable, false));
  EXPECT_TRUE(canHold(reachable, true));
  EXPECT_FALSE(canHold(behind, false));
  EXPECT_TRUE(canHold(behind, true));
  auto names = [](const std::vector<Member>& members) {
    std::vector<std::string> out;
    for (const Member& m : members) out.push_back(m.name);
    return out;
  };
  const std::vector<Member> members = {reachable, behind};
  EXPECT_EQ(names(sparesFor(members, false)), std::vector<std::string>({"node_3"}));
  EXPECT_EQ(names(sparesFor(members, true)), std::vector<std::string>({"node_4", "node_3"}));
  // chooseSpare then takes the first that fits: the reachable one when the other is too small.
  std::vector<Member> small_behind = members;
  small_behind[1] = replacementMember("node_4", MemberState::kSpare, 0, 1, 2);
  small_behind[1].dial_out_only = true;
  EXPECT_EQ(chooseSpare(sparesFor(small_behind, true), 4.0)->name, "node_3");
  EXPECT_EQ(chooseSpare(sparesFor(members, true), 4.0)->name, "node_4");
}

// node_0..2 with stages estimated at 0.03, 0.24 and 0.37 GB, all reachable.
std::vector<NodeSpec> threePlacedNodes() {
  std::vector<NodeSpec> placed(3);
  const double gb[] = {0.03, 0.24, 0.37};
  for (int i = 0; i < 3; ++i) {
    placed[size_t(i)].name = "node_" + std::to_string(i);
    placed[size_t(i)].estimated_memory_bytes = gb[i] * 1e9;
  }
  return placed;
}

TEST(Replacement, ASpareIsToldWhichStagesFitItsRam) {
  const std::vector<NodeSpec> placed = threePlacedNodes();
  const Member small = replacementMember("node_5", MemberState::kSpare, 0, 0.1);
  EXPECT_EQ(spareNote(small, placed),
            "the run is planned; this volunteer waits as a spare: it takes over a node whose "
            "volunteer is lost or leaves if its stage fits in the 0.10 GB it gives (node_0 0.03 GB; "
            "not node_1 0.24 GB, node_2 0.37 GB), or, with the coordinator's --grow, joins a new cluster");
  const Member tiny = replacementMember("node_6", MemberState::kSpare, 0, 0.02);
  EXPECT_NE(spareNote(tiny, placed).find("no stage of the plan fits in the 0.02 GB this volunteer gives"),
            std::string::npos);
  EXPECT_EQ(spareNote(small, {}), "");
}

// A dial-out-only spare cannot take over a node placed reachable (canHold), so its note says which
// nodes it never could: example.volunteers_short's dial-out-only spare was told the reachable Stem
// fitted. A reachable spare can take over any node that fits, one placed dial-out only included.
TEST(Replacement, ASpareIsToldWhichNodesItsKindCannotTakeOver) {
  std::vector<NodeSpec> placed = threePlacedNodes();
  placed[1].dial_out_only = true;
  Member reachable = replacementMember("node_5", MemberState::kSpare, 0, 0.3);
  EXPECT_EQ(spareNote(reachable, placed),
            "the run is planned; this volunteer waits as a spare: it takes over a node whose "
            "volunteer is lost or leaves if its stage fits in the 0.30 GB it gives (node_0 0.03 GB, "
            "node_1 0.24 GB; not node_2 0.37 GB), or, with the coordinator's --grow, joins a new "
            "cluster");
  Member behind = reachable;
  behind.dial_out_only = true;
  EXPECT_EQ(spareNote(behind, placed),
            "the run is planned; this volunteer waits as a spare: it takes over a node whose "
            "volunteer is lost or leaves if its stage fits in the 0.30 GB it gives (node_1 0.24 GB; "
            "not node_2 0.37 GB) and its peers reach it as they reached that node (not node_0: this "
            "volunteer joined as dial-out only, and their peers dial their volunteers), or, with the "
            "coordinator's --grow, joins a new cluster");
  placed[1].dial_out_only = false;  // every node reachable: nothing this spare can take over
  EXPECT_EQ(spareNote(behind, placed),
            "no node of the plan can be taken over by this volunteer: node_0, node_1 fit in the "
            "0.30 GB it gives, but this volunteer joined as dial-out only, and their peers dial their "
            "volunteers; the others need more (node_2 0.37 GB); it waits as a spare, and with the "
            "coordinator's --grow joins a new cluster");
}

TEST(Replacement, PlanRepointsTheNodeItsNeighboursAndItsRingPeersOnly) {
  const std::vector<NodeSpec> nodes = twoByThree();
  const std::string fresh = generateCurveKeyPair().public_key;
  const ReplacementPlan plan = planReplacement(nodes, "node_1", "127.0.0.9:6001", fresh);
  EXPECT_EQ(plan.taken_over.name, "node_1");
  EXPECT_EQ(plan.taken_over.address, "127.0.0.9:6001");
  EXPECT_EQ(plan.taken_over.extra["public_key"], fresh);
  EXPECT_EQ(plan.taken_over.extra["num_clusters"], 2);
  EXPECT_EQ(plan.taken_over.rings[0].members[0].address, "127.0.0.9:6001");  // itself in its ring
  EXPECT_EQ(plan.taken_over.upstream->address, peerRef("node_0").address);       // its peers unchanged
  EXPECT_EQ(plan.taken_over.rings[0].members[1].address, peerRef("node_4").address);
  ASSERT_EQ(plan.told.size(), 3u);
  EXPECT_EQ(plan.told[0].name, "node_0");
  EXPECT_EQ(plan.told[0].downstream->address, "127.0.0.9:6001");
  EXPECT_EQ(plan.told[0].downstream->public_key, fresh);
  EXPECT_EQ(plan.told[0].address, peerRef("node_0").address);
  EXPECT_EQ(plan.told[1].name, "node_2");
  EXPECT_EQ(plan.told[1].upstream->address, "127.0.0.9:6001");
  EXPECT_EQ(plan.told[2].name, "node_4");  // its ring peer in cluster 1
  EXPECT_EQ(plan.told[2].rings[0].members[0].address, "127.0.0.9:6001");
  EXPECT_EQ(plan.told[2].rings[0].members[0].public_key, fresh);
  EXPECT_EQ(plan.told[2].upstream->address, peerRef("node_3").address);
  EXPECT_THROW(planReplacement(nodes, "node_9", "a:1", "k"), BadInput);
}

// A node placed dial-out only keeps no address when a reachable spare takes it over: the new holder
// dials its peers as the lost one did, and their references to it still say it dials them.
TEST(Replacement, ANodePlacedDialOutOnlyKeepsNoAddressWhoeverHoldsIt) {
  std::vector<NodeSpec> nodes = twoByThree();
  markDialOutOnly(nodes, {"node_1"});  // as the coordinator places it (DialOutPlacement.h)
  const std::string fresh = generateCurveKeyPair().public_key;
  const ReplacementPlan plan = planReplacement(nodes, "node_1", "127.0.0.9:6001", fresh);
  EXPECT_TRUE(plan.taken_over.dial_out_only);
  EXPECT_EQ(plan.taken_over.address, "");
  EXPECT_EQ(plan.taken_over.extra["public_key"], fresh);
  ASSERT_EQ(plan.told.size(), 3u);
  const PeerRef* refs[] = {&*plan.told[0].downstream, &*plan.told[1].upstream,
                           &plan.told[2].rings[0].members[0]};
  for (const PeerRef* ref : refs) {
    EXPECT_EQ(ref->name, "node_1");
    EXPECT_TRUE(ref->dial_out_only);
    EXPECT_EQ(ref->address, "");
    EXPECT_EQ(ref->public_key, fresh);
  }
}

// A holder that comes back (restarted) takes its node again if it can still hold it: one placed
// reachable needs it reachable again, one placed dial-out only takes it either way.
TEST(Replacement, AHolderComesBackToItsNodeIfItCanStillHoldIt) {
  const Member holder = replacementMember("node_1", MemberState::kAssigned, 0);
  EXPECT_FALSE(holderCannotComeBack(holder, /*reachable=*/true, /*node_dial_out_only=*/false));
  EXPECT_FALSE(holderCannotComeBack(holder, true, true));
  EXPECT_FALSE(holderCannotComeBack(holder, false, true));
  EXPECT_EQ(holderCannotComeBack(holder, false, false),
            "node_1 holds a node placed as reachable at 127.0.0.1:7001 and is now dial-out only; "
            "join as it was placed, or wait until a spare has taken the node over");
}

TEST(Replacement, TheLostRowGetsTheFirstFreeLostName) {
  const std::vector<Member> members = {replacementMember("node_1", MemberState::kAssigned, 0),
                                       replacementMember("node_1-lost-1", MemberState::kLost, 0)};
  EXPECT_EQ(lostRowName("node_1", members), "node_1-lost-2");
  EXPECT_EQ(lostRowName("node_2", members), "node_2-lost-1");
  EXPECT_TRUE(isLostRowName("node_1-lost-12"));
  for (const char* name : {"node_1", "node_1-lost-", "-lost-1", "node_1-lost-x", "node_1-lost-1a"})
    EXPECT_FALSE(isLostRowName(name)) << name;
}

// A volunteer that said it leaves (its active hours ended) may come back when it does not ask for
// its old name; one that was lost (silent) may not; nor may it ask for the name it gave up.
TEST(Replacement, AVolunteerThatLeftOrWasLostComesBackWithoutItsName) {
  const std::string dir = (fs::temp_directory_path() / ("cairn_left_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  CoordinatorStore store(dir + "/coordinator.db");
  const Member left = replacementMember("node_1", MemberState::kLeft, 0);
  const Member lost = replacementMember("node_2", MemberState::kAssigned, 0);
  store.putMember(left);
  store.putMember(lost);
  store.putMember(replacementMember("node_3", MemberState::kSpare, 0));
  store.putMember(replacementMember("node_4", MemberState::kSpare, 0));
  store.takeOver("node_1", "node_1-lost-1", "node_3", 1);
  store.setState("node_2", MemberState::kLost);
  store.takeOver("node_2", "node_2-lost-1", "node_4", 1);
  EXPECT_EQ(store.memberByName("node_1-lost-1")->state, MemberState::kLeft);  // kept: it said so
  EXPECT_EQ(store.memberByName("node_2-lost-1")->state, MemberState::kLost);

  JoinAsk ask;
  ask.token = "0123456789abcdef0123456789abcdef";
  ask.advertise = "127.0.0.1:7100";
  ask.probe = {8.0, 4, 50.0, 1000.0, {}, "1.13.0"};
  auto decide = [&](const std::string& key) {
    return decideJoin(ask, key, ask.token, {}, store.members(), "1.13.0");
  };
  const JoinDecision back = decide(left.public_key);
  EXPECT_EQ(back.kind, JoinDecision::Kind::kRejoining);
  ASSERT_TRUE(back.member.has_value());
  EXPECT_EQ(back.member->name, "node_1-lost-1");
  // A lost volunteer back (it was frozen, or cut off, past --lost-after-s) rejoins the same way.
  const JoinDecision woken = decide(lost.public_key);
  EXPECT_EQ(woken.kind, JoinDecision::Kind::kRejoining) << woken.reason;
  ASSERT_TRUE(woken.member.has_value());
  EXPECT_EQ(woken.member->name, "node_2-lost-1");
  ask.name = "node_1";  // the name it gave up now belongs to the spare's key
  EXPECT_NE(decide(left.public_key).reason.find("belongs to another key"), std::string::npos);

  store.renameMember("node_1-lost-1", "node_5");
  EXPECT_EQ(store.memberByKey(left.public_key)->name, "node_5");
  EXPECT_THROW(store.renameMember("node_1-lost-1", "node_6"), InternalError);
  fs::remove_all(dir);
}

TEST(Replacement, AMemberSpeakingForTheNodeItLostIsToldItWasTaken) {
  // The row "node_1-lost-1" speaking as node_1: the volunteer frozen past --lost-after-s, back.
  const Rejected taken = notThisMember("node_1-lost-1", "node_1");
  EXPECT_TRUE(taken.node_taken);
  EXPECT_NE(taken.reason.find("node_1 was given to another volunteer"), std::string::npos);
  // Anyone else claiming a name is only told it is not that member.
  for (const auto& [row, claimed] : std::vector<std::pair<std::string, std::string>>{
           {"node_1", "node_2"}, {"node_11-lost-1", "node_1"}, {"node_1-lost-x", "node_1"}, {"", "node_1"},
           {"node_1-lost-", "node_1"}}) {
    const Rejected other = notThisMember(row, claimed);
    EXPECT_FALSE(other.node_taken) << row << " as " << claimed;
    EXPECT_EQ(other.reason, "you are not " + claimed + ": join first") << row;
  }
}

}  // namespace
}  // namespace cairn::coordinator
