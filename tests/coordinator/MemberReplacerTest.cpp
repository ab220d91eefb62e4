// MemberReplacer carrying out the replacement of a lost volunteer against a real store and
// node_data folder (coordinator/MemberReplacer.h), and NodeHeaders, what it reads of node.json.
// Expected values are written out by hand from the plan each test builds (ReplacementNodes.h).
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
#include "tests/coordinator/ReplacerRuns.h"
#include "tests/common/ScratchDir.h"

namespace cairn::coordinator {
namespace {

namespace fs = std::filesystem;
using testing::peerRef;
using testing::replacementMember;
using testing::twoByThree;
using testing::placeOneNode;
using testing::replacementFreshDir;
using testing::writeTwoByThreeRun;

TEST(MemberReplacer, ASpareTakesALostNodeOverWithItsCheckpointAndItsPeersAreTold) {
  const std::string out = replacementFreshDir("replacer");
  CoordinatorStore store(out + "/coordinator.db");
  const Member spare = writeTwoByThreeRun(out, store);
  std::vector<std::string> placed;
  for (const NodeSpec& n : twoByThree()) placed.push_back(n.name);
  store.setMeta("placed", nlohmann::json(placed).dump());
  fs::create_directories(out + "/checkpoints/node_1");
  const std::string ckpt = out + "/checkpoints/node_1/step_20.ckpt";
  std::ofstream(ckpt, std::ios::binary) << "checkpoint bytes";
  store.putCheckpoint({"node_1", 20, ckpt, 7});
  const std::string lost_key = store.memberByName("node_1")->public_key;

  std::vector<std::pair<std::string, Frames>> sent;
  MemberReplacer replacer(store, out, 15, /*started_at=*/100,
                          [&](const std::string& key, const Frames& f) { sent.emplace_back(key, f); });
  // Everyone heard at 110 but node_1 (last at 100).
  for (const auto& n : placed)
    if (n != "node_1") store.touch(n, 110);
  store.touch("node_6", 110);  // the spare's "waiting" heartbeats
  replacer.poll(114);  // 14 s of silence: not yet
  EXPECT_TRUE(sent.empty());
  replacer.poll(116);
  EXPECT_EQ(replacer.replaced(), 1u);
  ASSERT_EQ(sent.size(), 2u);
  std::string why;
  // To the spare: first its new name, then the assignment with the checkpoint.
  EXPECT_EQ(sent[0].first, spare.public_key);
  auto first = decodeToVolunteer(sent[0].second, 1 << 20, &why);
  ASSERT_TRUE(first) << why;
  const auto* accepted = std::get_if<Accepted>(&*first);
  ASSERT_NE(accepted, nullptr);
  EXPECT_EQ(accepted->name, "node_1");
  EXPECT_EQ(accepted->state, "assigned");
  EXPECT_EQ(sent[1].first, spare.public_key);
  auto second = decodeToVolunteer(sent[1].second, 1 << 20, &why);
  ASSERT_TRUE(second) << why;
  const auto* a = std::get_if<Assignment>(&*second);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->name, "node_1");
  EXPECT_EQ(a->stage, "stage of node_1");
  ASSERT_TRUE(a->checkpoint.has_value());
  EXPECT_EQ(*a->checkpoint, "checkpoint bytes");
  EXPECT_EQ(a->checkpoint_step, 20);
  EXPECT_EQ(a->num_clusters, 2);
  const NodeSpec given = parseNodeSpec(a->node, "assignment");
  EXPECT_EQ(given.address, spare.advertise);
  EXPECT_EQ(given.extra["public_key"], spare.public_key);
  EXPECT_EQ(parseJobSpec(a->job, "assignment").job_id, "job");

