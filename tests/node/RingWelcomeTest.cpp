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

#include "node/protocol/RingJoin.h"
#include "node/ring/RingClusterSync.h"
#include "node/ring/RingMembership.h"
#include "node/testing/FaultyTransport.h"
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
using Saved = std::vector<std::pair<std::string, torch::Tensor>>;
using testing::Event;
using testing::SetOnExit;

Saved savedOf(RingClusterSync& sync) {
  Saved tensors;
  nlohmann::json meta;
  sync.saveState(&tensors, &meta);
  return tensors;
}

// Node `name` of the ring {a, b} on `addresses` (host:port, a's first): its transport, mailbox
// and RingClusterSync; body(sync, stage) runs after start().
// `last_synced_step` (≥ 0): loaded as a checkpoint's, before start(); `another_process`: as if
// that checkpoint was written by another process (ClusterSync::setResumedFromAnotherProcess).
void runNode(zmq::context_t& context, const std::string& name, const std::vector<std::string>& addresses,
             const State& initial, bool joining,
             const std::function<void(RingClusterSync&, torch::jit::Module&)>& body,
             int64_t last_synced_step = -1, bool another_process = false) {
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
  {
    // Short: before the welcome desk, the joiner's wait (3 × this) ran out and start() failed.
    RingClusterSync sync(mailbox, spec, options, 1, std::chrono::milliseconds(2000));
    sync.setJoining(joining);
    if (last_synced_step >= 0) sync.loadState({}, {{"last_synced_step", last_synced_step}});
    sync.setResumedFromAnotherProcess(another_process);
    torch::jit::Module stage = makeStage(initial);
    sync.start(stage);
    body(sync, stage);
  }  // the sync (and its welcome desk's thread) before the transport closes: ClusterSyncHarness.h
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

using Body = std::function<void(RingClusterSync&, torch::jit::Module&)>;

// What each member of a restartBoth threw (null: nothing).
struct PairErrors {
  std::exception_ptr a, b;
};

// Both members of ring {a, b} restarting at once (RingRestart.h), each in a thread of its own and
// resumed as from its own checkpoint: a's last sync at step 4, b's at step 6 (b's is the newest);
// `a_another_process`: a's checkpoint as if another process wrote it. body(sync, stage) after start().
PairErrors restartBoth(const State& a_init, const Body& a_body, const State& b_init,
                       const Body& b_body, bool a_another_process = false) {
  const std::vector<std::string> addresses = testutil::freeLoopbackAddresses(2);
  zmq::context_t context;
  PairErrors errors;
  auto node = [&](const std::string& name, const State& initial, const Body& body,
                  int64_t last_sync, bool another, std::exception_ptr& error) {
    try {
      runNode(context, name, addresses, initial, true, body, last_sync, another);
    } catch (...) {
      error = std::current_exception();
    }
  };
  std::thread a([&] { node("a", a_init, a_body, 4, a_another_process, errors.a); });
  std::thread b([&] { node("b", b_init, b_body, 6, false, errors.b); });
  a.join();
  b.join();
  return errors;
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
  State a_started, b_started, a_after, b_after;
  Saved a_outer, b_outer;
  int64_t a_generation = -1, b_generation = -1;
  auto body = [](int seed, State& started, Saved& outer, State& after, int64_t& generation) {
    return [seed, &started, &outer, &after, &generation](RingClusterSync& sync,
                                                         torch::jit::Module& stage) {
      started = stateOf(stage);
      outer = savedOf(sync);
      generation = sync.generation("ring_0");
      perturbSeeded(stage, seed);
      sync.synchronize();
      after = stateOf(stage);
    };
  };
  const PairErrors errors =
      restartBoth(init, body(21, a_started, a_outer, a_after, a_generation), b_init,
                  body(22, b_started, b_outer, b_after, b_generation));
  if (errors.a) std::rethrow_exception(errors.a);
  if (errors.b) std::rethrow_exception(errors.b);
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
  State a_started, a_after;
  int64_t a_generation_started = -1, a_generation_after = -1;
  const PairErrors errors = restartBoth(
      init,
      [&](RingClusterSync& sync, torch::jit::Module& stage) {
        a_started = stateOf(stage);
        a_generation_started = sync.generation("ring_0");
        perturbSeeded(stage, 21);
        sync.synchronize();
        a_after = stateOf(stage);
        a_generation_after = sync.generation("ring_0");
      },
      b_init,
      [](RingClusterSync& sync, torch::jit::Module& stage) {
        perturbSeeded(stage, 22);
        sync.synchronize();
      });
  if (errors.a) std::rethrow_exception(errors.a);
  ASSERT_TRUE(errors.b) << "b's corrupt copy was not caught";
  try {
    std::rethrow_exception(errors.b);
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

// The other way round: the older member a (the one that takes the welcome) trained alone after a
// flipped bit made one of its weights huge, and b's welcome carries a sound copy. Taking it would
// heal a's copy silently, hiding the only sign that a's memory flips bits (seen in the soak: a
// flipping Root whose ring peer was away took its welcome later and finished as if nothing had
// happened). Checked, when a's copy is of its own process's making: a refuses to go on, naming its
// own copy (BadInput, as when its first sync's contribution check names it); b, its welcome sent,
// drops a at its sync and trains on alone. When a's copy was loaded from a checkpoint another
// process wrote (a spare resuming the flipping node's checkpoint, which that node wrote before it
// was caught; refusing there would fail every spare in turn): a takes b's copy and both sync on.
struct OlderCorruptRun {
  std::exception_ptr a_error;
  bool a_started = false;
  State a_started_state, a_after, b_after;
  int64_t b_generation_after = -1;
};
OlderCorruptRun runOlderCorrupt(const State& a_init, const State& b_init, bool another_process) {
  OlderCorruptRun run;
  const PairErrors errors = restartBoth(
      a_init,
      [&](RingClusterSync& sync, torch::jit::Module& stage) {
        run.a_started = true;
        run.a_started_state = stateOf(stage);
        perturbSeeded(stage, 21);
        sync.synchronize();
        run.a_after = stateOf(stage);
      },
      b_init,
      [&](RingClusterSync& sync, torch::jit::Module& stage) {
        perturbSeeded(stage, 22);
        sync.synchronize();
        run.b_after = stateOf(stage);
        run.b_generation_after = sync.generation("ring_0");
      },
      another_process);
  if (errors.b) std::rethrow_exception(errors.b);
  run.a_error = errors.a;
  return run;
}

TEST(RingRestart, AnOlderMemberWithACorruptCopyNamesItselfRatherThanTakingTheWelcome) {
  torch::manual_seed(45);
  const State init = ringState();
  State a_init = copyOf(init);
  a_init["0.weight"][2][0] = -6.8e36;  // exponent bit 30 of a small weight flipped
  State b_init = copyOf(init);
  b_init["0.weight"] += 0.25;
  const OlderCorruptRun own = runOlderCorrupt(a_init, b_init, /*another_process=*/false);
  EXPECT_FALSE(own.a_started) << "a took b's welcome over its own corrupt copy";
  ASSERT_TRUE(own.a_error) << "a's corrupt copy was not named";
  try {
    std::rethrow_exception(own.a_error);
  } catch (const BadInput& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("this node's copy"), std::string::npos) << what;
    EXPECT_NE(what.find("corrupt"), std::string::npos) << what;
    EXPECT_NE(what.find("from b"), std::string::npos) << what;
  }
  EXPECT_EQ(own.b_generation_after, 2);  // a dropped at b's sync
  EXPECT_LT(own.b_after.at("0.weight").abs().max().item<double>(), 1e3);

  const OlderCorruptRun loaded = runOlderCorrupt(a_init, b_init, /*another_process=*/true);
  if (loaded.a_error) std::rethrow_exception(loaded.a_error);
  ASSERT_TRUE(loaded.a_started);
  for (const auto& [name, t] : b_init)  // a took b's copy: its corrupt weight is gone
    EXPECT_TRUE(torch::equal(loaded.a_started_state.at(name), t)) << "a's " << name << " is not b's";
  EXPECT_EQ(loaded.b_generation_after, 1);  // nobody dropped: an ordinary sync over both
  for (const auto& [name, t] : loaded.a_after)
    EXPECT_TRUE(torch::equal(t, loaded.b_after.at(name))) << name << " differs a vs b after the sync";
}

// A transport that records which peers it was asked to dial again.
class RedialLog : public FaultyTransport {
 public:
  using FaultyTransport::FaultyTransport;
  void redial(const std::string& peer) override {
    redialled.push_back(peer);
    FaultyTransport::redial(peer);
  }
  std::vector<std::string> redialled;
};

// A join request with a life this node has not seen from its sender means the sender's process
// (re)started, perhaps a moment ago at the same address, and this node's connection to it may
// still end at the old process (PeerRepoint.ARedialledPeerGetsTheNextMessageOverANewConnection):
// noting it dials the sender again, once per life, before anything answers it; requests of a
// life already seen (a repeat, or a late one of an earlier life), without a life, or from a
// non-member do not. The lives are the node's, not a ring's: the same life asking in a second
// ring is no new process.
TEST(RingJoinRequests, ASenderIsDialledAgainAtEachNewLifeOnly) {
  zmq::context_t context;
  ZmqTransport zmq_transport(context, "a", "inproc://ring_join_requests_a");
  RedialLog transport(zmq_transport);
  Mailbox mailbox(transport);
  NodeSpec spec;
  spec.name = "a";
  for (const char* id : {"ring_0", "ring_1"}) {
    RingSpec r;
    r.id = id;
    r.members = {{"a", "", ""}, {"b", "", ""}};
    spec.rings.push_back(r);
  }
  RingContext ctx(mailbox, spec, SyncOptions{}, std::chrono::milliseconds(1000));
  Ring ring0, ring1;
  ring0.spec = spec.rings[0];
  ring1.spec = spec.rings[1];
  auto ask = [&ctx](Ring& ring, const std::string& sender, uint64_t life) {
    noteJoinRequest(ctx, ring, encode(JoinRequest{sender, ring.spec.id, life}));
  };
  ask(ring0, "b", 7);  // b's first request seen: a process this node has not heard from
  ask(ring0, "b", 7);  // its repeat (a joiner asks every second)
  ask(ring1, "b", 7);  // the same life in the other ring
  EXPECT_EQ(transport.redialled, std::vector<std::string>{"b"});
  ask(ring0, "b", 9);  // b restarted
  ask(ring1, "b", 9);
  ask(ring0, "b", 7);  // a request of b's old life, queued before it restarted
  ask(ring0, "b", 0);  // no life given: nothing to tell lives apart by
  ask(ring0, "z", 5);  // not a member: kept aside, never dialled
  EXPECT_EQ(transport.redialled, (std::vector<std::string>{"b", "b"}));
  EXPECT_EQ(ring0.join_requests, std::set<std::string>{"b"});
  EXPECT_EQ(ring1.asker_lives.at("b"), 9u);
  EXPECT_EQ(ring0.asker_lives.at("b"), 0u);  // the latest request's, as before
  EXPECT_EQ(ring0.strangers, std::set<std::string>{"z"});
  zmq_transport.flushAndClose(std::chrono::milliseconds(0));
}

}  // namespace
}  // namespace cairn
