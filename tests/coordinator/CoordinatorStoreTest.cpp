// The coordinator's SQLite store (coordinator/CoordinatorStore.h): a reopened store is the same
// run; the loop's group commit (a batch is one transaction: its own reads see it, another
// connection and a crash do not until it is committed, a failed write inside it undoes only
// itself; Outbox holds the replies until then); the oldest of the placed nodes' newest
// checkpoints against a loop over every node; the CheckpointWriter that writes uploads off the
// loop (order, failures reported, bytes waiting bounded).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include "coordinator/CoordinatorStore.h"
#include "tests/coordinator/MemberRows.h"
#include "coordinator/Outbox.h"
#include "coordinator/CheckpointWriter.h"
#include "core/CurveKeys.h"
#include "core/Error.h"
#include "core/Fnv.h"
#include "tests/common/ScratchDir.h"

namespace cairn::coordinator {
namespace {

namespace fs = std::filesystem;
using test_rows::memberRow;

std::string storeDir(const std::string& name) {
  return ::cairn::testing::scratchDir("store_" + name);
}

const std::string kStoreToken = "0123456789abcdef0123456789abcdef";


TEST(CoordinatorStore, KeepsTheRunAcrossReopening) {
  const std::string dir = storeDir("store");
  const std::string key0 = generateCurveKeyPair().public_key, key1 = generateCurveKeyPair().public_key;
  {
    CoordinatorStore store(dir + "/coordinator.db");
    EXPECT_EQ(store.nextMemberName(), "node_0");
    store.setMeta("token", kStoreToken);
    store.putMember(memberRow("node_0", key0, "127.0.0.1:7001", MemberState::kSpare));
    store.putMember(memberRow("node_1", key1, "127.0.0.1:7002", MemberState::kSpare));
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

// A database from before dial-out-only volunteers (members without the dial_out_only column):
// the column is added, every old row reachable; a dial-out-only member keeps its mark.
TEST(CoordinatorStore, AnOlderMembersTableGainsDialOutOnlyAndKeepsItsRows) {
  const std::string dir = storeDir("dialout");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/coordinator.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "CREATE TABLE members (name TEXT PRIMARY KEY, public_key TEXT NOT NULL "
                         "UNIQUE, advertise TEXT NOT NULL, probe TEXT NOT NULL, state TEXT NOT "
                         "NULL, joined_at REAL NOT NULL, last_seen REAL NOT NULL);"
                         "INSERT INTO members VALUES ('node_0', 'k0', '10.0.0.1:7100', '{}', "
                         "'spare', 1, 1);",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  {
    CoordinatorStore store(dir + "/coordinator.db");
    ASSERT_EQ(store.members().size(), 1u);
    EXPECT_FALSE(store.members()[0].dial_out_only);
    Member behind = memberRow("node_1", "k1", "", MemberState::kSpare);
    behind.dial_out_only = true;
    store.putMember(behind);
  }
  CoordinatorStore reopened(dir + "/coordinator.db");
  const auto back = reopened.memberByName("node_1");
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(back->dial_out_only);
  EXPECT_EQ(back->advertise, "");
  EXPECT_FALSE(reopened.memberByName("node_0")->dial_out_only);
}

TEST(CoordinatorStore, ABatchIsSeenByItsOwnReadsAndByAnotherConnectionOnlyOnceCommitted) {
  const std::string db = storeDir("batch") + "/coordinator.db";
  CoordinatorStore store(db);
  store.putMember(memberRow("node_0", generateCurveKeyPair().public_key, "127.0.0.1:7001", MemberState::kSpare));
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
  store.flushHeard();  // the heartbeat's time, written (the loop does this every 5 s)
  EXPECT_DOUBLE_EQ(other.memberByName("node_0")->last_seen, 0.0);
  store.commitBatch();
  EXPECT_FALSE(store.batchOpen());
  store.commitBatch();  // none open: nothing happens
  EXPECT_EQ(other.memberByName("node_0")->state, MemberState::kAssigned);
  EXPECT_DOUBLE_EQ(other.memberByName("node_0")->last_seen, 77.0);
  ASSERT_TRUE(other.checkpoint("node_0").has_value());
  EXPECT_EQ(other.checkpoint("node_0")->step, 12);
}

// A heartbeat's time is seen by every read of this store at once and written only by flushHeard,
// a rename or a take-over (so it stays with its row) or the store's closing.
TEST(CoordinatorStore, AHeartbeatsTimeIsReadAtOnceAndWrittenWhenFlushedOrBeforeARename) {
  const std::string db = storeDir("heard") + "/coordinator.db";
  {
    CoordinatorStore store(db);
    store.putMember(memberRow("node_0", generateCurveKeyPair().public_key, "127.0.0.1:7001", MemberState::kAssigned));
    store.putMember(memberRow("node_1", generateCurveKeyPair().public_key, "127.0.0.1:7002", MemberState::kSpare));
    CoordinatorStore other(db);
    store.touch("node_0", 50.0);
    store.touch("node_1", 51.0);
    EXPECT_DOUBLE_EQ(store.memberByName("node_0")->last_seen, 50.0);
    EXPECT_DOUBLE_EQ(store.memberByKey(store.memberByName("node_1")->public_key)->last_seen, 51.0);
    EXPECT_DOUBLE_EQ(store.members()[0].last_seen, 50.0);
    EXPECT_DOUBLE_EQ(other.memberByName("node_0")->last_seen, 0.0);
    store.flushHeard();
    EXPECT_DOUBLE_EQ(other.memberByName("node_0")->last_seen, 50.0);
    // Heard again, then taken over: the old holder's time goes with its renamed row, the spare's
    // row (now called node_0) has the take-over's time, not the old holder's.
    store.touch("node_0", 60.0);
    store.takeOver("node_0", "node_0-lost-1", "node_1", 70.0);
    EXPECT_DOUBLE_EQ(other.memberByName("node_0-lost-1")->last_seen, 60.0);
    EXPECT_DOUBLE_EQ(store.memberByName("node_0")->last_seen, 70.0);
    store.touch("node_0", 80.0);  // the new holder heard; written when the store closes
  }
  CoordinatorStore store(db);
  EXPECT_DOUBLE_EQ(store.memberByName("node_0")->last_seen, 80.0);
  EXPECT_DOUBLE_EQ(store.memberByName("node_0-lost-1")->last_seen, 60.0);
}

TEST(CoordinatorStore, AStoreClosedWithAnOpenBatchKeepsItsWrites) {
  const std::string db = storeDir("close") + "/coordinator.db";
  {
    CoordinatorStore store(db);
    store.beginBatch();
    store.setMeta("phase", "planned");
    store.putMember(memberRow("node_3", generateCurveKeyPair().public_key, "127.0.0.1:7003", MemberState::kAssigned));
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
    store.putMember(memberRow("node_0", generateCurveKeyPair().public_key, "127.0.0.1:7001", MemberState::kAssigned));
    store.beginBatch();
    store.putMember(memberRow("node_1", generateCurveKeyPair().public_key, "127.0.0.1:7002", MemberState::kSpare));
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

// members() keeps the rows it read until the table changes: after every kind of write, in and out
// of a batch, a failed take-over's rollback included, it equals a fresh connection's read of the
// committed table (the reference), heartbeats' times overlaid; membersVersion() moves with every
// change of a row but not with a heartbeat's time or its flush.
TEST(CoordinatorStore, KeptMembersEqualAFreshReadAfterEveryKindOfWrite) {
  const std::string db = storeDir("members_kept") + "/coordinator.db";
  CoordinatorStore store(db);
  std::mt19937 rng(11);
  std::vector<std::string> keys;
  for (int i = 0; i < 8; ++i) keys.push_back(generateCurveKeyPair().public_key);
  std::map<std::string, double> heard;  // what touch() gave since the last flush
  int lost = 0;
  for (int round = 0; round < 300; ++round) {
    const std::string name = "node_" + std::to_string(rng() % 6);
    const std::string spare = "node_" + std::to_string(rng() % 6);
    const auto row = store.memberByName(name);
    const auto spare_row = store.memberByName(spare);
    const int op = int(rng() % 6);
    if ((op == 1 || op == 4 || op == 5) && !row) continue;
    if (op == 5 && (spare == name || !spare_row || spare_row->state != MemberState::kSpare)) continue;
    const bool batch = rng() % 3 == 0;
    if (batch) store.beginBatch();
    const std::vector<Member> before = store.members();
    const uint64_t version = store.membersVersion();
    bool rows_kept = false, version_kept = false;  // what this write must leave as it was
    switch (op) {
      case 0:  // insert or replace (a key another row holds replaces that row too)
        store.putMember(memberRow(name, keys[rng() % keys.size()] + (row ? "" : std::to_string(round)),
                                  "127.0.0.1:" + std::to_string(7000 + round), MemberState::kSpare));
        heard.clear();  // flushed first
        break;
      case 1:
        store.setState(name, rng() % 2 ? MemberState::kAssigned : MemberState::kLost);
        break;
      case 2:
        store.touch(name, double(round));
        heard[name] = double(round);
        rows_kept = version_kept = true;
        break;
      case 3:
        store.flushHeard();
        heard.clear();
        rows_kept = version_kept = true;
        break;
      case 4:  // a take-over by a spare that does not exist: throws, rolls its savepoint back
        EXPECT_THROW(store.takeOver(name, name + "-lost-x", "node_none", double(round)), Error);
        heard.clear();  // flushed first
        rows_kept = true;
        break;
      default:
        store.takeOver(name, name + "-lost-" + std::to_string(++lost), spare, double(round));
        heard.clear();
        break;
    }
    if (batch) store.commitBatch();
    const std::vector<Member> kept = store.members();
    CoordinatorStore fresh(db);
    const std::vector<Member> reference = fresh.members();
    ASSERT_EQ(kept.size(), reference.size()) << "round " << round;
    for (size_t k = 0; k < kept.size(); ++k) {
      const Member& a = kept[k];
      const Member& b = reference[k];
      EXPECT_EQ(a.name, b.name) << "round " << round;
      EXPECT_EQ(a.public_key, b.public_key);
      EXPECT_EQ(a.advertise, b.advertise);
      EXPECT_EQ(a.state, b.state) << a.name << ", round " << round;
      const auto h = heard.find(a.name);
      EXPECT_DOUBLE_EQ(a.last_seen, h != heard.end() ? h->second : b.last_seen) << a.name << ", round " << round;
    }
    bool same_rows = before.size() == kept.size();
    for (size_t k = 0; same_rows && k < kept.size(); ++k)
      same_rows = before[k].name == kept[k].name && before[k].state == kept[k].state &&
                  before[k].advertise == kept[k].advertise && before[k].public_key == kept[k].public_key;
    if (rows_kept) {
      EXPECT_TRUE(same_rows) << "round " << round;
    }
    if (!same_rows) {
      EXPECT_NE(store.membersVersion(), version) << "round " << round;
    }
    if (version_kept) {
      EXPECT_EQ(store.membersVersion(), version) << "round " << round;
    }
  }
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

namespace cairn::coordinator {
namespace {

// Waits (at most 10 s) until the writer has `n` files done, taking them.
std::vector<CheckpointFile> takeDone(CheckpointWriter& writer, size_t n) {
  std::vector<CheckpointFile> out;
  for (int i = 0; i < 1000 && out.size() < n; ++i) {
    for (CheckpointFile& f : writer.done()) out.push_back(std::move(f));
    if (out.size() < n) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return out;
}

// An upload as the loop hands it to the writer: its checksum the volunteer's (fnv1a64 of it).
CheckpointFile upload(const std::string& node, int64_t step, const std::string& path, std::string bytes) {
  const uint64_t checksum = fnv1a64(bytes);
  return {node, step, checksum, path, std::move(bytes), ""};
}

// The CheckpointWriter writes each file whole, in the order submitted, reports one it cannot
// write (a folder where the file should go) instead of throwing, does not write one whose bytes
// do not match its checksum (reported as corrupt), and refuses a file past its byte bound while
// others wait (one file always fits).
TEST(CheckpointWriter, WritesInOrderReportsFailuresAndBoundsTheBytesWaiting) {
  const std::string dir = storeDir("writer");
  {
    CheckpointWriter writer;
    fs::create_directories(dir + "/n/step_2.ckpt");  // a folder: cannot be replaced by a file
    for (int step = 1; step <= 3; ++step)
      ASSERT_TRUE(writer.submit(upload("n", step, dir + "/n/step_" + std::to_string(step) + ".ckpt",
                                       std::string(1000 * step, char('a' + step)))));
    CheckpointFile corrupt = upload("n", 4, dir + "/n/step_4.ckpt", std::string(100, 'e'));
    corrupt.bytes[7] = 'f';  // after the checksum was taken
    ASSERT_TRUE(writer.submit(std::move(corrupt)));
    const auto done = takeDone(writer, 4);
    ASSERT_EQ(done.size(), 4u);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(done[size_t(i)].step, i + 1);
    EXPECT_TRUE(done[0].error.empty()) << done[0].error;
    EXPECT_FALSE(done[1].error.empty());
    EXPECT_FALSE(done[1].corrupt);
    EXPECT_TRUE(done[2].error.empty()) << done[2].error;
    EXPECT_TRUE(done[3].corrupt);
    EXPECT_EQ(done[3].error, "the attachment does not match its checksum");
    EXPECT_FALSE(fs::exists(dir + "/n/step_4.ckpt"));
    std::ifstream in(dir + "/n/step_3.ckpt", std::ios::binary);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), std::string(3000, 'd'));
    EXPECT_EQ(writer.waiting(), 0u);
  }
  // A bound of 1,500 bytes. The first file's temporary path is a FIFO nobody reads, so the
  // worker holds it (blocked opening it) while the second is submitted: refused, deterministically.
  const std::string fifo = dir + "/m/step_1.ckpt.tmp";
  fs::create_directories(dir + "/m");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  CheckpointWriter small(1500);
  ASSERT_TRUE(small.submit(upload("m", 1, dir + "/m/step_1.ckpt", std::string(1000, 'x'))));
  EXPECT_FALSE(small.submit(upload("m", 2, dir + "/m/step_2.ckpt", std::string(1000, 'y'))));
  EXPECT_EQ(small.refused(), 1u);
  {  // read the FIFO: the write goes through; the worker then opens it again to fsync it (it
     // waits for a writer: given one), and the fsync fails on a pipe, which is reported
    const int fd = ::open(fifo.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    char buffer[4096];
    size_t got = 0;
    for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) got += size_t(n);
    ::close(fd);
    EXPECT_EQ(got, 1000u);
    int writer_end = -1;
    for (int i = 0; i < 1000 && writer_end < 0; ++i) {
      writer_end = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // ENXIO until the worker opens it
      if (writer_end < 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_GE(writer_end, 0);
    ::close(writer_end);
  }
  const auto first = takeDone(small, 1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_FALSE(first[0].error.empty());
  ASSERT_TRUE(small.submit(upload("m", 3, dir + "/m/step_3.ckpt", std::string(5000, 'z'))));  // nothing waits
  ASSERT_EQ(takeDone(small, 1).size(), 1u);
  EXPECT_EQ(fs::file_size(dir + "/m/step_3.ckpt"), 5000u);
}

}  // namespace
}  // namespace cairn::coordinator
