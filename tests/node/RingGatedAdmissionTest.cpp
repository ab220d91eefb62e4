// Gated admissions between ring members' syncs (ClusterSync::gateAdmissions), with real ZeroMQ on
// loopback tcp: a paused cluster is admitted at the same boundary in every ring, a member listing
// more ring members still agrees on joiners, and a joiner is told when every other member
// finished before admitting it. The orderings are made by events, never by sleeps; no assertion
// depends on timing.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <ATen/CPUGeneratorImpl.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <stdexcept>
#include <mutex>
#include <optional>
#include <thread>

#include "node/ring/RingClusterSync.h"
#include "node/transport/ZmqTransport.h"
#include "tests/common/LoopbackPorts.h"
#include "tests/node/RingTestEvents.h"
#include "tests/node/RingTestStages.h"

namespace cairn {
namespace {

using testing::makeStage;
using testing::perturbSeeded;
using testing::State;
using testing::stateOf;
using testing::Event;
using testing::SetOnExit;

// One node of a two-member ring for the gated-admission test: `members` (cluster order) of ring
// `ring_id` on `addresses` (host:port by name); `gate`: gated admissions, deciding as a Root
// (`decides`); body(sync, stage) after start().
void runGatedNode(zmq::context_t& context, const std::string& name, const std::string& ring_id,
                  const std::vector<std::string>& members,
                  const std::map<std::string, std::string>& addresses, const State& initial,
                  bool joining, bool decides,
                  const std::function<void(RingClusterSync&, torch::jit::Module&)>& body,
                  int64_t local_steps = 2) {
  NodeSpec spec;
  spec.name = name;
  spec.cluster = name.back() - '0';
  RingSpec ring;
  ring.id = ring_id;
  for (const auto& [n, t] : initial) ring.parameters.push_back(n);
  for (const auto& m : members) ring.members.push_back({m, addresses.at(m), ""});
  ring.rank = members[0] == name ? 0 : 1;
  spec.rings = {ring};
  spec.address = "tcp://" + addresses.at(name);
  ZmqTransport transport(context, name, spec.address);
  Mailbox mailbox(transport);
  {
    RingClusterSync sync(mailbox, spec, SyncOptions{}, local_steps,
                         std::chrono::milliseconds(20000));
    sync.setJoining(joining);
    sync.gateAdmissions(decides);
    torch::jit::Module stage = makeStage(initial);
    sync.start(stage);
    body(sync, stage);
  }  // the sync (and its welcome desk's thread) before the transport closes: ClusterSyncHarness.h
  transport.flushAndClose(std::chrono::milliseconds(2000));
}

// One step, of index `done` (the weights moved first at the start of each interval of
// `local_steps`, by a seed of the interval's end boundary); the steps done after it.
int64_t oneStep(RingClusterSync& sync, torch::jit::Module& stage, int64_t done, uint64_t salt,
                int64_t local_steps = 2) {
  if (done % local_steps == 0) perturbSeeded(stage, salt + uint64_t(done + local_steps));
  sync.afterOptimizerStep(done, stage);
  return done + 1;
}

// Steps done up to sync boundary `b` (local_steps 2: steps b-2 and b-1).
void toBoundary(RingClusterSync& sync, torch::jit::Module& stage, int64_t b, uint64_t salt) {
  oneStep(sync, stage, oneStep(sync, stage, b - 2, salt), salt);
}

// A Root alone in its ring, from `done` steps on: steps one at a time (each boundary noted by
// `at_boundary`) until it decided an admission — after a step between syncs that saw a join
// request, or after a sync that did; the steps done then.
int64_t stepUntilAdmissionDecided(RingClusterSync& sync, torch::jit::Module& stage, int64_t done,
                                  uint64_t salt, const std::function<void(int64_t)>& at_boundary) {
  for (int round = 0; !sync.pendingAdmission(); ++round) {
    if (round >= 8000) throw std::runtime_error("r1's join request was never seen");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    done = oneStep(sync, stage, done, salt);
    if (done % 2 == 0) at_boundary(done);
  }
  return done;
}

// r1's first life in the ring {r0, r1} (gated): one sync with r0, then it leaves.
void firstLifeLeaves(zmq::context_t& context, const std::map<std::string, std::string>& addresses,
                     const State& init, uint64_t salt) {
  runGatedNode(context, "r1", "ring_r", {"r0", "r1"}, addresses, init, false, false,
               [salt](RingClusterSync& sync, torch::jit::Module& stage) {
                 toBoundary(sync, stage, 2, salt);
                 sync.leave();
               });
}

// Gated admissions (ClusterSync::gateAdmissions): two clusters of two stages, a Root ring
// {r0, r1} and a Leaf ring {l0, l1}. Cluster 1 pauses (both its stages leave) and resumes. Its
// Root asks first; cluster 0's Root, alone in its ring, sees the request after some step d
// (between syncs, or at a sync) and decides to admit cluster 1 at its next boundary A > d; the
// test carries that decision to l0 as the activations of step d would. Cluster 1's Leaf asks only
// after l0 passed d. Without the gate, r1 was welcomed at once (the welcome desk) or at d, and l1
// at A: cluster 1's pipeline a sync out of step with cluster 0 in one ring (the 24-volunteer
// soak's stall). Checked: r1 holds exactly r0's weights at A, l1 exactly l0's at A (both admitted
// at the same boundary), the decision names cluster 1 at the boundary after d, and both rings end
// in generation 2 (1: cluster 1 left; 2: admitted).
TEST(RingGatedAdmission, AClusterIsAdmittedAtTheSameBoundaryInEveryRing) {
  torch::manual_seed(46);
  const State root_init = {{"0.weight", torch::randn({4, 3})}};
  const State leaf_init = {{"1.weight", torch::randn({2, 4})}};
  const std::vector<std::string> names = {"r0", "r1", "l0", "l1"};
  const std::vector<std::string> ports = testutil::freeLoopbackAddresses(4);
  std::map<std::string, std::string> addresses;
  for (size_t i = 0; i < names.size(); ++i) addresses[names[i]] = ports[i];
  zmq::context_t context;
  Event r1_left, l1_left, r0_alone, decided, go_l1;
  int64_t at = -1, decided_at = -1;
  std::vector<int64_t> decided_clusters;
  std::map<int64_t, State> r0_at, l0_at;
  State r1_admitted, l1_admitted;
  int64_t r0_generation = -1, l0_generation = -1;
  std::map<std::string, std::exception_ptr> errors;
  std::mutex errors_mutex;
  auto guarded = [&](const std::string& name, std::vector<Event*> release, const std::function<void()>& f) {
    try {
      f();
    } catch (...) {
      std::lock_guard<std::mutex> lock(errors_mutex);
      errors[name] = std::current_exception();
      for (Event* e : release) e->set();  // nobody waits forever on a failed node
    }
  };
  const std::vector<std::string> root_ring = {"r0", "r1"}, leaf_ring = {"l0", "l1"};
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    guarded("r0", {&r0_alone, &decided}, [&] {
      runGatedNode(context, "r0", "ring_r", root_ring, addresses, root_init, false, true,
                   [&](RingClusterSync& sync, torch::jit::Module& stage) {
                     toBoundary(sync, stage, 2, 100);  // with r1
                     r1_left.wait();
                     toBoundary(sync, stage, 4, 100);  // drops r1 (it left)
                     r0_at[4] = stateOf(stage);
                     r0_alone.set();
                     int64_t done = stepUntilAdmissionDecided(
                         sync, stage, 4, 100, [&](int64_t at_b) { r0_at[at_b] = stateOf(stage); });
                     decided_at = done;
                     at = sync.pendingAdmission()->steps_done;
                     decided_clusters = sync.pendingAdmission()->clusters;
                     decided.set();
                     while (done < at) {
                       done = oneStep(sync, stage, done, 100);
                       if (done % 2 == 0) r0_at[done] = stateOf(stage);
                     }
                     r0_generation = sync.generation("ring_r");
                   });
    });
  });
  threads.emplace_back([&] {
    guarded("l0", {&go_l1}, [&] {
      runGatedNode(context, "l0", "ring_l", leaf_ring, addresses, leaf_init, false, false,
                   [&](RingClusterSync& sync, torch::jit::Module& stage) {
                     toBoundary(sync, stage, 2, 200);
                     l1_left.wait();
                     toBoundary(sync, stage, 4, 200);
                     decided.wait();
                     if (at <= decided_at) throw std::runtime_error("an admission before its decision");
                     int64_t done = 4;
                     while (done < decided_at)  // in step with r0, as its pipeline neighbour
                       done = oneStep(sync, stage, done, 200);
                     go_l1.set();  // l1 asks only now: after l0's step d
                     sync.admitClustersAt({at, decided_clusters});  // what "__admit" carries
                     while (done < at) {
                       done = oneStep(sync, stage, done, 200);
                       if (done % 2 == 0) l0_at[done] = stateOf(stage);
                     }
                     l0_generation = sync.generation("ring_l");
                   });
    });
  });
  auto cluster1 = [&](const std::string& name, const std::vector<std::string>& ring,
                      const State& init, Event& left, Event& go, State& admitted) {
    guarded(name, {&left}, [&] {
      runGatedNode(context, name, name[0] == 'r' ? "ring_r" : "ring_l", ring, addresses, init,
                   false, name[0] == 'r', [&](RingClusterSync& sync, torch::jit::Module& stage) {
                     toBoundary(sync, stage, 2, name[0] == 'r' ? 100 : 200);
                     sync.leave();
                   });
      left.set();
      go.wait();
      runGatedNode(context, name, name[0] == 'r' ? "ring_r" : "ring_l", ring, addresses, init,
                   true, name[0] == 'r', [&](RingClusterSync&, torch::jit::Module& stage) {
                     admitted = stateOf(stage);
                   });
    });
  };
  threads.emplace_back([&] { cluster1("r1", root_ring, root_init, r1_left, r0_alone, r1_admitted); });
  threads.emplace_back([&] { cluster1("l1", leaf_ring, leaf_init, l1_left, go_l1, l1_admitted); });
  for (auto& t : threads) t.join();
  for (const auto& [name, e] : errors)
    if (e) std::rethrow_exception(e);
  EXPECT_EQ(decided_clusters, std::vector<int64_t>{1});
  EXPECT_EQ(at, (decided_at / 2 + 1) * 2);
  ASSERT_TRUE(r0_at.count(at) && r0_at.count(at - 2) && l0_at.count(at));
  EXPECT_TRUE(torch::equal(r1_admitted.at("0.weight"), r0_at.at(at).at("0.weight")))
      << "r1 was not welcomed at the admission boundary " << at;
  EXPECT_FALSE(torch::equal(r1_admitted.at("0.weight"), r0_at.at(at - 2).at("0.weight")));
  EXPECT_TRUE(torch::equal(l1_admitted.at("1.weight"), l0_at.at(at).at("1.weight")))
      << "l1 was not welcomed at the admission boundary " << at;
  EXPECT_EQ(r0_generation, 2);
  EXPECT_EQ(l0_generation, 2);
}

