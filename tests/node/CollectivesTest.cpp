// Collectives: ranks as threads over inproc:// (one zmq context, CollectivesHarness.h),
// parametrised over group size × element count × dtype, and the ring's messages under load,
// forgery and malformed chunks. Every result is compared with a direct computation from all
// ranks' inputs (CollectiveChecks). Members lost, silent, replaced or leaving:
// CollectivesFailuresTest.cpp; ranks as processes: CollectivesOverProcessesTest.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <sstream>
#include <thread>

#include "core/Error.h"
#include "node/ring/RingState.h"
#include "node/transport/ZmqTransport.h"
#include "tests/node/CollectiveChecks.h"
#include "tests/node/CollectivesHarness.h"

// The harness (CollectivesHarness.h) is cairn::testing's: so are these tests.
namespace cairn::testing {
namespace {

using Clock = std::chrono::steady_clock;

class CollectivesOverThreads : public ::testing::TestWithParam<CollectiveCase> {};

TEST_P(CollectivesOverThreads, MatchDirectComputation) {
  const auto [n, numel, dtype] = GetParam();
  std::vector<testing::CheckResult> results(n);
  auto outcomes =
      runRanks(n, overThreadsOptions(), [&, dtype = dtype, numel = numel](int r, ProcessGroup& g) {
        results[r] = testing::checkAllCollectives(g, dtype, numel);
      });
  testing::clearCaches();
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(outcomes[r].error, "") << "rank " << r;
    for (const auto& f : results[r].failures) ADD_FAILURE() << "rank " << r << ": " << f;
  }
  // Every block is finished by one rank and copied to the others: the results are bit-identical.
  for (int r = 1; r < n; ++r)
    EXPECT_TRUE(torch::equal(results[r].all_reduce_sum, results[0].all_reduce_sum)) << "rank " << r;
}

const auto kAllDtypes = ::testing::Values(torch::kFloat32, torch::kFloat16, torch::kBFloat16,
                                          torch::kFloat64, torch::kInt64, torch::kInt32,
                                          torch::kUInt8, torch::kBool);

INSTANTIATE_TEST_SUITE_P(Small, CollectivesOverThreads,
                         ::testing::Combine(::testing::Range(1, 9),
                                            ::testing::Values<int64_t>(0, 1, 7, 1000), kAllDtypes),
                         caseName);
// 2.5 * 10^5 elements (many pipelined segments): every group size in float32; two sizes (odd, and
// the largest) for float16 (float32 partials) and int64 (exact); one for the other dtypes — enough
// to cover each reduction path without a long suite.
INSTANTIATE_TEST_SUITE_P(Large, CollectivesOverThreads,
                         ::testing::Combine(::testing::Range(1, 9),
                                            ::testing::Values<int64_t>(250000),
                                            ::testing::Values(torch::kFloat32)),
                         caseName);
INSTANTIATE_TEST_SUITE_P(LargeOtherDtypes, CollectivesOverThreads,
                         ::testing::Combine(::testing::Values(3, 8),
                                            ::testing::Values<int64_t>(250000),
                                            ::testing::Values(torch::kFloat16, torch::kInt64)),
                         caseName);
INSTANTIATE_TEST_SUITE_P(LargeRemainingDtypes, CollectivesOverThreads,
                         ::testing::Combine(::testing::Values(5),
                                            ::testing::Values<int64_t>(250000),
                                            ::testing::Values(torch::kBFloat16, torch::kFloat64,
                                                              torch::kInt32, torch::kUInt8,
                                                              torch::kBool)),
                         caseName);

// Tiny segments and a window of one or two messages: many more messages than the window, so
// the ring's flow control (send t once t−m arrived, at most max_in_flight ahead) is exercised.
TEST(Collectives, ManyTinySegmentsThroughANarrowWindow) {
  for (int window : {1, 2, 5}) {
    for (int n : {2, 3, 5}) {
      ProcessGroupOptions options = testOptions();
      options.segment_bytes = 8;
      options.max_in_flight = window;
      std::vector<testing::CheckResult> results(n);
      auto outcomes = runRanks(n, options, [&](int r, ProcessGroup& g) {
        results[r] = testing::checkAllCollectives(g, torch::kFloat32, 1000);
      });
      testing::clearCaches();
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(outcomes[r].error, "") << "window " << window << " n " << n << " rank " << r;
        for (const auto& f : results[r].failures)
          ADD_FAILURE() << "window " << window << " n " << n << " rank " << r << ": " << f;
      }
    }
  }
}

