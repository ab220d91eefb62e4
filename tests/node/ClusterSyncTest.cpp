// RingClusterSync: nodes of several "clusters" as threads, each with its own ZmqTransport over
// inproc:// and a stage module built in C++, against direct computations of what a sync must give:
//   SameCut        2 clusters × 2 nodes, average: parameters and buffers bit-identical across
//                  clusters right after the reduce, equal to the mean (integers: the max)
//   DifferentCuts  cluster 0 = 1 node, cluster 1 = 2 nodes: one node in two rings with different
//                  partners; every tensor equals the average of its pre-reduce copies (rings run
//                  concurrently, and one after another); the same for "gradients"
//   Concurrently   that node's rings progress at the same time (a wait that would deadlock rings
//                  taken in order completes)
//   Gradients      "gradients" for 10 Adam steps equals libtorch's own torch::optim::Adam on the
//                  union batch (max abs diff <= 1e-5)
//   DiLoCo         two outer steps equal the direct Nesterov outer-SGD computation
//   Mismatch       differing initial weights: refused, naming the differing node
// Failures (docs/OPERATIONS.md "Failures while training"), 3 clusters × 1 node over FaultyTransport:
//   lost mid-average / mid-gradients (dies after n sends), disconnected in DiLoCo (liveness, with a
//   timeout far past the ctest limit): the other two finish that sync with the direct average /
//   DiLoCo update over the two, bit-identical, and train on; the lost one restores its own state
//   concurrent rings: a death in one of a node's rings re-forms that ring only; the other ring's
//   average is exact and loses nobody
//   leave(): dropped without a timeout (huge timeout; counted as "left", not "lost")
//   join: the joiner gets exactly x0's parameters, buffers and θ_prev/momentum; the next sync is
//   the DiLoCo update over all three
//   saveState/loadState: resuming from the saved outer state equals the uninterrupted run
#include <gtest/gtest.h>

#include <cstring>
#include <torch/torch.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <map>
#include <thread>

#include "core/Error.h"
#include "node/testing/FaultyTransport.h"
#include "node/ring/RingClusterSync.h"
#include "node/transport/ZmqTransport.h"
#include "trainer/Optimizer.h"
#include "tests/node/RingTestStages.h"