// The Root of a live cluster sees a resumed cluster's request between its syncs and admits it at
// its very next boundary: the request is not left waiting for a sync to note it and then for the
// boundary after that (up to two sync intervals; 4.8 s of the churn benchmark's 9.9 s from a kill
// to the spare's first step). With local_steps 4000 the ring {r0, r1} syncs at 4000 (both), 8000
// (r0 drops r1, which left) and 12000; r1 asks once r0 is alone, while r0 steps between 8000 and
// 12000. Checked: r0 decides while it is between syncs (without the check after each step it
// decides nothing before 12000 and this test fails), names cluster 1 at 12000, and r1 is welcomed
// there with exactly r0's weights of 12000, both in generation 2.
TEST(RingGatedAdmission, ARootAdmitsAClusterItSeesAskingBetweenSyncsAtItsNextBoundary) {
  torch::manual_seed(49);
  constexpr int64_t kL = 4000;
  const State init = {{"0.weight", torch::randn({4, 3})}};
  const std::vector<std::string> ports = testutil::freeLoopbackAddresses(2);
  const std::map<std::string, std::string> addresses = {{"r0", ports[0]}, {"r1", ports[1]}};
  zmq::context_t context;
  Event r1_left, r0_alone;
  int64_t decided_at = -1, r0_generation = -1, r1_generation = -1;
  std::optional<ClusterAdmission> decided;
  State r0_at_admission, r1_admitted;
  std::exception_ptr r0_error, r1_error;
  auto steps = [](RingClusterSync& sync, torch::jit::Module& stage, int64_t from, int64_t to,
                  uint64_t salt) {
    while (from < to) from = oneStep(sync, stage, from, salt, kL);
  };
  std::thread r0([&] {
    try {
      SetOnExit release{r0_alone};
      runGatedNode(context, "r0", "ring_r", {"r0", "r1"}, addresses, init, false, true,
                   [&](RingClusterSync& sync, torch::jit::Module& stage) {
                     steps(sync, stage, 0, kL, 800);  // the sync at 4000 with r1
                     r1_left.wait();
                     steps(sync, stage, kL, 2 * kL, 800);  // drops r1 (it left)
                     r0_alone.set();
                     int64_t done = 2 * kL;
                     while (!sync.pendingAdmission()) {
                       if (done == 3 * kL - 1)
                         throw std::runtime_error("no admission decided between the syncs");
                       std::this_thread::sleep_for(std::chrono::milliseconds(5));
                       done = oneStep(sync, stage, done, 800, kL);
                     }
                     decided_at = done;
                     decided = sync.pendingAdmission();
                     steps(sync, stage, done, 3 * kL, 800);
                     r0_at_admission = stateOf(stage);
                     r0_generation = sync.generation("ring_r");
                   }, kL);
    } catch (...) {
      r0_error = std::current_exception();
    }
  });
  std::thread r1([&] {
    try {
      {
        SetOnExit release{r1_left};
        runGatedNode(context, "r1", "ring_r", {"r0", "r1"}, addresses, init, false, false,
                     [&](RingClusterSync& sync, torch::jit::Module& stage) {
                       steps(sync, stage, 0, kL, 800);
                       sync.leave();
                     }, kL);
      }
      r0_alone.wait();
      runGatedNode(context, "r1", "ring_r", {"r0", "r1"}, addresses, init, true, true,
                   [&](RingClusterSync& sync, torch::jit::Module& stage) {
                     r1_admitted = stateOf(stage);
                     r1_generation = sync.generation("ring_r");
                   }, kL);
    } catch (...) {
      r1_error = std::current_exception();
    }
  });
  r0.join();
  r1.join();
  if (r0_error) std::rethrow_exception(r0_error);
  if (r1_error) std::rethrow_exception(r1_error);
  ASSERT_TRUE(decided);
  EXPECT_GT(decided_at, 2 * kL);
  EXPECT_LT(decided_at, 3 * kL);
  EXPECT_EQ(decided->steps_done, 3 * kL);
  EXPECT_EQ(decided->clusters, std::vector<int64_t>{1});
  EXPECT_FALSE(decided->growth);
  EXPECT_TRUE(torch::equal(r1_admitted.at("0.weight"), r0_at_admission.at("0.weight")))
      << "r1 was not welcomed with r0's weights of step " << 3 * kL;
  EXPECT_EQ(r0_generation, 2);
  EXPECT_EQ(r1_generation, 2);
}

