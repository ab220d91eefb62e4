// A growth taken by clusters at different steps (the 24-volunteer soak: a cluster that resumed
// from a checkpoint lags the others by whole syncs), with real ZeroMQ on loopback tcp. Ring
// ring_0 holds a0 (cluster 0, leading: 8 steps done at the agreeing sync) and b1 (cluster 1,
// lagging: 4 steps done at the same sync); a growth adds c2 (cluster 2) from step F = 11, off the
// local_steps grid (2). Both members gate their admissions as Roots do (the sync schedule).
// The sync's deal tally carries the leading count (DealAgreement::leading_steps_done = 8 on both),
// from which each arms the admission as trainer/DealChange.h does: F less its lag, so a0 at 11
// and b1 at 7 — the same sync of both. Before, both armed it at 11: b1 reached its step 11 two
// syncs after a0, a0's admission sync waited on a member that was not admitting, and the new
// cluster was never admitted together.
// Checked: the agreement's leading count; b1's pending admission is the growth at 7 (what
// "__admit" carries to its other stages); c2 is welcomed with exactly the weights a0 and b1 hold
// after that sync; the next sync averages all three; no timing decides an assertion.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <ATen/CPUGeneratorImpl.h>

#include <condition_variable>
#include <map>
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

constexpr int64_t kLocalSteps = 2;
constexpr int64_t kFirstStep = 11;  // F: the new cluster's first step
constexpr uint64_t kOffer = 77;     // the deal's fingerprint both Roots propose

struct Member {
  std::string name;
  int64_t steps_at_agreement;  // own steps done at the sync that agrees on the deal
};

// NodeSpec `name` with ring_0 over `initial`'s tensors, listing `members` (cluster order) on
// `addresses`: the start of a node's node.json, or a coordinator's update to it.
NodeSpec ringUpdate(const std::string& name, const std::vector<std::string>& members,
                    const std::map<std::string, std::string>& addresses, const State& initial) {
  NodeSpec updated;
  updated.name = name;
  RingSpec ring;
  ring.id = "ring_0";
  for (const auto& [n, t] : initial) ring.parameters.push_back(n);
  for (const auto& m : members) {
    if (m == name) ring.rank = int(ring.members.size());
    ring.members.push_back({m, addresses.at(m), ""});
  }
  updated.rings = {ring};
  return updated;
}

using BeforeStart = std::function<void(RingClusterSync&, ZmqTransport&)>;

// Node `name` of ring_0 (members `members`, cluster order) on `addresses`, gated as a Root unless
// `gate` is false; before_start(sync, transport) runs before start(), body(sync, stage, transport)
// after it.
void runGrowthNode(zmq::context_t& context, const std::string& name, const std::vector<std::string>& members,
             const std::map<std::string, std::string>& addresses, const State& initial, bool joining,
             const std::function<void(RingClusterSync&, torch::jit::Module&, ZmqTransport&)>& body,
             const BeforeStart& before_start = {}, bool gate = true) {
  NodeSpec spec = ringUpdate(name, members, addresses, initial);
  spec.cluster = name.back() - '0';
  spec.address = "tcp://" + addresses.at(name);
  ZmqTransport transport(context, name, spec.address);
  Mailbox mailbox(transport);
  {
    RingClusterSync sync(mailbox, spec, SyncOptions{}, kLocalSteps, std::chrono::milliseconds(20000));
    sync.setJoining(joining);
    if (gate) sync.gateAdmissions(/*decides=*/true);
    if (before_start) before_start(sync, transport);
    torch::jit::Module stage = makeStage(initial);
    sync.start(stage);
    body(sync, stage, transport);
  }  // the sync (and its welcome desk's thread) before the transport closes: ClusterSyncHarness.h
  transport.flushAndClose(std::chrono::milliseconds(2000));
}

// afterOptimizerStep for steps [from, to), the weights moved (seeded) before each.
void stepsTo(RingClusterSync& sync, torch::jit::Module& stage, int64_t from, int64_t to, uint64_t salt) {
  for (int64_t step = from; step < to; ++step) {
    perturbSeeded(stage, salt + uint64_t(step));
    sync.afterOptimizerStep(step, stage);
  }
}

// The nodes' threads joined; the first error any of them recorded is rethrown.
void joinRethrowing(std::vector<std::thread>& threads,
                    const std::map<std::string, std::exception_ptr>& errors) {
  for (auto& t : threads) t.join();
  for (const auto& [name, e] : errors)
    if (e) std::rethrow_exception(e);
}

