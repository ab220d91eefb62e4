// CoordinatorStore: what a coordinator (`clusterize --serve`) must not forget, in one SQLite file
// (<out>/coordinator.db), so that a restarted coordinator picks the run up where it was:
//   meta         key → value: the invite token, the run's phase (gathering | planned | done),
//                the number of clusters
//   members      one row per volunteer: name, public key, advertised address, probe figures,
//                state, when it joined and was last heard from; a spare that took a lost
//                volunteer's node over holds its name (the lost row is renamed <name>-lost-<n>)
//   results      the trained stages received: node name → file, summary (result.json)
//   checkpoints  the newest checkpoint held per node: node name → step, file, checksum
//   credit       per node and step, the key that trained it and its figures (coordinator/Credit.h);
//                credit_totals their sums per key and node, kept by triggers
// Every write is atomic (SQLite's journal); outside a batch each is its own transaction. The
// coordinator's loop batches (beginBatch … commitBatch: group commit, one fsync for the writes of
// many messages; it holds the replies that depend on them until the commit). Files themselves are
// written by the caller before their row (a row never names a file that is not complete).
// Ownership: owns the connection, and a thread with a second one that checkpoints the write-ahead
// log once a second (off the loop). Thread-safety: one thread (the coordinator's loop).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

struct sqlite3;
struct sqlite3_stmt;

namespace cairn::coordinator {

// kRelaying: a volunteer that only relays (provider --relay): never placed, never a spare.
enum class MemberState { kJoining, kSpare, kAssigned, kDone, kLost, kLeft, kRelaying };
std::string toString(MemberState state);
MemberState parseMemberState(const std::string& text);  // Internal error on anything else

struct Member {
  std::string name;        // "node_4"
  std::string public_key;  // Z85
  std::string advertise;   // host:port peers dial; empty for a volunteer that gave none
  // Nobody can dial it (no address, or the coordinator's dial-back got no answer): it dials its
  // peers (node/transport/ReversedLinks.h), which must all be reachable. Column dial_out_only.
  bool dial_out_only = false;
  std::string probe_json;  // the join's probe (node/protocol/VolunteerProbeCodec.h): {"ram_gb":…,
                           // "cores":…,"compute_gflops":…,"bandwidth_mbps":…,"gpus":[…],"libtorch":…}
  MemberState state = MemberState::kJoining;
  double joined_at = 0;    // seconds since the epoch
  double last_seen = 0;
};

struct StoredResult {
  std::string name;
  std::string path;
  std::string summary_json;
};

struct StoredCheckpoint {
  std::string name;
  int64_t step = 0;
  std::string path;
  uint64_t checksum = 0;
};

// One step of a node, credited to the key of the volunteer that trained it (coordinator/Credit.h).
struct CreditStep {
  int64_t step = 0;        // steps done (1-based, as metrics.jsonl counts them)
  int64_t samples = 0;     // samples carried through the stage in that step
  double compute_s = 0;    // its compute seconds
  int64_t sent_bytes = 0;  // tensor bytes its transport sent in that step
};

// What one key gave one node: the kept steps credited to it and their sums.
struct CreditTotal {
  std::string key, node;
  int64_t steps = 0, samples = 0;
  double compute_s = 0;
  int64_t sent_bytes = 0;
};

class CoordinatorStore {
 public:
  // Opens (creating if needed) the database at `path`; BadInput naming the file when it is not a
  // coordinator database or cannot be opened.
  explicit CoordinatorStore(const std::string& path);
  ~CoordinatorStore();
  CoordinatorStore(const CoordinatorStore&) = delete;
  CoordinatorStore& operator=(const CoordinatorStore&) = delete;

  // Group commit: the writes from beginBatch() (no-op while one is open) to commitBatch() (no-op
  // when none is) are one transaction; reads in between see them. The destructor commits an open
  // batch.
  void beginBatch();
  void commitBatch();
  bool batchOpen() const { return batch_open_; }

  std::optional<std::string> meta(const std::string& key) const;
  void setMeta(const std::string& key, const std::string& value);
  // The plan's node names (meta "placed"; none before the plan).
  std::vector<std::string> placedNames() const;

