#include "coordinator/CoordinatorStore.h"

#include <sqlite3.h>

#include <cstring>
#include <functional>

#include "core/Log.h"

#include "core/Error.h"

namespace cairn::coordinator {
namespace {

}  // namespace

// A statement from the store's cache (prepared once per SQL text, SQLite's own compiled form
// kept: preparing per call was 7 % of the coordinator's loop at 1,000 volunteers), reset and
// unbound on scope exit; binds text/int64/double by position (from 1). One user at a time per SQL
// text (the store is one thread's, and no method nests a statement inside itself).
class CoordinatorStore::Statement {
 public:
  Statement(const CoordinatorStore& store, const char* sql) : db_(store.db_), path_(store.path_) {
    auto& cached = store.statements_[sql];
    if (!cached.stmt &&
        sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &cached.stmt, nullptr) != SQLITE_OK)
      CAIRN_THROW(InternalError, path_, ": SQL error in \"", sql, "\": ", sqlite3_errmsg(db_));
    if (cached.busy) CAIRN_THROW(InternalError, path_, ": a statement used inside itself: ", sql);
    cached.busy = true;
    busy_ = &cached.busy;
    stmt_ = cached.stmt;
  }
  ~Statement() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    *busy_ = false;
  }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  Statement& text(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), int(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& integer(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Statement& real(int i, double v) {
    sqlite3_bind_double(stmt_, i, v);
    return *this;
  }
  // One step: true while a row is available.
  bool step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    CAIRN_THROW(InternalError, path_, ": SQLite: ", sqlite3_errmsg(db_));
  }
  std::string column(int i) const {
    const unsigned char* t = sqlite3_column_text(stmt_, i);
    return t ? std::string(reinterpret_cast<const char*>(t), size_t(sqlite3_column_bytes(stmt_, i)))
             : std::string();
  }
  int64_t columnInt(int i) const { return sqlite3_column_int64(stmt_, i); }
  double columnReal(int i) const { return sqlite3_column_double(stmt_, i); }

 private:
  sqlite3* db_;
  const std::string& path_;
  sqlite3_stmt* stmt_ = nullptr;
  bool* busy_ = nullptr;
};

namespace {

#define CAIRN_MEMBER_COLUMNS \
  "name, public_key, advertise, probe, state, joined_at, last_seen, dial_out_only"

template <typename Row>
Member readRow(const Row& s) {
  Member m;
  m.name = s.column(0);
  m.public_key = s.column(1);
  m.advertise = s.column(2);
  m.probe_json = s.column(3);
  m.state = parseMemberState(s.column(4));
  m.joined_at = s.columnReal(5);
  m.last_seen = s.columnReal(6);
  m.dial_out_only = s.columnInt(7) != 0;
  return m;
}

}  // namespace

std::string toString(MemberState state) {
  static const char* const kNames[] = {"joining", "spare", "assigned", "done", "lost", "left", "relaying"};
  const auto i = static_cast<size_t>(state);  // MemberState's order
  return i < sizeof kNames / sizeof kNames[0] ? kNames[i] : "?";
}

MemberState parseMemberState(const std::string& text) {
  for (int i = 0; i <= static_cast<int>(MemberState::kRelaying); ++i)  // the last state
    if (toString(static_cast<MemberState>(i)) == text) return static_cast<MemberState>(i);
  CAIRN_THROW(InternalError, "coordinator.db: unknown member state \"", text, "\"");
}