  // The store: node_1 is now the spare's; the lost volunteer's row is kept, lost.
  const auto holder = store.memberByName("node_1");
  ASSERT_TRUE(holder);
  EXPECT_EQ(holder->public_key, spare.public_key);
  EXPECT_EQ(holder->state, MemberState::kAssigned);
  EXPECT_FALSE(store.memberByName("node_6"));
  const auto old = store.memberByKey(lost_key);
  ASSERT_TRUE(old);
  EXPECT_EQ(old->name, "node_1-lost-1");
  EXPECT_EQ(old->state, MemberState::kLost);
  // The lost volunteer coming back is refused its old name; without it, it rejoins (as a spare:
  // Admissions::rejoin, its node being taken).
  JoinAsk ask{"t", "127.0.0.1:7001", {8, 4, 50, 1000, {}, "1.13.0"}, "node_1"};
  EXPECT_NE(decideJoin(ask, lost_key, "t", {}, store.members(), "1.13.0").reason.find("belongs to another key"),
            std::string::npos);
  ask.name.clear();
  EXPECT_EQ(decideJoin(ask, lost_key, "t", {}, store.members(), "1.13.0").kind, JoinDecision::Kind::kRejoining);
  // The plan on disk: node_1 and the three nodes naming it re-pointed.
  EXPECT_EQ(readNodeSpec(nodeSpecPath(out, "node_1")).address, spare.advertise);
  EXPECT_EQ(readNodeSpec(nodeSpecPath(out, "node_0")).downstream->address, spare.advertise);
  EXPECT_EQ(readNodeSpec(nodeSpecPath(out, "node_4")).rings[0].members[0].public_key, spare.public_key);
  EXPECT_EQ(readNodeSpec(nodeSpecPath(out, "node_3")).downstream->address, peerRef("node_4").address);