namespace cairn {
namespace {

using testing::makeStage;
using testing::perturbSeeded;
using testing::State;
using testing::stateOf;

std::vector<std::string> namesOf(const State& s) {
  std::vector<std::string> n;
  for (const auto& [k, v] : s) n.push_back(k);
  return n;
}

struct TestNode {
  std::string name;
  int cluster = 0;
  std::vector<std::string> names;  // state this node holds
};

struct TestRing {
  std::string id;
  std::vector<std::string> names;
  std::vector<std::string> members;  // cluster order
};

std::atomic<int> run_counter{0};

// Endpoints: `prefix` + name (inproc), or, for a prefix "tcp:<port>", tcp on loopback with one port
// per member in cluster order from <port> on (a node that restarts must be reachable again, which
// ZeroMQ's inproc transport does not do for a peer that rebinds).
std::string endpointFor(const std::string& prefix, const std::string& name,
                        const std::vector<std::string>& members) {
  if (prefix.rfind("tcp:", 0) != 0) return prefix + name;
  const int base = std::stoi(prefix.substr(4));
  const auto at = std::find(members.begin(), members.end(), name) - members.begin();
  return "tcp://127.0.0.1:" + std::to_string(base + int(at));
}

NodeSpec specOf(const TestNode& node, const std::vector<TestRing>& rings, const std::string& prefix) {
  NodeSpec spec;
  spec.name = node.name;
  spec.cluster = node.cluster;
  for (const auto& r : rings) {
    auto self = std::find(r.members.begin(), r.members.end(), spec.name);
    if (self == r.members.end()) continue;
    RingSpec ring;
    ring.id = r.id;
    ring.parameters = r.names;
    for (const auto& m : r.members) {
      std::string endpoint = endpointFor(prefix, m, r.members);
      if (endpoint.rfind("tcp://", 0) == 0) endpoint = endpoint.substr(6);
      ring.members.push_back({m, endpoint, ""});
    }
    ring.rank = int(self - r.members.begin());
    spec.rings.push_back(ring);
    spec.address = endpointFor(prefix, spec.name, r.members);
  }
  if (spec.address.empty()) spec.address = prefix + spec.name;
  return spec;
}

struct MemberSetup {
  std::chrono::milliseconds timeout{20000};
  int64_t local_steps = 1;
  bool joining = false;
  GradientSyncOptions gradients;  // "gradients": bucket cap, overlap
  // Called before start() (e.g. loadState, fault settings).
  std::function<void(RingClusterSync&, FaultyTransport&)> before_start;
};

using MemberBody = std::function<void(RingClusterSync&, torch::jit::Module&, FaultyTransport&)>;

// One node's life: its transport (wrapped in a FaultyTransport), mailbox and RingClusterSync.
void runMember(zmq::context_t& context, const std::string& prefix, const TestNode& node,
               const std::vector<TestRing>& rings, const State& initial, SyncOptions options,
               const MemberSetup& setup, const MemberBody& body) {
  NodeSpec spec = specOf(node, rings, prefix);
  // A node that restarts under the same name rebinds its inproc endpoint, which ZeroMQ releases
  // shortly after the old socket closed.
  std::unique_ptr<ZmqTransport> owned;
  for (int attempt = 0; !owned; ++attempt) {
    try {
      owned = std::make_unique<ZmqTransport>(context, spec.name, spec.address);
    } catch (const std::exception& e) {
      if (attempt >= 100 || std::string(e.what()).find("already in use") == std::string::npos)
        throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ZmqTransport& transport = *owned;
  FaultyTransport faulty(transport);
  Mailbox mailbox(faulty);
  RingClusterSync sync(mailbox, spec, options, setup.local_steps, setup.timeout, setup.gradients);
  sync.setJoining(setup.joining);
  torch::jit::Module stage = makeStage(initial);
  if (setup.before_start) setup.before_start(sync, faulty);
  sync.start(stage);
  body(sync, stage, faulty);
  transport.flushAndClose(std::chrono::milliseconds(2000));
}

// Runs body(i, sync, stage) for every node on its own thread; rethrows the first error.
void runNodes(const std::vector<TestNode>& nodes, const std::vector<TestRing>& rings,
              const std::vector<State>& initial, SyncOptions options,
              const std::function<void(size_t, RingClusterSync&, torch::jit::Module&)>& body,
              MemberSetup setup = {},
              const std::function<void(size_t, FaultyTransport&)>& faults = {}) {
  zmq::context_t context;
  const std::string prefix = "inproc://sync" + std::to_string(run_counter++) + "_";
  std::vector<std::exception_ptr> errors(nodes.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < nodes.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        runMember(context, prefix, nodes[i], rings, initial[i], options, setup,
                  [&](RingClusterSync& sync, torch::jit::Module& stage, FaultyTransport& faulty) {
                    if (faults) faults(i, faulty);
                    body(i, sync, stage);
                  });
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

State layerState(const std::string& layer, int64_t width, uint64_t seed) {
  torch::manual_seed(seed);
  return {{layer + ".weight", torch::randn({width, 3})},
          {layer + ".bias", torch::randn({width}, torch::kDouble)},
          {layer + ".running_mean", torch::randn({width})},
          {layer + ".num_batches_tracked", torch::tensor(int64_t(5))}};
}

State merge(State a, const State& b) {
  a.insert(b.begin(), b.end());
  return a;
}

// Local training stand-in: every tensor moves by node-specific noise (integers by +node).
void perturb(torch::jit::Module& stage, int node) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(1000 + uint64_t(node));
  for (const auto& p : stage.named_parameters(true)) p.value.add_(torch::randn_like(p.value));
  for (const auto& b : stage.named_buffers(true)) {
    if (b.value.is_floating_point())
      b.value.add_(torch::randn_like(b.value));
    else
      b.value.add_(node);
  }
}

// For every name: the expected value after a reduce of the copies in `before` (one per holder).
void expectAverages(const std::vector<State>& before, const std::vector<State>& after,
                    const std::vector<TestRing>& rings, const std::vector<TestNode>& nodes) {
  auto index = [&](const std::string& n) {
    for (size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i].name == n) return i;
    ADD_FAILURE() << n;
    return size_t(0);
  };
  for (const auto& r : rings)
    for (const auto& name : r.names) {
      std::vector<torch::Tensor> copies;
      for (const auto& m : r.members) copies.push_back(before[index(m)].at(name));
      torch::Tensor expected;
      if (copies[0].is_floating_point()) {
        expected = torch::stack(copies).to(torch::kDouble).mean(0);
      } else {
        expected = std::get<0>(torch::stack(copies).max(0));
      }
      const torch::Tensor first = after[index(r.members[0])].at(name);
      for (const auto& m : r.members) {
        const torch::Tensor got = after[index(m)].at(name);
        EXPECT_TRUE(torch::equal(got, first))
            << name << " at " << m << " differs from " << r.members[0] << " (not bit-identical)";
        const double diff =
            (got.to(torch::kDouble) - expected.to(torch::kDouble)).abs().max().item<double>();
        // Relative to the values' size: a float32 average is exact to a few ulps of the result,
        // and how large the values are can depend on how many steps a test trained (one test
        // trains until a newcomer is welcomed: ~16 after 271 steps, where an ulp is 1.9e-6).
        const double scale = std::max(1.0, expected.to(torch::kDouble).abs().max().item<double>());
        EXPECT_LE(diff, 1e-6 * scale) << name << " at " << m;
      }
    }
}

TEST(RingClusterSync, SameCutAverageIsBitIdentical) {
  const State l0 = layerState("0", 5, 1), l1 = layerState("1", 2, 2);
  std::vector<TestNode> nodes = {{"c0s0", 0, namesOf(l0)},
                                 {"c0s1", 0, namesOf(l1)},
                                 {"c1s0", 1, namesOf(l0)},
                                 {"c1s1", 1, namesOf(l1)}};
  std::vector<TestRing> rings = {{"ring_0", namesOf(l0), {"c0s0", "c1s0"}},
                                 {"ring_1", namesOf(l1), {"c0s1", "c1s1"}}};
  std::vector<State> before(4), after(4);
  runNodes(nodes, rings, {l0, l1, l0, l1}, {}, [&](size_t i, RingClusterSync& sync, auto& stage) {
    perturb(stage, int(i));
    before[i] = stateOf(stage);
    sync.synchronize();
    after[i] = stateOf(stage);
    EXPECT_EQ(sync.activeRings(), 1u);
  });
  expectAverages(before, after, rings, nodes);
  EXPECT_EQ(after[0].at("0.num_batches_tracked").item<int64_t>(), 5 + 2);
}

TEST(RingClusterSync, DifferentCutsAverageEveryCopy) {
  const State l0 = layerState("0", 5, 3), l1 = layerState("1", 4, 4), l2 = layerState("2", 3, 5);
  // Cluster 0: one node with everything; cluster 1: {0} and {1, 2}.
  std::vector<std::string> n12 = namesOf(merge(l1, l2));
  std::vector<TestNode> nodes = {
      {"a", 0, namesOf(merge(merge(l0, l1), l2))}, {"b", 1, namesOf(l0)}, {"c", 1, n12}};
  std::vector<TestRing> rings = {{"ring_0", namesOf(l0), {"a", "b"}}, {"ring_1", n12, {"a", "c"}}};
  for (bool concurrent : {true, false}) {
    SCOPED_TRACE(concurrent ? "rings concurrently" : "rings one after another");
    SyncOptions options;
    options.concurrent_rings = concurrent;
    std::vector<State> before(3), after(3);
    runNodes(nodes, rings, {merge(merge(l0, l1), l2), l0, merge(l1, l2)}, options,
             [&](size_t i, RingClusterSync& sync, auto& stage) {
               perturb(stage, int(i) + 1);
               before[i] = stateOf(stage);
               sync.synchronize();
               after[i] = stateOf(stage);
               if (i == 0) {
                 EXPECT_EQ(sync.activeRings(), 2u);
               }
             });
    expectAverages(before, after, rings, nodes);
  }
}

// The rings of one node run at the same time, not one after another: "a" shares ring_0 with "b"
// and ring_1 with "c", and "b" holds back its sync until "c" has finished its own. Rings taken in
// ring id order would have "a" wait in ring_0 for "b", which waits for "c", which waits in ring_1
// for "a": nobody moves until the 10 s timeout drops someone, and the averages come out wrong.
// Reference: the direct average of every tensor's copies.
TEST(RingClusterSync, RingsOfOneNodeRunConcurrently) {
  const State l0 = layerState("0", 6, 21), l1 = layerState("1", 5, 22);
  std::vector<TestNode> nodes = {
      {"a", 0, namesOf(merge(l0, l1))}, {"b", 1, namesOf(l0)}, {"c", 1, namesOf(l1)}};
  std::vector<TestRing> rings = {{"ring_0", namesOf(l0), {"a", "b"}},
                                 {"ring_1", namesOf(l1), {"a", "c"}}};
  std::mutex mutex;
  std::condition_variable c_done;
  bool c_finished = false;
  bool b_waited_in_vain = false;
  std::vector<State> before(3), after(3);
  MemberSetup setup;
  setup.timeout = std::chrono::milliseconds(10000);
  runNodes(
      nodes, rings, {merge(l0, l1), l0, l1}, {},
      [&](size_t i, RingClusterSync& sync, auto& stage) {
        perturb(stage, int(i) + 7);
        before[i] = stateOf(stage);
        if (i == 1) {  // b: only after c's sync has returned
          std::unique_lock<std::mutex> lock(mutex);
          b_waited_in_vain =
              !c_done.wait_for(lock, std::chrono::seconds(60), [&] { return c_finished; });
        }
        sync.synchronize();
        if (i == 2) {
          std::lock_guard<std::mutex> lock(mutex);
          c_finished = true;
          c_done.notify_all();
        }
        after[i] = stateOf(stage);
        EXPECT_EQ(sync.stats().members_lost, 0) << nodes[i].name;
      },
      setup);
  EXPECT_FALSE(b_waited_in_vain);
  expectAverages(before, after, rings, nodes);
}

// "gradients" with clusters cut differently: the node in two rings averages each ring's gradients
// with that ring's partner (both rings at once). Reference: the mean of the copies' gradients.
TEST(RingClusterSync, DifferentCutsGradientsAreAveragedPerRing) {
  const State l0 = {{"0.weight", torch::randn({4, 3})}, {"0.bias", torch::randn({4})}};
  const State l1 = {{"1.weight", torch::randn({2, 4})}};
  std::vector<TestNode> nodes = {{"a", 0, {"0.bias", "0.weight", "1.weight"}},
                                 {"b", 1, {"0.bias", "0.weight"}},
                                 {"c", 1, {"1.weight"}}};
  std::vector<TestRing> rings = {{"ring_0", {"0.bias", "0.weight"}, {"a", "b"}},
                                 {"ring_1", {"1.weight"}, {"a", "c"}}};
  SyncOptions options;
  options.mode = SyncMode::kGradients;
  std::vector<State> grads_before(3), grads_after(3);
  auto gradsOf = [](torch::jit::Module& stage) {
    State g;
    for (const auto& p : stage.named_parameters(true)) g[p.name] = p.value.grad().clone();
    return g;
  };
  runNodes(nodes, rings, {merge(l0, l1), l0, l1}, options,
           [&](size_t i, RingClusterSync& sync, torch::jit::Module& stage) {
             torch::manual_seed(300 + uint64_t(i));
             for (const auto& p : stage.named_parameters(true))
               p.value.mutable_grad() = torch::randn_like(p.value);
             grads_before[i] = gradsOf(stage);
             sync.beforeOptimizerStep(0, stage);
             grads_after[i] = gradsOf(stage);
           });
  for (const auto& r : rings)
    for (const auto& name : r.names) {
      const size_t x = 0, y = r.members[1] == "b" ? 1 : 2;
      const torch::Tensor expected = (grads_before[x].at(name) + grads_before[y].at(name)) / 2;
      for (size_t i : {x, y}) {
        EXPECT_LE((grads_after[i].at(name) - expected).abs().max().item<double>(), 1e-6)
            << name << " at " << nodes[i].name;
        EXPECT_TRUE(torch::equal(grads_after[i].at(name), grads_after[x].at(name))) << name;
      }
    }
}

TEST(RingClusterSync, GradientsEqualTrainingOnTheUnionBatch) {
  const int64_t batch = 8, steps = 10;
  torch::manual_seed(7);
  const State init = {{"0.weight", torch::randn({4, 6})}, {"0.bias", torch::randn({4})}};
  std::vector<torch::Tensor> xs, ys;  // per step: the union batch (cluster c: rows c*B..)
  for (int s = 0; s < steps; ++s) {
    xs.push_back(torch::randn({2 * batch, 6}));
    ys.push_back(torch::randn({2 * batch, 4}));
  }
  OptimizerOptions adam;
  adam.kind = OptimizerKind::kAdam;
  adam.lr = 0.01;
  adam.weight_decay = 0;
  SyncOptions options;
  options.mode = SyncMode::kGradients;
  std::vector<TestNode> nodes = {{"g0", 0, {"0.bias", "0.weight"}}, {"g1", 1, {"0.bias", "0.weight"}}};
  std::vector<TestRing> rings = {{"ring_0", {"0.bias", "0.weight"}, {"g0", "g1"}}};
  std::vector<State> trained(2);
  runNodes(nodes, rings, {init, init}, options, [&](size_t c, RingClusterSync& sync, auto& stage) {
    torch::Tensor w = stage.attr("0").toModule().attr("weight").toTensor();
    torch::Tensor b = stage.attr("0").toModule().attr("bias").toTensor();
    Optimizer optimizer({w, b}, adam);
    for (int s = 0; s < steps; ++s) {
      torch::Tensor x = xs[size_t(s)].narrow(0, int64_t(c) * batch, batch);
      torch::Tensor y = ys[size_t(s)].narrow(0, int64_t(c) * batch, batch);
      torch::mse_loss(torch::addmm(b, x, w.t()), y).backward();
      sync.beforeOptimizerStep(s, stage);
      optimizer.step(adam.lr);
      optimizer.zeroGrad();
      sync.afterOptimizerStep(s, stage);
    }
    trained[c] = stateOf(stage);
  });
  // Reference: libtorch's C++ frontend, one process, the union batch.
  torch::Tensor w = init.at("0.weight").clone().requires_grad_(true);
  torch::Tensor b = init.at("0.bias").clone().requires_grad_(true);
  torch::optim::Adam reference({w, b}, torch::optim::AdamOptions(adam.lr));
  for (int s = 0; s < steps; ++s) {
    reference.zero_grad();
    torch::mse_loss(torch::addmm(b, xs[size_t(s)], w.t()), ys[size_t(s)]).backward();
    reference.step();
  }
  for (size_t c = 0; c < 2; ++c) {
    const double dw = (trained[c].at("0.weight") - w.detach()).abs().max().item<double>();
    const double db = (trained[c].at("0.bias") - b.detach()).abs().max().item<double>();
    std::printf("gradients mode, cluster %zu: max abs diff vs union batch %.3g (weight) %.3g (bias)\n",
                c, dw, db);
    EXPECT_LE(dw, 1e-5);
    EXPECT_LE(db, 1e-5);
  }
  EXPECT_TRUE(torch::equal(trained[0].at("0.weight"), trained[1].at("0.weight")));
}

TEST(RingClusterSync, DiLoCoOuterStepsMatchDirectComputation) {
  torch::manual_seed(11);
  const State init = {{"0.weight", torch::randn({3, 5})}, {"0.running_mean", torch::randn({3})}};
  SyncOptions options;
  options.mode = SyncMode::kDiLoCo;  // lr 0.7, momentum 0.9, Nesterov
  std::vector<std::string> names = {"0.running_mean", "0.weight"};
  std::vector<TestNode> nodes = {{"d0", 0, names}, {"d1", 1, names}};
  std::vector<TestRing> rings = {{"ring_0", names, {"d0", "d1"}}};
  std::vector<std::vector<State>> before(2, std::vector<State>(2)), after(2, std::vector<State>(2));
  runNodes(nodes, rings, {init, init}, options, [&](size_t c, RingClusterSync& sync, auto& stage) {
    for (int round = 0; round < 2; ++round) {
      perturb(stage, int(c) + 10 * round);
      before[size_t(round)][c] = stateOf(stage);
      sync.synchronize();
      after[size_t(round)][c] = stateOf(stage);
    }
  });
  torch::Tensor previous = init.at("0.weight").to(torch::kDouble), momentum;
  for (int round = 0; round < 2; ++round) {
    torch::Tensor delta = ((previous - before[size_t(round)][0].at("0.weight").to(torch::kDouble)) +
                           (previous - before[size_t(round)][1].at("0.weight").to(torch::kDouble))) /
                          2;
    momentum = round == 0 ? delta.clone() : momentum * 0.9 + delta;
    previous = previous - 0.7 * (delta + 0.9 * momentum);
    for (size_t c = 0; c < 2; ++c) {
      const auto& got = after[size_t(round)][c];
      EXPECT_LE((got.at("0.weight").to(torch::kDouble) - previous).abs().max().item<double>(), 1e-6)
          << "round " << round << " cluster " << c;
      torch::Tensor mean = (before[size_t(round)][0].at("0.running_mean") +
                            before[size_t(round)][1].at("0.running_mean")) / 2;
      EXPECT_LE((got.at("0.running_mean") - mean).abs().max().item<double>(), 1e-6);
    }
    EXPECT_TRUE(torch::equal(after[size_t(round)][0].at("0.weight"),
                             after[size_t(round)][1].at("0.weight")));
  }
}

TEST(RingClusterSync, RefusesDifferentInitialWeightsNamingTheNode) {
  State a = layerState("0", 4, 21), b = a;
  b["0.weight"] = b["0.weight"].clone();
  b["0.weight"][0][0] += 1e-3;
  std::vector<std::string> names;
  for (const auto& [k, v] : a) names.push_back(k);
  try {
    runNodes({{"m0", 0, names}, {"m1", 1, names}}, {{"ring_0", names, {"m0", "m1"}}}, {a, b}, {},
             [](size_t, RingClusterSync&, auto&) {});
    FAIL() << "different initial weights were accepted";
  } catch (const BadInput& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("m1 (cluster 1) starts from different weights than m0"), std::string::npos)
        << what;
    EXPECT_NE(what.find("ring_0"), std::string::npos) << what;
  }
}


// ---------------------------------------------------------------------------------------------
// Lost, leaving and returning ring members: 3 clusters × 1 node, one ring over all tensors.
namespace {

const std::vector<std::string> kThree = {"x0", "x1", "x2"};

std::vector<TestNode> threeNodes(const State& s) {
  return {{"x0", 0, namesOf(s)}, {"x1", 1, namesOf(s)}, {"x2", 2, namesOf(s)}};
}


void expectSameState(const State& a, const State& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, t] : a)
    EXPECT_TRUE(torch::equal(t, b.at(name))) << what << ": " << name << " differs";
}

// Sends the lost member makes before it vanishes: the join agreement (one 3-element all-reduce,
// 4 sends) and 5 sends of the values: it dies inside the second bucket's all-reduce.
constexpr uint64_t kDieAfterSends = 4 + 5;

}  // namespace

TEST(RingClusterSyncFailures, MemberDyingMidAverageIsDroppedAndTheOthersAverageWithoutIt) {
  const State init = layerState("0", 5, 31);
  const auto nodes = threeNodes(init);
  const std::vector<TestRing> rings = {{"ring_0", namesOf(init), kThree}};
  std::vector<std::vector<State>> before(2, std::vector<State>(3)), after(2, std::vector<State>(3));
  std::vector<RingClusterSyncStats> stats(3);
  std::vector<std::vector<std::string>> views(3);
  MemberSetup setup;
  setup.timeout = std::chrono::milliseconds(1500);
  runNodes(
      nodes, rings, {init, init, init}, {},
      [&](size_t i, RingClusterSync& sync, torch::jit::Module& stage) {
        for (size_t round = 0; round < 2; ++round) {
          perturbSeeded(stage, 100 * round + i);
          before[round][i] = stateOf(stage);
          sync.synchronize();
          after[round][i] = stateOf(stage);
        }
        stats[i] = sync.stats();
        views[i] = sync.view("ring_0");
      },
      setup,
      [](size_t i, FaultyTransport& faulty) {
        if (i == 2) faulty.setDisconnectAfterSends(kDieAfterSends);
      });
  const std::vector<TestRing> survivors = {{"ring_0", namesOf(init), {"x0", "x1"}}};
  for (size_t round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    expectAverages(before[round], after[round], survivors, nodes);
    // The lost member restored its own pre-sync tensors and now trains alone.
    expectSameState(after[round][2], before[round][2], "x2 after its failed sync");
  }
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(stats[i].members_lost, 1) << i;
    EXPECT_EQ(stats[i].redone_syncs, 1) << i;
    EXPECT_EQ(views[i], (std::vector<std::string>{"x0", "x1"}));
  }
  EXPECT_EQ(views[2], (std::vector<std::string>{"x2"}));
  std::printf("lost mid-average: survivors redid 1 sync; x2 dropped %lld member(s)\n",
              static_cast<long long>(stats[2].members_lost));
}