CoordinatorStore::CoordinatorStore(const std::string& path) : path_(path) {
  if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    const std::string why = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    CAIRN_THROW(BadInput, path, ": cannot open the coordinator database: ", why);
  }
  sqlite3_busy_timeout(db_, 5000);
  try {
    exec("PRAGMA journal_mode=WAL");
    // The write-ahead log is copied into the database by a thread of its own (below), not by the
    // commit that happens to fill it: that copy and its fsync held the coordinator's loop.
    exec("PRAGMA wal_autocheckpoint=0");
    exec("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)");
    exec("CREATE TABLE IF NOT EXISTS members (name TEXT PRIMARY KEY, public_key TEXT NOT NULL "
         "UNIQUE, advertise TEXT NOT NULL, probe TEXT NOT NULL, state TEXT NOT NULL, joined_at "
         "REAL NOT NULL, last_seen REAL NOT NULL, dial_out_only INTEGER NOT NULL DEFAULT 0)");
    if (!columnExists("members", "dial_out_only"))  // older: every member was reachable
      exec("ALTER TABLE members ADD COLUMN dial_out_only INTEGER NOT NULL DEFAULT 0");
    exec("CREATE TABLE IF NOT EXISTS results (name TEXT PRIMARY KEY, path TEXT NOT NULL, summary "
         "TEXT NOT NULL)");
    exec("CREATE TABLE IF NOT EXISTS checkpoints (name TEXT PRIMARY KEY, step INTEGER NOT NULL, "
         "path TEXT NOT NULL, checksum TEXT NOT NULL)");
    exec("CREATE TABLE IF NOT EXISTS credit (node TEXT NOT NULL, step INTEGER NOT NULL, key TEXT "
         "NOT NULL, samples INTEGER NOT NULL, compute_s REAL NOT NULL, sent_bytes INTEGER NOT NULL, "
         "PRIMARY KEY (node, step))");
    // MAX(step) over every node at each checkpoint of a run with no planned length (Credit.h):
    // with this index one lookup, without it a scan of every credited step.
    exec("CREATE INDEX IF NOT EXISTS credit_by_step ON credit (step)");
    // Totals per (key, node), kept by triggers as credit rows come and go: the live view asks for
    // them every second, and a GROUP BY over every credited step grew with the run's length
    // (1,000 volunteers credit 2,000 steps a second). A database from before them is summed once.
    const bool had_totals = tableExists("credit_totals");
    exec("CREATE TABLE IF NOT EXISTS credit_totals (key TEXT NOT NULL, node TEXT NOT NULL, steps "
         "INTEGER NOT NULL, samples INTEGER NOT NULL, compute_s REAL NOT NULL, sent_bytes INTEGER "
         "NOT NULL, PRIMARY KEY (key, node))");
    exec("CREATE TRIGGER IF NOT EXISTS credit_added AFTER INSERT ON credit BEGIN INSERT INTO "
         "credit_totals (key, node, steps, samples, compute_s, sent_bytes) VALUES (NEW.key, "
         "NEW.node, 1, NEW.samples, NEW.compute_s, NEW.sent_bytes) ON CONFLICT (key, node) DO "
         "UPDATE SET steps = steps + 1, samples = samples + excluded.samples, compute_s = "
         "compute_s + excluded.compute_s, sent_bytes = sent_bytes + excluded.sent_bytes; END");
    exec("CREATE TRIGGER IF NOT EXISTS credit_removed AFTER DELETE ON credit BEGIN UPDATE "
         "credit_totals SET steps = steps - 1, samples = samples - OLD.samples, compute_s = "
         "compute_s - OLD.compute_s, sent_bytes = sent_bytes - OLD.sent_bytes WHERE key = OLD.key "
         "AND node = OLD.node; DELETE FROM credit_totals WHERE key = OLD.key AND node = OLD.node "
         "AND steps <= 0; END");
    if (!had_totals)
      exec("INSERT INTO credit_totals SELECT key, node, COUNT(*), SUM(samples), SUM(compute_s), "
           "SUM(sent_bytes) FROM credit GROUP BY key, node");
  } catch (const Error& e) {
    for (auto& [sql, cached] : statements_) sqlite3_finalize(cached.stmt);  // else close fails
    statements_.clear();
    sqlite3_close(db_);
    db_ = nullptr;
    CAIRN_THROW(BadInput, path, ": not a coordinator database (", e.what(), ")");
  }
  hookMembers();
  checkpointer_ = std::thread([this] { checkpointWal(); });
}

void CoordinatorStore::hookMembers() {
  sqlite3_update_hook(
      db_,
      [](void* self, int, const char*, const char* table, sqlite3_int64) {
        auto* store = static_cast<CoordinatorStore*>(self);
        if (std::strcmp(table, "members") == 0 && !store->flushing_heard_) store->membersChanged();
      },
      this);
  // A failed COMMIT (SQLite rolls the batch back); "ROLLBACK TO" a savepoint is seen in exec().
  sqlite3_rollback_hook(db_, [](void* self) { static_cast<CoordinatorStore*>(self)->membersChanged(); }, this);
}