// A member that restarted may list more ring members than the live ones: a growth appends
// members, and a restarted member reads them from its node.json while the live ones hold them
// until the admission step. The join agreement's flags were sized by each member's own list, so
// the two sent all-reduce chunks of different sizes, each dropped the other's as malformed, and
// the ring stalled until the timeouts dropped members (the 24-volunteer soak). Here r1 comes back
// listing {r0, r1, r2} while r0 lists {r0, r1}: r1 is admitted, and their next sync averages both
// (bit-identical on both) in the same generation.
TEST(RingGatedAdmission, AMemberListingMoreRingMembersStillAgreesOnJoiners) {
  torch::manual_seed(47);
  const State init = {{"0.weight", torch::randn({4, 3})}};
  const std::vector<std::string> ports = testutil::freeLoopbackAddresses(3);
  const std::map<std::string, std::string> addresses = {
      {"r0", ports[0]}, {"r1", ports[1]}, {"r2", ports[2]}};  // nothing listens at r2's
  zmq::context_t context;
  Event r1_left, r0_alone, r1_back;
  State r0_after, r1_after;
  int64_t r0_generation = -1, r1_generation = -1;
  std::exception_ptr r0_error, r1_error;
  std::thread r0([&] {
    try {
      SetOnExit release{r0_alone};
      runGatedNode(context, "r0", "ring_r", {"r0", "r1"}, addresses, init, false, true,
                   [&](RingClusterSync& sync, torch::jit::Module& stage) {
                     toBoundary(sync, stage, 2, 300);
                     r1_left.wait();
                     toBoundary(sync, stage, 4, 300);
                     r0_alone.set();
                     int64_t b = 4;
                     for (int round = 0; sync.view("ring_r").size() < 2; ++round) {
                       if (round >= 4000) throw std::runtime_error("r1 was never admitted");
                       std::this_thread::sleep_for(std::chrono::milliseconds(5));
                       b += 2;
                       toBoundary(sync, stage, b, 300);
                     }
                     r1_back.wait();
                     toBoundary(sync, stage, b + 2, 300);  // the first sync of both
                     r0_after = stateOf(stage);
                     r0_generation = sync.generation("ring_r");
                   });
    } catch (...) {
      r0_error = std::current_exception();
    }
  });
  std::thread r1([&] {
    try {
      SetOnExit release{r1_left};
      firstLifeLeaves(context, addresses, init, 300);
      r1_left.set();
      r0_alone.wait();
      runGatedNode(context, "r1", "ring_r", {"r0", "r1", "r2"}, addresses, init, true, false,
                   [&](RingClusterSync& sync, torch::jit::Module& stage) {
                     r1_back.set();
                     toBoundary(sync, stage, 2, 400);  // its own step count: it resumed
                     r1_after = stateOf(stage);
                     r1_generation = sync.generation("ring_r");
                   });
    } catch (...) {
      r1_back.set();
      r1_error = std::current_exception();
    }
  });
  r0.join();
  r1.join();
  if (r0_error) std::rethrow_exception(r0_error);
  if (r1_error) std::rethrow_exception(r1_error);
  EXPECT_TRUE(torch::equal(r0_after.at("0.weight"), r1_after.at("0.weight")));
  EXPECT_EQ(r0_generation, 2);  // 1: r1 left; 2: r1 admitted; no loss at their sync
  EXPECT_EQ(r1_generation, 2);
}

