// The welcome of a joiner between a ring member's syncs (node/ring/RingWelcomeDesk.h), with real
// ZeroMQ on loopback tcp: two nodes a, b in one ring (DiLoCo). b syncs once and leaves; a's next
// sync drops it (a is alone), then a trains on and BLOCKS — as a node blocked in a pipeline wait
// that depends, through another ring, on the joiner's own cluster — until b's second life (a
// joiner, which asks to join only once a is blocked) has finished start(). a can only get past
// that block if its join request is answered while it blocks: before the welcome desk, b waited
// for a welcome from a's next sync, which never came (b's 3 × 2 s join wait ran out, its fallback
// identical-start check found a missing, and start() threw). The ordering is made by the two
// events, never by a sleep; no assertion depends on timing.
// Checked: b gets exactly a's parameters, buffers and outer state as of a's last sync (not a's
// moved-on weights), both enter generation 2, and the next sync of a is b's first: the DiLoCo
// update over both, bit-identical on both.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <ATen/CPUGeneratorImpl.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <stdexcept>
#include <mutex>
#include <thread>

#include "node/ring/RingClusterSync.h"
#include "node/transport/ZmqTransport.h"
#include "tests/common/LoopbackPorts.h"
#include "tests/node/RingTestStages.h"

namespace cairn {
namespace {

using testing::makeStage;
using testing::perturbSeeded;
using testing::State;
using testing::stateOf;
using Saved = std::vector<std::pair<std::string, torch::Tensor>>;

// One-shot event between the two node threads.
class Event {
 public:
  void set() {
    std::lock_guard<std::mutex> lock(mutex_);
    set_ = true;
    changed_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return set_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool set_ = false;
};

// Sets `event` when the scope ends, however it ends (a failed start() must still release a).
struct SetOnExit {
  Event& event;
  ~SetOnExit() { event.set(); }
};

Saved savedOf(RingClusterSync& sync) {
  Saved tensors;
  nlohmann::json meta;
  sync.saveState(&tensors, &meta);
  return tensors;
}

// Node `name` of the ring {a, b} on `addresses` (host:port, a's first): its transport, mailbox
// and RingClusterSync; body(sync, stage) runs after start().
// `last_synced_step` (≥ 0): loaded as a checkpoint's, before start().
void runNode(zmq::context_t& context, const std::string& name, const std::vector<std::string>& addresses,
             const State& initial, bool joining,
             const std::function<void(RingClusterSync&, torch::jit::Module&)>& body,
             int64_t last_synced_step = -1) {
  NodeSpec spec;
  spec.name = name;
  spec.cluster = name == "a" ? 0 : 1;
  RingSpec ring;
  ring.id = "ring_0";
  for (const auto& [n, t] : initial) ring.parameters.push_back(n);
  ring.members = {{"a", addresses[0], ""}, {"b", addresses[1], ""}};
  ring.rank = name == "a" ? 0 : 1;
  spec.rings = {ring};
  spec.address = "tcp://" + addresses[size_t(ring.rank)];
  ZmqTransport transport(context, name, spec.address);
  Mailbox mailbox(transport);
  SyncOptions options;
  options.mode = SyncMode::kDiLoCo;
  // Short: before the welcome desk, the joiner's wait (3 × this) ran out and start() failed.
  RingClusterSync sync(mailbox, spec, options, 1, std::chrono::milliseconds(2000));
  sync.setJoining(joining);
  if (last_synced_step >= 0) sync.loadState({}, {{"last_synced_step", last_synced_step}});
  torch::jit::Module stage = makeStage(initial);
  sync.start(stage);
  body(sync, stage);
  transport.flushAndClose(std::chrono::milliseconds(2000));
}

// The ring's tensors of these tests: a float weight, a double bias, a buffer and an integer
// buffer (drawn from torch's generator: seed it first).
State ringState() {
  return {{"0.weight", torch::randn({4, 3})},
          {"0.bias", torch::randn({4}, torch::kDouble)},
          {"0.running_mean", torch::randn({4})},
          {"0.num_batches_tracked", torch::tensor(int64_t(3))}};
}

State copyOf(const State& state) {
  State copy;
  for (const auto& [name, t] : state) copy[name] = t.clone();
  return copy;
}

TEST(RingWelcome, AJoinRequestIsAnsweredWhileThePeerIsBlockedRightAfterItsSync) {
  torch::manual_seed(41);
  const State init = ringState();
  const std::vector<std::string> addresses = testutil::freeLoopbackAddresses(2);
  zmq::context_t context;
  Event a_blocked, b_started;
  State a_at_sync, a_before, a_after, b_admitted, b_before, b_after;
  Saved a_outer, b_outer;
  RingClusterSyncStats a_stats, b_stats;
  int64_t a_generation_admitted = -1, a_generation = -1, b_generation = -1;
  std::exception_ptr a_error, b_error;
  std::thread a([&] {
    try {
      SetOnExit release_b{a_blocked};  // b must not wait forever if a fails first
      runNode(context, "a", addresses, init, false, [&](RingClusterSync& sync, torch::jit::Module& stage) {
        perturbSeeded(stage, 1);
        sync.synchronize();  // with b
        perturbSeeded(stage, 2);
        sync.synchronize();  // b left: dropped, a is alone; this is the last sync before b asks
        a_at_sync = stateOf(stage);
        a_outer = savedOf(sync);
        perturbSeeded(stage, 3);  // a trains on past its sync point...
        a_blocked.set();    // ...and blocks; b asks to join only now
        b_started.wait();
        a_generation_admitted = sync.generation("ring_0");
        perturbSeeded(stage, 4);
        a_before = stateOf(stage);
        sync.synchronize();  // b's first sync
        a_after = stateOf(stage);
        a_stats = sync.stats();
        a_generation = sync.generation("ring_0");
      });
    } catch (...) {
      a_error = std::current_exception();
    }
  });
  std::thread b([&] {
    try {
      SetOnExit release_a{b_started};
      runNode(context, "b", addresses, init, false, [&](RingClusterSync& sync, torch::jit::Module& stage) {
        perturbSeeded(stage, 11);
        sync.synchronize();
        sync.leave();
      });
      a_blocked.wait();
      runNode(context, "b", addresses, init, true, [&](RingClusterSync& sync, torch::jit::Module& stage) {
        b_admitted = stateOf(stage);
        b_outer = savedOf(sync);
        b_stats = sync.stats();
        b_started.set();
        perturbSeeded(stage, 12);
        b_before = stateOf(stage);
        sync.synchronize();
        b_after = stateOf(stage);
        b_generation = sync.generation("ring_0");
      });
    } catch (...) {
      b_error = std::current_exception();
    }
  });
  a.join();
  b.join();
  if (b_error) std::rethrow_exception(b_error);
  if (a_error) std::rethrow_exception(a_error);
  // b holds a's state as of a's last sync, not a's moved-on weights.
  ASSERT_EQ(b_admitted.size(), a_at_sync.size());
  for (const auto& [name, t] : a_at_sync)
    EXPECT_TRUE(torch::equal(b_admitted.at(name), t)) << name << " differs from a's at its sync";
  ASSERT_EQ(b_outer.size(), a_outer.size());
  std::map<std::string, torch::Tensor> outer(a_outer.begin(), a_outer.end());
  for (const auto& [name, t] : b_outer) {
    ASSERT_TRUE(outer.count(name)) << name;
    EXPECT_TRUE(torch::equal(t, outer.at(name))) << "b's " << name << " differs from a's";
  }
  EXPECT_EQ(b_stats.joined_rings, 1);
  EXPECT_EQ(a_stats.members_joined, 1);
  EXPECT_EQ(b_stats.last_welcome_checksum, a_stats.last_welcome_checksum);
  EXPECT_EQ(a_generation_admitted, 2);  // 1: b left; 2: b admitted, before a's next sync
  EXPECT_EQ(a_generation, 2);
  EXPECT_EQ(b_generation, 2);
  // a's next sync is b's first: the DiLoCo update over both from the outer state of a's sync.
  for (const std::string name : {"0.weight", "0.bias"}) {
    const torch::ScalarType dtype = init.at(name).scalar_type();
    torch::Tensor prev, momentum;
    for (const auto& [key, t] : a_outer) {
      if (t.scalar_type() != dtype) continue;
      if (key.find(".previous.") != std::string::npos) prev = t.to(torch::kDouble);
      if (key.find(".momentum.") != std::string::npos) momentum = t.to(torch::kDouble);
    }
    ASSERT_TRUE(prev.defined() && momentum.defined()) << name;
    prev = prev.view(init.at(name).sizes());
    momentum = momentum.view(init.at(name).sizes());
    const torch::Tensor delta = ((prev - a_before.at(name).to(torch::kDouble)) +
                                 (prev - b_before.at(name).to(torch::kDouble))) / 2;
    const torch::Tensor expected = prev - 0.7 * (delta + 0.9 * (0.9 * momentum + delta));
    EXPECT_LE((a_after.at(name).to(torch::kDouble) - expected).abs().max().item<double>(), 1e-5)
        << name;
    EXPECT_TRUE(torch::equal(a_after.at(name), b_after.at(name))) << name << " differs a vs b";
  }
  EXPECT_TRUE(torch::equal(a_after.at("0.running_mean"), b_after.at("0.running_mean")));
}

// Every member restarting at once (RingRestart.h): two clusters each resumed from their own
// checkpoint, a's with its last sync at step 4, b's at step 6, and different weights. Nobody is live
// to welcome the other: before RingRestart, both fell back to the fresh start's identical-weights
// check and refused to train (BadInput). Checked: both train on from b's state (the newest last
// sync): a's parameters, buffers and DiLoCo outer state become exactly b's; both enter generation
// 1; their next sync is an ordinary DiLoCo sync over both, bit-identical on both.
TEST(RingRestart, EveryMemberRestartingTakesTheNewestLastSync) {
  torch::manual_seed(43);
  const State init = ringState();
  State b_init = copyOf(init);
  b_init["0.weight"] += 0.25;
  b_init["0.running_mean"] -= 1.0;
  b_init["0.num_batches_tracked"] += 2;
  const std::vector<std::string> addresses = testutil::freeLoopbackAddresses(2);
  zmq::context_t context;
  State a_started, b_started, a_after, b_after;
  Saved a_outer, b_outer;
  int64_t a_generation = -1, b_generation = -1;
  std::exception_ptr a_error, b_error;
  auto node = [&](const std::string& name, const State& initial, int64_t last_sync, State& started,
                  Saved& outer, State& after, int64_t& generation, std::exception_ptr& error) {
    try {
      runNode(context, name, addresses, initial, true,
              [&](RingClusterSync& sync, torch::jit::Module& stage) {
                started = stateOf(stage);
                outer = savedOf(sync);
                generation = sync.generation("ring_0");
                perturbSeeded(stage, name == "a" ? 21 : 22);
                sync.synchronize();
                after = stateOf(stage);
              },
              last_sync);
    } catch (...) {
      error = std::current_exception();
    }
  };
  std::thread a([&] { node("a", init, 4, a_started, a_outer, a_after, a_generation, a_error); });
  std::thread b([&] { node("b", b_init, 6, b_started, b_outer, b_after, b_generation, b_error); });
  a.join();
  b.join();
  if (a_error) std::rethrow_exception(a_error);
  if (b_error) std::rethrow_exception(b_error);
  ASSERT_EQ(a_started.size(), b_init.size());
  for (const auto& [name, t] : b_init) {
    EXPECT_TRUE(torch::equal(a_started.at(name), t)) << "a's " << name << " is not b's";
    EXPECT_TRUE(torch::equal(b_started.at(name), t)) << "b's own " << name << " changed";
  }
  ASSERT_EQ(a_outer.size(), b_outer.size());
  ASSERT_FALSE(a_outer.empty());
  for (size_t i = 0; i < a_outer.size(); ++i) {
    EXPECT_EQ(a_outer[i].first, b_outer[i].first);
    EXPECT_TRUE(torch::equal(a_outer[i].second, b_outer[i].second)) << a_outer[i].first;
  }
  EXPECT_EQ(a_generation, 1);
  EXPECT_EQ(b_generation, 1);
  for (const auto& [name, t] : a_after)
    EXPECT_TRUE(torch::equal(t, b_after.at(name))) << name << " differs a vs b after the sync";
  EXPECT_FALSE(torch::equal(a_after.at("0.weight"), b_init.at("0.weight")));  // a sync happened
}

// The same restart, but b's copy (the newest last sync, so the one the welcome carries) holds a
// weight made huge by a flipped exponent bit while b trained alone: nobody compared it before.
// Taking the welcome would copy the corruption to a, and then both copies agree and no check can
// name either. Checked: a keeps its own weights (not b's) while it enters b's generation, and at
// their first sync the contribution check names b: b refuses to go on (BadInput), a drops b and
// syncs alone, its weights finite and of their usual size.
TEST(RingRestart, ANewestMemberWithACorruptCopyIsCaughtNotCopied) {
  torch::manual_seed(44);
  const State init = ringState();
  State b_init = copyOf(init);
  b_init["0.weight"] += 0.25;
  b_init["0.weight"][1][2] = 3.0e30;  // exponent bit 30 of a weight near 1 flipped
  const std::vector<std::string> addresses = testutil::freeLoopbackAddresses(2);
  zmq::context_t context;
  State a_started, a_after;
  int64_t a_generation_started = -1, a_generation_after = -1;
  std::exception_ptr a_error, b_error;
  std::thread a([&] {
    try {
      runNode(context, "a", addresses, init, true,
              [&](RingClusterSync& sync, torch::jit::Module& stage) {
                a_started = stateOf(stage);
                a_generation_started = sync.generation("ring_0");
                perturbSeeded(stage, 21);
                sync.synchronize();
                a_after = stateOf(stage);
                a_generation_after = sync.generation("ring_0");
              },
              4);
    } catch (...) {
      a_error = std::current_exception();
    }
  });
  std::thread b([&] {
    try {
      runNode(context, "b", addresses, b_init, true,
              [&](RingClusterSync& sync, torch::jit::Module& stage) {
                perturbSeeded(stage, 22);
                sync.synchronize();
              },
              6);
    } catch (...) {
      b_error = std::current_exception();
    }
  });
  a.join();
  b.join();
  if (a_error) std::rethrow_exception(a_error);
  ASSERT_TRUE(b_error) << "b's corrupt copy was not caught";
  try {
    std::rethrow_exception(b_error);
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a_generation_started, 1);  // entered b's generation...
  for (const auto& [name, t] : init)   // ...with its own weights
    EXPECT_TRUE(torch::equal(a_started.at(name), t)) << "a took b's " << name;
  EXPECT_EQ(a_generation_after, 2);  // b dropped at the sync
  EXPECT_TRUE(torch::isfinite(a_after.at("0.weight")).all().item<bool>());
  EXPECT_LT(a_after.at("0.weight").abs().max().item<double>(), 1e3);
}

// One node of a two-member ring for the gated-admission test: `members` (cluster order) of ring
// `ring_id` on `addresses` (host:port by name); `gate`: gated admissions, deciding as a Root
// (`decides`); body(sync, stage) after start().
void runGatedNode(zmq::context_t& context, const std::string& name, const std::string& ring_id,
                  const std::vector<std::string>& members,
                  const std::map<std::string, std::string>& addresses, const State& initial,
                  bool joining, bool decides,
                  const std::function<void(RingClusterSync&, torch::jit::Module&)>& body) {
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
  RingClusterSync sync(mailbox, spec, SyncOptions{}, /*local_steps=*/2,
                       std::chrono::milliseconds(20000));
  sync.setJoining(joining);
  sync.gateAdmissions(decides);
  torch::jit::Module stage = makeStage(initial);
  sync.start(stage);
  body(sync, stage);
  transport.flushAndClose(std::chrono::milliseconds(2000));
}

// Steps done up to sync boundary `b` (local_steps 2: steps b-2 and b-1), the weights moved first.
void toBoundary(RingClusterSync& sync, torch::jit::Module& stage, int64_t b, uint64_t salt) {
  perturbSeeded(stage, salt + uint64_t(b));
  sync.afterOptimizerStep(b - 2, stage);
  sync.afterOptimizerStep(b - 1, stage);
}

// A Root alone in its ring, from boundary `b` on: syncs boundary after boundary (each noted by
// `at_boundary`) until a sync saw a join request and it decided an admission; the last boundary.
int64_t syncUntilAdmissionDecided(RingClusterSync& sync, torch::jit::Module& stage, int64_t b,
                                  uint64_t salt, const std::function<void(int64_t)>& at_boundary) {
  for (int round = 0; !sync.pendingAdmission(); ++round) {
    if (round >= 4000) throw std::runtime_error("r1's join request never reached a sync");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    b += 2;
    toBoundary(sync, stage, b, salt);
    at_boundary(b);
  }
  return b;
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
// Root asks first; cluster 0's Root, alone in its ring, sees the request at a sync (boundary d)
// and decides to admit cluster 1 at its next boundary A = d + 2; the test carries that decision to
// l0 as the activations would. Cluster 1's Leaf asks only after l0 passed d. Without the gate, r1
// was welcomed at once (the welcome desk) or at d, and l1 at A: cluster 1's pipeline a sync out
// of step with cluster 0 in one ring (the 24-volunteer soak's stall). Checked: r1 holds exactly
// r0's weights at A, l1 exactly l0's at A (both admitted at the same boundary), the decision
// names cluster 1 at d + 2, and both rings end in generation 2 (1: cluster 1 left; 2: admitted).
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
                     r0_alone.set();
                     int64_t b = syncUntilAdmissionDecided(
                         sync, stage, 4, 100, [&](int64_t at_b) { r0_at[at_b] = stateOf(stage); });
                     decided_at = b;
                     at = sync.pendingAdmission()->steps_done;
                     decided_clusters = sync.pendingAdmission()->clusters;
                     decided.set();
                     while (b < at) {
                       b += 2;
                       toBoundary(sync, stage, b, 100);
                       r0_at[b] = stateOf(stage);
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
                     int64_t b = 4;
                     while (b < decided_at) {  // in step with r0, as its pipeline neighbour
                       b += 2;
                       toBoundary(sync, stage, b, 200);
                     }
                     go_l1.set();  // l1 asks only now: after l0's boundary d
                     sync.admitClustersAt({at, decided_clusters});  // what "__admit" carries
                     while (b < at) {
                       b += 2;
                       toBoundary(sync, stage, b, 200);
                       l0_at[b] = stateOf(stage);
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
  EXPECT_EQ(at, decided_at + 2);
  ASSERT_TRUE(r0_at.count(at) && l0_at.count(at));
  EXPECT_TRUE(torch::equal(r1_admitted.at("0.weight"), r0_at.at(at).at("0.weight")))
      << "r1 was not welcomed at the admission boundary " << at;
  EXPECT_FALSE(torch::equal(r1_admitted.at("0.weight"), r0_at.at(decided_at).at("0.weight")));
  EXPECT_TRUE(torch::equal(l1_admitted.at("1.weight"), l0_at.at(at).at("1.weight")))
      << "l1 was not welcomed at the admission boundary " << at;
  EXPECT_EQ(r0_generation, 2);
  EXPECT_EQ(l0_generation, 2);
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
// together with a member that had gone. Gated (the sync schedule): r0, alone, only notes r1's
// request at its syncs, decides to admit cluster 1 at a later boundary, and finishes first.
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
                     const int64_t b =
                         syncUntilAdmissionDecided(sync, stage, 4, 500, [](int64_t) {});
                     decided_clusters = sync.pendingAdmission()->clusters;
                     sync.finish(b, stage);  // the run ends before the admission boundary
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
