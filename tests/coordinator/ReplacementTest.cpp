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
}

// Who may hold a node: one placed dial-out only anyone (it dials its peers); one placed reachable a
// reachable volunteer, or a dial-out-only one whose links turn around, which needs a relay where a
// peer of the node dials out only too. The spares of the node's own kind are tried first.
TEST(Replacement, WhoMayHoldANodeAndInWhichOrderTheSparesAreTried) {
  Member reachable = replacementMember("node_3", MemberState::kSpare, 0, 8, 1);
  Member behind = replacementMember("node_4", MemberState::kSpare, 0, 8, 2);
  behind.dial_out_only = true;
  std::vector<NodeSpec> nodes = twoByThree();
  const NodeSpec all_reachable = nodes[1];  // node_1: peers node_0, node_2, node_4, all reachable
  markDialOutOnly(nodes, {"node_4"});
  const NodeSpec ring_peer_behind = nodes[1];  // node_1 again, its ring peer node_4 dial-out only
  markDialOutOnly(nodes, {"node_1"});
  const NodeSpec placed_behind = nodes[1];
  EXPECT_EQ(dialOutOnlyPeersOf(all_reachable), std::vector<std::string>{});
  EXPECT_EQ(dialOutOnlyPeersOf(ring_peer_behind), std::vector<std::string>{"node_4"});
  for (const bool relays : {false, true}) {
    EXPECT_TRUE(canHold(reachable, all_reachable, relays));
    EXPECT_TRUE(canHold(reachable, ring_peer_behind, relays));
    EXPECT_TRUE(canHold(reachable, placed_behind, relays));
    EXPECT_TRUE(canHold(behind, all_reachable, relays));
    EXPECT_EQ(canHold(behind, ring_peer_behind, relays), relays);
    EXPECT_TRUE(canHold(behind, placed_behind, relays));
  }
  auto names = [](const std::vector<Member>& members) {
    std::vector<std::string> out;
    for (const Member& m : members) out.push_back(m.name);
    return out;
  };
  const std::vector<Member> members = {behind, reachable};
  EXPECT_EQ(names(sparesFor(members, all_reachable, false)), std::vector<std::string>({"node_3", "node_4"}));
  EXPECT_EQ(names(sparesFor(members, ring_peer_behind, false)), std::vector<std::string>({"node_3"}));
  EXPECT_EQ(names(sparesFor(members, ring_peer_behind, true)), std::vector<std::string>({"node_3", "node_4"}));
  EXPECT_EQ(names(sparesFor({reachable, behind}, placed_behind, false)),
            std::vector<std::string>({"node_4", "node_3"}));
  // chooseSpare then takes the first that fits: the other kind when its own is too small.
  std::vector<Member> small_behind = {reachable, behind};
  small_behind[1] = replacementMember("node_4", MemberState::kSpare, 0, 1, 2);
  small_behind[1].dial_out_only = true;
  EXPECT_EQ(chooseSpare(sparesFor(small_behind, placed_behind, false), 4.0)->name, "node_3");
  EXPECT_EQ(chooseSpare(sparesFor(members, placed_behind, false), 4.0)->name, "node_4");
  std::vector<Member> small_reachable = members;
  small_reachable[1] = replacementMember("node_3", MemberState::kSpare, 0, 1, 1);
  EXPECT_EQ(chooseSpare(sparesFor(small_reachable, all_reachable, false), 4.0)->name, "node_4");
  EXPECT_FALSE(chooseSpare(sparesFor(small_reachable, ring_peer_behind, false), 4.0).has_value());
  EXPECT_EQ(unlikeReachNote(ring_peer_behind),
            "node_1 needs a new holder; this volunteer joined as dial-out only, so it would dial "
            "node_1's peers, but node_4 dials out only too, and a link between two such volunteers "
            "needs a relay, which nobody offers (a volunteer's `provider --join … --relay`, or the "
            "coordinator's --relay); it stays a spare");
}