  // Peers go out on each told replacementMember's next heartbeat, once; a restarted coordinator still owes
  // the ones not sent yet.
  sent.clear();
  replacer.onHeartbeat(*store.memberByName("node_3"));  // not told
  EXPECT_TRUE(sent.empty());
  replacer.onHeartbeat(*store.memberByName("node_0"));
  ASSERT_EQ(sent.size(), 1u);
  auto peers = decodeToVolunteer(sent[0].second, 1 << 20, &why);
  ASSERT_TRUE(peers) << why;
  const auto* update = std::get_if<PeersUpdate>(&*peers);
  ASSERT_NE(update, nullptr);
  EXPECT_EQ(update->name, "node_0");
  EXPECT_EQ(parseNodeSpec(update->node, "peers").downstream->public_key, spare.public_key);
  replacer.onHeartbeat(*store.memberByName("node_0"));
  EXPECT_EQ(sent.size(), 1u);
  MemberReplacer restarted(store, out, 15, 200,
                           [&](const std::string& key, const Frames& f) { sent.emplace_back(key, f); });
  restarted.onHeartbeat(*store.memberByName("node_2"));
  restarted.onHeartbeat(*store.memberByName("node_4"));
  EXPECT_EQ(sent.size(), 3u);
  restarted.poll(210);  // everyone heard since its start: nothing lost, nothing sent
  EXPECT_EQ(sent.size(), 3u);
  fs::remove_all(out);
}

TEST(MemberReplacer, WithoutASpareTheNodeStaysLostUntilOneJoins) {
  const std::string out = replacementFreshDir("nospare");
  CoordinatorStore store(out + "/coordinator.db");
  placeOneNode(out, store, replacementMember("node_0", MemberState::kAssigned, 0));
  std::vector<Frames> sent;
  MemberReplacer replacer(store, out, 5, 0, [&](const std::string&, const Frames& f) { sent.push_back(f); });
  replacer.poll(10);
  EXPECT_EQ(store.memberByName("node_0")->state, MemberState::kLost);
  EXPECT_TRUE(sent.empty());
  store.putMember(replacementMember("node_1", MemberState::kSpare, 10, 8, 5));
  replacer.poll(11);
  ASSERT_EQ(sent.size(), 2u);  // accepted + assignment, without a checkpoint (none uploaded)
  std::string why;
  auto a = decodeToVolunteer(sent[1], 1 << 20, &why);
  ASSERT_TRUE(a) << why;
  EXPECT_FALSE(std::get<Assignment>(*a).checkpoint.has_value());
  EXPECT_EQ(store.memberByName("node_0")->state, MemberState::kAssigned);
  fs::remove_all(out);
}

// A dial-out-only spare takes over a node placed reachable: its links turn around. node_1's ring
// peer node_4 dials out only too, so that link needs a relay: with none offered the spare hears why
// it cannot take node_1, whatever its RAM (example.volunteers_short once told a 9.76 GB spare that a
// 0.03 GB stage did not fit), once; with a relay it takes node_1 over, which is placed dial-out only
// from then on, and the link node_1-node_4 goes through the relay, named in both node.json files.
TEST(MemberReplacer, ADialOutOnlySpareTakesANodePlacedReachableThroughARelayWhereItsPeerDialsOutToo) {
  const std::string out = replacementFreshDir("turned");
  CoordinatorStore store(out + "/coordinator.db");
  Member spare = writeTwoByThreeRun(out, store);
  spare.dial_out_only = true;
  spare.advertise = "";
  store.putMember(spare);
  std::vector<NodeSpec> nodes = twoByThree();
  markDialOutOnly(nodes, {"node_4"});
  std::vector<std::string> placed;
  for (const NodeSpec& n : nodes) {
    writeJsonFile(nodeSpecPath(out, n.name), toJson(n));
    placed.push_back(n.name);
  }
  store.setMeta("placed", nlohmann::json(placed).dump());
  for (const auto& n : placed)
    if (n != "node_1") store.touch(n, 110);
  store.touch("node_6", 110);
  std::vector<std::pair<std::string, Frames>> sent;
  MemberReplacer replacer(store, out, 15, 100,
                          [&](const std::string& key, const Frames& f) { sent.emplace_back(key, f); });
  std::vector<PeerRef::Relay> relays;
  replacer.relayThrough([&] { return relays; });
  replacer.poll(116);
  EXPECT_EQ(store.memberByName("node_1")->state, MemberState::kLost);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].first, spare.public_key);
  std::string why;
  auto told = decodeToVolunteer(sent[0].second, 1 << 20, &why);
  ASSERT_TRUE(told) << why;
  EXPECT_EQ(std::get<Accepted>(*told).note, unlikeReachNote(nodes[1]));
  EXPECT_NE(std::get<Accepted>(*told).note.find("but node_4 dials out only too"), std::string::npos);
  replacer.poll(117);  // told once
  EXPECT_EQ(sent.size(), 1u);

  relays = {{"relay_1", "10.0.9.1:7000", testing::keyOf("node_91")}};
  replacer.poll(118);
  ASSERT_EQ(sent.size(), 3u);  // accepted + assignment, to the dial-out-only spare
  EXPECT_EQ(sent[2].first, spare.public_key);
  EXPECT_EQ(store.memberByName("node_1")->public_key, spare.public_key);
  const NodeSpec taken = readNodeSpec(nodeSpecPath(out, "node_1"));
  EXPECT_TRUE(taken.dial_out_only);
  EXPECT_EQ(taken.address, "");
  ASSERT_TRUE(taken.rings[0].members[1].relay.has_value());
  EXPECT_EQ(*taken.rings[0].members[1].relay, relays[0]);
  EXPECT_FALSE(taken.upstream->relay.has_value());
  const NodeSpec ring_peer = readNodeSpec(nodeSpecPath(out, "node_4"));
  EXPECT_TRUE(ring_peer.rings[0].members[0].dial_out_only);
  EXPECT_EQ(ring_peer.rings[0].members[0].public_key, spare.public_key);
  ASSERT_TRUE(ring_peer.rings[0].members[0].relay.has_value());
  EXPECT_EQ(*ring_peer.rings[0].members[0].relay, relays[0]);
  const NodeSpec upstream = readNodeSpec(nodeSpecPath(out, "node_0"));
  EXPECT_TRUE(upstream.downstream->dial_out_only);
  EXPECT_EQ(upstream.downstream->address, "");
  EXPECT_FALSE(upstream.downstream->relay.has_value());  // node_0 is reachable: node_1 dials it
}

// A volunteer that joined dial-out only.
Member behindRouter(const std::string& name, MemberState state, double last_seen, double ram_gb,
                    double joined_at) {
  Member m = replacementMember(name, state, last_seen, ram_gb, joined_at);
  m.dial_out_only = true;
  m.advertise = "";
  return m;
}

