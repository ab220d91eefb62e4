// The harness of the RingClusterSync tests (ClusterSync*Test.cpp): nodes of several "clusters" as
// threads, each with its own ZmqTransport (over inproc://, or tcp on loopback for a node that
// restarts) wrapped in a FaultyTransport, its mailbox and RingClusterSync; the layer states they
// start from, a stand-in for local training, and the checks against direct computations.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "node/ring/RingClusterSync.h"
#include "node/testing/FaultyTransport.h"
#include "node/transport/ZmqTransport.h"
#include "tests/common/LoopbackPorts.h"
#include "tests/node/RingTestStages.h"
#include "trainer/Device.h"

namespace cairn::testing {

inline std::vector<std::string> namesOf(const State& s) {
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

inline std::atomic<int> run_counter{0};

// Endpoints: `prefix` + name (inproc), or, for a prefix "tcp:<port>,<port>,...", tcp on loopback
// with those ports for the members in cluster order (a node that restarts must be reachable
// again, which ZeroMQ's inproc transport does not do for a peer that rebinds).
inline std::string endpointFor(const std::string& prefix, const std::string& name,
                               const std::vector<std::string>& members) {
  if (prefix.rfind("tcp:", 0) != 0) return prefix + name;
  const auto at = std::find(members.begin(), members.end(), name) - members.begin();
  size_t start = 4;
  for (auto i = 0; i < at; ++i) start = prefix.find(',', start) + 1;
  return "tcp://127.0.0.1:" + prefix.substr(start, prefix.find(',', start) - start);
}

// The "tcp:<port>,..." prefix of `count` members on free loopback ports (tests/common/LoopbackPorts.h).
inline std::string tcpPrefix(int count) {
  std::string prefix = "tcp:";
  for (int port : testutil::freeLoopbackPorts(count)) prefix += std::to_string(port) + ",";
  prefix.pop_back();
  return prefix;
}

inline NodeSpec specOf(const TestNode& node, const std::vector<TestRing>& rings,
                       const std::string& prefix) {
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
  // By node name: the placement given to setPlacement before start() (none: not called).
  std::map<std::string, std::shared_ptr<const TensorPlacement>> placements;
};

using MemberBody = std::function<void(RingClusterSync&, torch::jit::Module&, FaultyTransport&)>;

// One node's life: its transport (wrapped in a FaultyTransport), mailbox and RingClusterSync.
inline void runMember(zmq::context_t& context, const std::string& prefix, const TestNode& node,
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
  // The ring sync is destroyed before the transport closes: its welcome desk's thread
  // (node/ring/RingWelcomeDesk.h) polls the transport until then, and flushAndClose must not run
  // beside any other call. Closed with the desk still polling (a cut-off member alone in its
  // ring), libzmq aborted the test process (signaler.cpp:265). ProviderRun leaves the rings first.
  {
    RingClusterSync sync(mailbox, spec, options, setup.local_steps, setup.timeout, setup.gradients);
    sync.setJoining(setup.joining);
    torch::jit::Module stage = makeStage(initial);
    if (setup.before_start) setup.before_start(sync, faulty);
    const auto placement = setup.placements.find(spec.name);
    if (placement != setup.placements.end()) sync.setPlacement(placement->second);
    sync.start(stage);
    body(sync, stage, faulty);
  }
  transport.flushAndClose(std::chrono::milliseconds(2000));
}

// Runs body(i, sync, stage) for every node on its own thread; rethrows the first error.
inline void runNodes(const std::vector<TestNode>& nodes, const std::vector<TestRing>& rings,
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

inline State layerState(const std::string& layer, int64_t width, uint64_t seed) {
  torch::manual_seed(seed);
  return {{layer + ".weight", torch::randn({width, 3})},
          {layer + ".bias", torch::randn({width}, torch::kDouble)},
          {layer + ".running_mean", torch::randn({width})},
          {layer + ".num_batches_tracked", torch::tensor(int64_t(5))}};
}

inline State merge(State a, const State& b) {
  a.insert(b.begin(), b.end());
  return a;
}

// Local training stand-in: every tensor moves by node-specific noise (integers by +node).
inline void perturb(torch::jit::Module& stage, int node) {
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
inline void expectAverages(const std::vector<State>& before, const std::vector<State>& after,
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

inline const std::vector<std::string> kThree = {"x0", "x1", "x2"};

inline std::vector<TestNode> threeNodes(const State& s) {
  return {{"x0", 0, namesOf(s)}, {"x1", 1, namesOf(s)}, {"x2", 2, namesOf(s)}};
}


inline void expectSameState(const State& a, const State& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, t] : a)
    EXPECT_TRUE(torch::equal(t, b.at(name))) << what << ": " << name << " differs";
}


// Sends the lost member makes before it vanishes: the join agreement (one 3-element all-reduce,
// 4 sends) and 5 sends of the values: it dies inside the second bucket's all-reduce.
inline constexpr uint64_t kDieAfterSends = 4 + 5;

// Silent corruption (issue [Q]): flips bit 30 of float `index` of parameter `name` (the top
// exponent bit: 0.3 becomes ~1e38, a value of magnitude >= 1 becomes inf or NaN).
inline void flipBit30(torch::jit::Module& stage, const std::string& name, int64_t index) {
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

}  // namespace cairn::testing
