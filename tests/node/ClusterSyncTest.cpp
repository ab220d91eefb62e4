// RingClusterSync: nodes of several "clusters" as threads (ClusterSyncHarness.h), each with its
// own ZmqTransport over inproc:// and a stage module built in C++, against direct computations of
// what a sync must give:
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
// Failures: ClusterSyncFailuresTest.cpp; joining and welcomes: ClusterSyncJoinTest.cpp; growth:
// ClusterSyncGrowthTest.cpp; "gradients" overlapped with backward: ClusterSyncOverlapTest.cpp.
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

}  // namespace
}  // namespace cairn::testing
