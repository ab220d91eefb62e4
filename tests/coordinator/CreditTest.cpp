// Credit (coordinator/Credit.h) against a brute-force reference: a random history of step records
// and resumes from several keys for one node, replayed on a plain map (a step's newest record
// wins; a resume forgets the steps after it), must leave exactly the store's credited steps; a
// checkpoint fills only the steps nobody holds, up to the plan; the totals the store keeps by
// triggers equal the replay's sums; malformed records are skipped.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>
#include <set>

#include <sqlite3.h>

#include "coordinator/CoordinatorStore.h"
#include "coordinator/Credit.h"
#include "tests/common/ScratchDir.h"

namespace cairn::coordinator {
namespace {

namespace fs = std::filesystem;

std::string creditDir(const std::string& name) {
  return ::cairn::testing::scratchDir("credit_" + name);
}

nlohmann::json creditStepRecord(int64_t step) {
  return {{"step", step}, {"loss", 1.5}, {"samples", 32}, {"compute_s", 0.25}, {"sent_bytes", 1000}};
}

TEST(Credit, RandomHistoriesOfRecordsAndResumesEqualAReplayOnAMap) {
  const std::string dir = creditDir("random");
  std::mt19937 draw(20261128);
  for (int trial = 0; trial < 20; ++trial) {
    CoordinatorStore store(dir + "/run_" + std::to_string(trial) + ".db");
    std::map<int64_t, std::string> reference;
    std::set<int64_t> filled;  // steps credited by a checkpoint (no figures)
    int64_t at = 0;  // the node's next step
    for (int batch = 0; batch < 30; ++batch) {
      const std::string key = "key_" + std::to_string(draw() % 3);
      if (draw() % 4 == 0) {  // a checkpoint of the step it is at: fills the steps nobody holds
        creditCheckpoint(store, key, "node_1", at, /*planned_steps=*/1000);
        for (int64_t s = 1; s <= at; ++s)
          if (reference.emplace(s, key).second) filled.insert(s);
        continue;
      }
      std::vector<nlohmann::json> records;
      for (int r = 0, n = int(draw() % 6); r < n; ++r) {
        if (draw() % 5 == 0 && at > 0) {  // a resume from an earlier step
          const int64_t from = int64_t(draw() % uint32_t(at + 1)) - 1;
          records.push_back({{"resumed_from", from}});
          reference.erase(reference.upper_bound(from), reference.end());
          filled.erase(filled.upper_bound(from), filled.end());
          at = std::max<int64_t>(from, 0);
        } else {
          records.push_back(creditStepRecord(++at));
          reference[at] = key;
          filled.erase(at);
        }
      }
      records.push_back({{"eval", {{"loss", 1.0}}}});  // not a step: no credit
      EXPECT_EQ(creditRecords(store, key, "node_1", records), 0u);
    }
    const auto credited = store.creditedSteps("node_1");
    ASSERT_EQ(credited.size(), reference.size()) << "trial " << trial;
    size_t i = 0;
    for (const auto& [step, key] : reference) {
      EXPECT_EQ(credited[i].first, step) << "trial " << trial;
      EXPECT_EQ(credited[i].second, key) << "trial " << trial << " step " << step;
      ++i;
    }
    // The totals (kept by triggers) against the replay: per key, its steps, and the figures of
    // those with a record (a checkpoint's fill has none).
    std::map<std::string, std::pair<int64_t, int64_t>> expected;  // key → (steps, with figures)
    for (const auto& [step, key] : reference) {
      ++expected[key].first;
      expected[key].second += filled.count(step) ? 0 : 1;
    }
    const auto totals = store.creditTotals();
    ASSERT_EQ(totals.size(), expected.size()) << "trial " << trial;
    for (const CreditTotal& t : totals) {
      ASSERT_TRUE(expected.count(t.key)) << t.key;
      const auto [steps, recorded] = expected[t.key];
      EXPECT_EQ(t.node, "node_1");
      EXPECT_EQ(t.steps, steps) << "trial " << trial << " " << t.key;
      EXPECT_EQ(t.samples, 32 * recorded) << "trial " << trial << " " << t.key;
      EXPECT_EQ(t.sent_bytes, 1000 * recorded) << "trial " << trial << " " << t.key;
      EXPECT_NEAR(t.compute_s, 0.25 * double(recorded), 1e-9) << "trial " << trial << " " << t.key;
    }
  }
  fs::remove_all(dir);
}

TEST(Credit, ACheckpointFillsOnlyUnheldStepsUpToThePlanAndRecordsReplaceTheFill) {
  const std::string dir = creditDir("checkpoint");
  CoordinatorStore store(dir + "/coordinator.db");
  creditRecords(store, "old", "node_1", {creditStepRecord(1), creditStepRecord(2)});
  creditCheckpoint(store, "old", "node_1", 5, /*planned_steps=*/100);  // records 3..5 not in yet
  creditCheckpoint(store, "liar", "node_1", int64_t(1) << 40, 100);     // bounded by the plan
  creditRecords(store, "old", "node_1", {creditStepRecord(3)});
  const auto credited = store.creditedSteps("node_1");
  ASSERT_EQ(credited.size(), 100u);
  for (int64_t s = 1; s <= 5; ++s) EXPECT_EQ(credited[size_t(s - 1)].second, "old") << s;
  for (int64_t s = 6; s <= 100; ++s) EXPECT_EQ(credited[size_t(s - 1)].second, "liar") << s;
  const auto totals = store.creditTotals();
  ASSERT_EQ(totals.size(), 2u);
  EXPECT_EQ(totals[1].key, "old");
  EXPECT_EQ(totals[1].steps, 5);
  EXPECT_EQ(totals[1].samples, 3 * 32);  // steps 4 and 5: from the checkpoint, no figures
  // Before any plan is known the fill stops at the highest step any record credited.
  creditCheckpoint(store, "k", "node_2", 500, 0);
  EXPECT_EQ(store.creditedSteps("node_2").size(), 100u);
  fs::remove_all(dir);
}

// A database written before the totals were kept (no credit_totals table, no triggers) gets them
// summed once when it is opened; from then on the triggers keep them.
TEST(Credit, ADatabaseFromBeforeTheTotalsGetsThemSummedOnOpening) {
  const std::string db = creditDir("migrate") + "/coordinator.db";
  std::vector<CreditTotal> before;
  {
    CoordinatorStore store(db);
    creditRecords(store, "a", "node_1", {creditStepRecord(1), creditStepRecord(2), creditStepRecord(3)});
    creditRecords(store, "b", "node_1", {creditStepRecord(3)});
    creditRecords(store, "b", "node_2", {creditStepRecord(1)});
    before = store.creditTotals();
    ASSERT_EQ(before.size(), 3u);
  }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "DROP TRIGGER credit_added; DROP TRIGGER credit_removed; DROP TABLE "
                              "credit_totals", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(raw);
  CoordinatorStore store(db);
  const auto after = store.creditTotals();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].key, before[i].key);
    EXPECT_EQ(after[i].node, before[i].node);
    EXPECT_EQ(after[i].steps, before[i].steps);
    EXPECT_EQ(after[i].samples, before[i].samples);
  }
  EXPECT_EQ(after[0].steps, 2);  // a: steps 1 and 2 (step 3 went to b)
  creditRecords(store, "a", "node_2", {creditStepRecord(2)});
  EXPECT_EQ(store.creditTotals().size(), 4u);
}