// node_0 -> node_1 -> node_2, one pipeline, with stages estimated at 0.03, 0.24 and 0.37 GB, all
// reachable.
std::vector<NodeSpec> threePlacedNodes() {
  std::vector<NodeSpec> placed(3);
  const double gb[] = {0.03, 0.24, 0.37};
  for (int i = 0; i < 3; ++i) {
    placed[size_t(i)].name = "node_" + std::to_string(i);
    placed[size_t(i)].estimated_memory_bytes = gb[i] * 1e9;
    if (i > 0) placed[size_t(i)].upstream = peerRef("node_" + std::to_string(i - 1));
    if (i < 2) placed[size_t(i)].downstream = peerRef("node_" + std::to_string(i + 1));
  }
  return placed;
}

TEST(Replacement, ASpareIsToldWhichStagesFitItsRam) {
  const std::vector<NodeSpec> placed = threePlacedNodes();
  const Member small = replacementMember("node_5", MemberState::kSpare, 0, 0.1);
  EXPECT_EQ(spareNote(small, placed, false),
            "the run is planned; this volunteer waits as a spare: it takes over a node whose "
            "volunteer is lost or leaves if its stage fits in the 0.10 GB it gives (node_0 0.03 GB; "
            "not node_1 0.24 GB, node_2 0.37 GB), or, with the coordinator's --grow, joins a new cluster");
  const Member tiny = replacementMember("node_6", MemberState::kSpare, 0, 0.02);
  EXPECT_NE(spareNote(tiny, placed, false).find("no stage of the plan fits in the 0.02 GB this volunteer gives"),
            std::string::npos);
  EXPECT_EQ(spareNote(small, {}, false), "");
}

