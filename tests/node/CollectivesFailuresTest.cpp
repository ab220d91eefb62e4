// Collectives whose members fail (CollectivesHarness.h, ranks as threads): a silent, absent,
// replaced or leaving member ends the others' waits naming it; a stop asked ends a wait as
// interrupted; a leave from an earlier life of the group is not taken; bad arguments refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <sstream>
#include <thread>

#include "core/Error.h"
#include "node/ring/RingState.h"
#include "node/testing/FaultyTransport.h"
#include "node/transport/ZmqTransport.h"
#include "tests/node/CollectiveChecks.h"
#include "tests/node/CollectivesHarness.h"

// The harness (CollectivesHarness.h) is cairn::testing's: so are these tests.
namespace cairn::testing {
namespace {

using Clock = std::chrono::steady_clock;

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

// A transport whose record of one peer still says kDisconnected, since an hour ago, while messages
// from it flow: what a member sees of a peer admitted back into its ring (a new group) while the
// disconnection of that peer's previous life is still on record and its new connection is not up.
class StaleDisconnection : public FaultyTransport {
 public:
  StaleDisconnection(Transport& inner, std::string peer)
      : FaultyTransport(inner), peer_(std::move(peer)) {}
  PeerLiveness liveness(const std::string& peer) const override {
    if (peer == peer_) return {PeerState::kDisconnected, Clock::now() - std::chrono::hours(1)};
    return FaultyTransport::liveness(peer);
  }

 private:
  std::string peer_;
};

// The disconnected grace counts from the group's creation at the earliest: rank0 waits on rank1,
// whose disconnection rank0's transport has on record from long before the group, and rank1
// sends 300 ms later. rank0 must wait for it (the grace, 5 s, is not over) and both end with the
// exact sum. Before, rank0 dropped rank1 at its first look ("disconnected (transport) for over
// 5000 ms"): the soak's and RingClusterSyncGrowth's rejoining members, dropped right after their
// admission on a loaded machine.
TEST(Collectives, AMemberDisconnectedBeforeTheGroupWasMadeHasTheWholeGraceToConnect) {
  const std::vector<std::string> names = rankNames(2);
  const std::string prefix = "inproc://stale_grace_";
  zmq::context_t context;
  ProcessGroupOptions options = testOptions();
  options.disconnected_grace = 5s;
  std::vector<RankOutcome> outcomes(2);
  std::vector<torch::Tensor> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        ZmqTransport zmq(context, names[r], prefix + names[r]);
        zmq.addPeer(names[1 - r], prefix + names[1 - r]);
        StaleDisconnection stale(zmq, r == 0 ? names[1] : "nobody");
        Mailbox mailbox(stale);
        ProcessGroup group(mailbox, "stale", names, names[r], options);
        if (r == 1) std::this_thread::sleep_for(300ms);  // rank0 waits on it meanwhile
        torch::Tensor t = torch::full({1000}, float(r + 1));
        group.allReduce(t, ReduceOp::kSum);
        results[r] = t;
        zmq.flushAndClose(2000ms);
      } catch (const std::exception& e) {
        outcomes[r].error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(outcomes[r].error, "") << "rank" << r;
    if (results[r].defined()) {
      EXPECT_TRUE(torch::equal(results[r], torch::full({1000}, 3.0f))) << "rank" << r;
    }
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

}  // namespace
}  // namespace cairn::testing