// Every one of `names` holds the mean of the three states before their sync (a0, b1, c2: summed
// in rank order), for each tensor of `init`.
void expectAveragedOverThree(const std::map<std::string, State>& before,
                             const std::map<std::string, State>& after,
                             const std::vector<std::string>& names, const State& init) {
  for (const auto& [name, t] : init) {
    const torch::Tensor mean =
        (before.at("a0").at(name) + before.at("b1").at(name) + before.at("c2").at(name)) / 3;
    for (const std::string& n : names)
      EXPECT_TRUE(torch::allclose(after.at(n).at(name), mean, 1e-5, 1e-6))
          << n << " after the first sync of three: " << name;
  }
}

TEST(RingClusterSyncGrowth, ClustersAtDifferentStepsAdmitTheNewClusterAtTheSameSync) {
  torch::manual_seed(47);
  const State init = {{"0.weight", torch::randn({3, 4})}, {"0.bias", torch::randn({3})}};
  const std::vector<std::string> names = {"a0", "b1", "c2"};
  const std::vector<std::string> ports = testutil::freeLoopbackAddresses(3);
  std::map<std::string, std::string> addresses;
  for (size_t i = 0; i < names.size(); ++i) addresses[names[i]] = ports[i];
  const std::vector<std::string> before_growth = {"a0", "b1"}, grown = {"a0", "b1", "c2"};
  const std::vector<Member> running = {{"a0", 8}, {"b1", 4}};

  zmq::context_t context;
  std::mutex mutex;  // guards everything below
  std::map<std::string, int64_t> leading, armed_at, pending_at;
  std::map<std::string, bool> pending_growth;
  std::map<std::string, State> at_admission, before_last, after_last;
  std::map<std::string, std::exception_ptr> errors;
  auto record = [&](auto& map, const std::string& name, auto value) {
    std::lock_guard<std::mutex> lock(mutex);
    map[name] = value;
  };
  std::vector<std::thread> threads;
  for (size_t i = 0; i < running.size(); ++i) {
    threads.emplace_back([&, i] {
      const Member m = running[i];
      try {
        runGrowthNode(context, m.name, before_growth, addresses, init, false,
                [&](RingClusterSync& sync, torch::jit::Module& stage, ZmqTransport& transport) {
                  // Up to the agreeing sync: every earlier boundary is a sync of both (the same
                  // ordinal), the last one tallies the proposals.
                  const int64_t start = m.steps_at_agreement - 2 * kLocalSteps;
                  stepsTo(sync, stage, start, m.steps_at_agreement - 1, 100);
                  sync.proposeDeal(kOffer, true);
                  stepsTo(sync, stage, m.steps_at_agreement - 1, m.steps_at_agreement, 100);
                  const std::optional<DealAgreement> agreed = sync.takeDealAgreement();
                  if (!agreed || agreed->offer != kOffer) throw std::runtime_error("no agreement");
                  record(leading, m.name, agreed->leading_steps_done);
                  // As DealChange arms it: F less this cluster's lag behind the leading one.
                  const int64_t lag = std::max(m.steps_at_agreement, agreed->leading_steps_done) -
                                      m.steps_at_agreement;
                  const int64_t at = kFirstStep - lag;
                  record(armed_at, m.name, at);
                  sync.proposeDeal(0, true);
                  // The coordinator's update: the newcomer's address, and the ring grown.
                  transport.addPeer("c2", "tcp://" + addresses.at("c2"));
                  sync.addMembers(ringUpdate(m.name, grown, addresses, init), /*at_admission_step=*/true);
                  sync.admitJoinersAt(at);
                  const std::optional<ClusterAdmission> pending = sync.pendingAdmission();
                  record(pending_at, m.name, pending ? pending->steps_done : -1);
                  record(pending_growth, m.name, pending && pending->growth);
                  stepsTo(sync, stage, m.steps_at_agreement, at - 1, 100);
                  perturbSeeded(stage, 100 + uint64_t(at - 1));
                  sync.afterOptimizerStep(at - 1, stage);  // the admission sync (off the grid)
                  record(at_admission, m.name, stateOf(stage));
                  // The next grid boundary: an ordinary sync of the three.
                  const int64_t next = (at / kLocalSteps + 1) * kLocalSteps;
                  stepsTo(sync, stage, at, next - 1, 300);
                  perturbSeeded(stage, 900 + i);
                  record(before_last, m.name, stateOf(stage));
                  sync.afterOptimizerStep(next - 1, stage);
                  record(after_last, m.name, stateOf(stage));
                });
      } catch (...) {
        record(errors, m.name, std::current_exception());
      }
    });
  }
  threads.emplace_back([&] {
    try {
      State other;
      for (const auto& [name, t] : init) other[name] = t + 1;  // replaced by the welcome
      runGrowthNode(context, "c2", grown, addresses, other, /*joining=*/true,
              [&](RingClusterSync& sync, torch::jit::Module& stage, ZmqTransport&) {
                record(at_admission, "c2", stateOf(stage));  // its first step is F, with the welcome
                const int64_t next = (kFirstStep / kLocalSteps + 1) * kLocalSteps;
                stepsTo(sync, stage, kFirstStep, next - 1, 500);
                perturbSeeded(stage, 902);
                record(before_last, "c2", stateOf(stage));
                sync.afterOptimizerStep(next - 1, stage);
                record(after_last, "c2", stateOf(stage));
              });
    } catch (...) {
      record(errors, "c2", std::current_exception());
    }
  });
  joinRethrowing(threads, errors);

  EXPECT_EQ(leading.at("a0"), 8);
  EXPECT_EQ(leading.at("b1"), 8);
  EXPECT_EQ(armed_at.at("a0"), kFirstStep);
  EXPECT_EQ(armed_at.at("b1"), kFirstStep - 4);
  EXPECT_EQ(pending_at.at("b1"), kFirstStep - 4);  // what "__admit" carries down b1's pipeline
  EXPECT_TRUE(pending_growth.at("b1"));
  for (const auto& [name, t] : init) {
    EXPECT_TRUE(torch::equal(at_admission.at("c2").at(name), at_admission.at("a0").at(name)))
        << "c2 was not welcomed with a0's weights of the admission sync: " << name;
    EXPECT_TRUE(torch::equal(at_admission.at("a0").at(name), at_admission.at("b1").at(name)))
        << "a0 and b1 disagree after the admission sync: " << name;
  }
  expectAveragedOverThree(before_last, after_last, names, init);  // the next sync: all three
}