// A spare's note names the nodes it cannot hold (canHold): example.volunteers_short's
// dial-out-only spare was once told the reachable Stem fitted when it could not take it. Here node_1
// is placed dial-out only, so a dial-out-only spare could hold node_0 (its peer node_1) only
// through a relay; a reachable spare can take over any node that fits.
TEST(Replacement, ASpareIsToldWhichNodesItCannotHold) {
  std::vector<NodeSpec> placed = threePlacedNodes();
  markDialOutOnly(placed, {"node_1"});
  Member reachable = replacementMember("node_5", MemberState::kSpare, 0, 0.3);
  EXPECT_EQ(spareNote(reachable, placed, false),
            "the run is planned; this volunteer waits as a spare: it takes over a node whose "
            "volunteer is lost or leaves if its stage fits in the 0.30 GB it gives (node_0 0.03 GB, "
            "node_1 0.24 GB; not node_2 0.37 GB), or, with the coordinator's --grow, joins a new "
            "cluster");
  Member behind = reachable;
  behind.dial_out_only = true;
  EXPECT_EQ(spareNote(behind, placed, false),
            "the run is planned; this volunteer waits as a spare: it takes over a node whose "
            "volunteer is lost or leaves if its stage fits in the 0.30 GB it gives (node_1 0.24 GB; "
            "not node_2 0.37 GB) and it can reach that node's peers (not node_0: this volunteer "
            "joined as dial-out only, and so are peers of theirs, which it could reach only through "
            "a relay, and none is offered), or, with the coordinator's --grow, joins a new cluster");
  EXPECT_EQ(spareNote(behind, placed, true), spareNote(reachable, placed, false));  // a relay
  std::vector<NodeSpec> two = {placed[0], placed[2]};  // node_0 (peer node_1 dials out) and node_2
  EXPECT_EQ(spareNote(behind, two, false),
            "no node of the plan can be taken over by this volunteer: node_0 fit in the 0.30 GB it "
            "gives, but this volunteer joined as dial-out only, and so are peers of theirs, which "
            "it could reach only through a relay, and none is offered; the others need more (node_2 "
            "0.37 GB); it waits as a spare, and with the coordinator's --grow joins a new cluster");
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

// The references to node_1 of twoByThree in a plan's told nodes (node_0's downstream, node_2's
// upstream, node_4's ring entry): dial-out only, no address, `key`, no relay.
void expectToldNode1DialsOut(const ReplacementPlan& plan, const std::string& key) {
  ASSERT_EQ(plan.told.size(), 3u);
  const PeerRef* refs[] = {&*plan.told[0].downstream, &*plan.told[1].upstream,
                           &plan.told[2].rings[0].members[0]};
  for (const PeerRef* ref : refs) {
    EXPECT_EQ(ref->name, "node_1");
    EXPECT_TRUE(ref->dial_out_only);
    EXPECT_EQ(ref->address, "");
    EXPECT_EQ(ref->public_key, key);
    EXPECT_FALSE(ref->relay.has_value());
  }
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
  expectToldNode1DialsOut(plan, fresh);
}

// A node placed reachable taken over by a dial-out-only spare is placed dial-out only from then on:
// no address in its node.json nor in its peers' references, which name the spare's key; its peers
// are reachable here, so they accept its dial and no link needs a relay.
TEST(Replacement, ADialOutOnlyHolderTurnsTheLinksOfANodePlacedReachable) {
  const std::vector<NodeSpec> nodes = twoByThree();
  const std::string fresh = generateCurveKeyPair().public_key;
  const ReplacementPlan plan = planReplacement(nodes, "node_1", "", fresh, /*holder_dial_out_only=*/true);
  EXPECT_TRUE(plan.turned);
  EXPECT_EQ(plan.relayed, 0u);
  EXPECT_TRUE(plan.taken_over.dial_out_only);
  EXPECT_EQ(plan.taken_over.address, "");
  EXPECT_EQ(plan.taken_over.extra["public_key"], fresh);
  EXPECT_EQ(plan.taken_over.upstream->address, peerRef("node_0").address);  // it dials them there
  EXPECT_FALSE(plan.taken_over.upstream->dial_out_only);
  expectToldNode1DialsOut(plan, fresh);
  // A reachable holder keeps the node as placed.
  EXPECT_FALSE(planReplacement(nodes, "node_1", "127.0.0.9:6001", fresh).turned);
}

// Turned dial-out only, a node whose ring peer node_4 dials out only too reaches it through the
// relay carrying the fewest links (relay_1 carries node_4-node_5 already), named in both ends'
// entries; its reachable neighbours get no relay. Without a relay the plan is refused.
TEST(Replacement, ATurnedNodesLinkToADialOutOnlyPeerGoesThroughTheLeastLoadedRelay) {
  std::vector<NodeSpec> nodes = twoByThree();
  markDialOutOnly(nodes, {"node_4", "node_5"});
  const PeerRef::Relay r1{"relay_1", "10.0.9.1:7000", testing::keyOf("node_91")},
      r2{"relay_2", "10.0.9.2:7000", testing::keyOf("node_92")};
  EXPECT_EQ(relayLinksOfNode(nodes, "node_5", {r1}), 1u);  // node_4-node_5, through relay_1
  const std::string fresh = generateCurveKeyPair().public_key;
  const ReplacementPlan plan = planReplacement(nodes, "node_1", "", fresh, true, {r1, r2});
  EXPECT_TRUE(plan.turned);
  EXPECT_EQ(plan.relayed, 1u);
  const PeerRef& ring_peer = plan.taken_over.rings[0].members[1];
  EXPECT_EQ(ring_peer.name, "node_4");
  ASSERT_TRUE(ring_peer.relay.has_value());
  EXPECT_EQ(ring_peer.relay->name, "relay_2");
  EXPECT_FALSE(plan.taken_over.upstream->relay.has_value());
  EXPECT_FALSE(plan.taken_over.downstream->relay.has_value());
  ASSERT_EQ(plan.told.size(), 3u);
  EXPECT_EQ(plan.told[2].name, "node_4");
  ASSERT_TRUE(plan.told[2].rings[0].members[0].relay.has_value());
  EXPECT_EQ(plan.told[2].rings[0].members[0].relay->name, "relay_2");
  EXPECT_EQ(plan.told[2].downstream->relay->name, "relay_1");  // its other relayed link, as it was
  EXPECT_THROW(planReplacement(nodes, "node_1", "", fresh, true, {}), BadInput);
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