// Two groups over the same four nodes' mailboxes, members in different orders: node 3 belongs
// only to group "b" and starts it at once, so its chunks reach nodes 1 and 2 while they are
// still inside group "a"'s all-reduce. Each group's result must be its own members' sum.
TEST(Collectives, ConcurrentGroupsDoNotConfuseMessages) {
  const auto names = rankNames(4);
  const std::vector<std::string> a = {"rank0", "rank1", "rank2"};
  const std::vector<std::string> b = {"rank3", "rank2", "rank1"};
  zmq::context_t context;
  std::vector<std::string> errors(4);
  std::vector<torch::Tensor> a_results(4), b_results(4);
  auto input = [](int node, int group_salt) {
    return torch::arange(5000, torch::kFloat64) * (node + 1) + group_salt;
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      try {
        ZmqTransport transport(context, names[r], "inproc://groups_" + names[r]);
        for (int p = 0; p < 4; ++p)
          if (p != r) transport.addPeer(names[p], "inproc://groups_" + names[p]);
        Mailbox mailbox(transport);
        ProcessGroupOptions options = testOptions();
        options.segment_bytes = 1024;  // many messages per operation
        std::optional<ProcessGroup> ga, gb;
        if (r != 3) ga.emplace(mailbox, "a", a, names[r], options);
        if (r != 0) gb.emplace(mailbox, "b", b, names[r], options);
        for (int round = 0; round < 3; ++round) {
          if (ga) {
            a_results[r] = input(r, 1000 * round);
            ga->allReduce(a_results[r]);
          }
          if (gb) {
            b_results[r] = input(r, 2000 * round + 7);
            gb->allReduce(b_results[r], ReduceOp::kMax);
          }
        }
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  const torch::Tensor a_expected = input(0, 2000) + input(1, 2000) + input(2, 2000);
  const torch::Tensor b_expected = torch::maximum(torch::maximum(input(1, 4007), input(2, 4007)),
                                                  input(3, 4007));
  for (int r : {0, 1, 2}) EXPECT_TRUE(torch::equal(a_results[r], a_expected)) << "rank " << r;
  for (int r : {1, 2, 3}) EXPECT_TRUE(torch::equal(b_results[r], b_expected)) << "rank " << r;
}

// An intruder sends chunks that look like ours: a wrong dtype and size claiming to be rank0, one
// from a name outside the group, and a stale one for an operation already finished. Each is
// dropped and counted, and the real all-reduces still give the right sums.
TEST(Collectives, MalformedAndForeignChunksAreDroppedAndCounted) {
  zmq::context_t context;
  ZmqTransport intruder(context, "intruder", "inproc://intr_x");
  intruder.addPeer("rank1", "inproc://intr_rank1");
  auto forged = [](const std::string& sender, uint64_t step, torch::Tensor t) {
    Message m;
    m.kind = MessageKind::kCollective;
    m.sender = sender;
    m.tag = "coll:test";
    m.step = step;
    m.microbatch = 0;
    m.tensors.push_back({"", t});
    return m;
  };
  // Queued before the group starts, so rank1 reads them before rank0's real chunk of step 0.
  ASSERT_EQ(intruder.send("rank1", forged("rank0", 0, torch::zeros({3}, torch::kFloat64)), 1s),
            SendStatus::kSent);
  ASSERT_EQ(intruder.send("rank1", forged("mallory", 0, torch::zeros({50})), 1s), SendStatus::kSent);

  ProcessGroupStats rank1_stats;
  torch::Tensor results[2];
  std::string errors[2];
  std::thread threads[2];
  std::atomic<bool> first_done{false};
  for (int r = 0; r < 2; ++r) {
    threads[r] = std::thread([&, r] {
      try {
        const auto names = rankNames(2);
        ZmqTransport transport(context, names[r], "inproc://intr_" + names[r]);
        transport.addPeer(names[1 - r], "inproc://intr_" + names[1 - r]);
        Mailbox mailbox(transport);
        ProcessGroup group(mailbox, "test", names, names[r], testOptions());
        torch::Tensor t = torch::full({100}, float(r + 1));
        group.allReduce(t);
        if (r == 1) {
          // A late copy of operation 0's chunk arrives during operation 1: stale.
          ASSERT_EQ(intruder.send("rank1", forged("rank0", 0, torch::zeros({50})), 1s),
                    SendStatus::kSent);
          first_done = true;
        } else {
          while (!first_done) std::this_thread::sleep_for(1ms);
        }
        results[r] = torch::full({100}, float(10 * (r + 1)));
        group.allReduce(results[r]);
        if (r == 1) rank1_stats = group.stats();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  for (auto& r : results) EXPECT_TRUE(torch::equal(r, torch::full({100}, 30.f)));
  EXPECT_EQ(rank1_stats.dropped_malformed, 2u);  // wrong dtype/size; non-member sender
  EXPECT_EQ(rank1_stats.dropped_stale, 1u);
  EXPECT_EQ(rank1_stats.operations, 2u);
}

// Direct exchanges (small groups) take chunks from several members in any order, keeping early
// ones aside. A forged chunk claiming to be rank2's reduce-scatter chunk (the wrong size) is kept
// aside at rank1 before rank2's real one, and both arrive while rank1 still waits for rank0: the
// forged one must not shadow the real one (it is dropped when rank2's chunk is asked for, the
// real one is taken). The order is made, not raced: rank1 holds both messages, puts them back
// forged first, and only then lets rank0 start.
TEST(Collectives, ForgedChunkDoesNotShadowTheRealOneInADirectExchange) {
  const int n = 3;
  const auto names = rankNames(n);
  zmq::context_t context;
  ZmqTransport intruder(context, "intruder", "inproc://shadow_x");
  intruder.addPeer("rank1", "inproc://shadow_rank1");
  Message forged;
  forged.kind = MessageKind::kCollective;
  forged.sender = "rank2";
  forged.tag = "coll:test";
  forged.step = 0;
  forged.microbatch = 0;
  forged.tensors.push_back({"", torch::zeros({3})});
  ASSERT_EQ(intruder.send("rank1", forged, 1s), SendStatus::kSent);

  // 12 KB (over the whole exchange's 64 bytes), blocks of 1000 float32 in one segment each: the
  // direct reduce-scatter and all-gather.
  const int64_t numel = 3000;
  std::vector<torch::Tensor> results(n);
  ProcessGroupStats rank1_stats;
  std::vector<std::string> errors(n);
  std::atomic<bool> queued{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        ZmqTransport transport(context, names[r], "inproc://shadow_" + names[r]);
        for (int p = 0; p < n; ++p)
          if (p != r) transport.addPeer(names[p], "inproc://shadow_" + names[p]);
        Mailbox mailbox(transport);
        ProcessGroupOptions options = testOptions();
        if (options.direct_max_members < n)  // the default must make this group direct
          throw std::runtime_error("direct_max_members is below the group's size");
        ProcessGroup group(mailbox, "test", names, names[r], options);
        if (r == 1) {
          std::vector<Message> held;  // the forged chunk and rank2's real one, in any order
          while (held.size() < 2) {
            auto m = mailbox.receive(
                [](const Message& m) { return m.tag == "coll:test" && m.sender == "rank2"; }, 10s);
            if (!m) throw std::runtime_error("the chunks claiming to be rank2's did not arrive");
            held.push_back(std::move(*m));
          }
          std::sort(held.begin(), held.end(), [](const Message& a, const Message& b) {
            return a.tensors.at(0).tensor.numel() < b.tensors.at(0).tensor.numel();
          });  // forged (3 values) first
          for (auto it = held.rbegin(); it != held.rend(); ++it) mailbox.putBack(*it);
          queued = true;
        } else if (r == 0) {
          while (!queued) std::this_thread::sleep_for(1ms);
        }
        results[size_t(r)] = torch::arange(numel, torch::kFloat32) * float(r + 1);
        group.allReduce(results[size_t(r)]);
        if (r == 1) rank1_stats = group.stats();
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
        queued = true;
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
  const torch::Tensor expected = torch::arange(numel, torch::kFloat32) * 6.f;
  for (int r = 0; r < n; ++r) EXPECT_TRUE(torch::equal(results[size_t(r)], expected)) << r;
  EXPECT_EQ(rank1_stats.dropped_malformed, 1u);
  EXPECT_EQ(rank1_stats.dropped_unexpected, 0u);
}

// Direct exchanges and the ring give the same exact results (integer sums, max) and both end
// bit-identical on every member for floats; barrier works either way. 1001 elements take the
// direct reduce-scatter and all-gather, 3 and 5 (≤ 64 bytes) the whole exchange.
TEST(Collectives, DirectExchangesAndTheRingAgree) {
  for (int n : {2, 3, 4, 6}) {
    std::vector<torch::Tensor> sums[2], maxes[2], averages[2], tiny_maxes[2], tiny_averages[2];
    for (int direct = 0; direct < 2; ++direct) {
      ProcessGroupOptions options = testOptions();
      options.direct_max_members = direct ? 16 : 0;
      sums[direct].resize(size_t(n));
      maxes[direct].resize(size_t(n));
      averages[direct].resize(size_t(n));
      tiny_maxes[direct].resize(size_t(n));
      tiny_averages[direct].resize(size_t(n));
      auto outcomes = runRanks(n, options, [&](int r, ProcessGroup& g) {
        torch::Tensor s = torch::arange(1001, torch::kLong) * (r + 1);
        g.allReduce(s);
        g.barrier();
        torch::Tensor m = torch::arange(1001, torch::kInt32) * ((r % 2) ? 1 : -1) + r;
        g.allReduce(m, ReduceOp::kMax);
        torch::Tensor a = torch::linspace(-1, 1, 1001) * float(r + 1) / 3.f;
        g.allReduce(a, ReduceOp::kAverage);
        g.barrier();
        torch::Tensor tm = torch::tensor({int64_t(r), int64_t(7 - r), int64_t(3)}, torch::kLong);
        g.allReduce(tm, ReduceOp::kMax);
        torch::Tensor ta = torch::linspace(-2, 3, 5) / float(r + 3);
        g.allReduce(ta, ReduceOp::kAverage);
        tiny_maxes[direct][size_t(r)] = tm;
        tiny_averages[direct][size_t(r)] = ta;
        sums[direct][size_t(r)] = s;
        maxes[direct][size_t(r)] = m;
        averages[direct][size_t(r)] = a;
      });
      for (int r = 0; r < n; ++r) ASSERT_EQ(outcomes[size_t(r)].error, "") << n << " " << r;
    }
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(torch::equal(sums[1][size_t(r)], sums[0][size_t(r)])) << n << " " << r;
      EXPECT_TRUE(torch::equal(maxes[1][size_t(r)], maxes[0][size_t(r)])) << n << " " << r;
      EXPECT_TRUE(torch::equal(averages[1][size_t(r)], averages[1][0])) << n << " " << r;
      EXPECT_TRUE(torch::equal(tiny_maxes[1][size_t(r)], tiny_maxes[0][size_t(r)])) << n << r;
      EXPECT_TRUE(torch::equal(tiny_averages[1][size_t(r)], tiny_averages[1][0])) << n << r;
      EXPECT_TRUE(torch::allclose(tiny_averages[1][size_t(r)], tiny_averages[0][size_t(r)]));
      EXPECT_TRUE(torch::allclose(averages[1][size_t(r)], averages[0][size_t(r)], 1e-6, 1e-6));
    }
  }
}

// A member that binds its endpoint but never joins the operation: everyone else gets PeerLost
// naming it — the neighbour that waits for it directly, the others through the abort — and
// within twice the timeout (a liveness bound, not a performance figure).

}  // namespace
}  // namespace cairn::testing
