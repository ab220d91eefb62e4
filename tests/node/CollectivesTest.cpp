// Collectives: ranks as threads over inproc:// (one zmq context), parametrised over group size ×
// element count × dtype, and ranks as processes over tcp://127.0.0.1 (collectives_rank). Every
// result is compared with a direct computation from all ranks' inputs (CollectiveChecks).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "core/Error.h"
#include "node/ring/RingState.h"
#include "node/transport/ZmqTransport.h"
#include "tests/common/LoopbackPorts.h"
#include "tests/node/CollectiveChecks.h"

#ifndef CAIRN_COLLECTIVES_RANK_BINARY
#error "the build passes the path of collectives_rank"
#endif

namespace cairn {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::vector<std::string> rankNames(int n) {
  std::vector<std::string> names;
  for (int r = 0; r < n; ++r) names.push_back("rank" + std::to_string(r));
  return names;
}

// What each rank thread ended with: "" or the error it threw (with its kind).
struct RankOutcome {
  std::string error;
  std::optional<ErrorKind> kind;
};

// Runs body(rank, group) on one thread per rank, each with its own ZmqTransport over inproc://
// and a ProcessGroup over its Mailbox. `silent` ranks bind their transport but never call a
// collective (they hold it until the others are done); `absent` ranks never bind at all.
std::vector<RankOutcome> runRanks(int n, const ProcessGroupOptions& options,
                                  const std::function<void(int, ProcessGroup&)>& body,
                                  std::vector<int> silent = {}, std::vector<int> absent = {}) {
  static std::atomic<int> run_counter{0};
  const std::string prefix = "inproc://collectives" + std::to_string(run_counter++) + "_";
  const auto names = rankNames(n);
  zmq::context_t context;
  std::vector<RankOutcome> outcomes(n);
  std::atomic<int> active{0};
  std::vector<std::thread> threads;
  auto contains = [](const std::vector<int>& v, int r) {
    return std::find(v.begin(), v.end(), r) != v.end();
  };
  for (int r = 0; r < n; ++r) {
    if (contains(absent, r) || contains(silent, r)) continue;
    ++active;
  }
  for (int r = 0; r < n; ++r) {
    if (contains(absent, r)) continue;
    threads.emplace_back([&, r] {
      try {
        ZmqTransport transport(context, names[r], prefix + names[r]);
        for (int p = 0; p < n; ++p)
          if (p != r) transport.addPeer(names[p], prefix + names[p]);
        if (contains(silent, r)) {
          while (active.load() > 0) std::this_thread::sleep_for(5ms);
          return;
        }
        Mailbox mailbox(transport);
        ProcessGroup group(mailbox, "test", names, names[r], options);
        try {
          body(r, group);
        } catch (...) {
          --active;
          throw;
        }
        --active;
      } catch (const Error& e) {
        outcomes[r] = {e.what(), e.kind()};
      } catch (const std::exception& e) {
        outcomes[r] = {e.what(), std::nullopt};
      }
    });
  }
  for (auto& t : threads) t.join();
  return outcomes;
}

ProcessGroupOptions testOptions() {
  ProcessGroupOptions options;
  options.timeout = 20s;            // a hang fails the test instead of stalling it
  options.segment_bytes = 64 * 1024;  // 10^6 elements cross the wire in many pipelined segments
  return options;
}

// The parametrised cases' groups cut a large tensor into 16 KiB segments: 2.5 * 10^5 float32
// elements cross in as many pipelined segments (62) as 10^6 did in testOptions()' 64 KiB, with a
// quarter of the bytes to copy and reduce; every block of a large case still spans several
// segments (a ring, not a direct exchange), and the small cases (<= 8 KB) fit one either way.
ProcessGroupOptions overThreadsOptions() {
  ProcessGroupOptions options = testOptions();
  options.segment_bytes = 16 * 1024;
  return options;
}

using CollectiveCase = std::tuple<int, int64_t, torch::ScalarType>;

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

std::string caseName(const ::testing::TestParamInfo<CollectiveCase>& info) {
  const auto [n, numel, dtype] = info.param;
  return "n" + std::to_string(n) + "_numel" + std::to_string(numel) + "_" + dtypeName(dtype);
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
TEST(Collectives, SilentMemberYieldsPeerLostNamingIt) {
  for (int silent : {0, 2}) {
    const int n = 4;
    ProcessGroupOptions options = testOptions();
    options.timeout = 600ms;
    const auto start = Clock::now();
    std::vector<Clock::duration> took(n);
    auto outcomes = runRanks(
        n, options,
        [&](int r, ProcessGroup& g) {
          torch::Tensor t = torch::ones({300000});
          try {
            g.allReduce(t);
          } catch (...) {
            took[r] = Clock::now() - start;
            throw;
          }
        },
        /*silent=*/{silent});
    for (int r = 0; r < n; ++r) {
      if (r == silent) continue;
      EXPECT_EQ(outcomes[r].kind, ErrorKind::kPeerLost) << "rank " << r << ": " << outcomes[r].error;
      EXPECT_NE(outcomes[r].error.find("rank" + std::to_string(silent) + " "), std::string::npos)
          << "rank " << r << ": " << outcomes[r].error;
      EXPECT_LT(took[r], 2 * options.timeout) << "rank " << r;
    }
  }
}

// A member the caller says was replaced (ProcessGroupOptions::replaced: a spare took its node
// over, node/ring/RingState.h ReplacedMembers) is alive on the wire — bound, silent, like a
// replacement still replaying from its checkpoint — but will never send this group's chunks:
// the waits on it end at once as PeerLost naming it, not after the minute-long timeout (were
// `replaced` not asked, the errors would say "sent nothing for 60000 ms").
TEST(Collectives, ReplacedMemberEndsTheWaitsOnItAtOnce) {
  const int n = 3;
  ProcessGroupOptions options = testOptions();
  options.timeout = 60s;
  options.replaced = [](const std::string& member) { return member == "rank2"; };
  auto outcomes = runRanks(
      n, options, [](int, ProcessGroup& g) {
        torch::Tensor t = torch::ones({1000});
        g.allReduce(t);
      },
      /*silent=*/{2});
  int said_replaced = 0;
  for (int r : {0, 1}) {
    EXPECT_EQ(outcomes[r].kind, ErrorKind::kPeerLost) << "rank " << r << ": " << outcomes[r].error;
    EXPECT_NE(outcomes[r].error.find("rank2 "), std::string::npos) << "rank " << r << ": " << outcomes[r].error;
    EXPECT_EQ(outcomes[r].error.find("sent nothing"), std::string::npos) << outcomes[r].error;
    said_replaced += outcomes[r].error.find("was replaced") != std::string::npos;
  }
  EXPECT_GE(said_replaced, 1);
}

// A stop asked of this node (ProcessGroupOptions::interrupted: a signal, or its node given to
// another volunteer: the 24-volunteer soak's woken Root spent five minutes in its ring's waits on
// members that refused it, one minute each) ends a wait interrupt_after later as Interrupted, not
// after the timeout as PeerLost naming the silent member; the next operation throws at once.
TEST(Collectives, AStopAskedEndsAWaitOnASilentMemberAsInterrupted) {
  const int n = 3;
  ProcessGroupOptions options = testOptions();
  options.timeout = 60s;
  options.interrupt_after = 200ms;
  options.interrupted = [] { return true; };
  std::vector<std::string> first(n), second(n);
  auto outcomes = runRanks(
      n, options, [&](int r, ProcessGroup& g) {
        torch::Tensor t = torch::ones({1000});
        try {
          g.allReduce(t);
        } catch (const Interrupted& e) {
          first[r] = e.what();
        }
        try {
          g.barrier();
        } catch (const Interrupted& e) {
          second[r] = e.what();
        }
      },
      /*silent=*/{2});
  for (int r : {0, 1}) {
    EXPECT_EQ(outcomes[r].error, "") << "rank " << r << " threw something other than Interrupted";
    EXPECT_NE(first[r].find("group test allReduce #0: a stop was asked and, 200 ms later, this node "
                            "still waits"),
              std::string::npos)
        << "rank " << r << ": " << first[r];
    EXPECT_NE(second[r].find("barrier #1: a stop was asked"), std::string::npos)
        << "rank " << r << ": " << second[r];
  }
}

// ReplacedMembers: a mark counts for the groups made before it, not for those made after (the
// group that admits the replacement must wait on the new process like on any member).
TEST(ReplacedMembers, OnlyGroupsMadeBeforeTheMarkCountTheMemberAsGone) {
  ReplacedMembers replaced;
  const uint64_t before = replaced.epoch();
  EXPECT_FALSE(replaced.since("b", before));
  replaced.mark({"b"});
  const uint64_t after = replaced.epoch();
  EXPECT_TRUE(replaced.since("b", before));
  EXPECT_FALSE(replaced.since("a", before));
  EXPECT_FALSE(replaced.since("b", after));
  replaced.mark({"b", "c"});  // replaced again (its replacement was lost in turn)
  EXPECT_TRUE(replaced.since("b", after));
  EXPECT_TRUE(replaced.since("c", before));
}

// A member that never even started (nothing bound at its endpoint), and an operation after a
// failure: the group is broken and says so at once.
TEST(Collectives, AbsentMemberYieldsPeerLostAndTheGroupStaysBroken) {
  const int n = 3;
  ProcessGroupOptions options = testOptions();
  options.timeout = 400ms;
  std::vector<std::string> second_error(n);
  auto outcomes = runRanks(
      n, options,
      [&](int r, ProcessGroup& g) {
        try {
          g.barrier();
        } catch (const PeerLost&) {
          try {
            g.barrier();
          } catch (const PeerLost& again) {
            second_error[r] = again.what();
          }
          throw;
        }
      },
      /*silent=*/{}, /*absent=*/{1});
  for (int r : {0, 2}) {
    EXPECT_EQ(outcomes[r].kind, ErrorKind::kPeerLost) << outcomes[r].error;
    EXPECT_NE(outcomes[r].error.find("rank1 "), std::string::npos) << outcomes[r].error;
    EXPECT_EQ(second_error[r], outcomes[r].error);
  }
}

// A member that announces its leave: every other member fails at once naming it (lostByLeave),
// also the one blocked sending to it, with a timeout no test could wait for.
TEST(Collectives, LeaveMakesEveryOtherMemberFailNamingTheLeaver) {
  const int n = 4;
  ProcessGroupOptions options = testOptions();
  options.timeout = 600s;
  std::vector<std::string> lost(n);
  std::vector<int> by_leave(n, -1);
  auto outcomes = runRanks(n, options, [&](int r, ProcessGroup& g) {
    if (r == 3) {
      g.sendLeave(100ms);
      return;
    }
    torch::Tensor t = torch::ones({300000});
    try {
      g.allReduce(t);
    } catch (const PeerLost&) {
      lost[r] = g.lostPeer();
      by_leave[r] = g.lostByLeave() ? 1 : 0;
      throw;
    }
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(outcomes[r].kind, ErrorKind::kPeerLost) << "rank " << r << ": " << outcomes[r].error;
    EXPECT_NE(outcomes[r].error.find("rank3 (rank 3) left the group"), std::string::npos)
        << outcomes[r].error;
    EXPECT_EQ(lost[r], "rank3");
    EXPECT_EQ(by_leave[r], 1);
  }
  EXPECT_EQ(outcomes[3].error, "");
}

// A stage that stops and starts again (to apply new peers) makes its ring's group again with the
// same id, generation 0. The leave that a member sent when its earlier life ended may still be in
// the others' mailboxes: before the stamp check, the new group took it and failed naming a member
// that had not left (both sides then started alone). Here rank 2 ends a life of 4 operations with
// a leave (once all three are done with it), then a marker on the same pipe makes sure the leave (stamped #4) is in ranks 0 and 1's
// mailboxes before the group of the next life (same id) runs two all-reduces: both give the
// right sums on every rank, and ranks 0 and 1 each count the leave as stale.
TEST(Collectives, ALeaveLeftOverFromAnEarlierLifeOfTheGroupIsNotTaken) {
  const auto names = rankNames(3);
  zmq::context_t context;
  std::vector<std::string> errors(3);
  std::vector<torch::Tensor> results(3);
  std::vector<uint64_t> stale(3, 0);
  std::atomic<int> lives_done{0};  // the leave is sent once every rank is done with its life
  auto input = [](int r, int round) { return torch::arange(3000, torch::kFloat64) * (r + 1) + round; };
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      try {
        ZmqTransport transport(context, names[r], "inproc://lives_" + names[r]);
        for (int p = 0; p < 3; ++p)
          if (p != r) transport.addPeer(names[p], "inproc://lives_" + names[p]);
        Mailbox mailbox(transport);
        {
          ProcessGroup life(mailbox, "ring_0", names, names[r], testOptions());
          for (int round = 0; round < 4; ++round) {
            torch::Tensor t = input(r, round);
            life.allReduce(t);
          }
          ++lives_done;
          if (r == 2) {
            while (lives_done.load() < 3) std::this_thread::sleep_for(1ms);
            life.sendLeave(1000ms);
          }
        }
        Message marker;
        marker.kind = MessageKind::kCollective;
        marker.sender = names[r];
        marker.tag = "marker";
        if (r == 2) {
          for (int p : {0, 1}) ASSERT_EQ(mailbox.send(names[p], marker, 5000ms), SendStatus::kSent);
        } else {
          auto is_marker = [](const Message& m) { return m.tag == "marker"; };
          ASSERT_TRUE(mailbox.receive(is_marker, 20000ms)) << "rank " << r << ": no marker";
        }
        ProcessGroup next(mailbox, "ring_0", names, names[r], testOptions());
        for (int round = 10; round < 12; ++round) {
          results[r] = input(r, round);
          next.allReduce(results[r]);
        }
        stale[r] = next.stats().dropped_stale;
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  const torch::Tensor expected = input(0, 11) + input(1, 11) + input(2, 11);
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(torch::equal(results[r], expected)) << "rank " << r;
  EXPECT_GE(stale[0], 1u);
  EXPECT_GE(stale[1], 1u);
}

TEST(Collectives, RejectsBadArguments) {
  zmq::context_t context;
  ZmqTransport transport(context, "solo", "inproc://solo");
  Mailbox mailbox(transport);
  EXPECT_THROW(ProcessGroup(mailbox, "", {"solo"}, "solo"), BadInput);
  EXPECT_THROW(ProcessGroup(mailbox, "g", {"solo", "solo"}, "solo"), BadInput);
  EXPECT_THROW(ProcessGroup(mailbox, "g", {"a", "b"}, "solo"), BadInput);
  ProcessGroup group(mailbox, "g", {"solo"}, "solo");
  torch::Tensor ints = torch::ones({4}, torch::kInt64);
  EXPECT_THROW(group.allReduce(ints, ReduceOp::kAverage), BadInput);
  torch::Tensor flags = torch::ones({4}, torch::kBool);
  EXPECT_THROW(group.allReduce(flags, ReduceOp::kAverage), BadInput);
  torch::Tensor floats = torch::ones({4});
  EXPECT_THROW(group.broadcast(floats, 1), BadInput);
  torch::Tensor complex = torch::ones({4}, torch::kComplexFloat);
  EXPECT_THROW(group.allReduce(complex), BadInput);
  EXPECT_THROW(group.scatter(floats, {}, 0), BadInput);  // the root must pass one per rank
  // A rejected call consumes no sequence number: the group still works.
  group.allReduce(floats, ReduceOp::kAverage);
  EXPECT_TRUE(torch::equal(floats, torch::ones({4})));
}

// ---------------------------------------------------------------------------------------------
// Ranks as processes over tcp://127.0.0.1.

struct RankProcess {
  pid_t pid = -1;
  std::string stderr_path;
};

std::vector<RankProcess> startRanks(int n, const std::vector<std::string>& extra_args) {
  const auto ports = testutil::freeLoopbackPorts(n);  // tests/common/LoopbackPorts.h
  std::string port_list;
  for (int p : ports) port_list += (port_list.empty() ? "" : ",") + std::to_string(p);
  std::vector<RankProcess> ranks(n);
  for (int r = 0; r < n; ++r) {
    ranks[r].stderr_path = ::testing::TempDir() + "collectives_rank_" + std::to_string(::getpid()) +
                           "_" + std::to_string(r) + ".err";
    std::vector<std::string> args = {CAIRN_COLLECTIVES_RANK_BINARY, "--rank", std::to_string(r),
                                     "--ports", port_list};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    const pid_t pid = ::fork();
    if (pid == 0) {
      FILE* err = std::freopen(ranks[r].stderr_path.c_str(), "w", stderr);
      (void)err;
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ranks[r].pid = pid;
  }
  return ranks;
}

int waitForExit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

using ProcessCase = std::tuple<int, int64_t, torch::ScalarType>;
class CollectivesOverProcesses : public ::testing::TestWithParam<ProcessCase> {};

TEST_P(CollectivesOverProcesses, MatchDirectComputation) {
  const auto [n, numel, dtype] = GetParam();
  auto ranks = startRanks(n, {"--dtype", dtypeName(dtype), "--numel", std::to_string(numel)});
  for (int r = 0; r < n; ++r) {
    const int code = waitForExit(ranks[r].pid);
    EXPECT_EQ(code, 0) << "rank " << r << ": " << readFile(ranks[r].stderr_path);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tcp, CollectivesOverProcesses,
    ::testing::Values(ProcessCase{2, 1000000, torch::kFloat32}, ProcessCase{3, 1000, torch::kFloat16},
                      ProcessCase{4, 7, torch::kInt64}, ProcessCase{4, 1000000, torch::kBFloat16},
                      ProcessCase{5, 0, torch::kFloat64}, ProcessCase{3, 1, torch::kBool}),
    caseName);

// SIGKILL one rank while all of them all-reduce in a loop: every survivor exits with PeerLost
// (exit code 3) naming the killed rank (how long after the kill is printed: about twice the
// timeout on a quiet machine).
TEST(CollectivesOverProcessesKill, KilledRankIsNamedByEverySurvivor) {
  const int n = 4, victim = 2;
  const auto timeout = 1000ms;
  auto ranks = startRanks(n, {"--mode", "loop", "--timeout-ms", std::to_string(timeout.count())});
  // Kill only once every rank is inside the loop (has finished one all-reduce).
  for (int r = 0; r < n; ++r) {
    const auto give_up = Clock::now() + 60s;
    while (readFile(ranks[r].stderr_path).find("looping") == std::string::npos) {
      ASSERT_LT(Clock::now(), give_up) << "rank " << r << " never started looping";
      std::this_thread::sleep_for(20ms);
    }
  }
  const auto killed_at = Clock::now();
  ::kill(ranks[victim].pid, SIGKILL);
  EXPECT_EQ(waitForExit(ranks[victim].pid), 128 + SIGKILL);
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    const int code = waitForExit(ranks[r].pid);
    const auto took = Clock::now() - killed_at;
    const std::string err = readFile(ranks[r].stderr_path);
    EXPECT_EQ(code, 3) << "rank " << r << ": " << err;
    EXPECT_NE(err.find("rank" + std::to_string(victim) + " "), std::string::npos) << "rank " << r << ": " << err;
    // How fast is a figure, not an assertion (it depends on the machine's load): printed.
    std::printf("rank %d exited %lld ms after the kill (timeout %lld ms)\n", r,
                static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()),
                static_cast<long long>(timeout.count()));
  }
}

}  // namespace
}  // namespace cairn
