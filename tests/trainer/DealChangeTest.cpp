// DealChange: a running cluster takes a new deal (trainer/DealChange.h; docs/TRAINING.md "the deal"): the Root
// takes an offered deal between steps when it only changes epochs after the current one, the new
// epoch_steps table travels down the pipeline on activations ("__epoch_steps") so every stage ends
// at the new total, and every stage asks its ClusterSync to admit the new cluster at the first
// step of the epoch the deal adds it from. A deal offered too late is refused and changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <unistd.h>

#include "core/Error.h"
#include "tests/trainer/InMemoryPipeline.h"
#include "tests/trainer/DealTestRuns.h"
#include "tests/trainer/TrainerTestPaths.h"
#include "trainer/ClusterSync.h"
#include "trainer/Dataset.h"
#include "trainer/DealChange.h"
#include "trainer/DealSampler.h"
#include "trainer/Sampler.h"
#include "trainer/TrainerCheckpoints.h"

namespace cairn {
namespace {

using testing::AdmissionRecorder;
using testing::dealRunOptions;
using testing::kGrown;
using testing::kStages;
using testing::Offer;
using testing::runWithOffer;

TEST(DealChange, TheRootTakesAnOfferedDealAndEveryStageEndsAtTheNewTotal) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  std::vector<AdmissionRecorder> syncs(kStages);
  Offer offer;
  offer.from_step = 3;  // taken at step 3 of epoch 0: epoch 1 and later change
  TrainOptions used;
  DataOptions data;
  const testing::PipelineRun run = runWithOffer(offer, syncs, &used, &data);
  const int64_t n = loadDatasets(data, used.seed).train->size();
  const std::vector<int64_t> sizes = ShardSampler::equalChunks(n, 4, 1);
  const ShardSampler alone(sizes, 0, 1, {}, used.seed);
  const ShardSampler first(sizes, 0, 2, {}, used.seed), second(sizes, 1, 2, {}, used.seed);
  const int64_t b = used.batch_size;
  const int64_t grown = std::min(first.shard().size(), second.shard().size()) / size_t(b);
  // Epoch 0 as one cluster (untouched by the offer), epochs 1 and 2 cluster 0's shard of two.
  std::vector<std::vector<int64_t>> expected;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const std::vector<int64_t> order = epoch == 0 ? alone.epochOrder(0) : first.epochOrder(epoch);
    const int64_t steps = epoch == 0 ? n / b : grown;
    for (int64_t k = 0; k < steps; ++k)
      expected.emplace_back(order.begin() + k * b, order.begin() + (k + 1) * b);
  }
  ASSERT_NE(grown, n / b);
  EXPECT_EQ(run.batches, expected);
  ASSERT_EQ(run.results.size(), size_t(kStages));
  for (const TrainerResult& r : run.results) EXPECT_EQ(r.steps, int64_t(expected.size()));
  EXPECT_EQ(run.losses.size(), expected.size());
  // The Root arms the admission (its ClusterSync carries it down the pipeline, "__admit").
  EXPECT_EQ(syncs[0].admitted, std::vector<int64_t>{n / b});
  for (size_t i = 1; i < syncs.size(); ++i) EXPECT_TRUE(syncs[i].admitted.empty()) << "stage " << i;
}

TEST(DealChange, ADealOfferedAfterItsEpochBeganIsRefusedAndChangesNothing) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  std::vector<AdmissionRecorder> syncs(kStages);
  Offer offer;
  TrainOptions used;
  DataOptions data;
  // Offered from the first step of epoch 1 on: one cluster's steps per epoch.
  {
    const std::string node_data = testing::trainerModelsDir() + "/cnn_bn_dropout/node_data";
    const JobSpec job = readJobSpec(jobSpecPath(node_data));
    const TrainOptions t = parseTrainOptions(job.training, jobSpecPath(node_data));
    const DataOptions d = parseDataOptions(job.data, jobSpecPath(node_data));
    offer.from_step = loadDatasets(d, t.seed).train->size() / t.batch_size;
  }
  const testing::PipelineRun run = runWithOffer(offer, syncs, &used, &data);
  for (const TrainerResult& r : run.results) EXPECT_EQ(r.steps, 3 * offer.from_step);
  EXPECT_EQ(run.batches.size(), size_t(3 * offer.from_step));
  for (const AdmissionRecorder& s : syncs) EXPECT_TRUE(s.admitted.empty());
}