void CoordinatorStore::checkpointWal() {
  // Its own connection (SQLite connections are not shared across threads here). A passive
  // checkpoint copies what no reader still needs and never blocks the loop's writes; once a
  // second is plenty (the log then stays at about a second of writes).
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path_.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    CAIRN_WARN(path_, ": cannot open a second connection for the log's checkpoints: ",
               db ? sqlite3_errmsg(db) : "out of memory", "; the log grows until the store closes");
    sqlite3_close(db);
    return;
  }
  sqlite3_busy_timeout(db, 1000);
  std::unique_lock<std::mutex> lock(checkpointer_mutex_);
  while (!checkpointer_stop_) {
    checkpointer_wake_.wait_for(lock, std::chrono::seconds(1));
    if (checkpointer_stop_) break;
    lock.unlock();
    (void)sqlite3_wal_checkpoint_v2(db, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
    lock.lock();
  }
  sqlite3_close(db);
}

Member CoordinatorStore::readMember(const Statement& s) const {
  Member m = readRow(s);
  if (const auto heard = heard_.find(m.name); heard != heard_.end()) m.last_seen = heard->second;
  return m;
}

void CoordinatorStore::flushHeard() {
  if (heard_.empty()) return;
  exec("SAVEPOINT heard");  // one transaction (or part of the open batch), not one per member
  flushing_heard_ = true;
  try {
    for (const auto& [name, when] : heard_) {
      Statement s(*this, "UPDATE members SET last_seen = ? WHERE name = ?");
      s.real(1, when).text(2, name);
      s.step();
    }
    exec("RELEASE heard");
  } catch (...) {
    flushing_heard_ = false;
    exec("ROLLBACK TO heard; RELEASE heard");
    throw;
  }
  flushing_heard_ = false;
  if (members_cache_)  // the kept rows now hold what the table holds
    for (Member& m : *members_cache_)
      if (const auto heard = heard_.find(m.name); heard != heard_.end()) m.last_seen = heard->second;
  heard_.clear();
}

CoordinatorStore::~CoordinatorStore() {
  {
    std::lock_guard<std::mutex> lock(checkpointer_mutex_);
    checkpointer_stop_ = true;
  }
  checkpointer_wake_.notify_all();
  if (checkpointer_.joinable()) checkpointer_.join();
  try {
    flushHeard();
    commitBatch();  // what the loop wrote before it stopped (each write was kept before batching)
  } catch (const Error& e) {
    CAIRN_WARN(path_, ": the last writes could not be committed: ", e.what());
  }
  for (auto& [sql, cached] : statements_) sqlite3_finalize(cached.stmt);
  sqlite3_close(db_);
}

void CoordinatorStore::beginBatch() {
  if (batch_open_) return;
  exec("BEGIN");
  batch_open_ = true;
}

void CoordinatorStore::commitBatch() {
  if (!batch_open_) return;
  batch_open_ = false;  // a failed COMMIT leaves no transaction either (SQLite rolls it back)
  exec("COMMIT");
}

bool CoordinatorStore::columnExists(const std::string& table, const std::string& column) const {
  Statement s(*this, "SELECT 1 FROM pragma_table_info(?) WHERE name = ?");
  return s.text(1, table).text(2, column).step();
}

bool CoordinatorStore::tableExists(const std::string& table) const {
  Statement s(*this, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?");
  s.text(1, table);
  return s.step();
}

void CoordinatorStore::exec(const std::string& sql) {
  if (sql.rfind("ROLLBACK", 0) == 0) membersChanged();  // the rows may be back as they were
  char* error = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
    const std::string why = error ? error : "unknown error";
    sqlite3_free(error);
    CAIRN_THROW(InternalError, path_, ": SQLite: ", why);
  }
}

std::optional<std::string> CoordinatorStore::meta(const std::string& key) const {
  Statement s(*this, "SELECT value FROM meta WHERE key = ?");
  s.text(1, key);
  if (!s.step()) return std::nullopt;
  return s.column(0);
}

void CoordinatorStore::setMeta(const std::string& key, const std::string& value) {
  Statement s(*this, "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)");
  s.text(1, key).text(2, value);
  s.step();
}

std::string CoordinatorStore::nextMemberName() {
  int64_t next = 0;
  auto atLeast = [&next](const std::string& number, int64_t plus) {  // a name's number and beyond
    try {
      next = std::max<int64_t>(next, std::stoll(number) + plus);
    } catch (const std::exception&) {
    }
  };
  if (const auto given = meta("names_given")) atLeast(*given, 0);
  Statement s(*this, "SELECT name FROM members");
  while (s.step()) {
    const std::string name = s.column(0);
    if (name.rfind("node_", 0) == 0) atLeast(name.substr(5), 1);
  }
  setMeta("names_given", std::to_string(next + 1));
  return "node_" + std::to_string(next);
}