// Silent corruption (issue [Q]): x2's copy of "0.weight" gets bit 30 of one float flipped (the top
// exponent bit: 0.3 becomes ~1e38, a value of magnitude >= 1 becomes inf or NaN) before a sync. Its
// contribution is checked before the average (RingSyncMath.h checkContributions): x2 refuses to go
// on (BadInput naming the corruption), x0 and x1 drop it and average without it. Without the check
// the average would carry the flipped value into every copy.
void flipBit30(torch::jit::Module& stage, const std::string& name, int64_t index) {
  torch::NoGradGuard no_grad;
  for (const auto& p : stage.named_parameters(true))
    if (p.name == name) {
      float* value = p.value.data_ptr<float>() + index;
      uint32_t bits;
      std::memcpy(&bits, value, sizeof bits);
      bits ^= uint32_t(1) << 30;
      std::memcpy(value, &bits, sizeof bits);
    }
}

void expectCorruptCopyDropped(bool to_non_finite) {
  const State init = layerState("0", 5, 31);
  const auto nodes = threeNodes(init);
  const std::vector<TestRing> rings = {{"ring_0", namesOf(init), kThree}};
  std::vector<State> before(3), after(3);
  std::vector<RingClusterSyncStats> stats(3);
  std::vector<std::string> refused(3);
  MemberSetup setup;
  setup.timeout = std::chrono::milliseconds(5000);
  runNodes(nodes, rings, {init, init, init}, {},
           [&](size_t i, RingClusterSync& sync, torch::jit::Module& stage) {
             perturbSeeded(stage, 700 + i);
             if (i == 2) {
               // The first element of magnitude below 1 (a huge finite result) or at least 1.
               const torch::Tensor w = stateOf(stage).at("0.weight").flatten();
               int64_t index = 0;
               while ((std::abs(w[index].item<float>()) >= 1) != to_non_finite) ++index;
               flipBit30(stage, "0.weight", index);
             }
             before[i] = stateOf(stage);
             try {
               sync.synchronize();
             } catch (const BadInput& e) {
               refused[i] = e.what();
             }
             after[i] = stateOf(stage);
             stats[i] = sync.stats();
           },
           setup);
  EXPECT_NE(refused[2].find("corrupt"), std::string::npos) << refused[2];
  EXPECT_NE(refused[2].find(to_non_finite ? "non-finite" : "magnitude"), std::string::npos)
      << refused[2];
  EXPECT_TRUE(refused[0].empty() && refused[1].empty()) << refused[0] << refused[1];
  expectAverages(before, after, {{"ring_0", namesOf(init), {"x0", "x1"}}}, nodes);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(stats[i].members_lost, 1) << i;
    EXPECT_TRUE(torch::isfinite(after[i].at("0.weight")).all().item<bool>()) << i;
    EXPECT_LT(after[i].at("0.weight").abs().max().item<double>(), 10) << i;
  }
}