// A Root whose cluster shares rings with other clusters (agreesOnDeals): the ring's agreement
// stood in for by a sync every kSyncEvery steps that agrees on what this Root proposed (or on
// another offer, or with another Root refusing). Records what the Root proposed and when the
// admission was asked for (steps done when DealChange took the deal).
class AgreeingSync : public ClusterSync {
 public:
  static constexpr int64_t kSyncEvery = 4;
  enum class Others { kSameOffer, kOtherOffer, kCannotTake };
  // `lead_by`: the leading cluster's steps done at each sync exceed this one's by that many (this
  // cluster resumed from a checkpoint and lags).
  // `taken_before`: another Root had taken the offer at a sync this cluster missed.
  explicit AgreeingSync(bool root, Others others = Others::kSameOffer, int64_t lead_by = 0,
                        bool taken_before = false)
      : root_(root), others_(others), lead_by_(lead_by), taken_before_(taken_before) {}
  void start(torch::jit::Module&) override {}
  void beforeOptimizerStep(int64_t, torch::jit::Module&) override {}
  void afterOptimizerStep(int64_t step, torch::jit::Module&) override {
    done = step + 1;
    if (done % kSyncEvery != 0 || proposed == 0 || proposed == kNoOffer) return;
    agreement = DealAgreement{others_ == Others::kOtherOffer ? proposed + 1 : proposed,
                              proposed_can_take && others_ != Others::kCannotTake, done + lead_by_,
                              taken_before_};
  }
  void finish(int64_t, torch::jit::Module&) override {}
  void admitJoinersAt(int64_t steps_done) override {
    admitted.push_back(steps_done);
    admitted_after.push_back(done);
  }
  bool agreesOnDeals() const override { return root_; }
  void proposeDeal(uint64_t offer, bool can_take, bool taken) override {
    if (taken) proposed_taken = true;
    if (proposals.empty() || proposals.back() != offer) proposals.push_back(offer);
    proposed = offer;
    proposed_can_take = can_take;
  }
  std::optional<DealAgreement> takeDealAgreement() override {
    std::optional<DealAgreement> out;
    out.swap(agreement);
    return out;
  }

  int64_t done = 0;
  uint64_t proposed = 0;
  bool proposed_can_take = true;
  std::optional<DealAgreement> agreement;
  std::vector<uint64_t> proposals;
  bool proposed_taken = false;  // proposed an offer it had taken
  std::vector<int64_t> admitted, admitted_after;

 private:
  bool root_;
  Others others_;
  int64_t lead_by_;
  bool taken_before_;
};

testing::PipelineRun runAgreeing(Offer& offer, std::vector<AgreeingSync>& syncs) {
  return runWithOffer(offer, [&](int i) -> ClusterSync* { return &syncs[size_t(i)]; });
}

int64_t oneClusterStepsPerEpoch() {
  const std::string node_data = testing::trainerModelsDir() + "/cnn_bn_dropout/node_data";
  const JobSpec job = readJobSpec(jobSpecPath(node_data));
  const TrainOptions t = parseTrainOptions(job.training, jobSpecPath(node_data));
  DataOptions d = parseDataOptions(job.data, jobSpecPath(node_data));
  return loadDatasets(d, t.seed).train->size() / t.batch_size;
}

