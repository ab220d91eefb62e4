// The coordinator's SQLite store (coordinator/CoordinatorStore.h): a reopened store is the same
// run; the loop's group commit (a batch is one transaction: its own reads see it, another
// connection and a crash do not until it is committed, a failed write inside it undoes only
// itself; Outbox holds the replies until then); the oldest of the placed nodes' newest
// checkpoints against a loop over every node.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "coordinator/CoordinatorStore.h"
#include "coordinator/Outbox.h"
#include "core/CurveKeys.h"
#include "core/Error.h"

namespace cairn::coordinator {
namespace {

namespace fs = std::filesystem;

std::string storeDir(const std::string& name) {
  const std::string dir = (fs::temp_directory_path() / ("cairn_store_" + name + "_" +
                                                        std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

const std::string kStoreToken = "0123456789abcdef0123456789abcdef";

Member row(const std::string& name, const std::string& key, const std::string& advertise,
              MemberState state) {
  Member m;
  m.name = name;
  m.public_key = key;
  m.advertise = advertise;
  m.probe_json = R"({"ram_gb":8,"cores":4,"compute_gflops":50,"bandwidth_mbps":1000})";
  m.state = state;
  return m;
}

TEST(CoordinatorStore, KeepsTheRunAcrossReopening) {
  const std::string dir = storeDir("store");
  const std::string key0 = generateCurveKeyPair().public_key, key1 = generateCurveKeyPair().public_key;
  {
    CoordinatorStore store(dir + "/coordinator.db");
    EXPECT_EQ(store.nextMemberName(), "node_0");
    store.setMeta("token", kStoreToken);
    store.putMember(row("node_0", key0, "127.0.0.1:7001", MemberState::kSpare));
    store.putMember(row("node_1", key1, "127.0.0.1:7002", MemberState::kSpare));
    store.setState("node_1", MemberState::kAssigned);
    store.touch("node_1", 1234.5);
    store.putResult({"node_1", dir + "/w.pt", R"({"steps":3})"});
    store.putCheckpoint({"node_1", 40, dir + "/c40", 99});
    store.putCheckpoint({"node_1", 50, dir + "/c50", 100});
  }
  CoordinatorStore store(dir + "/coordinator.db");
  EXPECT_EQ(store.meta("token").value_or(""), kStoreToken);
  EXPECT_FALSE(store.meta("phase").has_value());
  EXPECT_EQ(store.nextMemberName(), "node_2");
  // A name once given is never given again, even when no row holds it any more (node_2 above was
  // given but never stored; a spare that took a lost node over leaves its name unused likewise).
  EXPECT_EQ(store.nextMemberName(), "node_3");
  const auto m1 = store.memberByKey(key1);
  ASSERT_TRUE(m1.has_value());
  EXPECT_EQ(m1->name, "node_1");
  EXPECT_EQ(m1->state, MemberState::kAssigned);
  EXPECT_EQ(m1->advertise, "127.0.0.1:7002");
  EXPECT_DOUBLE_EQ(m1->last_seen, 1234.5);
  ASSERT_EQ(store.members().size(), 2u);
  ASSERT_EQ(store.results().size(), 1u);
  EXPECT_EQ(store.results()[0].summary_json, R"({"steps":3})");
  const auto c = store.checkpoint("node_1");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->step, 50);
  EXPECT_EQ(c->checksum, 100u);
  EXPECT_FALSE(store.checkpoint("node_0").has_value());
}

TEST(CoordinatorStore, RefusesAFileThatIsNotADatabase) {
  const std::string dir = storeDir("notdb");
  {
    std::ofstream f(dir + "/coordinator.db");
    f << "this is not an SQLite file, but long enough to look like a header to sqlite3 ......\n";
  }
  try {
    CoordinatorStore store(dir + "/coordinator.db");
    FAIL() << "opened a text file as the coordinator database";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("coordinator.db"), std::string::npos) << e.what();
  }
}

TEST(CoordinatorStore, ABatchIsSeenByItsOwnReadsAndByAnotherConnectionOnlyOnceCommitted) {
  const std::string db = storeDir("batch") + "/coordinator.db";
  CoordinatorStore store(db);
  store.putMember(row("node_0", generateCurveKeyPair().public_key, "127.0.0.1:7001", MemberState::kSpare));
  CoordinatorStore other(db);  // a second connection: what a restarted coordinator would read
  store.beginBatch();
  EXPECT_TRUE(store.batchOpen());
  store.touch("node_0", 77.0);
  store.setState("node_0", MemberState::kAssigned);
  store.putCheckpoint({"node_0", 12, "/tmp/c12", 5});
  store.beginBatch();  // already open: still one batch
  ASSERT_TRUE(store.memberByName("node_0").has_value());
  EXPECT_DOUBLE_EQ(store.memberByName("node_0")->last_seen, 77.0);
  EXPECT_EQ(store.memberByName("node_0")->state, MemberState::kAssigned);
  EXPECT_EQ(other.memberByName("node_0")->state, MemberState::kSpare);
  EXPECT_DOUBLE_EQ(other.memberByName("node_0")->last_seen, 0.0);
  EXPECT_FALSE(other.checkpoint("node_0").has_value());
  store.commitBatch();
  EXPECT_FALSE(store.batchOpen());
  store.commitBatch();  // none open: nothing happens
  EXPECT_EQ(other.memberByName("node_0")->state, MemberState::kAssigned);
  EXPECT_DOUBLE_EQ(other.memberByName("node_0")->last_seen, 77.0);
  ASSERT_TRUE(other.checkpoint("node_0").has_value());
  EXPECT_EQ(other.checkpoint("node_0")->step, 12);
}

TEST(CoordinatorStore, AStoreClosedWithAnOpenBatchKeepsItsWrites) {
  const std::string db = storeDir("close") + "/coordinator.db";
  {
    CoordinatorStore store(db);
    store.beginBatch();
    store.setMeta("phase", "planned");
    store.putMember(row("node_3", generateCurveKeyPair().public_key, "127.0.0.1:7003", MemberState::kAssigned));
  }
  CoordinatorStore store(db);
  EXPECT_EQ(store.meta("phase").value_or(""), "planned");
  ASSERT_TRUE(store.memberByName("node_3").has_value());
  EXPECT_EQ(store.memberByName("node_3")->state, MemberState::kAssigned);
}

// A take-over that fails inside a batch (no such spare) undoes its own first update (the lost row
// renamed) and nothing else of the batch.
TEST(CoordinatorStore, AFailedTakeOverInsideABatchUndoesOnlyItself) {
  const std::string db = storeDir("savepoint") + "/coordinator.db";
  {
    CoordinatorStore store(db);
    store.putMember(row("node_0", generateCurveKeyPair().public_key, "127.0.0.1:7001", MemberState::kAssigned));
    store.beginBatch();
    store.putMember(row("node_1", generateCurveKeyPair().public_key, "127.0.0.1:7002", MemberState::kSpare));
    try {
      store.takeOver("node_0", "node_0-lost-1", "node_9", 10.0);
      FAIL() << "a take-over by a spare that does not exist went through";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInternal);
      EXPECT_NE(std::string(e.what()).find("node_9"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(store.batchOpen());
    store.takeOver("node_0", "node_0-lost-1", "node_1", 11.0);  // the batch goes on
    store.commitBatch();
  }
  CoordinatorStore store(db);
  ASSERT_TRUE(store.memberByName("node_0-lost-1").has_value());
  EXPECT_EQ(store.memberByName("node_0-lost-1")->state, MemberState::kLost);
  ASSERT_TRUE(store.memberByName("node_0").has_value());
  EXPECT_EQ(store.memberByName("node_0")->advertise, "127.0.0.1:7002");
  EXPECT_EQ(store.memberByName("node_0")->state, MemberState::kAssigned);
  EXPECT_FALSE(store.memberByName("node_1").has_value());
  EXPECT_EQ(store.members().size(), 2u);
}

// One query over meta "placed" against the loop it replaced (a lookup per placed node): seeded
// random plans where some nodes hold no checkpoint, some hold several uploads, and checkpoints of
// nodes that are not placed (a growth's proposed nodes) must not count.
TEST(CoordinatorStore, TheOldestNewestCheckpointOfThePlacedNodesIsTheMinimumOverThem) {
  CoordinatorStore store(storeDir("keep_from") + "/coordinator.db");
  EXPECT_FALSE(store.oldestNewestCheckpointOfPlaced().has_value());  // no plan
  std::mt19937 rng(7);
  for (int round = 0; round < 40; ++round) {
    const int nodes = 1 + int(rng() % 12);
    std::vector<std::string> placed;
    for (int n = 0; n < nodes; ++n) placed.push_back("node_" + std::to_string(round * 100 + n));
    store.beginBatch();  // one fsync per round
    store.setMeta("placed", nlohmann::json(placed).dump());
    for (int n = 0; n < nodes + 2; ++n) {  // the last two are not placed
      if (rng() % 5 == 0) continue;        // holds none
      for (int upload = int(rng() % 3); upload >= 0; --upload)
        store.putCheckpoint({"node_" + std::to_string(round * 100 + n), int64_t(rng() % 500),
                             "/tmp/x", 1});
    }
    std::optional<int64_t> expected;
    bool all_hold = true;
    for (const std::string& name : placed) {
      const auto held = store.checkpoint(name);
      if (!held) all_hold = false;
      else expected = expected ? std::min(*expected, held->step) : held->step;
    }
    if (!all_hold) expected.reset();
    EXPECT_EQ(store.oldestNewestCheckpointOfPlaced(), expected) << "round " << round;
    store.commitBatch();
  }
  store.setMeta("placed", "[]");
  EXPECT_FALSE(store.oldestNewestCheckpointOfPlaced().has_value());
}

}  // namespace
}  // namespace cairn::coordinator

namespace cairn::coordinator {
namespace {

// The Outbox (group commit): while a batch is open a reply is held and the writes are invisible to
// another connection (a restarted coordinator); at the commit the superseded file is removed, then
// the replies go out in order — each delivered reply finds its writes committed and the old file
// gone. With no batch open a reply goes at once.
TEST(Outbox, RepliesWaitForTheCommitOfTheWritesTheyAcknowledge) {
  const std::string dir = storeDir("outbox");
  CoordinatorStore store(dir + "/coordinator.db");
  CoordinatorStore other(dir + "/coordinator.db");
  const std::string old_file = dir + "/step_10.ckpt";
  std::ofstream(old_file) << "old";
  store.putCheckpoint({"node_0", 10, old_file, 1});
  std::vector<std::string> delivered;
  Outbox outbox(store, [&](const std::string& routing_id, const Frames& frames) {
    EXPECT_FALSE(fs::exists(old_file)) << "a reply went out before the old file was removed";
    ASSERT_TRUE(other.checkpoint("node_0").has_value());
    EXPECT_EQ(other.checkpoint("node_0")->step, 20) << "a reply went out before its write was committed";
    delivered.push_back(routing_id + ":" + frames.at(0));
  });
  outbox.begin();
  EXPECT_TRUE(outbox.open());
  store.putCheckpoint({"node_0", 20, dir + "/step_20.ckpt", 2});
  outbox.removeAfterCommit(old_file);
  outbox.send("a", {"ack 20"});
  outbox.send("b", {"metrics ack"});
  EXPECT_TRUE(delivered.empty());
  EXPECT_EQ(outbox.held(), 2u);
  EXPECT_EQ(other.checkpoint("node_0")->step, 10);
  EXPECT_TRUE(fs::exists(old_file));
  outbox.commit();
  EXPECT_FALSE(outbox.open());
  EXPECT_EQ(delivered, (std::vector<std::string>{"a:ack 20", "b:metrics ack"}));
  EXPECT_EQ(outbox.held(), 0u);
  outbox.send("c", {"now"});  // no batch open: at once
  EXPECT_EQ(delivered.back(), "c:now");
}

}  // namespace
}  // namespace cairn::coordinator