TEST(RingClusterSyncFailures, ACopyWithAFlippedExponentBitIsDroppedBeforeTheAverage) {
  expectCorruptCopyDropped(/*to_non_finite=*/false);
}

TEST(RingClusterSyncFailures, ACopyWithANonFiniteWeightIsDroppedBeforeTheAverage) {
  expectCorruptCopyDropped(/*to_non_finite=*/true);
}

// Two syncs of the three members x0, x1, x2 (ring_0 over `init`) with
// CAIRN_TEST_FLIP_AFTER_AVERAGE=`flip`: the states before and after each round, each member's
// stats and what it refused (a member that refused stops there).
struct FlipRounds {
  std::vector<std::vector<State>> before{2, std::vector<State>(3)}, after{2, std::vector<State>(3)};
  std::vector<RingClusterSyncStats> stats{3};
  std::vector<std::string> refused{3};
};

FlipRounds runFlipRounds(const State& init, const SyncOptions& options, const char* flip, uint64_t salt) {
  FlipRounds out;
  MemberSetup setup;
  setup.timeout = std::chrono::milliseconds(5000);
  EXPECT_EQ(setenv("CAIRN_TEST_FLIP_AFTER_AVERAGE", flip, 1), 0);
  runNodes(threeNodes(init), {{"ring_0", namesOf(init), kThree}}, {init, init, init}, options,
           [&](size_t i, RingClusterSync& sync, torch::jit::Module& stage) {
             for (size_t round = 0; round < 2; ++round) {
               perturbSeeded(stage, salt + 10 * round + i);
               out.before[round][i] = stateOf(stage);
               try {
                 sync.synchronize();
               } catch (const BadInput& e) {
                 out.refused[i] = e.what();
               }
               out.after[round][i] = stateOf(stage);
               if (!out.refused[i].empty()) break;
             }
             out.stats[i] = sync.stats();
           },
           setup);
  unsetenv("CAIRN_TEST_FLIP_AFTER_AVERAGE");
  return out;
}

// Round 0 of `r`: x0 and x1 agree, and x2's 0.weight differs from theirs in bit 0 of element
// `index` only.
void expectOnlyBit0Flipped(const FlipRounds& r, int64_t index) {
  expectSameState(r.after[0][0], r.after[0][1], "x0 vs x1 after the first sync");
  const torch::Tensor clean = r.after[0][0].at("0.weight").flatten();
  const torch::Tensor flipped = r.after[0][2].at("0.weight").flatten();
  EXPECT_EQ((clean != flipped).sum().item<int64_t>(), 1);
  int32_t a = 0, b = 0;
  const float ca = clean[index].item<float>(), fb = flipped[index].item<float>();
  std::memcpy(&a, &ca, sizeof a);
  std::memcpy(&b, &fb, sizeof b);
  EXPECT_EQ(a ^ b, 1) << "bit 0 of element " << index;
}

// Corruption after the check (issue [Q]): x2 flips the lowest mantissa bit of one weight right
// after its first average's reduction (CAIRN_TEST_FLIP_AFTER_AVERAGE, RingTestHooks.h): a change no
// magnitude check can see, so x2 leaves that sync with a result unlike x0's and x1's. At the next
// sync the members compare their last results' checksums (RingSyncMath.h checkContributions): x2 is
// outvoted 2 to 1, refuses to go on (BadInput), and x0 and x1 drop it and average without it.
// Without the checksums x2's copy would be averaged in, and nobody refused.
TEST(RingClusterSyncFailures, ACopyCorruptedAfterTheAverageIsCaughtAtTheNextSync) {
  const State init = layerState("0", 5, 37);
  const FlipRounds r = runFlipRounds(init, {}, "x2:0.weight:3:0", 800);
  expectOnlyBit0Flipped(r, 3);
  // Round 1: x2 refused; x0 and x1 averaged without it.
  EXPECT_NE(r.refused[2].find("result of the last average hashing to"), std::string::npos) << r.refused[2];
  EXPECT_TRUE(r.refused[0].empty() && r.refused[1].empty()) << r.refused[0] << r.refused[1];
  expectAverages(r.before[1], r.after[1], {{"ring_0", namesOf(init), {"x0", "x1"}}}, threeNodes(init));
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(r.stats[i].members_lost, 1) << i;
}

// The same in DiLoCo (issue [Q]): x2 flips the lowest mantissa bit of element 2 of its outer
// step's result — θ_prev and the weight copied from it — right after its first outer step. The
// weights then train on as usual; only the outer state shows it. At the next sync the members
// compare their outer-state checksums (θ_prev, momentum: RingBuckets::outerStateChecksum): x2 is
// outvoted 2 to 1 and refuses to go on, and x0 and x1 take the outer step without it — exactly the
// two-member step computed here. Without the check x2's flipped θ_prev would be averaged in
// (Δ = θ_prev − θ_local) and nobody refused.
TEST(RingClusterSyncFailures, ADiLoCoOuterStateCorruptedAfterItsStepIsCaughtAtTheNextSync) {
  const State init = layerState("0", 5, 43);
  SyncOptions options;
  options.mode = SyncMode::kDiLoCo;  // lr 0.7, momentum 0.9, Nesterov
  const FlipRounds r = runFlipRounds(init, options, "x2:0.weight:2:0", 850);
  const auto& before = r.before;
  const auto& after = r.after;
  expectOnlyBit0Flipped(r, 2);
  // Round 1: x2 refused naming its outer state; x0 and x1 stepped together from round 0's θ.
  EXPECT_NE(r.refused[2].find("outer state (θ_prev, momentum) hashing to"), std::string::npos) << r.refused[2];
  EXPECT_TRUE(r.refused[0].empty() && r.refused[1].empty()) << r.refused[0] << r.refused[1];
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(r.stats[i].members_lost, 1) << i;
  for (const std::string name : {"0.weight", "0.bias"}) {  // the parameters (the buffers are averaged)
    const torch::Tensor theta = after[0][0].at(name).to(torch::kDouble);
    // Round 1 over x0 and x1 only: Δ averaged over the two, momentum 0.9 m0 + Δ with m0 round 0's
    // Δ over three (recovered from round 0's step: θ1 = θ0 − 0.7 (Δ0 + 0.9 Δ0)).
    const torch::Tensor init_d = init.at(name).to(torch::kDouble);
    const torch::Tensor m0 = (init_d - theta) / (0.7 * 1.9);
    const torch::Tensor d1 = ((theta - before[1][0].at(name).to(torch::kDouble)) +
                              (theta - before[1][1].at(name).to(torch::kDouble))) / 2;
    const torch::Tensor m1 = 0.9 * m0 + d1;
    const torch::Tensor expected = theta - 0.7 * (d1 + 0.9 * m1);
    for (size_t i = 0; i < 2; ++i)
      EXPECT_LE((after[1][i].at(name).to(torch::kDouble) - expected).abs().max().item<double>(), 1e-5)
          << name << " x" << i;
  }
}

