// A replacement sooner (coordinator/MemberReplacer.h): a holder whose connections to the
// coordinator all closed is lost after --gone-after-s (ConnectionWatch.h), and the peers a
// replacement re-points get their update at once as well as on their next heartbeat. Expected values
// are written out by hand from the plan each test builds (ReplacerRuns.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <optional>

#include "coordinator/CoordinatorStore.h"
#include "coordinator/MemberReplacer.h"
#include "coordinator/Replacement.h"
#include "core/JsonReader.h"
#include "core/NodeData.h"
#include "tests/coordinator/ReplacementNodes.h"
#include "tests/coordinator/ReplacerRuns.h"

namespace cairn::coordinator {
namespace {

namespace fs = std::filesystem;
using testing::placeOneNode;
using testing::replacementFreshDir;
using testing::replacementMember;
using testing::twoByThree;
using testing::writeTwoByThreeRun;

// With the coordinator's connection watch (ConnectionWatch.h, --gone-after-s): a holder whose
// connections all closed is lost after the gone time, long before --lost-after-s, and of two
// spares the one whose connections all closed too (its process ended while it waited) is passed
// over for the one still connected, though it joined first.
TEST(MemberReplacer, AHolderWhoseConnectionsClosedGoesToTheSpareStillConnected) {
  const std::string out = replacementFreshDir("gone");
  CoordinatorStore store(out + "/coordinator.db");
  placeOneNode(out, store, replacementMember("node_0", MemberState::kAssigned, /*last_seen=*/100));
  const Member dead_spare = replacementMember("node_1", MemberState::kSpare, 100, 8, 5);
  const Member spare = replacementMember("node_2", MemberState::kSpare, 100, 8, 6);
  store.putMember(dead_spare);
  store.putMember(spare);
  std::map<std::string, double> gone = {{store.memberByName("node_0")->public_key, 101},
                                        {dead_spare.public_key, 90}};
  std::vector<std::string> sent_to;
  MemberReplacer replacer(store, out, /*lost_after_s=*/600, 0,
                          [&](const std::string& key, const Frames&) { sent_to.push_back(key); });
  replacer.poll(103);  // gone 2 s: not yet (and silent 3 s of 600)
  EXPECT_EQ(store.memberByName("node_0")->state, MemberState::kAssigned);
  replacer.watchConnections({[&gone](const std::string& key) -> std::optional<double> {
                               const auto it = gone.find(key);
                               return it == gone.end() ? std::nullopt : std::optional<double>(it->second);
                             },
                             3});
  replacer.poll(103.5);
  EXPECT_EQ(store.memberByName("node_0")->state, MemberState::kAssigned);
  replacer.poll(104.5);  // gone 3.5 s
  EXPECT_EQ(replacer.replaced(), 1u);
  EXPECT_EQ(store.memberByName("node_0")->public_key, spare.public_key);
  EXPECT_EQ(store.memberByKey(dead_spare.public_key)->state, MemberState::kSpare);
  ASSERT_EQ(sent_to.size(), 2u);  // accepted + assignment, both to the connected spare
  EXPECT_EQ(sent_to[0], spare.public_key);
  EXPECT_EQ(sent_to[1], spare.public_key);
  fs::remove_all(out);
}

// The peers a replacement re-points get their node.json at once on their heartbeat connection
// (sendAtOnce), exactly the file on disk, and are still owed it on their next heartbeat (a message
// to a connection that went meanwhile is lost; the volunteer ignores the repeat). A member whose
// heartbeat connection is not known gets it on its heartbeat only.
TEST(MemberReplacer, PeersGoOutAtOnceAndAgainOnTheNextHeartbeat) {
  const std::string out = replacementFreshDir("at_once");
  CoordinatorStore store(out + "/coordinator.db");
  writeTwoByThreeRun(out, store);
  std::vector<std::string> placed;
  for (const NodeSpec& n : twoByThree()) placed.push_back(n.name);
  store.setMeta("placed", nlohmann::json(placed).dump());
  for (const auto& n : placed)
    if (n != "node_1") store.touch(n, 110);
  store.touch("node_6", 110);  // the spare's "waiting" heartbeats
  const std::string unknown_key = store.memberByName("node_4")->public_key;  // no heartbeat route
  std::map<std::string, std::vector<PeersUpdate>> at_once;  // by key
  std::vector<std::pair<std::string, Frames>> sent;
  MemberReplacer replacer(store, out, 15, 100, [&](const std::string& key, const Frames& f) { sent.emplace_back(key, f); });
  replacer.sendAtOnce([&](const std::string& key, const Frames& frames) {
    if (key == unknown_key) return false;
    std::string why;
    const auto m = decodeToVolunteer(frames, 1 << 20, &why);
    EXPECT_TRUE(m && std::holds_alternative<PeersUpdate>(*m)) << why;
    if (m) at_once[key].push_back(std::get<PeersUpdate>(*m));
    return true;
  });
  replacer.poll(116);
  ASSERT_EQ(replacer.replaced(), 1u);
  ASSERT_EQ(at_once.size(), 2u);  // node_0 and node_2 at once; node_4's route unknown
  for (const std::string name : {"node_0", "node_2"}) {
    const auto& got = at_once[store.memberByName(name)->public_key];
    ASSERT_EQ(got.size(), 1u) << name;
    EXPECT_EQ(got[0].name, name);
    EXPECT_EQ(got[0].node, toJson(readNodeSpec(nodeSpecPath(out, name)))) << name;
  }
  // Still owed to all three: each gets it again on its next heartbeat.
  for (const std::string name : {"node_0", "node_2", "node_4"}) {
    const size_t before = sent.size();
    replacer.onHeartbeat(*store.memberByName(name));
    ASSERT_EQ(sent.size(), before + 1) << name;
    replacer.onHeartbeat(*store.memberByName(name));
    EXPECT_EQ(sent.size(), before + 1) << name;  // once
  }
  fs::remove_all(out);
}

}  // namespace
}  // namespace cairn::coordinator