TEST(DealChange, RootsThatShareRingsTakeAnOfferOnlyAtTheStepAfterTheSyncThatAgreedOnIt) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  std::vector<AgreeingSync> syncs = {AgreeingSync(true), AgreeingSync(false), AgreeingSync(false)};
  Offer offer;
  offer.from_step = 1;  // seen before step 1; a lone Root would take it there
  const testing::PipelineRun run = runAgreeing(offer, syncs);
  const int64_t per_epoch = oneClusterStepsPerEpoch();
  ASSERT_GT(per_epoch, AgreeingSync::kSyncEvery);
  // "No offer" before step 1, then the fingerprint of the offer's text, agreed at the sync after
  // step 3 (4 steps done), taken before step 4: every stage admits the new cluster at epoch 1's
  // first step.
  EXPECT_EQ(syncs[0].proposals, (std::vector<uint64_t>{kNoOffer, offerFingerprint(kGrown.dump())}));
  EXPECT_TRUE(syncs[0].proposed_can_take);
  EXPECT_EQ(syncs[0].admitted_after, std::vector<int64_t>{AgreeingSync::kSyncEvery});
  EXPECT_EQ(syncs[0].admitted, std::vector<int64_t>{per_epoch});
  EXPECT_TRUE(syncs[1].admitted.empty());  // the Root's ClusterSync carries it down
  EXPECT_TRUE(syncs[2].admitted.empty());
  for (const TrainerResult& r : run.results) EXPECT_LT(r.steps, 3 * per_epoch);  // the grown deal's shorter epochs
  EXPECT_EQ(syncs[1].proposals, std::vector<uint64_t>{});  // only the Root proposes
}

// A Root whose cluster lags the leading one (it resumed from a checkpoint: its syncs fall after
// fewer steps, at the same ordinals): the agreement's leading_steps_done is lead_by steps ahead.
// It takes the offer at the same sync as the others and arms the admission lead_by steps before
// the new cluster's first step, which the leading cluster reaches at that same sync. When the
// leading cluster is already in the epoch the deal changes, the lagging Root refuses it too
// (alone it was still in epoch 0 and would have taken it: the clusters would split).
TEST(DealChange, ALaggingRootArmsTheAdmissionAtTheLeadingClustersSyncAndJudgesTheEpochThere) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const int64_t per_epoch = oneClusterStepsPerEpoch();
  const int64_t lag = AgreeingSync::kSyncEvery;
  ASSERT_GT(per_epoch, 2 * lag);
  {
    std::vector<AgreeingSync> syncs = {AgreeingSync(true, AgreeingSync::Others::kSameOffer, lag),
                                       AgreeingSync(false), AgreeingSync(false)};
    Offer offer;
    offer.from_step = 1;
    const testing::PipelineRun run = runAgreeing(offer, syncs);
    EXPECT_EQ(syncs[0].admitted_after, std::vector<int64_t>{AgreeingSync::kSyncEvery});
    EXPECT_EQ(syncs[0].admitted, std::vector<int64_t>{per_epoch - lag});
    for (const TrainerResult& r : run.results) EXPECT_LT(r.steps, 3 * per_epoch);
  }
  {
    // Agreed at the sync after 4 steps, the leading cluster then at epoch 1's first step.
    std::vector<AgreeingSync> syncs = {
        AgreeingSync(true, AgreeingSync::Others::kSameOffer, per_epoch - AgreeingSync::kSyncEvery),
        AgreeingSync(false), AgreeingSync(false)};
    Offer offer;
    offer.from_step = 1;
    const testing::PipelineRun run = runAgreeing(offer, syncs);
    EXPECT_TRUE(syncs[0].admitted.empty());
    EXPECT_FALSE(syncs[0].proposed_taken);
    for (const TrainerResult& r : run.results) EXPECT_EQ(r.steps, 3 * per_epoch);
  }
  {
    // The same, but the other Roots had taken the offer at a sync this cluster missed (it was
    // resuming): it follows them, judged by its own epoch (0); the admission passed already.
    std::vector<AgreeingSync> syncs = {
        AgreeingSync(true, AgreeingSync::Others::kSameOffer, per_epoch - AgreeingSync::kSyncEvery,
                     /*taken_before=*/true),
        AgreeingSync(false), AgreeingSync(false)};
    Offer offer;
    offer.from_step = 1;
    const testing::PipelineRun run = runAgreeing(offer, syncs);
    EXPECT_TRUE(syncs[0].admitted.empty());
    EXPECT_TRUE(syncs[0].proposed_taken);  // and says so at the next syncs
    for (const TrainerResult& r : run.results) EXPECT_LT(r.steps, 3 * per_epoch);
  }
}