// Concurrent rings fail independently: "a" is in ring_0 {a, b, d} and ring_1 {a, c}, which run at
// the same time; "b" dies in the middle of ring_0's average. ring_0 drops it and "a" and "d"
// average without it; ring_1 completes the exact average of "a" and "c" with nobody lost.
TEST(RingClusterSyncFailures, ALossInOneOfConcurrentRingsReformsOnlyThatRing) {
  const State l0 = layerState("0", 5, 41), l1 = layerState("1", 4, 42);
  const std::vector<TestNode> nodes = {{"a", 0, namesOf(merge(l0, l1))},
                                       {"b", 1, namesOf(l0)},
                                       {"c", 1, namesOf(l1)},
                                       {"d", 2, namesOf(l0)}};
  const std::vector<TestRing> rings = {{"ring_0", namesOf(l0), {"a", "b", "d"}},
                                       {"ring_1", namesOf(l1), {"a", "c"}}};
  std::vector<State> before(4), after(4);
  std::vector<RingClusterSyncStats> stats(4);
  std::vector<std::vector<std::string>> views0(4), views1(4);
  MemberSetup setup;
  setup.timeout = std::chrono::milliseconds(1500);
  runNodes(
      nodes, rings, {merge(l0, l1), l0, l1, l0}, {},
      [&](size_t i, RingClusterSync& sync, torch::jit::Module& stage) {
        perturbSeeded(stage, 500 + i);
        before[i] = stateOf(stage);
        sync.synchronize();
        after[i] = stateOf(stage);
        stats[i] = sync.stats();
        if (i != 2) views0[i] = sync.view("ring_0");
        if (i == 0 || i == 2) views1[i] = sync.view("ring_1");
      },
      setup,
      [](size_t i, FaultyTransport& faulty) {
        if (i == 1) faulty.setDisconnectAfterSends(kDieAfterSends);
      });
  expectAverages(before, after,
                 {{"ring_0", namesOf(l0), {"a", "d"}}, {"ring_1", namesOf(l1), {"a", "c"}}}, nodes);
  expectSameState(after[1], before[1], "b after its failed sync");
  EXPECT_EQ(stats[0].members_lost, 1);
  EXPECT_EQ(stats[0].redone_syncs, 1);
  EXPECT_EQ(stats[2].members_lost, 0);
  EXPECT_EQ(stats[2].redone_syncs, 0);
  EXPECT_EQ(views0[0], (std::vector<std::string>{"a", "d"}));
  EXPECT_EQ(views0[3], (std::vector<std::string>{"a", "d"}));
  EXPECT_EQ(views1[0], (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(views1[2], (std::vector<std::string>{"a", "c"}));
}

TEST(RingClusterSyncFailures, MemberDyingInsideTheCommitLeavesTheFullAverageEverywhere) {
  // x2 sends everything of the reductions (4 agreement + 4 buckets × 4) and one barrier message:
  // every member has the full average of the three; none may redo the sync without x2.
  const State init = layerState("0", 5, 37);
  const auto nodes = threeNodes(init);
  const std::vector<TestRing> rings = {{"ring_0", namesOf(init), kThree}};
  std::vector<std::vector<State>> before(2, std::vector<State>(3)), after(2, std::vector<State>(3));
  std::vector<RingClusterSyncStats> stats(3);
  MemberSetup setup;
  setup.timeout = std::chrono::milliseconds(1500);
  runNodes(
      nodes, rings, {init, init, init}, {},
      [&](size_t i, RingClusterSync& sync, torch::jit::Module& stage) {
        for (size_t round = 0; round < 2; ++round) {
          perturbSeeded(stage, 500 + 100 * round + i);
          before[round][i] = stateOf(stage);
          sync.synchronize();
          after[round][i] = stateOf(stage);
        }
        stats[i] = sync.stats();
      },
      setup,
      [](size_t i, FaultyTransport& faulty) {
        if (i == 2) faulty.setDisconnectAfterSends(4 + 16 + 1);
      });
  expectAverages(before[0], after[0], rings, nodes);  // all three, x2 included
  expectAverages(before[1], after[1], {{"ring_0", namesOf(init), {"x0", "x1"}}}, nodes);
  EXPECT_EQ(stats[0].members_lost, 1);
  EXPECT_EQ(stats[1].members_lost, 1);
}

TEST(RingClusterSyncFailures, DisconnectedMemberInDiLoCoIsDroppedThroughLivenessNotTheTimeout) {
  torch::manual_seed(32);
  const State init = {{"0.weight", torch::randn({3, 5})},
                      {"0.bias", torch::randn({3}, torch::kDouble)},
                      {"0.running_mean", torch::randn({3})}};
  const auto nodes = threeNodes(init);
  const std::vector<TestRing> rings = {{"ring_0", namesOf(init), kThree}};
  SyncOptions options;
  options.mode = SyncMode::kDiLoCo;  // lr 0.7, momentum 0.9, Nesterov
  std::vector<State> before(3), after(3), again(3);
  std::vector<RingClusterSyncStats> stats(3);
  MemberSetup setup;
  // Far beyond the ctest limit of this test: only the transport's disconnected report (after
  // disconnected_grace, 1 s) can end the waits in time.
  setup.timeout = std::chrono::milliseconds(600000);
  runNodes(
      nodes, rings, {init, init, init}, options,
      [&](size_t i, RingClusterSync& sync, torch::jit::Module& stage) {
        perturbSeeded(stage, 7 + i);
        before[i] = stateOf(stage);
        sync.synchronize();
        after[i] = stateOf(stage);
        perturbSeeded(stage, 70 + i);
        sync.synchronize();  // training goes on among the survivors
        again[i] = stateOf(stage);
        stats[i] = sync.stats();
      },
      setup,
      [](size_t i, FaultyTransport& faulty) {
        if (i == 2)
          faulty.disconnectAll(true);
        else
          faulty.disconnect("x2");
      });
  for (const std::string name : {"0.weight", "0.bias"}) {
    const torch::Tensor prev = init.at(name).to(torch::kDouble);
    const torch::Tensor delta = ((prev - before[0].at(name).to(torch::kDouble)) +
                                 (prev - before[1].at(name).to(torch::kDouble))) /
                                2;
    const torch::Tensor expected = prev - 0.7 * (delta + 0.9 * delta);
    for (size_t i = 0; i < 2; ++i)
      EXPECT_LE((after[i].at(name).to(torch::kDouble) - expected).abs().max().item<double>(), 1e-6)
          << name << " at x" << i;
    EXPECT_TRUE(torch::equal(after[0].at(name), after[1].at(name))) << name;
    EXPECT_TRUE(torch::equal(again[0].at(name), again[1].at(name))) << name;
  }
  const torch::Tensor mean = (before[0].at("0.running_mean") + before[1].at("0.running_mean")) / 2;
  EXPECT_LE((after[0].at("0.running_mean") - mean).abs().max().item<double>(), 1e-6);
  expectSameState(after[2], before[2], "x2 after its failed sync");
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(stats[i].members_lost, 1) << i;
    EXPECT_EQ(stats[i].syncs, 2) << i;
  }
}

TEST(RingClusterSyncFailures, MemberDyingMidGradientAverageIsDropped) {
  torch::manual_seed(33);
  const State init = {{"0.weight", torch::randn({4, 6})}, {"0.bias", torch::randn({4})}};
  const auto nodes = threeNodes(init);
  const std::vector<TestRing> rings = {{"ring_0", namesOf(init), kThree}};
  SyncOptions options;
  options.mode = SyncMode::kGradients;
  std::vector<State> grads_before(3), grads_after(3);
  std::vector<RingClusterSyncStats> stats(3);
  auto gradsOf = [](torch::jit::Module& stage) {
    State g;
    for (const auto& p : stage.named_parameters(true)) g[p.name] = p.value.grad().clone();
    return g;
  };
  MemberSetup setup;
  setup.timeout = std::chrono::milliseconds(1500);
  runNodes(
      nodes, rings, {init, init, init}, options,
      [&](size_t i, RingClusterSync& sync, torch::jit::Module& stage) {
        at::Generator gen = at::detail::createCPUGenerator(50 + i);
        for (const auto& p : stage.named_parameters(true))
          p.value.mutable_grad() = at::randn(p.value.sizes(), gen, p.value.options());
        grads_before[i] = gradsOf(stage);
        sync.beforeOptimizerStep(0, stage);
        grads_after[i] = gradsOf(stage);
        stats[i] = sync.stats();
      },
      setup,
      [](size_t i, FaultyTransport& faulty) {
        // 2 sends of the contribution check's all-gather, then 2 of the all-reduce's 4.
        if (i == 2) faulty.setDisconnectAfterSends(4);  // inside the gradient all-reduce
      });
  for (const auto& [name, g0] : grads_before[0]) {
    const torch::Tensor expected = (g0.to(torch::kDouble) + grads_before[1].at(name).to(torch::kDouble)) / 2;
    for (size_t i = 0; i < 2; ++i)
      EXPECT_LE((grads_after[i].at(name).to(torch::kDouble) - expected).abs().max().item<double>(),
                1e-6)
          << name << " at x" << i;
    EXPECT_TRUE(torch::equal(grads_after[0].at(name), grads_after[1].at(name))) << name;
  }
  expectSameState(grads_after[2], grads_before[2], "x2's gradients after its failed sync");
  EXPECT_EQ(stats[0].members_lost, 1);
  EXPECT_EQ(stats[1].members_lost, 1);
}

TEST(RingClusterSyncFailures, LeavingMemberIsDroppedWithoutWaitingForATimeout) {
  const State init = layerState("0", 4, 34);
  const auto nodes = threeNodes(init);
  const std::vector<TestRing> rings = {{"ring_0", namesOf(init), kThree}};
  std::vector<std::vector<State>> before(2, std::vector<State>(3)), after(2, std::vector<State>(3));
  std::vector<RingClusterSyncStats> stats(3);
  MemberSetup setup;
  // Far beyond the ctest limit of this test: waiting for x2 to time out would fail it.
  setup.timeout = std::chrono::milliseconds(600000);
  runNodes(
      nodes, rings, {init, init, init}, {},
      [&](size_t i, RingClusterSync& sync, torch::jit::Module& stage) {
        perturbSeeded(stage, 200 + i);
        before[0][i] = stateOf(stage);
        sync.synchronize();
        after[0][i] = stateOf(stage);
        if (i == 2) sync.leave();
        perturbSeeded(stage, 300 + i);
        before[1][i] = stateOf(stage);
        sync.synchronize();  // x2: a no-op after leave()
        after[1][i] = stateOf(stage);
        stats[i] = sync.stats();
      },
      setup);
  expectAverages(before[0], after[0], rings, nodes);
  expectAverages(before[1], after[1], {{"ring_0", namesOf(init), {"x0", "x1"}}}, nodes);
  expectSameState(after[1][2], before[1][2], "x2 after leaving");
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(stats[i].members_left, 1) << i;
    EXPECT_EQ(stats[i].members_lost, 0) << i;
  }
}

