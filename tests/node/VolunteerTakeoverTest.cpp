// A volunteer's side of a replacement (docs/OPERATIONS.md "A lost volunteer is replaced by a
// spare"): a spare's assignment carrying the coordinator's checkpoint is written and verified, a
// running volunteer's `peers` update is checked against the node it runs, and VolunteerPeers
// stops a paused run only once an update is pending, then writes the new node.json.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/CurveKeys.h"
#include "core/Error.h"
#include "core/JsonReader.h"
#include "node/pipeline/ProviderRun.h"
#include "node/volunteer/VolunteerAssignment.h"
#include "node/volunteer/VolunteerPeers.h"
#include "node/volunteer/VolunteerWorkdir.h"
#include "trainer/Checkpoint.h"
#include "trainer/DealSampler.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;

struct VolunteerTakeoverTempDir {
  std::string path;
  VolunteerTakeoverTempDir() {
    path = (fs::temp_directory_path() / ("cairn_takeover_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(std::random_device{}())))
               .string();
    fs::create_directories(path);
  }
  ~VolunteerTakeoverTempDir() { fs::remove_all(path); }
};

std::string volunteerTakeoverDoublingStage() {
  torch::jit::Module m("Doubling");
  m.define("def forward(self, x):\n  return x * 2.0\n");
  std::ostringstream bytes;
  m.save(bytes);
  return bytes.str();
}

NodeSpec stem(const std::string& own_key) {
  NodeSpec node;
  node.name = "node_1";
  node.job_id = "job-7";
  node.address = "127.0.0.1:7001";
  node.cluster = 0;
  node.stage = 1;
  node.num_stages = 3;
  node.role = StageRole::kStem;
  node.upstream = PeerRef{"node_0", "127.0.0.1:7000", generateCurveKeyPair().public_key};
  node.downstream = PeerRef{"node_2", "127.0.0.1:7002", generateCurveKeyPair().public_key};
  node.inputs = {{"x", "tensor", "float32", {1, 4}}};
  node.outputs = {{"y", "tensor", "float32", {1, 4}}};
  node.extra["public_key"] = own_key;
  node.extra["num_clusters"] = 1;
  return node;
}

// `node` written as its node.json under DIR/node_data; returns that node_data folder.
std::string writtenNodeData(const VolunteerTakeoverTempDir& dir, const NodeSpec& node) {
  const std::string node_data = dir.path + "/node_data";
  fs::create_directories(nodeDirectory(node_data, node.name));
  writeJsonFile(nodeSpecPath(node_data, node.name), toJson(node));
  return node_data;
}

Assignment takeover(const NodeSpec& node, std::optional<std::string> checkpoint, int64_t step) {
  JobSpec job;
  job.job_id = node.job_id;
  job.data.location = "/nonexistent/data";
  job.data.format = "idx";
  Assignment a;
  a.name = node.name;
  a.node = toJson(node);
  a.job = toJson(job);
  a.stage = volunteerTakeoverDoublingStage();
  a.checkpoint = std::move(checkpoint);
  a.checkpoint_step = step;
  return a;
}

std::string checkpointBytes(const std::string& dir, int64_t step) {
  CheckpointData data;
  data.step = step;
  data.tensors = {{"stage.w", torch::arange(4, torch::kFloat32)}};
  writeCheckpoint(dir, data, 3);
  std::ifstream in(checkpointPath(dir, step), std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

TEST(VolunteerTakeover, ASparesAssignmentWithACheckpointIsWrittenVerifiedAndResumed) {
  VolunteerTakeoverTempDir dir;
  VolunteerWorkdir workdir(dir.path + "/spare");
  const CurveKeyPair identity = workdir.loadOrCreateIdentity();
  const std::string bytes = checkpointBytes(dir.path + "/source", 40);
  const CheckedAssignment a =
      checkAssignment(takeover(stem(identity.public_key), bytes, 40), "node_1", identity.public_key, "c");
  ASSERT_TRUE(a.checkpoint.has_value());
  EXPECT_EQ(a.checkpoint_step, 40);
  const WrittenAssignment written = workdir.writeAssignment(a, identity);
  EXPECT_TRUE(written.resume);
  EXPECT_EQ(written.checkpoint_steps, std::vector<int64_t>{40});
  const std::string checkpoints = nodeDirectory(written.node_data, "node_1") + "/checkpoints";
  // The very tensors of the coordinator's file.
  const CheckpointData back = readCheckpoint(checkpoints, 40);
  ASSERT_EQ(back.tensors.size(), 1u);
  EXPECT_TRUE(torch::equal(back.tensors[0].second, torch::arange(4, torch::kFloat32)));

  // A checkpoint that does not verify is refused, naming the step, and not left behind.
  VolunteerTakeoverTempDir other;
  VolunteerWorkdir second(other.path + "/spare");
  std::string corrupt = bytes;
  corrupt[corrupt.size() / 2] ^= 0x5a;
  const CheckedAssignment bad =
      checkAssignment(takeover(stem(identity.public_key), corrupt, 40), "node_1", identity.public_key, "c");
  try {
    second.writeAssignment(bad, identity);
    FAIL() << "a corrupt checkpoint was accepted";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint of step 40 for node_1 does not verify"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(validCheckpointSteps(other.path + "/spare/node_data/nodes/node_1/checkpoints").empty());
  // A checkpoint without its step is refused before anything is written.
  EXPECT_THROW(checkAssignment(takeover(stem(identity.public_key), bytes, -1), "node_1",
                               identity.public_key, "c"),
               BadInput);
}

std::string peersError(const PeersUpdate& u, const NodeSpec& current, const std::string& key) {
  try {
    checkPeersUpdate(u, current, key, "the coordinator at c:1");
  } catch (const BadInput& e) {
    return e.what();
  }
  return "";
}

TEST(VolunteerTakeover, APeersUpdateMayOnlyMoveThePeers) {
  const std::string own = generateCurveKeyPair().public_key;
  const NodeSpec current = stem(own);
  NodeSpec moved = current;
  moved.downstream->address = "127.0.0.1:7009";
  moved.downstream->public_key = generateCurveKeyPair().public_key;
  moved.extra.erase("num_clusters");
  const NodeSpec next = checkPeersUpdate({"node_1", toJson(moved)}, current, own, "c");
  EXPECT_EQ(next.downstream->address, "127.0.0.1:7009");
  EXPECT_EQ(next.downstream->public_key, moved.downstream->public_key);
  EXPECT_EQ(next.extra["num_clusters"], 1);  // kept from the node it runs
  EXPECT_EQ(next.extra["public_key"], own);

  EXPECT_NE(peersError({"node_2", toJson(moved)}, current, own).find("is for \"node_2\""),
            std::string::npos);
  NodeSpec other = moved;
  other.cluster = 1;
  EXPECT_NE(peersError({"node_1", toJson(other)}, current, own).find("is another node"),
            std::string::npos);
  other = moved;
  other.address = "127.0.0.1:7100";
  EXPECT_NE(peersError({"node_1", toJson(other)}, current, own).find("moves this node itself"),
            std::string::npos);
  other = moved;
  other.extra["public_key"] = generateCurveKeyPair().public_key;
  EXPECT_NE(peersError({"node_1", toJson(other)}, current, own).find("not this volunteer's key"),
            std::string::npos);
  nlohmann::json broken = toJson(moved);
  broken.erase("inputs");
  EXPECT_NE(peersError({"node_1", broken}, current, own).find("coordinator peers: node.json"),
            std::string::npos);
  for (const std::string& e : {peersError({"node_2", toJson(moved)}, current, own)})
    EXPECT_EQ(e.rfind("the coordinator at c:1 sent a peers update this volunteer cannot use: ", 0), 0u) << e;
}

// A Root that took an offered deal wrote it into its node.json as the deal in force; the
// coordinator's next update (written before it heard every Root take it) still offers it over the
// old deal. Written as it came, the update undid the take and the Root's next run (stopped while
// paused to take the update) planned with the old deal (the 24-volunteer soak). The deal taken
// stays in force; an update offering another deal, or none, is written as it came.
TEST(VolunteerTakeover, AnUpdateStillOfferingTheDealTakenKeepsItInForce) {
  VolunteerTakeoverTempDir dir;
  const std::string own = generateCurveKeyPair().public_key;
  const nlohmann::json old_deal = {{{"from_epoch", 0}, {"clusters", 2}}};
  const nlohmann::json grown = {{{"from_epoch", 0}, {"clusters", 2}}, {{"from_epoch", 2}, {"clusters", 3}}};
  NodeSpec taken = stem(own);
  taken.extra["deal"] = grown;  // what the Root wrote when it took the offer
  const std::string node_data = dir.path + "/node_data";
  fs::create_directories(nodeDirectory(node_data, "node_1"));
  const std::string path = nodeSpecPath(node_data, "node_1");
  VolunteerPeers peers(node_data, "node_1", own, "c");
  for (const bool same_offer : {true, false}) {
    writeJsonFile(path, toJson(taken));
    NodeSpec update = taken;
    update.upstream->address = "127.0.0.1:7556";  // a replaced neighbour: not applied live
    update.extra["deal"] = old_deal;
    update.extra["offered_deal"] = same_offer ? grown : nlohmann::json(old_deal);
    peers.offer({"node_1", toJson(update)});
    ASSERT_TRUE(peers.applyPending());
    const NodeSpec written = readNodeSpec(path);
    EXPECT_EQ(written.upstream->address, "127.0.0.1:7556");
    EXPECT_EQ(written.extra["deal"], same_offer ? grown : old_deal) << same_offer;
    EXPECT_EQ(written.extra.contains("offered_deal"), !same_offer) << same_offer;
  }
}

// What a Root proposes from the start of a run (ProviderRun.h startingOffer): the offer node.json
// holds over the deal in force; else the deal in force a growth brought (a Root that took it and
// ran its stage again: proposing nothing, it kept the Roots that missed the take from following
// it); nothing without either. DealChange.ARootUnderTheDealOfferedProposesItAsTakenAndChangesNothing
// checks what the trainer then proposes.
TEST(VolunteerTakeover, ARootStartsOfferingTheOfferOrTheGrownDealInForce) {
  const nlohmann::json old_deal = {{{"from_epoch", 0}, {"clusters", 2}}};
  const nlohmann::json grown = {{{"from_epoch", 0}, {"clusters", 2}}, {{"from_epoch", 2}, {"clusters", 3}}};
  NodeSpec node = stem(generateCurveKeyPair().public_key);
  EXPECT_EQ(startingOffer(node), std::nullopt);  // no growth in this run
  node.extra["deal"] = old_deal;
  node.extra["offered_deal"] = grown;
  EXPECT_EQ(startingOffer(node), std::optional<nlohmann::json>(grown));  // undecided: offered again
  putDealInForce(node.extra, grown);                                     // taken, then run again
  EXPECT_EQ(startingOffer(node), std::optional<nlohmann::json>(grown));
}

TEST(VolunteerTakeover, APendingUpdateStopsOnlyAPausedOrStartingRunThenIsWritten) {
  VolunteerTakeoverTempDir dir;
  const std::string own = generateCurveKeyPair().public_key;
  const NodeSpec current = stem(own);
  const std::string node_data = writtenNodeData(dir, current);
  VolunteerPeers peers(node_data, "node_1", own, "c");
  bool signal = false;
  const auto stop = peers.stopWhenReplaced([&] { return signal; });
  std::vector<std::string> seen;
  const auto on_event = peers.watch([&](const nlohmann::json& e) { seen.push_back(e.dump()); });
  EXPECT_FALSE(peers.applyPending());  // nothing pending
  NodeSpec moved = current;
  moved.upstream->address = "127.0.0.1:7555";
  peers.offer({"node_1", toJson(moved)});
  EXPECT_TRUE(peers.pending());
  // Not training yet (no "plan" event: connecting, agreeing on the resume step): the run stops and
  // starts again with the new peers at once.
  EXPECT_TRUE(stop());
  on_event({{"plan", {{"total_steps", 100}, {"steps_per_epoch", 10}, {"batch_size", 32}}}});
  EXPECT_FALSE(stop());  // training: the update waits for the pause
  on_event({{"state", "paused"}, {"message", "neighbour node_0 lost"}});
  EXPECT_TRUE(stop());
  on_event({{"state", "resumed"}, {"message", "from step 10"}});
  EXPECT_FALSE(stop());
  on_event({{"state", "paused"}, {"message", "again"}});
  EXPECT_TRUE(stop());
  EXPECT_EQ(seen.size(), 4u);  // every event still reaches the inner function
  EXPECT_TRUE(peers.applyPending());
  EXPECT_FALSE(peers.pending());
  EXPECT_FALSE(stop());
  EXPECT_EQ(readNodeSpec(nodeSpecPath(node_data, "node_1")).upstream->address, "127.0.0.1:7555");
  signal = true;
  EXPECT_TRUE(stop());
  // An update that does not check is dropped, the node.json kept.
  NodeSpec wrong = current;
  wrong.stage = 0;
  peers.offer({"node_1", toJson(wrong)});
  EXPECT_FALSE(peers.applyPending());
  EXPECT_EQ(readNodeSpec(nodeSpecPath(node_data, "node_1")).stage, 1);
}

// The coordinator sends a replacement's update at once and again on the next heartbeat
// (coordinator/MemberReplacer.h sendAtOnce): the repeat of an update held, or of one written, changes
// nothing — no second restart of the stage, no live re-pointing.
TEST(VolunteerTakeover, ARepeatedUpdateChangesNothing) {
  VolunteerTakeoverTempDir dir;
  const std::string own = generateCurveKeyPair().public_key;
  const NodeSpec current = stem(own);
  const std::string node_data = writtenNodeData(dir, current);
  VolunteerPeers peers(node_data, "node_1", own, "c");
  int live_calls = 0;
  peers.liveHook()([&](const NodeSpec&) -> std::vector<std::string> { ++live_calls; return {}; });
  NodeSpec moved = current;
  moved.upstream->address = "127.0.0.1:7555";
  peers.offer({"node_1", toJson(moved)});
  peers.offer({"node_1", toJson(moved)});  // the repeat while held
  EXPECT_TRUE(peers.pending());
  EXPECT_TRUE(peers.applyPending());
  EXPECT_FALSE(peers.applyPending());  // once
  peers.offer({"node_1", toJson(moved)});  // the repeat once written
  EXPECT_FALSE(peers.pending());
  EXPECT_EQ(live_calls, 0);
  EXPECT_EQ(readNodeSpec(nodeSpecPath(node_data, "node_1")).upstream->address, "127.0.0.1:7555");
  // Not a repeat (the same neighbours, something else changed): taken live.
  NodeSpec changed = readNodeSpec(nodeSpecPath(node_data, "node_1"));
  changed.extra["units"] = {1, 2};
  peers.offer({"node_1", toJson(changed)});
  EXPECT_EQ(live_calls, 1);
  peers.liveHook()({});
}

// Growing: a peers update the running node takes live (same neighbours, e.g. ring members
// appended) is handed to the run; one the run refuses is ignored with a warning and never
// crashes the volunteer, node.json kept.
TEST(VolunteerTakeover, ALiveUpdateTheRunRefusesIsIgnoredAndNodeJsonKept) {
  VolunteerTakeoverTempDir dir;
  const std::string own = generateCurveKeyPair().public_key;
  const NodeSpec current = stem(own);
  const std::string node_data = writtenNodeData(dir, current);
  VolunteerPeers peers(node_data, "node_1", own, "c");
  int calls = 0;
  bool refuse = true;
  peers.liveHook()([&](const NodeSpec& updated) -> std::vector<std::string> {
    ++calls;
    if (refuse) CAIRN_THROW(BadInput, "ring members for ", updated.name, ": refused");
    return {"node_9 joins the rings"};
  });
  NodeSpec changed = current;
  changed.extra["units"] = {1, 2};  // same peers: taken live
  EXPECT_NO_THROW(peers.offer({"node_1", toJson(changed)}));
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(peers.pending());
  EXPECT_FALSE(readNodeSpec(nodeSpecPath(node_data, "node_1")).extra.contains("units"));
  refuse = false;
  peers.offer({"node_1", toJson(changed)});
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(readNodeSpec(nodeSpecPath(node_data, "node_1")).extra.contains("units"));
  peers.liveHook()({});
}

// provider --join --memory-gb: a stage whose estimate needs more than the volunteer gives is
// refused with a sentence naming the node and both figures; one that fits, or no limit, is not.
TEST(VolunteerLimits, AStageBiggerThanTheMemoryGivenIsRefusedWithASentence) {
  NodeSpec node;
  node.name = "node_3";
  node.estimated_memory_bytes = 5.1e9;
  EXPECT_EQ(whyTooBigForVolunteer(node, 4.0),
            "refused node node_3: its stage needs an estimated 5.10 GB and this volunteer gives "
            "4.00 GB (--memory-gb)");
  EXPECT_EQ(whyTooBigForVolunteer(node, 5.1), "");  // exactly what it gives: fits
  EXPECT_EQ(whyTooBigForVolunteer(node, 16.0), "");
  EXPECT_EQ(whyTooBigForVolunteer(node, 0.0), "");  // 0: no limit
}

}  // namespace
}  // namespace cairn