TEST(Credit, MalformedRecordsAreSkippedAndCounted) {
  const std::string dir = creditDir("malformed");
  CoordinatorStore store(dir + "/coordinator.db");
  nlohmann::json no_samples = creditStepRecord(2);
  no_samples.erase("samples");  // an older provider: credited without samples
  const std::vector<nlohmann::json> records = {
      creditStepRecord(1), no_samples,
      {{"step", 0}, {"compute_s", 0.1}},                   // steps count from 1
      {{"step", 3}, {"compute_s", -1.0}},                  // negative time
      {{"step", 4}, {"compute_s", 0.1}, {"samples", "x"}},  // not a number
      {{"step", 5}},                                       // no compute_s
      {{"resumed_from", "soon"}},
      {{"step", int64_t(1) << 50}, {"compute_s", 0.1}}};   // past every bound
  EXPECT_EQ(creditRecords(store, "k", "node_1", records), 6u);
  const auto credited = store.creditedSteps("node_1");
  ASSERT_EQ(credited.size(), 2u);
  EXPECT_EQ(store.creditTotals()[0].samples, 32);
  fs::remove_all(dir);
}

TEST(Credit, JsonNamesEachKeysCurrentMember) {
  Member m;
  m.name = "node_4";
  m.public_key = "k1";
  const nlohmann::json j = creditJson({{"k1", "node_1", 3, 96, 0.5, 3000}, {"k9", "node_2", 1, 32, 0.1, 10}}, {m});
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["volunteer"], "node_4");
  EXPECT_EQ(j[0]["node"], "node_1");
  EXPECT_EQ(j[0]["steps"], 3);
  EXPECT_EQ(j[1]["volunteer"], "k9");  // no member holds the key any more: the key itself
}

}  // namespace
}  // namespace cairn::coordinator