// A cluster that was away while a growth was admitted (the 24-volunteer soak, seed 2: its Root
// paused, took the coordinator's growth update while paused — held for the admission step — and
// resumed after the others had admitted the new cluster). b1 syncs once with a0 and leaves; a0
// admits the newcomer c2 at step 4; b1 comes back joining, its node.json still listing {a0, b1},
// the growth held. a0's welcome names a0, b1 and c2: b1 takes it (the held members become ring
// members) with exactly a0's weights of that sync, and the next sync averages all three. Before,
// b1 dropped every such welcome ("view names a non-member") and gave up.
TEST(RingClusterSyncGrowth, AClusterBackAfterAGrowthWasAdmittedTakesAWelcomeNamingTheNewMembers) {
  torch::manual_seed(48);
  const State init = {{"0.weight", torch::randn({3, 4})}, {"0.bias", torch::randn({3})}};
  const std::vector<std::string> names = {"a0", "b1", "c2"};
  const std::vector<std::string> ports = testutil::freeLoopbackAddresses(3);
  std::map<std::string, std::string> addresses;
  for (size_t i = 0; i < names.size(); ++i) addresses[names[i]] = ports[i];
  const std::vector<std::string> two = {"a0", "b1"}, grown = {"a0", "b1", "c2"};
  zmq::context_t context;
  std::mutex mutex;
  std::condition_variable cv;
  bool b1_left = false, c2_admitted = false;
  auto set = [&](bool& flag) {
    std::lock_guard<std::mutex> lock(mutex);
    flag = true;
    cv.notify_all();
  };
  auto wait = [&](bool& flag) {
    std::unique_lock<std::mutex> lock(mutex);
    if (!cv.wait_for(lock, std::chrono::seconds(120), [&] { return flag; }))
      throw std::runtime_error("a step of the test never came");
  };
  std::map<std::string, State> welcomed, before_last, after_last;
  std::map<std::string, std::vector<std::string>> views;
  std::map<std::string, std::exception_ptr> errors;
  auto record = [&](auto& map, const std::string& name, auto value) {
    std::lock_guard<std::mutex> lock(mutex);
    map[name] = value;
  };
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    try {
      runGrowthNode(context, "a0", two, addresses, init, false,
                    [&](RingClusterSync& sync, torch::jit::Module& stage, ZmqTransport& transport) {
                      stepsTo(sync, stage, 0, 2, 100);  // a sync with b1
                      wait(b1_left);
                      transport.addPeer("c2", "tcp://" + addresses.at("c2"));
                      sync.addMembers(ringUpdate("a0", grown, addresses, init), /*at_admission_step=*/true);
                      sync.admitJoinersAt(4);
                      stepsTo(sync, stage, 2, 4, 100);  // 4 done: c2 admitted
                      set(c2_admitted);
                      // Syncs until b1 is back in the view (its join request comes when it starts).
                      int64_t step = 4;
                      for (; sync.view("ring_0").size() < 3; step += kLocalSteps) {
                        if (step > 400) throw std::runtime_error("b1 never came back");
                        stepsTo(sync, stage, step, step + kLocalSteps, 300);
                        std::this_thread::sleep_for(std::chrono::milliseconds(20));
                      }
                      record(welcomed, "a0", stateOf(stage));
                      record(views, "a0", sync.view("ring_0"));
                      perturbSeeded(stage, 900);
                      record(before_last, "a0", stateOf(stage));
                      sync.afterOptimizerStep(step + 1, stage);  // the next grid boundary
                      record(after_last, "a0", stateOf(stage));
                    },
                    {}, /*gate=*/false);
    } catch (...) {
      record(errors, "a0", std::current_exception());
    }
  });
  threads.emplace_back([&] {
    try {
      runGrowthNode(context, "b1", two, addresses, init, false,
                    [&](RingClusterSync& sync, torch::jit::Module& stage, ZmqTransport&) {
                      stepsTo(sync, stage, 0, 2, 100);
                      sync.leave();
                    },
                    {}, /*gate=*/false);
      set(b1_left);
      wait(c2_admitted);
      // Back: node.json as before the growth, the coordinator's update held for the admission.
      runGrowthNode(context, "b1", two, addresses, init, /*joining=*/true,
                    [&](RingClusterSync& sync, torch::jit::Module& stage, ZmqTransport&) {
                      record(welcomed, "b1", stateOf(stage));
                      record(views, "b1", sync.view("ring_0"));
                      perturbSeeded(stage, 901);
                      record(before_last, "b1", stateOf(stage));
                      sync.afterOptimizerStep(1, stage);  // its first sync: a0's and c2's next
                      record(after_last, "b1", stateOf(stage));
                    },
                    [&](RingClusterSync& sync, ZmqTransport& transport) {
                      transport.addPeer("c2", "tcp://" + addresses.at("c2"));
                      sync.addMembers(ringUpdate("b1", grown, addresses, init), /*at_admission_step=*/true);
                    },
                    /*gate=*/false);
    } catch (...) {
      record(errors, "b1", std::current_exception());
      set(b1_left);
    }
  });
  threads.emplace_back([&] {
    try {
      State other;
      for (const auto& [name, t] : init) other[name] = t + 1;
      runGrowthNode(context, "c2", grown, addresses, other, /*joining=*/true,
                    [&](RingClusterSync& sync, torch::jit::Module& stage, ZmqTransport&) {
                      // Syncs with a0 until b1 is back and one more.
                      int64_t step = 4;
                      for (; sync.view("ring_0").size() < 3; step += kLocalSteps) {
                        if (step > 400) throw std::runtime_error("b1 never came back (c2)");
                        stepsTo(sync, stage, step, step + kLocalSteps, 300);
                      }
                      perturbSeeded(stage, 902);
                      record(before_last, "c2", stateOf(stage));
                      sync.afterOptimizerStep(step + 1, stage);
                      record(after_last, "c2", stateOf(stage));
                    },
                    {}, /*gate=*/false);
    } catch (...) {
      record(errors, "c2", std::current_exception());
    }
  });
  joinRethrowing(threads, errors);
  EXPECT_EQ(views.at("b1"), grown);
  EXPECT_EQ(views.at("a0"), grown);
  for (const auto& [name, t] : init) {
    EXPECT_TRUE(torch::equal(welcomed.at("b1").at(name), welcomed.at("a0").at(name)))
        << "b1 was not welcomed with a0's weights of the admitting sync: " << name;
  }
  expectAveragedOverThree(before_last, after_last, names, init);  // the next sync: all three
}

