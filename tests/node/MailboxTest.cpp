#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "node/transport/Mailbox.h"
#include "node/transport/ZmqTransport.h"

namespace cairn {
namespace {

using namespace std::chrono_literals;

Message tagged(MessageKind kind, const std::string& tag) {
  Message m;
  m.kind = kind;
  m.tag = tag;
  m.sender = "a";
  return m;
}

// Sends to `peer` until a send would wait (its queue full); returns how many were queued (1000:
// it never filled).
int fillTheQueueTo(Mailbox& box, const std::string& peer) {
  int queued = 0;
  while (queued < 1000 && box.send(peer, tagged(MessageKind::kCollective, "fill"), 50ms) == SendStatus::kSent)
    ++queued;
  return queued;
}

TEST(Mailbox, SelectiveReceiveKeepsOthersInArrivalOrder) {
  zmq::context_t context;
  ZmqTransport a(context, "a", "inproc://mb_a"), b(context, "b", "inproc://mb_b");
  a.addPeer("b", "inproc://mb_b");
  for (const char* tag : {"x1", "y1", "x2", "y2"})
    ASSERT_EQ(a.send("b", tagged(tag[0] == 'x' ? MessageKind::kActivation : MessageKind::kGradient, tag), 1s),
              SendStatus::kSent);
  Mailbox box(b);
  auto isGradient = [](const Message& m) { return m.kind == MessageKind::kGradient; };
  auto isActivation = [](const Message& m) { return m.kind == MessageKind::kActivation; };
  auto g1 = box.receive(isGradient, 2s);
  ASSERT_TRUE(g1);
  EXPECT_EQ(g1->tag, "y1");
  EXPECT_EQ(box.buffered(), 1u);  // x1 was read past and kept
  auto g2 = box.receive(isGradient, 2s);
  ASSERT_TRUE(g2);
  EXPECT_EQ(g2->tag, "y2");
  auto x1 = box.receive(isActivation, 2s);
  auto x2 = box.receive(isActivation, 2s);
  ASSERT_TRUE(x1 && x2);
  EXPECT_EQ(x1->tag, "x1");
  EXPECT_EQ(x2->tag, "x2");
  EXPECT_FALSE(box.receive(isActivation, 50ms));
}

TEST(Mailbox, BoundedBufferDropsOldestUnwanted) {
  zmq::context_t context;
  ZmqTransport a(context, "a", "inproc://mbb_a"), b(context, "b", "inproc://mbb_b");
  a.addPeer("b", "inproc://mbb_b");
  for (int i = 0; i < 5; ++i)
    ASSERT_EQ(a.send("b", tagged(MessageKind::kControl, "junk" + std::to_string(i)), 1s), SendStatus::kSent);
  ASSERT_EQ(a.send("b", tagged(MessageKind::kGradient, "wanted"), 1s), SendStatus::kSent);
  Mailbox box(b, /*max_buffered=*/3);
  auto got = box.receive([](const Message& m) { return m.kind == MessageKind::kGradient; }, 2s);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->tag, "wanted");
  EXPECT_EQ(box.buffered(), 3u);
  EXPECT_EQ(box.droppedForSpace(), 2u);
  auto oldest = box.receive([](const Message&) { return true; }, 50ms);
  ASSERT_TRUE(oldest);
  EXPECT_EQ(oldest->tag, "junk2");
}

// Concurrent rings share one mailbox: several threads each wait for their own tag while one
// sender interleaves all tags over tcp. Reference: the order each tag was sent in. Every thread
// must get exactly its own messages, in that order, none lost, none taken by another thread.
TEST(Mailbox, ConcurrentReceiversEachGetTheirOwnMessagesInOrder) {
  zmq::context_t context;
  ZmqTransport a(context, "a", "inproc://mbc_a"), receiver(context, "b", "inproc://mbc_b");
  a.addPeer("b", "inproc://mbc_b");
  Mailbox box(receiver);
  constexpr int kTags = 4, kPerTag = 300;
  std::vector<std::vector<uint64_t>> got(kTags);
  std::vector<std::thread> threads;
  for (int t = 0; t < kTags; ++t)
    threads.emplace_back([&box, &got, t] {
      const std::string tag = "ring" + std::to_string(t);
      for (int i = 0; i < kPerTag; ++i) {
        auto m = box.receive([&tag](const Message& x) { return x.tag == tag; }, 20s);
        if (!m) return;  // the check below reports what is missing
        got[size_t(t)].push_back(m->step);
      }
    });
  // Bursts of 1..5 messages of one tag, tags in a seeded random order, so that every thread's
  // messages are often read (and filed) by the others.
  std::vector<int> next(kTags, 0);
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  auto draw = [&rng](int n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return int(rng % uint64_t(n));
  };
  for (int left = kTags * kPerTag; left > 0;) {
    const int t = draw(kTags), burst = 1 + draw(5);
    for (int c = 0; c < burst && next[size_t(t)] < kPerTag; ++c, --left) {
      Message m = tagged(MessageKind::kCollective, "ring" + std::to_string(t));
      m.step = uint64_t(next[size_t(t)]++);
      if (a.send("b", m, 10s) != SendStatus::kSent) {
        ADD_FAILURE() << "send to b timed out";
        left = 0;
        break;
      }
    }
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kTags; ++t) {
    ASSERT_EQ(got[size_t(t)].size(), size_t(kPerTag)) << "tag ring" << t;
    for (int i = 0; i < kPerTag; ++i)
      EXPECT_EQ(got[size_t(t)][size_t(i)], uint64_t(i)) << "ring" << t;
  }
  EXPECT_EQ(box.buffered(), 0u);
  EXPECT_EQ(box.droppedForSpace(), 0u);
}

// A thread blocked sending to a peer that reads nothing (its queue is full) must not keep another
// thread of the same node from receiving: the send and the receive hold different locks.
TEST(Mailbox, ABlockedSendDoesNotStopAnotherThreadReceiving) {
  zmq::context_t context;
  TransportOptions small;
  small.send_high_water_mark = 1;
  small.receive_high_water_mark = 1;
  ZmqTransport node(context, "n", "inproc://mbs_n", small);
  ZmqTransport slow(context, "slow", "inproc://mbs_slow", small);
  ZmqTransport other(context, "other", "inproc://mbs_other");
  node.addPeer("slow", "inproc://mbs_slow");
  other.addPeer("n", "inproc://mbs_n");
  Mailbox box(node);
  // Fill the path to "slow" until a send would wait.
  const int queued = fillTheQueueTo(box, "slow");
  ASSERT_LT(queued, 1000) << "the queue to slow never filled";
  std::atomic<bool> sending{true};
  SendStatus status = SendStatus::kTimedOut;
  std::thread blocked([&] {
    status = box.send("slow", tagged(MessageKind::kCollective, "late"), 60s);
    sending = false;
  });
  EXPECT_EQ(other.send("n", tagged(MessageKind::kCollective, "hello"), 5s), SendStatus::kSent);
  auto got = box.receive([](const Message& m) { return m.tag == "hello"; }, 30s);
  EXPECT_TRUE(got);
  EXPECT_TRUE(sending) << "the receive waited for the blocked send to end";
  // Now "slow" reads; the blocked send gets its room and completes.
  int drained = 0;
  while (sending || drained <= queued) {
    if (!slow.receive(100ms)) {
      if (!sending) break;
      continue;
    }
    ++drained;
  }
  blocked.join();
  EXPECT_EQ(status, SendStatus::kSent);
}

// A node whose only thread waits to send (its queue to "slow" full) still reads its inbound
// socket: each slice of the wait files what has arrived in the mailbox (Mailbox::
// drainWhileSending). "other" sends 40 messages through queues of one message each way; without
// the drain its third send would wait until its timeout and fail, nobody reading "n". With it all
// 40 are sent while n's send still waits ("slow" reads nothing until they are), and n's mailbox
// holds them in order. (libzmq 4.3.4 aborts a process that stopped reading a connection whose
// peer then gave it up: the 24-volunteer soak.)
TEST(Mailbox, ABlockedSendKeepsTheInboundFlowingIntoTheBuffer) {
  zmq::context_t context;
  TransportOptions small;
  small.send_high_water_mark = 1;
  small.receive_high_water_mark = 1;
  ZmqTransport node(context, "n", "inproc://mbd_n", small);
  ZmqTransport slow(context, "slow", "inproc://mbd_slow", small);
  ZmqTransport other(context, "other", "inproc://mbd_other", small);
  node.addPeer("slow", "inproc://mbd_slow");
  other.addPeer("n", "inproc://mbd_n");
  Mailbox box(node);
  ASSERT_LT(fillTheQueueTo(box, "slow"), 1000) << "the queue to slow never filled";
  std::atomic<bool> sending{true};
  SendStatus status = SendStatus::kTimedOut;
  std::thread blocked([&] {
    status = box.send("slow", tagged(MessageKind::kCollective, "late"), 120s);
    sending = false;
  });
  constexpr int kMessages = 40;
  int sent = 0;
  for (int i = 0; i < kMessages; ++i) {
    if (other.send("n", tagged(MessageKind::kCollective, "m" + std::to_string(i)), 20s) !=
        SendStatus::kSent)
      break;  // nobody read n for 20 s
    ++sent;
  }
  EXPECT_EQ(sent, kMessages);
  EXPECT_TRUE(sending) << "the send to slow ended before slow read anything";
  // Let the blocked send finish, then every message is in the buffer, in order.
  while (sending) (void)slow.receive(100ms);
  blocked.join();
  EXPECT_EQ(status, SendStatus::kSent);
  for (int i = 0; i < kMessages; ++i) {
    auto got = box.receive([](const Message&) { return true; }, 5s);
    ASSERT_TRUE(got) << i;
    EXPECT_EQ(got->tag, "m" + std::to_string(i));
  }
}

}  // namespace
}  // namespace cairn