// The spare that receives node_0's assignment (accepted + assignment, in that order).
Assignment assignmentSentTo(const std::vector<std::pair<std::string, Frames>>& sent,
                            const Member& spare) {
  EXPECT_EQ(sent.size(), 2u);
  if (sent.size() != 2u) return {};
  EXPECT_EQ(sent[1].first, spare.public_key);
  std::string why;
  auto a = decodeToVolunteer(sent[1].second, 1 << 20, &why);
  EXPECT_TRUE(a) << why;
  return a ? std::get<Assignment>(*a) : Assignment{};
}

// A node placed dial-out only dials its peers, which any volunteer can do: when no dial-out-only
// spare fits, a reachable one takes it over, and its node.json keeps no address (the reachable
// holder dials out too). When both kinds fit, the dial-out-only spare gets it, even if it joined
// later: reachable spares are kept for the nodes only they can hold.
TEST(MemberReplacer, AReachableSpareTakesOverANodePlacedDialOutOnly) {
  for (const bool behind_fits : {false, true}) {
    SCOPED_TRACE(behind_fits ? "both fit" : "only the reachable spare fits");
    const std::string out = replacementFreshDir(behind_fits ? "alike_first" : "reachable_holds");
    CoordinatorStore store(out + "/coordinator.db");
    placeOneNode(out, store, behindRouter("node_0", MemberState::kAssigned, 0, 8, 0), true);
    const Member reachable = replacementMember("node_1", MemberState::kSpare, 10, 16, 5);
    const Member behind = behindRouter("node_2", MemberState::kSpare, 10, behind_fits ? 16 : 4, 6);
    store.putMember(reachable);
    store.putMember(behind);
    std::vector<std::pair<std::string, Frames>> sent;
    MemberReplacer replacer(store, out, 5, 0,
                            [&](const std::string& key, const Frames& f) { sent.emplace_back(key, f); });
    replacer.poll(10);
    const Member& taker = behind_fits ? behind : reachable;
    const Assignment a = assignmentSentTo(sent, taker);
    EXPECT_EQ(a.name, "node_0");
    const NodeSpec written = readNodeSpec(nodeSpecPath(out, "node_0"));
    EXPECT_TRUE(written.dial_out_only);
    EXPECT_EQ(written.address, "");
    EXPECT_EQ(written.extra.value("public_key", ""), taker.public_key);
    EXPECT_EQ(a.node, toJson(written));
    const auto holder = store.memberByName("node_0");
    ASSERT_TRUE(holder.has_value());
    EXPECT_EQ(holder->public_key, taker.public_key);
    EXPECT_EQ(holder->state, MemberState::kAssigned);
    EXPECT_EQ(holder->dial_out_only, taker.dial_out_only);  // the volunteer's own kind, kept
    const Member& other = behind_fits ? reachable : behind;
    EXPECT_EQ(store.memberByName(other.name)->state, MemberState::kSpare);
  }
}

// The coordinator plans on its loop thread (1,000 volunteers: about 20 s, tools/bench/coordinator_load):
// no heartbeat is read meanwhile, so silence counts from the plan's end (deafUntil), not from the
// volunteer's last heartbeat before it; a volunteer silent for --lost-after-s after that is lost.
TEST(MemberReplacer, SilenceCountsFromTheEndOfALongPlan) {
  const std::string out = replacementFreshDir("deaf");
  CoordinatorStore store(out + "/coordinator.db");
  placeOneNode(out, store, replacementMember("node_0", MemberState::kAssigned, /*last_seen=*/10));
  MemberReplacer replacer(store, out, 15, /*started_at=*/0, [](const std::string&, const Frames&) {});
  replacer.deafUntil(30);  // planned from 10 to 30: node_0's heartbeats were not read
  replacer.poll(31);       // 21 s after its last heartbeat read, 1 s after the plan
  EXPECT_EQ(store.memberByName("node_0")->state, MemberState::kAssigned);
  replacer.deafUntil(20);  // never earlier than before
  replacer.poll(45);
  EXPECT_EQ(store.memberByName("node_0")->state, MemberState::kAssigned);
  replacer.poll(46);  // 16 s after the plan, still unheard: lost
  EXPECT_EQ(store.memberByName("node_0")->state, MemberState::kLost);
  fs::remove_all(out);
}