// A Root that took the offer and then ran its stage again (a pause for a replaced neighbour, its
// node.json holding the deal in force) is offered that deal from the start (node/pipeline/
// ProviderRun.h startingOffer): it proposes it as taken, never "no offer", so a Root that missed
// the sync where it was taken agrees with it and follows (proposing no offer, it kept that Root
// from ever agreeing: the 24-volunteer soak). Checked: its proposals are the deal's fingerprint
// alone, said taken; the agreement on it changes nothing (no admission), and it samples exactly
// what a run under that deal without any offer samples.
TEST(DealChange, ARootUnderTheDealOfferedProposesItAsTakenAndChangesNothing) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const std::string node_data = testing::trainerModelsDir() + "/cnn_bn_dropout/node_data";
  auto underGrown = [&](std::vector<AgreeingSync>* syncs, bool offered) {
    return testing::runInMemoryPipeline(node_data, dealRunOptions, [&, offered](int i, StageTrainerConfig& c) {
      c.data.chunks = 4;
      c.node.extra["deal"] = kGrown;
      if (syncs) c.cluster_sync = &(*syncs)[size_t(i)];
      if (i == 0 && offered)
        c.offered_deal = []() -> std::optional<nlohmann::json> { return kGrown; };
    });
  };
  const testing::PipelineRun reference = underGrown(nullptr, false);
  std::vector<AgreeingSync> syncs = {AgreeingSync(true), AgreeingSync(false), AgreeingSync(false)};
  const testing::PipelineRun run = underGrown(&syncs, true);
  EXPECT_EQ(syncs[0].proposals, std::vector<uint64_t>{offerFingerprint(kGrown.dump())});
  EXPECT_TRUE(syncs[0].proposed_taken);
  for (const AgreeingSync& s : syncs) EXPECT_TRUE(s.admitted.empty());
  EXPECT_EQ(run.batches, reference.batches);
  ASSERT_FALSE(reference.batches.empty());
  EXPECT_LT(int64_t(reference.batches.size()), 3 * oneClusterStepsPerEpoch());  // the grown deal's
}

TEST(DealChange, AnOfferTheRingDidNotAgreeOnOrAnotherRootCannotTakeChangesNothing) {
  ASSERT_FALSE(testing::trainerModelsDir().empty()) << "CAIRN_TEST_MODELS is not set";
  const int64_t per_epoch = oneClusterStepsPerEpoch();
  for (AgreeingSync::Others others : {AgreeingSync::Others::kOtherOffer, AgreeingSync::Others::kCannotTake}) {
    std::vector<AgreeingSync> syncs = {AgreeingSync(true, others), AgreeingSync(false), AgreeingSync(false)};
    Offer offer;
    offer.from_step = 1;
    const testing::PipelineRun run = runAgreeing(offer, syncs);
    const bool cannot = others == AgreeingSync::Others::kCannotTake;
    for (const TrainerResult& r : run.results) EXPECT_EQ(r.steps, 3 * per_epoch) << "cannot " << cannot;
    EXPECT_EQ(run.batches.size(), size_t(3 * per_epoch));
    for (const AgreeingSync& s : syncs) EXPECT_TRUE(s.admitted.empty()) << "cannot " << cannot;
  }
}

TEST(DealChange, OfferFingerprintsAreAboveNoOfferBelowTwoToTheSixtyTwoAndFollowTheText) {
  const uint64_t a = offerFingerprint(kGrown.dump()), b = offerFingerprint(kGrown.dump() + " ");
  EXPECT_GT(a, kNoOffer);
  EXPECT_LT(a, uint64_t(1) << 62);
  EXPECT_NE(a, b);
  EXPECT_EQ(a, fnv1a64(kGrown.dump()) & ((uint64_t(1) << 62) - 1));
}

TEST(DealChange, DealUpToKeepsTheEntriesInForceUpToAnEpoch) {
  const std::vector<DealEntry> deal = {{0, 1}, {2, 2}, {5, 3}};
  EXPECT_EQ(dealUpTo(deal, 0), (std::vector<DealEntry>{{0, 1}}));
  EXPECT_EQ(dealUpTo(deal, 1), (std::vector<DealEntry>{{0, 1}}));
  EXPECT_EQ(dealUpTo(deal, 2), (std::vector<DealEntry>{{0, 1}, {2, 2}}));
  EXPECT_EQ(dealUpTo(deal, 9), deal);
}

}  // namespace
}  // namespace cairn