  // Gives out the next name: node_<n> with n one more than the largest any row holds or any
  // earlier call gave (kept in meta "names_given": a spare that took a lost node over leaves its
  // own name unused, and that name is never given to another volunteer, so one name means one
  // volunteer in the metrics, the live page and the credit).
  std::string nextMemberName();
  void putMember(const Member& member);  // insert or replace by name
  std::optional<Member> memberByName(const std::string& name) const;
  std::optional<Member> memberByKey(const std::string& public_key) const;
  // By join time, then name. Read from SQLite once per change of the table and kept: any write to
  // it on this connection (SQLite's update hook; the coordinator's connection is the database's
  // only writer) or a rollback drops the kept rows; flushHeard() patches their times instead.
  // 1,000 rows took milliseconds to read and sort, asked for several times a second (the live
  // view, the replacer's poll, the grower) on the loop.
  std::vector<Member> members() const;
  // Changes with every change to the members' rows but their heartbeats' times (the live view
  // syncs its members only when it moved).
  uint64_t membersVersion() const { return members_version_; }
  void setState(const std::string& name, MemberState state);
  // The row `from` is called `to` from now on (a left volunteer back under a fresh name).
  void renameMember(const std::string& from, const std::string& to);
  // A heartbeat's time (last_seen): held in memory, seen by every read at once, and written by
  // flushHeard() (the coordinator's loop: every 5 s) or before a row is renamed or replaced. The
  // most frequent message writes nothing: 500 heartbeats a second touched every page of the
  // members table in every commit. Its time needs no durability: a restarted coordinator counts
  // silence from its own start (MemberReplacer::deafUntil).
  void touch(const std::string& name, double now);
  void flushHeard();
  // A spare takes a lost member's node over (MemberReplacer), in one transaction: the lost row is
  // renamed `lost_row_name` and marked lost (its key stays known, and refused if it comes back);
  // the spare's row takes the name `lost_name`, state assigned, last_seen `now`. A lost member
  // that said it leaves stays `left` (it may come back, JoinPolicy.h).
  void takeOver(const std::string& lost_name, const std::string& lost_row_name,
                const std::string& spare_name, double now);

  void putResult(const StoredResult& result);
  std::vector<StoredResult> results() const;

  // Credit (coordinator/Credit.h), each call atomic. creditSteps: each of `steps` of
  // `node` credited to `key` (a step credited before goes to the newest). dropCreditAfter: every
  // step of `node` after `step` forgotten (a resume rolled them back). creditUpTo: the steps
  // 1..`step` of `node` that nobody holds credited to `key` with no figures (its checkpoint of
  // that step; their records may have been lost with the volunteer).
  void creditSteps(const std::string& node, const std::string& key, const std::vector<CreditStep>& steps);
  void dropCreditAfter(const std::string& node, int64_t step);
  void creditUpTo(const std::string& node, const std::string& key, int64_t step);
  std::vector<CreditTotal> creditTotals() const;  // by key, then node
  int64_t maxCreditedStep() const;                 // of any node; 0: none
  // The key credited with each step of `node`, by step.
  std::vector<std::pair<int64_t, std::string>> creditedSteps(const std::string& node) const;

  void putCheckpoint(const StoredCheckpoint& checkpoint);
  std::optional<StoredCheckpoint> checkpoint(const std::string& name) const;
  // Over the nodes in meta "placed" (a JSON list of names): the smallest of their newest held
  // checkpoints' steps; nullopt when one of them has none (or none is placed).
  std::optional<int64_t> oldestNewestCheckpointOfPlaced() const;

 private:
  class Statement;
  Member readMember(const Statement& s) const;  // the row, with a time heard since overlaid
  struct CachedStatement {
    sqlite3_stmt* stmt = nullptr;
    bool busy = false;
  };
  void exec(const std::string& sql);
  bool tableExists(const std::string& table) const;
  bool columnExists(const std::string& table, const std::string& column) const;
  std::string path_;
  sqlite3* db_ = nullptr;
  bool batch_open_ = false;
  mutable std::unordered_map<std::string, CachedStatement> statements_;  // by SQL text
  std::unordered_map<std::string, int64_t> credited_through_;  // node → steps 1..n all credited
  std::unordered_map<std::string, double> heard_;  // name → last_seen not yet written (touch)
  mutable std::optional<std::vector<Member>> members_cache_;  // the rows as stored (members())
  uint64_t members_version_ = 0;
  bool flushing_heard_ = false;  // flushHeard's writes patch members_cache_ rather than drop it
  void membersChanged() {
    members_cache_.reset();
    ++members_version_;
  }
  void hookMembers();  // the update and rollback hooks that call membersChanged()
  void checkpointWal();  // the checkpointer thread: the log into the database once a second
  std::mutex checkpointer_mutex_;
  std::condition_variable checkpointer_wake_;
  bool checkpointer_stop_ = false;  // under checkpointer_mutex_
  std::thread checkpointer_;
};

}  // namespace cairn::coordinator