// A frozen volunteer (SIGSTOP: the 24-volunteer soak's fault) wakes after it was marked lost but
// before any spare came: it holds its node again, and the spare that joins later stays a spare
// (taking the node over would leave two processes training it). Silent again, it is lost again.
TEST(MemberReplacer, ALostNodeHeardAgainBeforeASpareCameIsHeldByItsVolunteerAgain) {
  const std::string out = replacementFreshDir("woken");
  CoordinatorStore store(out + "/coordinator.db");
  const Member holder = replacementMember("node_0", MemberState::kAssigned, 0);
  placeOneNode(out, store, holder);
  std::vector<Frames> sent;
  MemberReplacer replacer(store, out, 5, 0, [&](const std::string&, const Frames& f) { sent.push_back(f); });
  replacer.poll(10);
  ASSERT_EQ(store.memberByName("node_0")->state, MemberState::kLost);
  // Its heartbeat again (the coordinator touches the row, then tells the replacer).
  store.touch("node_0", 12);
  replacer.onHeartbeat(*store.memberByName("node_0"));
  EXPECT_EQ(store.memberByName("node_0")->state, MemberState::kAssigned);
  EXPECT_EQ(store.memberByName("node_0")->public_key, holder.public_key);
  const Member spare = replacementMember("node_1", MemberState::kSpare, 12, 8, 5);
  store.putMember(spare);
  replacer.poll(13);
  EXPECT_TRUE(sent.empty());
  EXPECT_EQ(store.memberByName("node_1")->state, MemberState::kSpare);
  EXPECT_EQ(replacer.replaced(), 0u);
  // Silent for longer than --lost-after-s again: lost again, and now the spare (heard: its
  // "waiting" heartbeats) takes it over.
  store.touch("node_1", 17);
  replacer.poll(18);
  EXPECT_EQ(replacer.replaced(), 1u);
  EXPECT_EQ(store.memberByName("node_0")->public_key, spare.public_key);
  EXPECT_EQ(store.memberByKey(holder.public_key)->name, "node_0-lost-1");
  fs::remove_all(out);
}

// A replacement while a growth is proposed (its spares assigned, their node.json written, the
// cluster not formed yet): the 24-volunteer soak's new cluster formed a minute after a ring peer
// of it was replaced and started with the lost volunteer's key, so it refused the replacement's
// connections. The growth's nodes are re-pointed too, and owed nothing (their holders get the
// whole file when the cluster forms). Here cluster 1 of twoByThree is the proposed growth.
TEST(MemberReplacer, AReplacementDuringAProposedGrowthRepointsTheGrowthsNodesToo) {
  const std::string out = replacementFreshDir("growing");
  CoordinatorStore store(out + "/coordinator.db");
  const Member spare = writeTwoByThreeRun(out, store);
  std::vector<std::string> placed, growing;
  for (const NodeSpec& n : twoByThree()) (n.cluster == 0 ? placed : growing).push_back(n.name);
  store.setMeta("placed", nlohmann::json(placed).dump());
  store.setMeta("growth", nlohmann::json({{"state", "proposed"}, {"cluster", 1}, {"spares", growing}}).dump());
  EXPECT_EQ(proposedGrowthNodes(store), growing);
  std::vector<std::pair<std::string, Frames>> sent;
  MemberReplacer replacer(store, out, 15, /*started_at=*/100,
                          [&](const std::string& key, const Frames& f) { sent.emplace_back(key, f); });
  for (const auto& n : placed)
    if (n != "node_1") store.touch(n, 110);
  store.touch("node_6", 110);  // the spare's "waiting" heartbeats
  replacer.poll(116);  // node_1 silent for 16 s: the spare takes it
  ASSERT_EQ(replacer.replaced(), 1u);
  // node_4 (cluster 1's stage 1) lists node_1 in its ring: re-pointed on disk, told nothing.
  EXPECT_EQ(readNodeSpec(nodeSpecPath(out, "node_4")).rings[0].members[0].public_key, spare.public_key);
  EXPECT_EQ(readNodeSpec(nodeSpecPath(out, "node_4")).rings[0].members[0].address, spare.advertise);
  sent.clear();
  replacer.onHeartbeat(*store.memberByName("node_4"));
  EXPECT_TRUE(sent.empty());
  replacer.onHeartbeat(*store.memberByName("node_0"));  // a placed neighbour is told as before
  EXPECT_EQ(sent.size(), 1u);
  // Once formed (state "done"), a growth's nodes are placed ones like any other.
  store.setMeta("growth", nlohmann::json({{"state", "done"}, {"cluster", 1}, {"spares", growing}}).dump());
  EXPECT_TRUE(proposedGrowthNodes(store).empty());
  fs::remove_all(out);
}

