// RingClusterSync's "gradients" overlapped with backward (GradientOverlap.h, ClusterSyncHarness.h):
// gradient buckets, the overlapped all-reduce bit-identical to the non-overlapped one, a loss
// during it, and corrupt or non-finite gradient contributions.
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

// A device whose copies to the host run behind the host, as a GPU's do (trainer/Device.h), made
// on the CPU: toHostLater hands out a host tensor of NaNs that takes the values (as they were when
// the copy was asked for) only when its wait runs, so a reduction that read a copy without waiting
// would average NaN and every member would refuse. Counts the copies asked for, those asked for
// while the test's last backward of a step ran, and the waits.
class LateCopies final : public TensorPlacement {
 public:
  torch::Device device() const override { return torch::kCPU; }
  torch::Tensor toDevice(const torch::Tensor& t) const override { return t; }
  torch::Tensor toHost(const torch::Tensor& t) const override { return t; }
  HostCopy toHostLater(const torch::Tensor& t) const override {
    ++copies;
    if (in_last_backward) ++copies_in_last_backward;
    const torch::Tensor host = torch::full_like(t, NAN);
    const torch::Tensor values = t.clone();
    return {host, [this, host, values] {
              ++waits;
              host.copy_(values);
            }};
  }
  bool copiesLater() const override { return true; }

  mutable std::atomic<int> copies{0}, copies_in_last_backward{0}, waits{0};
  std::atomic<bool> in_last_backward{false};
};

struct OverlapRun {
  std::vector<State> trained = std::vector<State>(3);
  std::vector<RingClusterSyncStats> stats = std::vector<RingClusterSyncStats>(3);
};

// 3 clusters × 1 node (a 3-member ring: the reduction order per element matters), 2 micro-batches
// of 4 rows per cluster and step, SGD; the gradient buckets 64 bytes (one tensor or two each).
// `late`: one per cluster, its placement (LateCopies), set before start.
OverlapRun trainMlp(bool overlap, const std::vector<torch::Tensor>& xs,
                    const std::vector<torch::Tensor>& ys, double lr, int64_t bucket_bytes = 64,
                    const std::vector<std::shared_ptr<LateCopies>>& late = {}) {
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
  for (size_t c = 0; c < late.size(); ++c) setup.placements["x" + std::to_string(c)] = late[c];
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
                 if (!late.empty()) late[c]->in_last_backward = mb == 1;
                 loss.backward();
                 if (!late.empty()) late[c]->in_last_backward = false;
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

// On a device whose copies run behind the host (a GPU's), each gradient bucket is copied out by
// the backward that finishes it — flattened where it lives and its copy to the host started in the
// AccumulateGrad hook of its last parameter, so on a GPU the copy is queued right behind the
// kernels that computed it, not behind the rest of backward — and the communication thread waits
// for that copy before it reduces the bucket; the averaged buckets are written back after
// backward. The parameters equal the non-overlapped path's bit for bit. Of the 7 buckets, the 6
// whose parameters all get a gradient are copied out in backward, each as its gradients and its
// weights' largest magnitudes (2 copies); "0.unused" never gets one, so the thread flattens its
// bucket itself once backward is over.
TEST(RingClusterSyncOverlap, ABucketIsCopiedOutByTheBackwardThatFinishesIt) {
  const int steps = 3;
  const double lr = 0.1;
  at::Generator gen = at::detail::createCPUGenerator(6);
  std::vector<torch::Tensor> xs, ys;
  for (int s = 0; s < steps; ++s) {
    xs.push_back(at::randn({24, 6}, gen));
    ys.push_back(at::randn({24, 4}, gen));
  }
  std::vector<std::shared_ptr<LateCopies>> late;
  for (int c = 0; c < 3; ++c) late.push_back(std::make_shared<LateCopies>());
  const OverlapRun copied = trainMlp(true, xs, ys, lr, 64, late);
  const OverlapRun off = trainMlp(false, xs, ys, lr);
  for (size_t c = 0; c < 3; ++c) {
    const std::string cluster = "cluster " + std::to_string(c);
    expectSameState(copied.trained[c], off.trained[c], cluster + " copied out vs not overlapped");
    EXPECT_EQ(copied.stats[c].overlapped_gradient_syncs, steps) << cluster;
    EXPECT_EQ(copied.stats[c].buckets_copied_in_backward, steps * 6) << cluster;
    EXPECT_EQ(late[c]->copies.load(), steps * 6 * 2) << cluster;
    EXPECT_EQ(late[c]->copies_in_last_backward.load(), steps * 6 * 2) << cluster;
    EXPECT_EQ(late[c]->waits.load(), steps * 6 * 2) << cluster;
    EXPECT_EQ(off.stats[c].buckets_copied_in_backward, 0) << cluster;
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
  std::vector<char> untouched(3, 0);  // not vector<bool>: its bits share words across the threads
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
             untouched[i] = same ? 1 : 0;
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
}  // namespace cairn::testing