TEST(RingClusterSyncFailures, FinishLeavesWithoutAnyoneDroppingAnyone) {
  // finish() = the final sync, then leave(): a fast finisher's leave reaching the others inside
  // the final commit must not make them drop it (it sent everything before leaving).
  const State init = layerState("0", 4, 38);
  const auto nodes = threeNodes(init);
  const std::vector<TestRing> rings = {{"ring_0", namesOf(init), kThree}};
  std::vector<State> before(3), after(3);
  std::vector<RingClusterSyncStats> stats(3);
  MemberSetup setup;
  setup.timeout = std::chrono::milliseconds(600000);  // only a leave could end a wait in time
  for (int repeat = 0; repeat < 5; ++repeat) {
    runNodes(
        nodes, rings, {init, init, init}, {},
        [&](size_t i, RingClusterSync& sync, torch::jit::Module& stage) {
          perturbSeeded(stage, 600 + 10 * uint64_t(repeat) + i);
          before[i] = stateOf(stage);
          sync.finish(1, stage);
          after[i] = stateOf(stage);
          stats[i] = sync.stats();
        },
        setup);
    SCOPED_TRACE("repeat " + std::to_string(repeat));
    expectAverages(before, after, rings, nodes);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(stats[i].members_left + stats[i].members_lost, 0) << i;
      EXPECT_EQ(stats[i].syncs, 1) << i;
    }
  }
}

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
  const std::string prefix = "tcp:6380";  // ports 6380-6382 (this test only)
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