void CoordinatorStore::putMember(const Member& m) {
  flushHeard();
  Statement s(*this,
              "INSERT OR REPLACE INTO members (name, public_key, advertise, probe, state, "
              "joined_at, last_seen, dial_out_only) VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
  s.text(1, m.name).text(2, m.public_key).text(3, m.advertise).text(4, m.probe_json);
  s.text(5, toString(m.state)).real(6, m.joined_at).real(7, m.last_seen);
  s.integer(8, m.dial_out_only ? 1 : 0);
  s.step();
}

std::optional<Member> CoordinatorStore::memberByName(const std::string& name) const {
  Statement s(*this, "SELECT " CAIRN_MEMBER_COLUMNS " FROM members WHERE name = ?");
  s.text(1, name);
  if (!s.step()) return std::nullopt;
  return readMember(s);
}

std::optional<Member> CoordinatorStore::memberByKey(const std::string& key) const {
  Statement s(*this, "SELECT " CAIRN_MEMBER_COLUMNS " FROM members WHERE public_key = ?");
  s.text(1, key);
  if (!s.step()) return std::nullopt;
  return readMember(s);
}

std::vector<Member> CoordinatorStore::members() const {
  if (!members_cache_) {
    Statement s(*this, "SELECT " CAIRN_MEMBER_COLUMNS
                       " FROM members ORDER BY joined_at, CAST(SUBSTR(name, 6) AS INTEGER), name");
    std::vector<Member> rows;
    while (s.step()) rows.push_back(readRow(s));
    members_cache_ = std::move(rows);
  }
  std::vector<Member> out = *members_cache_;
  if (!heard_.empty())
    for (Member& m : out)
      if (const auto heard = heard_.find(m.name); heard != heard_.end()) m.last_seen = heard->second;
  return out;
}

void CoordinatorStore::setState(const std::string& name, MemberState state) {
  Statement s(*this, "UPDATE members SET state = ? WHERE name = ?");
  s.text(1, toString(state)).text(2, name);
  s.step();
}

void CoordinatorStore::touch(const std::string& name, double now) { heard_[name] = now; }

void CoordinatorStore::renameMember(const std::string& from, const std::string& to) {
  flushHeard();  // the times heard belong to the rows' present names
  Statement s(*this, "UPDATE members SET name = ? WHERE name = ?");
  s.text(1, to).text(2, from);
  s.step();
  if (sqlite3_changes(db_) != 1) CAIRN_THROW(InternalError, path_, ": no member called ", from, " to rename");
}

void CoordinatorStore::takeOver(const std::string& lost_name, const std::string& lost_row_name,
                                const std::string& spare_name, double now) {
  flushHeard();
  exec("SAVEPOINT take_over");
  try {
    {
      Statement s(*this, "UPDATE members SET name = ?, state = CASE state WHEN ? THEN state "
                              "ELSE ? END WHERE name = ?");
      s.text(1, lost_row_name).text(2, toString(MemberState::kLeft)).text(3, toString(MemberState::kLost))
          .text(4, lost_name);
      s.step();
    }
    Statement s(*this, "UPDATE members SET name = ?, state = ?, last_seen = ? WHERE name = ?");
    s.text(1, lost_name).text(2, toString(MemberState::kAssigned)).real(3, now).text(4, spare_name);
    s.step();
    if (sqlite3_changes(db_) != 1)
      CAIRN_THROW(InternalError, path_, ": no spare called ", spare_name, " to take ", lost_name, " over");
    exec("RELEASE take_over");
  } catch (...) {
    exec("ROLLBACK TO take_over; RELEASE take_over");
    throw;
  }
}

void CoordinatorStore::creditSteps(const std::string& node, const std::string& key,
                                   const std::vector<CreditStep>& steps) {
  if (steps.empty()) return;
  exec("SAVEPOINT credit_steps");
  try {
    for (const CreditStep& c : steps) {
      {  // a step credited before goes to the newest: deleted first, so the totals' trigger sees it
        Statement s(*this, "DELETE FROM credit WHERE node = ? AND step = ?");
        s.text(1, node).integer(2, c.step);
        s.step();
      }
      Statement s(*this, "INSERT INTO credit (node, step, key, samples, compute_s, sent_bytes) "
                         "VALUES (?, ?, ?, ?, ?, ?)");
      s.text(1, node).integer(2, c.step).text(3, key).integer(4, c.samples).real(5, c.compute_s)
          .integer(6, c.sent_bytes);
      s.step();
    }
    exec("RELEASE credit_steps");
  } catch (...) {
    exec("ROLLBACK TO credit_steps; RELEASE credit_steps");
    throw;
  }
}

void CoordinatorStore::dropCreditAfter(const std::string& node, int64_t step) {
  Statement s(*this, "DELETE FROM credit WHERE node = ? AND step > ?");
  s.text(1, node).integer(2, step);
  s.step();
  if (auto it = credited_through_.find(node); it != credited_through_.end())
    it->second = std::min(it->second, std::max<int64_t>(step, 0));
}

void CoordinatorStore::creditUpTo(const std::string& node, const std::string& key, int64_t step) {
  // Steps 1..through are credited already (this store filled them, and no roll-back dropped
  // them since): only the steps after that are looked at, so a checkpoint costs its own stretch
  // of steps, not the whole run's. Unknown (a fresh store): from step 1, once.
  auto it = credited_through_.find(node);
  const int64_t through = it == credited_through_.end() ? 0 : it->second;
  if (step <= through) return;
  Statement s(*this, "WITH RECURSIVE n(step) AS (SELECT ? UNION ALL SELECT step + 1 FROM n "
                     "WHERE step < ?) INSERT OR IGNORE INTO credit (node, step, key, samples, "
                     "compute_s, sent_bytes) SELECT ?, step, ?, 0, 0, 0 FROM n");
  s.integer(1, through + 1).integer(2, step).text(3, node).text(4, key);
  s.step();
  credited_through_[node] = step;
}

int64_t CoordinatorStore::maxCreditedStep() const {
  Statement s(*this, "SELECT COALESCE(MAX(step), 0) FROM credit");
  return s.step() ? s.columnInt(0) : 0;
}

std::vector<CreditTotal> CoordinatorStore::creditTotals() const {
  Statement s(*this, "SELECT key, node, steps, samples, compute_s, sent_bytes FROM credit_totals "
                     "ORDER BY key, node");
  std::vector<CreditTotal> out;
  while (s.step())
    out.push_back({s.column(0), s.column(1), s.columnInt(2), s.columnInt(3), s.columnReal(4),
                   s.columnInt(5)});
  return out;
}

std::vector<std::pair<int64_t, std::string>> CoordinatorStore::creditedSteps(const std::string& node) const {
  Statement s(*this, "SELECT step, key FROM credit WHERE node = ? ORDER BY step");
  s.text(1, node);
  std::vector<std::pair<int64_t, std::string>> out;
  while (s.step()) out.emplace_back(s.columnInt(0), s.column(1));
  return out;
}

void CoordinatorStore::putResult(const StoredResult& r) {
  Statement s(*this, "INSERT OR REPLACE INTO results (name, path, summary) VALUES (?, ?, ?)");
  s.text(1, r.name).text(2, r.path).text(3, r.summary_json);
  s.step();
}

std::vector<StoredResult> CoordinatorStore::results() const {
  Statement s(*this, "SELECT name, path, summary FROM results ORDER BY name");
  std::vector<StoredResult> out;
  while (s.step()) out.push_back({s.column(0), s.column(1), s.column(2)});
  return out;
}

void CoordinatorStore::putCheckpoint(const StoredCheckpoint& c) {
  Statement s(*this,
              "INSERT OR REPLACE INTO checkpoints (name, step, path, checksum) VALUES (?, ?, ?, ?)");
  s.text(1, c.name).integer(2, c.step).text(3, c.path).text(4, std::to_string(c.checksum));
  s.step();
}

std::optional<int64_t> CoordinatorStore::oldestNewestCheckpointOfPlaced() const {
  // One query over meta "placed" (SQLite's json_each) instead of one per node: this is asked at
  // every checkpoint upload, and with 1,000 placed nodes the per-node lookups were the loop's time.
  Statement s(*this, "SELECT COUNT(*), COUNT(c.step), MIN(c.step) FROM json_each((SELECT value FROM "
                     "meta WHERE key = 'placed')) p LEFT JOIN checkpoints c ON c.name = p.value");
  if (!s.step() || s.columnInt(0) == 0 || s.columnInt(1) < s.columnInt(0)) return std::nullopt;
  return s.columnInt(2);
}

std::optional<StoredCheckpoint> CoordinatorStore::checkpoint(const std::string& name) const {
  Statement s(*this, "SELECT name, step, path, checksum FROM checkpoints WHERE name = ?");
  s.text(1, name);
  if (!s.step()) return std::nullopt;
  return StoredCheckpoint{s.column(0), s.columnInt(1), s.column(2), std::stoull(s.column(3))};
}

}  // namespace cairn::coordinator