// A member that holds the new cluster's members but never armed their admission (the 24-volunteer
// soak, seed 2: a Root took the deal and armed the admission, then resumed from an older
// checkpoint within the same run, which armed nothing; its rings held the newcomers from the
// coordinator's update). a0 and b1 (gated, as Roots) both hold c2 from the update; only a0 arms
// the admission, at step 4. At that sync b1 takes the held c2 in as a member because a0 admits it
// (Ring::held_members), so the ring admits c2 at one sync: c2 is welcomed with exactly the weights
// a0 and b1 hold after it, both views name c2, and the next sync averages all three. b1 arming the
// admission later (step 6) finds nothing left to take. Before, the ring could admit only the
// members every list held: c2 was never admitted and waited for a welcome that never came.
TEST(RingClusterSyncGrowth, AMemberHoldingTheNewMembersWithoutTheirAdmissionStepFollowsTheRing) {
  torch::manual_seed(49);
  const State init = {{"0.weight", torch::randn({3, 4})}, {"0.bias", torch::randn({3})}};
  const std::vector<std::string> names = {"a0", "b1", "c2"};
  const std::vector<std::string> ports = testutil::freeLoopbackAddresses(3);
  std::map<std::string, std::string> addresses;
  for (size_t i = 0; i < names.size(); ++i) addresses[names[i]] = ports[i];
  const std::vector<std::string> two = {"a0", "b1"}, grown = {"a0", "b1", "c2"};
  zmq::context_t context;
  std::mutex mutex;
  std::map<std::string, State> admitted, before_last, after_last;
  std::map<std::string, std::vector<std::string>> views;
  std::map<std::string, std::exception_ptr> errors;
  auto record = [&](auto& map, const std::string& name, auto value) {
    std::lock_guard<std::mutex> lock(mutex);
    map[name] = value;
  };
  auto running = [&](const std::string& name, bool arms) {
    try {
      runGrowthNode(context, name, two, addresses, init, false,
                    [&](RingClusterSync& sync, torch::jit::Module& stage, ZmqTransport& transport) {
                      stepsTo(sync, stage, 0, 2, 100);  // a sync of a0 and b1
                      transport.addPeer("c2", "tcp://" + addresses.at("c2"));
                      sync.addMembers(ringUpdate(name, grown, addresses, init), /*at_admission_step=*/true);
                      if (arms) sync.admitJoinersAt(4);
                      stepsTo(sync, stage, 2, 4, 100);  // 4 done: a0's admission sync
                      record(admitted, name, stateOf(stage));
                      record(views, name, sync.view("ring_0"));
                      if (!arms) sync.admitJoinersAt(6);  // late: nothing left to take
                      stepsTo(sync, stage, 4, 5, 300);
                      perturbSeeded(stage, name == "a0" ? 900 : 901);
                      record(before_last, name, stateOf(stage));
                      sync.afterOptimizerStep(5, stage);  // 6 done: a sync of the three
                      record(after_last, name, stateOf(stage));
                    });
    } catch (...) {
      record(errors, name, std::current_exception());
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(running, "a0", true);
  threads.emplace_back(running, "b1", false);
  threads.emplace_back([&] {
    try {
      State other;
      for (const auto& [name, t] : init) other[name] = t + 1;  // replaced by the welcome
      runGrowthNode(context, "c2", grown, addresses, other, /*joining=*/true,
                    [&](RingClusterSync& sync, torch::jit::Module& stage, ZmqTransport&) {
                      record(admitted, "c2", stateOf(stage));
                      perturbSeeded(stage, 902);
                      record(before_last, "c2", stateOf(stage));
                      sync.afterOptimizerStep(5, stage);
                      record(after_last, "c2", stateOf(stage));
                    });
    } catch (...) {
      record(errors, "c2", std::current_exception());
    }
  });
  joinRethrowing(threads, errors);
  EXPECT_EQ(views.at("a0"), grown);
  EXPECT_EQ(views.at("b1"), grown);
  for (const auto& [name, t] : init) {
    EXPECT_TRUE(torch::equal(admitted.at("c2").at(name), admitted.at("a0").at(name)))
        << "c2 was not welcomed with a0's weights of the admission sync: " << name;
    EXPECT_TRUE(torch::equal(admitted.at("a0").at(name), admitted.at("b1").at(name))) << name;
  }
  expectAveragedOverThree(before_last, after_last, names, init);  // the next sync: all three
}

}  // namespace
}  // namespace cairn