// NodeHeaders (what spareNote, the replacer's poll and the chunk worker read): a file is parsed
// once per version (a rewrite by writeJsonFile is read again, with its new figures, the others are
// not), its lists are left empty (of the rings, only members placed dial-out only are kept) and
// everything else equals readNodeSpec's, and a missing file is BadInput naming it.
TEST(NodeHeaders, ParsesEachNodeJsonOncePerVersionAndKeepsItsHeader) {
  const std::string out = replacementFreshDir("headers");
  std::vector<NodeSpec> nodes = twoByThree();
  for (NodeSpec& n : nodes) {
    n.estimated_memory_bytes = 1e9 * (1 + n.stage);
    fs::create_directories(nodeDirectory(out, n.name));
    writeJsonFile(nodeSpecPath(out, n.name), toJson(n));
  }
  NodeHeaders headers(out);
  std::vector<std::string> names;
  for (const NodeSpec& n : nodes) names.push_back(n.name);
  for (int round = 0; round < 3; ++round) {
    const std::vector<NodeSpec> got = headers.headers(names);
    ASSERT_EQ(got.size(), nodes.size());
    for (size_t i = 0; i < got.size(); ++i) {
      NodeSpec expected = readNodeSpec(nodeSpecPath(out, names[i]));
      EXPECT_FALSE(expected.rings.empty());
      EXPECT_TRUE(got[i].rings.empty() && got[i].inputs.empty() && got[i].outputs.empty());
      expected.rings.clear();
      expected.inputs.clear();
      expected.outputs.clear();
      EXPECT_EQ(toJson(got[i]), toJson(expected)) << names[i];
    }
  }
  EXPECT_EQ(headers.parses(), nodes.size());
  // node_4 moves to another cluster and needs more memory: only its file is read again.
  nodes[4].cluster = 7;
  nodes[4].estimated_memory_bytes = 5e9;
  writeJsonFile(nodeSpecPath(out, "node_4"), toJson(nodes[4]));
  EXPECT_EQ(headers.header("node_4").cluster, 7);
  EXPECT_DOUBLE_EQ(headers.header("node_4").estimated_memory_bytes, 5e9);
  EXPECT_EQ(headers.header("node_3").cluster, 1);
  EXPECT_EQ(headers.parses(), nodes.size() + 1);
  // Of the rings, a header keeps the members placed dial-out only (what canHold needs): node_1's
  // ring peer node_4, once node_1's file says it dials out only.
  markDialOutOnly(nodes, {"node_4"});
  writeJsonFile(nodeSpecPath(out, "node_1"), toJson(nodes[1]));
  const NodeSpec& node_1 = headers.header("node_1");
  ASSERT_EQ(node_1.rings.size(), 1u);
  ASSERT_EQ(node_1.rings[0].members.size(), 1u);
  EXPECT_EQ(node_1.rings[0].members[0].name, "node_4");
  EXPECT_EQ(dialOutOnlyPeersOf(node_1), std::vector<std::string>{"node_4"});
  EXPECT_EQ(headers.parses(), nodes.size() + 2);
  fs::remove(nodeSpecPath(out, "node_5"));
  try {
    headers.header("node_5");
    FAIL() << "a missing node.json was served from the cache";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find(nodeSpecPath(out, "node_5")), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cairn::coordinator