// A joiner whose every ring peer finishes its run before admitting it — a cluster replaced near
// the end of a short run resumes from its checkpoint while the live cluster finishes (integration
// nat_replace) — is told so (RingJoin.h closed) and trains without the ring at once. Before, it
// waited 3 × the ring timeout (60 s here) for a welcome nobody would send, then tried to start
// together with a member that had gone. Gated (the sync schedule): r0, alone, sees r1's request,
// decides to admit cluster 1 at its next boundary, and finishes before it.
// Checked: r0's decision names cluster 1 (its request arrived), r1's start() ends with the ring
// closed and not joined, r1 alone in its view with its own (checkpoint's) weights, and its syncs
// go on alone.
TEST(RingGatedAdmission, AJoinerIsToldWhenEveryOtherMemberFinishesBeforeAdmittingIt) {
  torch::manual_seed(48);
  const State init = {{"0.weight", torch::randn({4, 3})}};
  const std::vector<std::string> ports = testutil::freeLoopbackAddresses(2);
  const std::map<std::string, std::string> addresses = {{"r0", ports[0]}, {"r1", ports[1]}};
  zmq::context_t context;
  Event r1_left, r0_alone;
  std::vector<int64_t> decided_clusters;
  RingClusterSyncStats r1_stats;
  std::vector<std::string> r1_view, r1_view_after;
  State r1_started;
  std::exception_ptr r0_error, r1_error;
  std::thread r0([&] {
    try {
      SetOnExit release{r0_alone};
      runGatedNode(context, "r0", "ring_r", {"r0", "r1"}, addresses, init, false, true,
                   [&](RingClusterSync& sync, torch::jit::Module& stage) {
                     toBoundary(sync, stage, 2, 500);  // with r1
                     r1_left.wait();
                     toBoundary(sync, stage, 4, 500);  // drops r1 (it left)
                     r0_alone.set();
                     const int64_t done =
                         stepUntilAdmissionDecided(sync, stage, 4, 500, [](int64_t) {});
                     decided_clusters = sync.pendingAdmission()->clusters;
                     sync.finish(done, stage);  // the run ends before the admission boundary
                   });
    } catch (...) {
      r0_error = std::current_exception();
    }
  });
  std::thread r1([&] {
    try {
      {
        SetOnExit release{r1_left};
        firstLifeLeaves(context, addresses, init, 600);
      }
      r0_alone.wait();
      runGatedNode(context, "r1", "ring_r", {"r0", "r1"}, addresses, init, true, false,
                   [&](RingClusterSync& sync, torch::jit::Module& stage) {
                     r1_stats = sync.stats();
                     r1_view = sync.view("ring_r");
                     r1_started = stateOf(stage);
                     toBoundary(sync, stage, 2, 700);  // alone: a no-op sync
                     r1_view_after = sync.view("ring_r");
                   });
    } catch (...) {
      r1_error = std::current_exception();
    }
  });
  r0.join();
  r1.join();
  if (r0_error) std::rethrow_exception(r0_error);
  if (r1_error) std::rethrow_exception(r1_error);
  EXPECT_EQ(decided_clusters, std::vector<int64_t>{1});
  EXPECT_EQ(r1_stats.closed_rings, 1);
  EXPECT_EQ(r1_stats.joined_rings, 0);
  EXPECT_EQ(r1_view, std::vector<std::string>{"r1"});
  EXPECT_EQ(r1_view_after, std::vector<std::string>{"r1"});
  EXPECT_TRUE(torch::equal(r1_started.at("0.weight"), init.at("0.weight")));
}

}  // namespace
}  // namespace cairn
