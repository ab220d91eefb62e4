// RingClusterSync members that join a running ring (ClusterSyncHarness.h): 3 clusters × 1 node.
//   join: the joiner gets exactly x0's parameters, buffers and θ_prev/momentum; the next sync is
//   the DiLoCo update over all three
//   saveState/loadState: resuming from the saved outer state equals the uninterrupted run
//   welcomes from a broken or hostile peer: malformed ones are dropped, a valid one is applied
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


TEST(RingClusterSyncFailures, JoinerGetsTheLiveWeightsAndOuterStateAndTheNextSyncIncludesIt) {
  torch::manual_seed(35);
  const State init = {{"0.weight", torch::randn({3, 5})},
                      {"0.bias", torch::randn({3}, torch::kDouble)},
                      {"0.running_mean", torch::randn({3})},
                      {"0.num_batches_tracked", torch::tensor(int64_t(2))}};
  const auto nodes = threeNodes(init);
  const std::vector<TestRing> rings = {{"ring_0", namesOf(init), kThree}};
  SyncOptions options;
  options.mode = SyncMode::kDiLoCo;
  using Saved = std::pair<std::vector<std::pair<std::string, torch::Tensor>>, nlohmann::json>;
  std::vector<State> admitted(3), final_before(3), final_after(3);
  std::vector<Saved> saved(3);
  std::vector<RingClusterSyncStats> stats(3);
  std::vector<int64_t> generations(3);
  zmq::context_t context;
  const std::string prefix = tcpPrefix(3);
  MemberSetup setup;
  setup.timeout = std::chrono::milliseconds(20000);
  std::vector<std::exception_ptr> errors(3);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < 3; ++i)
    threads.emplace_back([&, i] {
      try {
        auto finalRound = [&](RingClusterSync& sync, torch::jit::Module& stage) {
          perturbSeeded(stage, 900 + i);
          final_before[i] = stateOf(stage);
          sync.synchronize();
          final_after[i] = stateOf(stage);
          stats[i] = sync.stats();
          generations[i] = sync.generation("ring_0");
        };
        if (i == 2) {
          // First life: one sync with everyone, then leave. Second life: join with stale weights.
          runMember(context, prefix, nodes[i], rings, init, options, setup,
                    [&](RingClusterSync& sync, torch::jit::Module& stage, FaultyTransport&) {
                      perturbSeeded(stage, 400);
                      sync.synchronize();
                      sync.leave();
                    });
          MemberSetup joiner = setup;
          joiner.joining = true;
          runMember(context, prefix, nodes[i], rings, init, options, joiner,
                    [&](RingClusterSync& sync, torch::jit::Module& stage, FaultyTransport&) {
                      admitted[i] = stateOf(stage);
                      saved[i].first.clear();
                      sync.saveState(&saved[i].first, &saved[i].second);
                      finalRound(sync, stage);
                    });
          return;
        }
        runMember(context, prefix, nodes[i], rings, init, options, setup,
                  [&](RingClusterSync& sync, torch::jit::Module& stage, FaultyTransport&) {
                    perturbSeeded(stage, 400 + i);
                    sync.synchronize();
                    // Train on (rounds of the two) until the ring has admitted the joiner; both
                    // survivors agree on the round (the admission is agreed by an all-reduce).
                    for (int round = 1; sync.stats().members_joined == 0; ++round) {
                      ASSERT_LT(round, 2000) << "the joiner was never admitted";
                      std::this_thread::sleep_for(std::chrono::milliseconds(5));
                      perturbSeeded(stage, 400 + 10 * uint64_t(round) + i);
                      sync.synchronize();
                      admitted[i] = stateOf(stage);
                      saved[i].first.clear();
                      sync.saveState(&saved[i].first, &saved[i].second);
                    }
                    finalRound(sync, stage);
                  });
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  // The joiner holds exactly the live members' parameters, buffers and outer state.
  expectSameState(admitted[2], admitted[0], "joiner vs x0 at admission");
  expectSameState(admitted[1], admitted[0], "x1 vs x0 at admission");
  ASSERT_EQ(saved[2].first.size(), saved[0].first.size());
  std::map<std::string, torch::Tensor> outer;
  for (const auto& [name, t] : saved[0].first) outer[name] = t;
  for (const auto& [name, t] : saved[2].first) {
    ASSERT_TRUE(outer.count(name)) << name;
    EXPECT_TRUE(torch::equal(t, outer.at(name))) << "joiner's " << name << " differs from x0's";
  }
  EXPECT_EQ(stats[0].members_joined, 1);
  EXPECT_EQ(stats[2].joined_rings, 1);
  EXPECT_EQ(stats[2].last_welcome_checksum, stats[0].last_welcome_checksum);
  EXPECT_EQ(generations, (std::vector<int64_t>{2, 2, 2}));  // 1: x2 left; 2: x2 admitted
  // The next sync includes the joiner: the DiLoCo update over all three, from the outer state.
  for (const std::string name : {"0.weight", "0.bias"}) {
    const torch::ScalarType dtype = init.at(name).scalar_type();
    torch::Tensor momentum;
    for (const auto& [key, t] : saved[0].first)
      if (key.find(".momentum.") != std::string::npos && t.scalar_type() == dtype)
        momentum = t.to(torch::kDouble).view(init.at(name).sizes());
    ASSERT_TRUE(momentum.defined()) << name;
    const torch::Tensor prev = admitted[0].at(name).to(torch::kDouble);
    torch::Tensor delta = torch::zeros_like(prev);
    for (size_t i = 0; i < 3; ++i) delta += prev - final_before[i].at(name).to(torch::kDouble);
    delta /= 3;
    const torch::Tensor next_momentum = 0.9 * momentum + delta;
    const torch::Tensor expected = prev - 0.7 * (delta + 0.9 * next_momentum);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_LE((final_after[i].at(name).to(torch::kDouble) - expected).abs().max().item<double>(),
                1e-5)
          << name << " at x" << i;
      EXPECT_TRUE(torch::equal(final_after[i].at(name), final_after[0].at(name))) << name << i;
    }
  }
  const torch::Tensor mean = (final_before[0].at("0.running_mean") +
                              final_before[1].at("0.running_mean") +
                              final_before[2].at("0.running_mean")) / 3;
  for (size_t i = 0; i < 3; ++i)
    EXPECT_LE((final_after[i].at("0.running_mean") - mean).abs().max().item<double>(), 1e-6);
}

// A welcome from the fake ring peer "w0" to "w1" on ring_0 (its text as given, `value` as
// value.0 when defined); the welcome tests' broken or hostile peer.
constexpr const char* kFakeWelcome =
    R"({"type":"welcome","generation":1,"view":["w0","w1"],"step":7,"transactions":3,"checksum":1})";
void sendFakeWelcome(ZmqTransport& transport, std::string text, const torch::Tensor& value) {
  Message m;
  m.kind = MessageKind::kCollective;
  m.sender = "w0";
  m.tag = "ring:ring_0";
  m.text = std::move(text);
  if (value.defined()) m.tensors.push_back({"value.0", value});
  ASSERT_EQ(transport.send("w1", m, std::chrono::milliseconds(2000)), SendStatus::kSent);
}

// The fake ring peer "w0" on its own thread: waits for w1's join request, then `answer`s it
// (sendFakeWelcome…) and closes. join() rethrows what went wrong on that thread.
class FakeWelcomer {
 public:
  FakeWelcomer(zmq::context_t& context, const std::string& prefix,
               std::function<void(ZmqTransport&)> answer)
      : thread_([this, &context, prefix, answer = std::move(answer)] {
          try {
            ZmqTransport transport(context, "w0", prefix + "w0");
            transport.addPeer("w1", prefix + "w1");
            auto request = transport.receive(std::chrono::milliseconds(20000));
            ASSERT_TRUE(request.has_value());
            ASSERT_NE(request->text.find("join"), std::string::npos);
            answer(transport);
            transport.flushAndClose(std::chrono::milliseconds(2000));
          } catch (...) {
            error_ = std::current_exception();
          }
        }) {}
  void join() {
    thread_.join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once error_ exists
};

TEST(RingClusterSyncFailures, MalformedWelcomesAreDroppedAndAValidOneIsApplied) {
  // A broken ring peer answers the join with welcomes that do not fit (not JSON, wrong types,
  // a wrong tensor size), then a valid one: the joiner survives the first and applies the last.
  torch::manual_seed(39);
  const State init = {{"0.weight", torch::randn({3, 4})}};
  const std::vector<TestNode> nodes = {{"w0", 0, {"0.weight"}}, {"w1", 1, {"0.weight"}}};
  const std::vector<TestRing> rings = {{"ring_0", {"0.weight"}, {"w0", "w1"}}};
  const torch::Tensor live = torch::randn({3, 4});
  zmq::context_t context;
  const std::string prefix = "inproc://welcome" + std::to_string(run_counter++) + "_";
  FakeWelcomer fake(context, prefix, [&](ZmqTransport& transport) {
    auto welcome = [&](std::string text, torch::Tensor value) {
      sendFakeWelcome(transport, std::move(text), value);
    };
    const std::string good = kFakeWelcome;
    welcome("welcome, not JSON", live.reshape({-1}));
    welcome(R"({"type":5,"generation":1,"view":["w0","w1"]})", live.reshape({-1}));
    welcome(R"({"type":"welcome","generation":1,"view":["w0","w1"],"step":"x","transactions":0,"checksum":1})",
            live.reshape({-1}));
    welcome(R"({"type":"welcome","generation":1,"view":["w0","stranger"],"step":7,"transactions":3,"checksum":1})",
            live.reshape({-1}));
    welcome(good, torch::zeros({5}));  // wrong element count
    welcome(good, live.reshape({-1}).to(torch::kDouble));  // wrong dtype
    welcome(good, live.reshape({-1}));
  });
  State joined;
  std::vector<std::string> view;
  RingClusterSyncStats stats;
  MemberSetup joiner;
  joiner.joining = true;
  joiner.timeout = std::chrono::milliseconds(20000);
  runMember(context, prefix, nodes[1], rings, init, {}, joiner,
            [&](RingClusterSync& sync, torch::jit::Module& stage, FaultyTransport&) {
              joined = stateOf(stage);
              view = sync.view("ring_0");
              stats = sync.stats();
            });
  fake.join();
  EXPECT_TRUE(torch::equal(joined.at("0.weight"), live));
  EXPECT_EQ(view, (std::vector<std::string>{"w0", "w1"}));
  EXPECT_EQ(stats.joined_rings, 1);
}

// A welcome whose copy looks corrupt next to the joiner's own (one weight ~1e30: a flipped
// exponent bit at a member that was alone in its ring): in "average" mode the joiner enters the
// sender's view but keeps its own weights (the next sync's contribution check names the corrupt
// copy: RingRestart.ANewestMemberWithACorruptCopyIsCaughtNotCopied); in "gradients" mode, which
// has no such check, it drops the welcome and takes the valid one that follows.
TEST(RingClusterSyncFailures, ACorruptLookingWelcomeIsNotTaken) {
  for (const SyncMode mode : {SyncMode::kAverage, SyncMode::kGradients}) {
    torch::manual_seed(45);
    const State init = {{"0.weight", torch::randn({3, 4})}};
    const std::vector<TestNode> nodes = {{"w0", 0, {"0.weight"}}, {"w1", 1, {"0.weight"}}};
    const std::vector<TestRing> rings = {{"ring_0", {"0.weight"}, {"w0", "w1"}}};
    const torch::Tensor live = torch::randn({3, 4});
    torch::Tensor corrupt = live.clone();
    corrupt[1][2] = 3.0e30;
    zmq::context_t context;
    const std::string prefix = "inproc://corrupt_welcome" + std::to_string(run_counter++) + "_";
    FakeWelcomer fake(context, prefix, [&](ZmqTransport& transport) {
      for (const torch::Tensor& value : {corrupt, live}) sendFakeWelcome(transport, kFakeWelcome, value.reshape({-1}));
    });
    State joined;
    std::vector<std::string> view;
    MemberSetup joiner;
    joiner.joining = true;
    SyncOptions options;
    options.mode = mode;
    runMember(context, prefix, nodes[1], rings, init, options, joiner,
              [&](RingClusterSync& sync, torch::jit::Module& stage, FaultyTransport&) {
                joined = stateOf(stage);
                view = sync.view("ring_0");
              });
    fake.join();
    const std::string name = toString(mode);
    EXPECT_EQ(view, (std::vector<std::string>{"w0", "w1"})) << name;
    if (mode == SyncMode::kAverage)
      EXPECT_TRUE(torch::equal(joined.at("0.weight"), init.at("0.weight"))) << "kept its own";
    else
      EXPECT_TRUE(torch::equal(joined.at("0.weight"), live)) << "took the valid welcome";
  }
}

TEST(RingClusterSyncFailures, SavedOuterStateReproducesTheUninterruptedDiLoCoRun) {
  torch::manual_seed(36);
  const State init = {{"0.weight", torch::randn({3, 5})}, {"0.bias", torch::randn({3}, torch::kDouble)}};
  const std::vector<std::string> names = namesOf(init);
  const std::vector<TestNode> nodes = {{"d0", 0, names}, {"d1", 1, names}};
  const std::vector<TestRing> rings = {{"ring_0", names, {"d0", "d1"}}};
  SyncOptions options;
  options.mode = SyncMode::kDiLoCo;
  using Saved = std::pair<std::vector<std::pair<std::string, torch::Tensor>>, nlohmann::json>;
  // Uninterrupted: two outer steps.
  std::vector<State> straight(2), mid(2), resumed(2), fresh(2);
  std::vector<Saved> saved(2);
  runNodes(nodes, rings, {init, init}, options, [&](size_t i, RingClusterSync& sync, auto& stage) {
    perturbSeeded(stage, 10 + i);
    sync.afterOptimizerStep(0, stage);
    perturbSeeded(stage, 20 + i);
    sync.afterOptimizerStep(1, stage);
    straight[i] = stateOf(stage);
  });
  // Interrupted after the first outer step: checkpoint, then new objects resume from it.
  runNodes(nodes, rings, {init, init}, options, [&](size_t i, RingClusterSync& sync, auto& stage) {
    perturbSeeded(stage, 10 + i);
    sync.afterOptimizerStep(0, stage);
    sync.saveState(&saved[i].first, &saved[i].second);
    mid[i] = stateOf(stage);
  });
  EXPECT_EQ(saved[0].second["last_synced_step"], 1);
  MemberSetup load;
  load.before_start = [&](RingClusterSync& sync, FaultyTransport& faulty) {
    const size_t i = faulty.name() == "d0" ? 0 : 1;
    sync.loadState(saved[i].first, saved[i].second);
  };
  runNodes(nodes, rings, mid, options, [&](size_t i, RingClusterSync& sync, auto& stage) {
    perturbSeeded(stage, 20 + i);
    sync.afterOptimizerStep(1, stage);
    resumed[i] = stateOf(stage);
  }, load);
  for (size_t i = 0; i < 2; ++i) expectSameState(resumed[i], straight[i], "resumed vs uninterrupted");
  // Control: resuming without the outer state (θ_prev from the weights, no momentum) differs.
  runNodes(nodes, rings, mid, options, [&](size_t i, RingClusterSync& sync, auto& stage) {
    perturbSeeded(stage, 20 + i);
    sync.afterOptimizerStep(1, stage);
    fresh[i] = stateOf(stage);
  });
  EXPECT_FALSE(torch::equal(fresh[0].at("0.weight"), straight[0].at("0.weight")));
  // A checkpoint tensor that does not fit is refused, naming it.
  Saved bad = saved[0];
  for (auto& [name, t] : bad.first)
    if (name.find(".previous.") != std::string::npos) t = torch::zeros({t.numel() + 1}, t.options());
  const std::string bad_name = bad.first.at(0).first;
  MemberSetup bad_load;
  bad_load.before_start = [&](RingClusterSync& sync, FaultyTransport&) {
    sync.loadState(bad.first, bad.second);
  };
  try {
    runNodes(nodes, rings, mid, options, [](size_t, RingClusterSync&, auto&) {}, bad_load);
    FAIL() << "a checkpoint tensor of the wrong size was accepted";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find(bad_name), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cairn::testing
