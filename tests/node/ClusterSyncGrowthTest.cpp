// RingClusterSync growth (docs/OPERATIONS.md "Growing", ClusterSyncHarness.h): members added to a
// running ring are welcomed with the live weights; deals agreed; updates that drop held members.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "core/Error.h"
#include "node/ring/RingClusterSync.h"
#include "node/testing/FaultyTransport.h"
#include "node/transport/ZmqTransport.h"
#include "tests/node/ClusterSyncHarness.h"
#include "trainer/Optimizer.h"

// The harness (ClusterSyncHarness.h, RingTestStages.h) is cairn::testing's: these tests live there.
namespace cairn::testing {
namespace {


// Growing (docs/OPERATIONS.md "Growing"): a node training alone is told mid-run that its ring
// gained a member (a new cluster, RingClusterSync::addMembers); the newcomer joins through the
// ring join, receives exactly the live weights, and the next sync averages over both.
TEST(RingClusterSyncGrowth, AMemberAddedMidRunIsWelcomedAndTheNextSyncIncludesIt) {
  torch::manual_seed(41);
  const State init = {{"0.weight", torch::randn({3, 5})},
                      {"0.bias", torch::randn({3}, torch::kDouble)},
                      {"0.running_mean", torch::randn({3})},
                      {"0.num_batches_tracked", torch::tensor(int64_t(2))}};
  const TestNode a{"a0", 0, namesOf(init)}, b{"b1", 1, namesOf(init)};
  const std::vector<TestRing> alone = {{"ring_0", namesOf(init), {"a0"}}};
  const std::vector<TestRing> grown = {{"ring_0", namesOf(init), {"a0", "b1"}}};
  zmq::context_t context;
  const std::string prefix = "inproc://grow" + std::to_string(run_counter++) + "_";
  MemberSetup setup;
  setup.timeout = std::chrono::milliseconds(20000);
  std::vector<State> admitted(2), before(2), after(2);
  std::vector<RingClusterSyncStats> stats(2);
  std::vector<std::string> added;
  std::atomic<bool> a_added{false};
  std::vector<std::exception_ptr> errors(2);
  std::thread ta([&] {
    try {
      runMember(context, prefix, a, alone, init, SyncOptions{}, setup,
                [&](RingClusterSync& sync, torch::jit::Module& stage, FaultyTransport& faulty) {
                  int64_t step = 0;
                  perturbSeeded(stage, 500);
                  sync.afterOptimizerStep(step++, stage);  // alone: nothing exchanged
                  EXPECT_EQ(sync.activeRings(), 0u);
                  faulty.addPeer("b1", prefix + "b1");
                  added = sync.addMembers(specOf(a, grown, prefix));
                  a_added = true;
                  // Train alone until the newcomer has asked and been welcomed (bounded wait).
                  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
                  while (sync.stats().members_joined == 0) {
                    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "b1 was never admitted";
                    perturbSeeded(stage, 500 + uint64_t(step));
                    sync.afterOptimizerStep(step++, stage);
                  }
                  admitted[0] = stateOf(stage);
                  perturbSeeded(stage, 900);
                  before[0] = stateOf(stage);
                  sync.afterOptimizerStep(step++, stage);
                  after[0] = stateOf(stage);
                  stats[0] = sync.stats();
                });
    } catch (...) {
      errors[0] = std::current_exception();
    }
  });
  std::thread tb([&] {
    try {
      MemberSetup joiner = setup;
      joiner.joining = true;
      // The newcomer starts from other weights: the welcome must replace them.
      State other;
      for (const auto& [name, t] : init) other[name] = t + 1;
      runMember(context, prefix, b, grown, other, SyncOptions{}, joiner,
                [&](RingClusterSync& sync, torch::jit::Module& stage, FaultyTransport&) {
                  admitted[1] = stateOf(stage);
                  perturbSeeded(stage, 901);
                  before[1] = stateOf(stage);
                  sync.afterOptimizerStep(0, stage);
                  after[1] = stateOf(stage);
                  stats[1] = sync.stats();
                });
    } catch (...) {
      errors[1] = std::current_exception();
    }
  });
  ta.join();
  tb.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  EXPECT_EQ(added, std::vector<std::string>{"b1"});
  expectSameState(admitted[1], admitted[0], "newcomer vs a0 at admission");
  EXPECT_EQ(stats[0].members_joined, 1);
  EXPECT_EQ(stats[1].joined_rings, 1);
  expectAverages(before, after, grown, {a, b});
}

// A growth update (a new deal: addMembers at_admission_step) is held until the admission step
// admitJoinersAt names, here off the local_steps grid (5 with local_steps 2): the newcomer, asking
// from the start, is welcomed there with exactly the weights after step 5, not at an earlier step.
TEST(RingClusterSyncGrowth, AMemberHeldForItsAdmissionStepIsWelcomedExactlyThere) {
  torch::manual_seed(43);
  const State init = {{"0.weight", torch::randn({3, 5})}, {"0.bias", torch::randn({3})}};
  const TestNode a{"a0", 0, namesOf(init)}, b{"b1", 1, namesOf(init)};
  const std::vector<TestRing> alone = {{"ring_0", namesOf(init), {"a0"}}};
  const std::vector<TestRing> grown = {{"ring_0", namesOf(init), {"a0", "b1"}}};
  zmq::context_t context;
  const std::string prefix = "inproc://held" + std::to_string(run_counter++) + "_";
  MemberSetup setup;
  setup.timeout = std::chrono::milliseconds(20000);
  setup.local_steps = 2;
  std::vector<State> admitted(2), before(2), after(2);
  std::vector<int64_t> joined_before_step5(1, -1);
  std::vector<std::exception_ptr> errors(2);
  std::thread ta([&] {
    try {
      runMember(context, prefix, a, alone, init, SyncOptions{}, setup,
                [&](RingClusterSync& sync, torch::jit::Module& stage, FaultyTransport& faulty) {
                  faulty.addPeer("b1", prefix + "b1");
                  EXPECT_EQ(sync.addMembers(specOf(a, grown, prefix), /*at_admission_step=*/true),
                            std::vector<std::string>{"b1"});
                  sync.admitJoinersAt(5);
                  // Give the newcomer's requests time to arrive (they must not be taken before step 5;
                  // the assertions below hold either way).
                  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
                  for (int64_t step = 0; step < 4; ++step) {
                    perturbSeeded(stage, 700 + uint64_t(step));
                    sync.afterOptimizerStep(step, stage);
                  }
                  joined_before_step5[0] = sync.stats().members_joined;
                  perturbSeeded(stage, 704);
                  admitted[0] = stateOf(stage);
                  sync.afterOptimizerStep(4, stage);  // 5 steps done: the admission
                  perturbSeeded(stage, 900);
                  before[0] = stateOf(stage);
                  sync.afterOptimizerStep(5, stage);  // 6 done: an ordinary sync with b1
                  after[0] = stateOf(stage);
                });
    } catch (...) {
      errors[0] = std::current_exception();
    }
  });
  std::thread tb([&] {
    try {
      MemberSetup joiner = setup;
      joiner.joining = true;
      State other;
      for (const auto& [name, t] : init) other[name] = t + 1;
      runMember(context, prefix, b, grown, other, SyncOptions{}, joiner,
                [&](RingClusterSync& sync, torch::jit::Module& stage, FaultyTransport&) {
                  admitted[1] = stateOf(stage);  // starts at step 5 with the welcome
                  perturbSeeded(stage, 901);
                  before[1] = stateOf(stage);
                  sync.afterOptimizerStep(5, stage);
                  after[1] = stateOf(stage);
                });
    } catch (...) {
      errors[1] = std::current_exception();
    }
  });
  ta.join();
  tb.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  EXPECT_EQ(joined_before_step5[0], 0);
  expectSameState(admitted[1], admitted[0], "newcomer vs a0 after step 5");
  expectAverages(before, after, grown, {a, b});
}

// The deal agreement (ClusterSync::proposeDeal, trainer/DealChange.h): at every sync the ring's
// members tally their proposals; an offer is agreed only when every proposer held it, members
// that propose nothing abstain, and one proposer's refusal reaches every member. Expected
// outcomes are written per sync from the proposals alone.
TEST(RingClusterSyncGrowth, DealProposalsAreAgreedOnlyWhenEveryProposerHoldsTheSameOffer) {
  const State l0 = layerState("0", 3, 5);
  const std::vector<TestNode> nodes = {{"c0s0", 0, namesOf(l0)}, {"c1s0", 1, namesOf(l0)},
                                       {"c2s0", 2, namesOf(l0)}};
  const std::vector<TestRing> rings = {{"ring_0", namesOf(l0), {"c0s0", "c1s0", "c2s0"}}};
  struct Proposal {
    uint64_t offer;
    bool can_take;
    bool taken = false;
  };
  // Per sync, per member.
  const std::vector<std::vector<Proposal>> rounds = {
      {{0, true}, {0, true}, {0, true}},    // nobody proposes
      {{7, true}, {7, true}, {0, true}},    // two propose 7, one abstains: 7 agreed
      {{7, true}, {9, true}, {0, true}},    // 7 and 9: nothing agreed
      {{9, true}, {9, true}, {9, false}},   // 9 everywhere, c2s0 cannot take it
      {{0, true}, {0, true}, {11, true}},   // a single proposer: its own offer
      {{11, true, true}, {11, true}, {0, true}}};  // c0s0 had taken it: every member learns so
  const std::vector<std::optional<DealAgreement>> expected = {
      std::nullopt, DealAgreement{7, true}, std::nullopt, DealAgreement{9, false},
      DealAgreement{11, true}, DealAgreement{11, true, 0, true}};
  std::vector<std::vector<std::optional<DealAgreement>>> got(nodes.size());
  std::vector<int> agrees(nodes.size(), -1), taken_twice(nodes.size(), -1);
  runNodes(nodes, rings, {l0, l0, l0}, {}, [&](size_t i, RingClusterSync& sync, auto&) {
    agrees[i] = sync.agreesOnDeals();
    for (const auto& round : rounds) {
      sync.proposeDeal(round[i].offer, round[i].can_take, round[i].taken);
      sync.synchronize();
      got[i].push_back(sync.takeDealAgreement());
    }
    taken_twice[i] = sync.takeDealAgreement().has_value();  // taken once per sync
  });
  for (size_t i = 0; i < nodes.size(); ++i) {
    EXPECT_EQ(agrees[i], 1) << nodes[i].name;
    EXPECT_EQ(taken_twice[i], 0) << nodes[i].name;
    ASSERT_EQ(got[i].size(), expected.size());
    for (size_t k = 0; k < expected.size(); ++k) {
      ASSERT_EQ(got[i][k].has_value(), expected[k].has_value()) << nodes[i].name << " sync " << k;
      if (!expected[k]) continue;
      EXPECT_EQ(got[i][k]->offer, expected[k]->offer) << nodes[i].name << " sync " << k;
      EXPECT_EQ(got[i][k]->all_can_take, expected[k]->all_can_take) << nodes[i].name << " sync " << k;
      EXPECT_EQ(got[i][k]->taken_before, expected[k]->taken_before) << nodes[i].name << " sync " << k;
    }
  }
}

TEST(RingClusterSyncGrowth, ANodeWithoutRingPeersDecidesDealsAlone) {
  const State l0 = layerState("0", 3, 6);
  const std::vector<TestNode> nodes = {{"c0s0", 0, namesOf(l0)}};
  const std::vector<TestRing> rings = {{"ring_0", namesOf(l0), {"c0s0"}}};
  int agrees = -1;
  runNodes(nodes, rings, {l0}, {}, [&](size_t, RingClusterSync& sync, auto&) {
    agrees = sync.agreesOnDeals();
  });
  EXPECT_EQ(agrees, 0);
}

// An abandoned growth (coordinator/Grower.h): the coordinator's next update lists the rings as
// before, which drops the members held for the admission; an admission step armed anyway finds
// none and the ring stays this node's alone.
TEST(RingClusterSyncGrowth, AnUpdateWithoutTheHeldMembersDropsThem) {
  const State init = {{"0.weight", torch::ones({2, 2})}};
  const TestNode a{"a0", 0, namesOf(init)};
  const std::vector<TestRing> alone = {{"ring_0", namesOf(init), {"a0"}}};
  const std::vector<TestRing> grown = {{"ring_0", namesOf(init), {"a0", "b1"}}};
  for (bool withdrawn : {false, true}) {
    zmq::context_t context;
    const std::string prefix = "inproc://drop" + std::to_string(run_counter++) + "_";
    MemberSetup setup;
    setup.timeout = std::chrono::milliseconds(300);
    std::vector<std::string> members;
    bool agrees = false;
    runMember(context, prefix, a, alone, init, SyncOptions{}, setup,
              [&](RingClusterSync& sync, torch::jit::Module& stage, FaultyTransport& faulty) {
                faulty.addPeer("b1", prefix + "b1");
                EXPECT_EQ(sync.addMembers(specOf(a, grown, prefix), /*at_admission_step=*/true),
                          std::vector<std::string>{"b1"});
                if (withdrawn) {
                  EXPECT_TRUE(sync.addMembers(specOf(a, alone, prefix)).empty());
                }
                sync.admitJoinersAt(1);
                sync.afterOptimizerStep(0, stage);  // the admission step: b1 never asks
                agrees = sync.agreesOnDeals();      // a ring member in another cluster
              });
    EXPECT_EQ(agrees, !withdrawn) << (withdrawn ? "withdrawn" : "kept");
  }
}

TEST(RingClusterSyncGrowth, AddMembersRefusesAnythingButAppendedMembers) {
  const State init = {{"0.weight", torch::ones({2, 2})}};
  const TestNode a{"a0", 0, namesOf(init)};
  zmq::context_t context;
  const std::string prefix = "inproc://growbad" + std::to_string(run_counter++) + "_";
  auto ring = [&](std::vector<std::string> members, std::string id = "ring_0") {
    return std::vector<TestRing>{{id, namesOf(init), members}};
  };
  runMember(context, prefix, a, ring({"a0"}), init, SyncOptions{}, MemberSetup{},
            [&](RingClusterSync& sync, torch::jit::Module&, FaultyTransport&) {
              auto refused = [&](const NodeSpec& spec, const std::string& words) {
                try {
                  sync.addMembers(spec);
                  ADD_FAILURE() << "accepted: " << words;
                } catch (const BadInput& e) {
                  EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
                }
              };
              NodeSpec other = specOf(a, ring({"a0", "x1"}), prefix);
              other.name = "z9";
              refused(other, "given to the rings of a0");
              refused(specOf(a, ring({"a0", "x1"}, "ring_9"), prefix), "has no ring ring_9");
              refused(specOf(a, ring({"x1", "a0"}), prefix), "only ever appended");
              refused(specOf(a, ring({"a0", "x1", "x1"}), prefix), "twice");
              EXPECT_TRUE(sync.addMembers(specOf(a, ring({"a0"}), prefix)).empty());
              EXPECT_EQ(sync.addMembers(specOf(a, ring({"a0", "x1"}), prefix)),
                        std::vector<std::string>{"x1"});
              // Queued (not applied yet): the same list again adds nothing, a shorter one is refused.
              EXPECT_TRUE(sync.addMembers(specOf(a, ring({"a0", "x1"}), prefix)).empty());
              refused(specOf(a, ring({"a0"}), prefix), "fewer than");
              EXPECT_EQ(sync.addMembers(specOf(a, ring({"a0", "x1", "y2"}), prefix)),
                        std::vector<std::string>{"y2"});
              sync.leave();
            });
}

}  // namespace
}  // namespace cairn::testing
