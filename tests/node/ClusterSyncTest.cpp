// RingClusterSync: nodes of several "clusters" as threads, each with its own ZmqTransport over
// inproc:// and a stage module built in C++, against direct computations of what a sync must give:
//   SameCut        2 clusters × 2 nodes, average: parameters and buffers bit-identical across
//                  clusters right after the reduce, equal to the mean (integers: the max)
//   DifferentCuts  cluster 0 = 1 node, cluster 1 = 2 nodes: one node in two rings with different
//                  partners; every tensor equals the average of its pre-reduce copies
//   Gradients      "gradients" for 10 Adam steps equals libtorch's own torch::optim::Adam on the
//                  union batch (max abs diff <= 1e-5)
//   DiLoCo         two outer steps equal the direct Nesterov outer-SGD computation
//   Mismatch       differing initial weights: refused, naming the differing node
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <map>
#include <thread>

#include "core/Error.h"
#include "node/RingClusterSync.h"
#include "node/ZmqTransport.h"
#include "trainer/Optimizer.h"

namespace cairn {
namespace {

using State = std::map<std::string, torch::Tensor>;

// A stage module whose state is `state` (dotted names "<layer>.<name>"), as clusterize's stages
// name theirs. Integer tensors become buffers, floating ones parameters unless named running_*.
torch::jit::Module makeStage(const State& state) {
  torch::jit::Module stage("Stage");
  std::map<std::string, torch::jit::Module> layers;
  for (const auto& [name, t] : state) {
    const auto dot = name.find('.');
    const std::string layer = name.substr(0, dot), leaf = name.substr(dot + 1);
    auto it = layers.find(layer);
    if (it == layers.end()) it = layers.emplace(layer, torch::jit::Module("Layer" + layer)).first;
    const bool buffer = !t.is_floating_point() || leaf.rfind("running_", 0) == 0;
    if (buffer)
      it->second.register_buffer(leaf, t.clone());
    else
      it->second.register_parameter(leaf, t.clone().requires_grad_(true), false);
  }
  for (auto& [name, m] : layers) stage.register_module(name, m);
  return stage;
}

State stateOf(const torch::jit::Module& stage) {
  State s;
  for (const auto& p : stage.named_parameters(true)) s[p.name] = p.value.detach().clone();
  for (const auto& b : stage.named_buffers(true)) s[b.name] = b.value.detach().clone();
  return s;
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

// Runs body(i, sync, stage) for every node on its own thread; rethrows the first error.
void runNodes(const std::vector<TestNode>& nodes, const std::vector<TestRing>& rings,
              const std::vector<State>& initial, SyncOptions options,
              const std::function<void(size_t, RingClusterSync&, torch::jit::Module&)>& body) {
  zmq::context_t context;
  const std::string prefix = "inproc://sync" + std::to_string(run_counter++) + "_";
  std::vector<std::exception_ptr> errors(nodes.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < nodes.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        NodeSpec spec;
        spec.name = nodes[i].name;
        spec.cluster = nodes[i].cluster;
        for (const auto& r : rings) {
          auto self = std::find(r.members.begin(), r.members.end(), spec.name);
          if (self == r.members.end()) continue;
          RingSpec ring;
          ring.id = r.id;
          ring.parameters = r.names;
          for (const auto& m : r.members) ring.members.push_back({m, prefix + m, ""});
          ring.rank = int(self - r.members.begin());
          spec.rings.push_back(ring);
        }
        ZmqTransport transport(context, spec.name, prefix + spec.name);
        Mailbox mailbox(transport);
        RingClusterSync sync(mailbox, spec, options, 1, std::chrono::milliseconds(20000));
        torch::jit::Module stage = makeStage(initial[i]);
        sync.start(stage);
        body(i, sync, stage);
        transport.flushAndClose(std::chrono::milliseconds(2000));
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
        EXPECT_TRUE(torch::equal(got, first)) << name << " at " << m << " differs from "
                                              << r.members[0] << " (not bit-identical)";
        const double diff = (got.to(torch::kDouble) - expected.to(torch::kDouble)).abs().max()
                                .item<double>();
        EXPECT_LE(diff, 1e-6) << name << " at " << m;
      }
    }
}

TEST(RingClusterSync, SameCutAverageIsBitIdentical) {
  const State l0 = layerState("0", 5, 1), l1 = layerState("1", 2, 2);
  auto names = [](const State& s) {
    std::vector<std::string> n;
    for (const auto& [k, v] : s) n.push_back(k);
    return n;
  };
  std::vector<TestNode> nodes = {{"c0s0", 0, names(l0)}, {"c0s1", 0, names(l1)},
                                 {"c1s0", 1, names(l0)}, {"c1s1", 1, names(l1)}};
  std::vector<TestRing> rings = {{"ring_0", names(l0), {"c0s0", "c1s0"}},
                                 {"ring_1", names(l1), {"c0s1", "c1s1"}}};
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
  auto names = [](const State& s) {
    std::vector<std::string> n;
    for (const auto& [k, v] : s) n.push_back(k);
    return n;
  };
  // Cluster 0: one node with everything; cluster 1: {0} and {1, 2}.
  std::vector<std::string> n12 = names(merge(l1, l2));
  std::vector<TestNode> nodes = {{"a", 0, names(merge(merge(l0, l1), l2))},
                                 {"b", 1, names(l0)},
                                 {"c", 1, n12}};
  std::vector<TestRing> rings = {{"ring_0", names(l0), {"a", "b"}}, {"ring_1", n12, {"a", "c"}}};
  std::vector<State> before(3), after(3);
  runNodes(nodes, rings, {merge(merge(l0, l1), l2), l0, merge(l1, l2)}, {},
           [&](size_t i, RingClusterSync& sync, auto& stage) {
             perturb(stage, int(i) + 1);
             before[i] = stateOf(stage);
             sync.synchronize();
             after[i] = stateOf(stage);
           });
  expectAverages(before, after, rings, nodes);
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

}  // namespace
}  // namespace cairn