// training_definition.wire.sync (SyncOptions::wire) reaches the rings' groups: 3 clusters average
// a layer with bf16 / int8 syncs. Every copy ends bit-identical; the float32 tensors went through
// the codec (bf16: every value a bfloat16; both: differ from the exact mean, within the codec's
// bound); the float64 bias is averaged exactly as with fp32 syncs, num_batches_tracked max-reduced.
TEST(RingClusterSyncWire, CompressedAverageIsBitIdenticalOnEveryCopy) {
  for (WireCodec codec : {WireCodec::kBf16, WireCodec::kInt8}) {
    const State l0 = layerState("0", 400, 1);
    std::vector<TestNode> nodes = {{"c0", 0, namesOf(l0)}, {"c1", 1, namesOf(l0)},
                                   {"c2", 2, namesOf(l0)}};
    std::vector<TestRing> rings = {{"ring_0", namesOf(l0), {"c0", "c1", "c2"}}};
    SyncOptions options;
    options.wire = codec;
    std::vector<State> before(3), after(3);
    runNodes(nodes, rings, {l0, l0, l0}, options,
             [&](size_t i, RingClusterSync& sync, auto& stage) {
               perturb(stage, int(i));
               before[i] = stateOf(stage);
               sync.synchronize();
               after[i] = stateOf(stage);
             });
    for (const auto& [name, t] : after[0]) {
      for (size_t i = 1; i < 3; ++i) {
        EXPECT_TRUE(torch::equal(after[i].at(name), t)) << toString(codec) << " " << name;
      }
      std::vector<torch::Tensor> copies;
      for (const auto& b : before) copies.push_back(b.at(name));
      if (t.scalar_type() == torch::kFloat) {
        const torch::Tensor exact = torch::stack(copies).to(torch::kDouble).mean(0);
        const double max_abs = torch::stack(copies).abs().max().item<double>();
        const double err = (t.to(torch::kDouble) - exact).abs().max().item<double>();
        // fp32 syncs: below ~1e-6 (float32 rounding of the sum); the codecs: 1e-3 and more.
        EXPECT_GT(err, 1e-5) << toString(codec) << " " << name << ": not compressed";
        EXPECT_LE(err, 3 * max_abs * (codec == WireCodec::kBf16 ? 1.0 / 512 : 0.5 / 127))
            << toString(codec) << " " << name;
        if (codec == WireCodec::kBf16) {
          EXPECT_FALSE((t.view(torch::kInt) & 0xFFFF).any().item<bool>()) << name;
        }
      } else if (t.scalar_type() == torch::kDouble) {
        const torch::Tensor exact = torch::stack(copies).mean(0);
        EXPECT_LE((t - exact).abs().max().item<double>(), 1e-12) << name;
      } else {
        EXPECT_TRUE(torch::equal(t, std::get<0>(torch::stack(copies).max(0)))) << name;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// "gradients" overlapped with backward (GradientOverlap.h): gradient buckets, the overlapped
// all-reduce bit-identical to the non-overlapped one, a loss during it.
namespace {

// A 3-layer MLP as a stage, plus a parameter no forward uses (its bucket is reduced only once
// backward is over, zeros: DDP's find_unused_parameters).
State mlpState() {
  at::Generator gen = at::detail::createCPUGenerator(77);
  auto randn = [&](std::vector<int64_t> shape) { return at::randn(shape, gen) * 0.5; };
  return {{"0.weight", randn({16, 6})}, {"0.bias", randn({16})},
          {"1.weight", randn({16, 16})}, {"1.bias", randn({16})},
          {"2.weight", randn({4, 16})},  {"2.bias", randn({4})},
          {"0.unused", randn({5})}};
}

torch::Tensor mlpForward(const std::map<std::string, torch::Tensor>& p, const torch::Tensor& x) {
  torch::Tensor h = torch::tanh(torch::addmm(p.at("0.bias"), x, p.at("0.weight").t()));
  h = torch::tanh(torch::addmm(p.at("1.bias"), h, p.at("1.weight").t()));
  return torch::addmm(p.at("2.bias"), h, p.at("2.weight").t());
}

std::map<std::string, torch::Tensor> paramsOf(torch::jit::Module& stage) {
  std::map<std::string, torch::Tensor> p;
  for (const auto& named : stage.named_parameters(true)) p[named.name] = named.value;
  return p;
}

struct OverlapRun {
  std::vector<State> trained = std::vector<State>(3);
  std::vector<RingClusterSyncStats> stats = std::vector<RingClusterSyncStats>(3);
};

// 3 clusters × 1 node (a 3-member ring: the reduction order per element matters), 2 micro-batches
// of 4 rows per cluster and step, SGD; the gradient buckets 64 bytes (one tensor or two each).
OverlapRun trainMlp(bool overlap, const std::vector<torch::Tensor>& xs,
                    const std::vector<torch::Tensor>& ys, double lr, int64_t bucket_bytes = 64) {
  const State init = mlpState();
  OptimizerOptions sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.lr = lr;
  sgd.weight_decay = 0;
  SyncOptions options;
  options.mode = SyncMode::kGradients;
  MemberSetup setup;
  setup.gradients.bucket_bytes = bucket_bytes;
  setup.gradients.overlap = overlap;
  OverlapRun run;
  runNodes(threeNodes(init), {{"ring_0", namesOf(init), kThree}}, {init, init, init}, options,
           [&](size_t c, RingClusterSync& sync, torch::jit::Module& stage) {
             std::vector<torch::Tensor> all;
             for (const auto& p : stage.named_parameters(true)) all.push_back(p.value);
             Optimizer optimizer(all, sgd);
             const auto p = paramsOf(stage);
             for (size_t s = 0; s < xs.size(); ++s) {
               for (int64_t mb = 0; mb < 2; ++mb) {
                 const int64_t row = int64_t(c) * 8 + mb * 4;
                 torch::Tensor loss =
                     torch::mse_loss(mlpForward(p, xs[s].narrow(0, row, 4)), ys[s].narrow(0, row, 4)) /
                     2;
                 sync.beforeBackward(int64_t(s), stage, mb == 1);
                 loss.backward();
               }
               sync.beforeOptimizerStep(int64_t(s), stage);
               optimizer.step(lr);
               optimizer.zeroGrad();
               sync.afterOptimizerStep(int64_t(s), stage);
             }
             run.trained[c] = stateOf(stage);
             run.stats[c] = sync.stats();
           },
           setup);
  return run;
}

}  // namespace

TEST(RingBuckets, GradientBucketsAreCutFromTheLastParameterBack) {
  const State state = {{"a.w", torch::randn({4, 4})},  // 64 bytes
                       {"b.w", torch::randn({2})},     // 8
                       {"c.w", torch::randn({3})},     // 12
                       {"d.w", torch::randn({20})},    // 80: over the cap, a bucket of its own
                       {"e.w", torch::randn({2}, torch::kDouble)},
                       {"f.n", torch::tensor(int64_t(3))}};
  torch::jit::Module stage = makeStage(state);
  auto membersOf = [](const RingBuckets& r) {
    std::vector<std::vector<size_t>> m;
    for (const auto& b : r.gradient_buckets) m.push_back(b.members);
    return m;
  };
  RingBuckets capped;
  capped.gradient_bucket_bytes = 64;
  capped.build(namesOf(state), stage, "n", "ring_0", "stage.pt", false);
  // float32 from the back: d | c+b (20 bytes; a would make 84) | a; then float64: e. No buffers.
  EXPECT_EQ(membersOf(capped), (std::vector<std::vector<size_t>>{{3}, {1, 2}, {0}, {4}}));
  RingBuckets whole;  // 0: one bucket per dtype, node.json's order (as before buckets were cut)
  whole.build(namesOf(state), stage, "n", "ring_0", "stage.pt", false);
  EXPECT_EQ(membersOf(whole), (std::vector<std::vector<size_t>>{{0, 1, 2, 3}, {4}}));
}

// A tensor tied under two names (a GPT's embedding and head in one stage, both listed by
// node.json's ring) keeps a place under each name, for the checksum, but joins one bucket once:
// averaged, reduced or stepped by DiLoCo once per sync.
TEST(RingBuckets, ATiedTensorJoinsItsBucketOnce) {
  torch::jit::Module stage("__torch__.TiedStage");
  const torch::Tensor tied = torch::randn({4, 3});
  stage.register_parameter("tok", tied, false);
  stage.register_parameter("bias", torch::randn({3}), false);
  stage.register_parameter("head", tied, false);
  RingBuckets ring;
  ring.build({"tok", "bias", "head"}, stage, "n", "ring_0", "stage.pt", true);
  ASSERT_EQ(ring.tensors.size(), 3u);
  EXPECT_TRUE(ring.tensors[2].is_same(ring.tensors[0]));
  ASSERT_EQ(ring.buckets.size(), 1u);
  EXPECT_EQ(ring.buckets[0].members, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(ring.buckets[0].numel, 15);
  EXPECT_EQ(ring.flatten(ring.buckets[0], false).numel(), 15);
  ASSERT_EQ(ring.gradient_buckets.size(), 1u);
  EXPECT_EQ(ring.gradient_buckets[0].members, (std::vector<size_t>{0, 1}));
}

// The overlapped all-reduce gives exactly the non-overlapped one's parameters, on every cluster,
// and both equal libtorch's SGD on the union batch (within float rounding).
TEST(RingClusterSyncOverlap, OverlappedEqualsNonOverlappedBitForBit) {
  const int steps = 4;
  const double lr = 0.1;
  at::Generator gen = at::detail::createCPUGenerator(5);
  std::vector<torch::Tensor> xs, ys;  // per step: the union batch (cluster c: rows 8c..8c+7)
  for (int s = 0; s < steps; ++s) {
    xs.push_back(at::randn({24, 6}, gen));
    ys.push_back(at::randn({24, 4}, gen));
  }
  const OverlapRun on = trainMlp(true, xs, ys, lr);
  const OverlapRun off = trainMlp(false, xs, ys, lr);
  for (size_t c = 0; c < 3; ++c) {
    expectSameState(on.trained[c], off.trained[c], "cluster " + std::to_string(c) + " on vs off");
    expectSameState(on.trained[c], on.trained[0], "cluster " + std::to_string(c) + " vs 0");
    EXPECT_EQ(on.stats[c].gradient_syncs, steps);
    EXPECT_EQ(on.stats[c].overlapped_gradient_syncs, steps);
    EXPECT_EQ(off.stats[c].gradient_syncs, steps);
    EXPECT_EQ(off.stats[c].overlapped_gradient_syncs, 0);
    EXPECT_EQ(on.stats[c].members_lost, 0);
  }
  std::printf("overlap: %lld of %d buckets started while backward ran (timing, not asserted)\n",
              static_cast<long long>(on.stats[0].buckets_reduced_in_backward), steps * 7);
  // Gradients that fit one bucket have nothing to overlap: the same parameters, on the ordinary
  // path after backward (no overlapped syncs) even with the overlap on.
  const OverlapRun one_bucket = trainMlp(true, xs, ys, lr, int64_t(1) << 20);
  for (size_t c = 0; c < 3; ++c) {
    expectSameState(one_bucket.trained[c], off.trained[c], "one bucket, cluster " + std::to_string(c));
    EXPECT_EQ(one_bucket.stats[c].gradient_syncs, steps);
    EXPECT_EQ(one_bucket.stats[c].overlapped_gradient_syncs, 0);
  }
  // Reference: one process, the union batch, torch::optim::SGD.
  std::map<std::string, torch::Tensor> ref;
  std::vector<torch::Tensor> ref_params;
  for (const auto& [name, t] : mlpState()) {
    ref[name] = t.clone().requires_grad_(true);
    ref_params.push_back(ref[name]);
  }
  torch::optim::SGD reference(ref_params, torch::optim::SGDOptions(lr));
  for (int s = 0; s < steps; ++s) {
    reference.zero_grad();
    torch::mse_loss(mlpForward(ref, xs[size_t(s)]), ys[size_t(s)]).backward();
    reference.step();
  }
  for (const auto& [name, t] : ref) {
    const double diff = (on.trained[0].at(name) - t.detach()).abs().max().item<double>();
    EXPECT_LE(diff, 1e-5) << name;
  }
}

// Three members' MLP batches (8 rows each) from `seed`.
void mlpBatches(uint64_t seed, std::vector<torch::Tensor>* xs, std::vector<torch::Tensor>* ys) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  for (int i = 0; i < 3; ++i) {
    xs->push_back(at::randn({8, 6}, gen));
    ys->push_back(at::randn({8, 4}, gen));
  }
}

// The gradients of `init`'s MLP on (x, y), computed here on copies (zeros where none).
State ownMlpGradients(const State& init, const torch::Tensor& x, const torch::Tensor& y) {
  std::map<std::string, torch::Tensor> p;
  for (const auto& [name, t] : init) p[name] = t.clone().requires_grad_(true);
  torch::mse_loss(mlpForward(p, x), y).backward();
  State own;
  for (const auto& [name, t] : p) own[name] = t.grad().defined() ? t.grad().clone() : torch::zeros_like(t);
  return own;
}

// The stage's gradients as they stand (zeros where none).
State gradientsOf(torch::jit::Module& stage) {
  State g;
  for (const auto& p : stage.named_parameters(true))
    g[p.name] = p.value.grad().defined() ? p.value.grad().clone() : torch::zeros_like(p.value);
  return g;
}

// x0 and x1 hold the average of their own gradients `own` (within 1e-6), bit-identical.
void expectTwoMemberAverage(const std::vector<State>& own, const std::vector<State>& after) {
  for (const auto& [name, g0] : own[0]) {
    const torch::Tensor expected = (g0.to(torch::kDouble) + own[1].at(name).to(torch::kDouble)) / 2;
    for (size_t i = 0; i < 2; ++i)
      EXPECT_LE((after[i].at(name).to(torch::kDouble) - expected).abs().max().item<double>(), 1e-6)
          << name << " at x" << i;
    EXPECT_TRUE(torch::equal(after[0].at(name), after[1].at(name))) << name;
  }
}

// A member lost during the overlapped all-reduce: the other two drop it, restore their own
// gradients and average them again without it (exactly the ordinary path's result); the lost one
// is left with its own gradients.
TEST(RingClusterSyncOverlap, MemberDyingMidOverlappedAllReduceIsDropped) {
  const State init = mlpState();
  SyncOptions options;
  options.mode = SyncMode::kGradients;
  std::vector<torch::Tensor> xs, ys;
  mlpBatches(9, &xs, &ys);
  std::vector<State> own, after(3);
  for (size_t i = 0; i < 3; ++i) own.push_back(ownMlpGradients(init, xs[i], ys[i]));
  std::vector<RingClusterSyncStats> stats(3);
  MemberSetup setup;
  setup.timeout = std::chrono::milliseconds(1500);
  setup.gradients.bucket_bytes = 64;
  runNodes(
      threeNodes(init), {{"ring_0", namesOf(init), kThree}}, {init, init, init}, options,
      [&](size_t i, RingClusterSync& sync, torch::jit::Module& stage) {
        torch::Tensor loss = torch::mse_loss(mlpForward(paramsOf(stage), xs[i]), ys[i]);
        sync.beforeBackward(0, stage, true);
        loss.backward();
        sync.beforeOptimizerStep(0, stage);
        after[i] = gradientsOf(stage);
        stats[i] = sync.stats();
      },
      setup,
      [](size_t i, FaultyTransport& faulty) {
        // 2 sends of the bucket's contribution check (an all-gather), then 2 of its all-reduce's 4.
        if (i == 2) faulty.setDisconnectAfterSends(4);  // inside the first bucket's all-reduce
      });
  expectTwoMemberAverage(own, after);
  for (const auto& [name, g2] : own[2])
    EXPECT_LE((after[2].at(name) - g2).abs().max().item<double>(), 1e-6)
        << name << " at x2 (its own gradients)";
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(stats[i].members_lost, 1) << i;
    EXPECT_EQ(stats[i].overlapped_gradient_syncs, 1) << i;
  }
}


// Silent corruption in "gradients" mode (issue [Q]): the copies are kept equal by averaged
// gradients, so a flipped weight would spread through the gradients it yields at the very next
// all-reduce. Each gradient bucket's contribution — its gradients and the weights they come from —
// is checked right before its average (RingSyncMath.h checkGradientContribution). x2's "2.weight"
// (the first bucket reduced) gets the top exponent bit of an element below 1 flipped (~1e38) before
// the step: x2 refuses (BadInput naming the corruption), x0 and x1 drop it and average their own
// gradients without it, exactly as if x2 had never been there. `overlap`: the check runs on the
// communication thread during backward (the same messages). Without the check x0's and x1's
// gradients would carry x2's huge or non-finite ones and nobody would refuse.
void expectCorruptGradientContributionDropped(bool overlap) {
  const State init = mlpState();
  SyncOptions options;
  options.mode = SyncMode::kGradients;
  std::vector<torch::Tensor> xs, ys;
  mlpBatches(11, &xs, &ys);
  std::vector<State> own, after(3);
  for (size_t i = 0; i < 2; ++i) own.push_back(ownMlpGradients(init, xs[i], ys[i]));
  std::vector<RingClusterSyncStats> stats(3);
  std::vector<std::string> refused(3);
  MemberSetup setup;
  setup.timeout = std::chrono::milliseconds(5000);
  setup.gradients.bucket_bytes = 64;
  setup.gradients.overlap = overlap;
  runNodes(threeNodes(init), {{"ring_0", namesOf(init), kThree}}, {init, init, init}, options,
           [&](size_t i, RingClusterSync& sync, torch::jit::Module& stage) {
             if (i == 2) {
               const torch::Tensor w = init.at("2.weight").flatten();
               int64_t index = 0;
               while (std::abs(w[index].item<float>()) >= 1) ++index;
               flipBit30(stage, "2.weight", index);
             }
             torch::Tensor loss = torch::mse_loss(mlpForward(paramsOf(stage), xs[i]), ys[i]);
             sync.beforeBackward(0, stage, true);
             loss.backward();
             try {
               sync.beforeOptimizerStep(0, stage);
             } catch (const BadInput& e) {
               refused[i] = e.what();
             }
             after[i] = gradientsOf(stage);
             stats[i] = sync.stats();
           },
           setup);
  EXPECT_NE(refused[2].find("corrupt"), std::string::npos) << refused[2];
  EXPECT_TRUE(refused[0].empty() && refused[1].empty()) << refused[0] << refused[1];
  expectTwoMemberAverage(own, after);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(stats[i].members_lost, 1) << i;
    EXPECT_EQ(stats[i].overlapped_gradient_syncs, overlap ? 1 : 0) << i;
  }
}

TEST(RingClusterSyncFailures, AGradientContributionFromAFlippedWeightIsDroppedBeforeTheAverage) {
  expectCorruptGradientContributionDropped(/*overlap=*/false);
}

TEST(RingClusterSyncOverlap, AFlippedWeightIsCaughtBeforeItsFirstOverlappedBucketIsAveraged) {
  expectCorruptGradientContributionDropped(/*overlap=*/true);
}

// Every member's gradients non-finite at once (a diverged training, not one corrupt copy): nobody
// is dropped, every member refuses to average NaN, saying the training diverged, and the gradients
// are left as they were.
TEST(RingClusterSyncFailures, NonFiniteGradientsOnEveryMemberStopEveryMemberAsDiverged) {
  torch::manual_seed(35);
  const State init = {{"0.weight", torch::randn({4, 6})}, {"0.bias", torch::randn({4})}};
  SyncOptions options;
  options.mode = SyncMode::kGradients;
  std::vector<std::string> refused(3);
  std::vector<RingClusterSyncStats> stats(3);
  std::vector<bool> untouched(3, false);
  MemberSetup setup;
  setup.timeout = std::chrono::milliseconds(5000);
  runNodes(threeNodes(init), {{"ring_0", namesOf(init), kThree}}, {init, init, init}, options,
           [&](size_t i, RingClusterSync& sync, torch::jit::Module& stage) {
             at::Generator gen = at::detail::createCPUGenerator(60 + i);
             std::vector<torch::Tensor> before;
             for (const auto& p : stage.named_parameters(true)) {
               p.value.mutable_grad() = at::randn(p.value.sizes(), gen, p.value.options());
               p.value.mutable_grad().view({-1})[int64_t(i)] = NAN;
               before.push_back(p.value.grad().clone());
             }
             try {
               sync.beforeOptimizerStep(0, stage);
             } catch (const BadInput& e) {
               refused[i] = e.what();
             }
             size_t k = 0;
             bool same = true;
             for (const auto& p : stage.named_parameters(true))
               same = same && torch::equal(p.value.grad().nan_to_num(7), before[k++].nan_to_num(7));
             untouched[i] = same;
             stats[i] = sync.stats();
           },
           setup);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NE(refused[i].find("the training diverged"), std::string::npos) << i << ": " << refused[i];
    EXPECT_EQ(stats[i].members_lost, 0) << i;
    EXPECT_TRUE(untouched[i]) << i;
  }
}

}  // namespace
}  // namespace cairn
