#include <gtest/gtest.h>

#include "node/testing/FaultyTransport.h"
#include "node/transport/ZmqTransport.h"

namespace cairn {
namespace {

using namespace std::chrono_literals;

struct Pair {
  zmq::context_t context;
  ZmqTransport a{context, "a", "inproc://fa"}, b{context, "b", "inproc://fb"};
  FaultyTransport faulty_a{a};
  Pair() {
    faulty_a.addPeer("b", "inproc://fb");
    b.addPeer("a", "inproc://fa");
  }
};

Message numbered(int i) {
  Message m;
  m.kind = MessageKind::kActivation;
  m.sender = "a";
  m.microbatch = i;
  m.tensors = {{"x", torch::full({8}, float(i))}};
  return m;
}

std::vector<int> drain(Transport& t) {
  std::vector<int> ids;
  while (auto m = t.receive(100ms)) ids.push_back(static_cast<int>(m->microbatch));
  return ids;
}

TEST(FaultyTransport, DropEveryThirdLosesExactlyThose) {
  Pair p;
  p.faulty_a.setDropEvery(3);
  for (int i = 1; i <= 9; ++i) ASSERT_EQ(p.faulty_a.send("b", numbered(i), 1s), SendStatus::kSent);
  EXPECT_EQ(drain(p.b), (std::vector<int>{1, 2, 4, 5, 7, 8}));
  EXPECT_EQ(p.faulty_a.dropped(), 3u);
}

TEST(FaultyTransport, DuplicateDeliversTwice) {
  Pair p;
  p.faulty_a.setDuplicate(true);
  ASSERT_EQ(p.faulty_a.send("b", numbered(5), 1s), SendStatus::kSent);
  EXPECT_EQ(drain(p.b), (std::vector<int>{5, 5}));
}

TEST(FaultyTransport, CorruptFlipsExactlyOneBitOfTensorData) {
  Pair p;
  p.faulty_a.setCorrupt(true);
  const Message m = numbered(3);
  ASSERT_EQ(p.faulty_a.send("b", m, 1s), SendStatus::kSent);
  auto got = p.b.receive(1s);
  ASSERT_TRUE(got);
  const auto& x = got->tensors[0].tensor;
  const auto& y = m.tensors[0].tensor;
  ASSERT_EQ(x.nbytes(), y.nbytes());
  int differing_bits = 0;
  for (size_t i = 0; i < x.nbytes(); ++i)
    differing_bits += __builtin_popcount(static_cast<const uint8_t*>(x.data_ptr())[i] ^
                                         static_cast<const uint8_t*>(y.data_ptr())[i]);
  EXPECT_EQ(differing_bits, 1);
  EXPECT_TRUE(torch::equal(y, torch::full({8}, 3.0f))) << "the sender's tensor must be untouched";
}

TEST(FaultyTransport, DisconnectCutsBothDirectionsAndReconnectRestores) {
  Pair p;
  p.faulty_a.disconnect("b");
  EXPECT_EQ(p.faulty_a.send("b", numbered(1), 50ms), SendStatus::kTimedOut);
  Message from_b = numbered(2);
  from_b.sender = "b";
  ASSERT_EQ(p.b.send("a", from_b, 1s), SendStatus::kSent);
  EXPECT_FALSE(p.faulty_a.receive(200ms).has_value());  // discarded: the link is cut
  p.faulty_a.reconnect("b");
  ASSERT_EQ(p.faulty_a.send("b", numbered(3), 1s), SendStatus::kSent);
  EXPECT_EQ(drain(p.b), (std::vector<int>{3}));
}

TEST(FaultyTransport, CutPeerIsReportedDisconnectedSinceTheCut) {
  Pair p;
  EXPECT_EQ(p.faulty_a.liveness("b").state, PeerState::kUnknown);  // inproc ZmqTransport: unknown
  const auto before = std::chrono::steady_clock::now();
  p.faulty_a.disconnect("b");
  const PeerLiveness cut = p.faulty_a.liveness("b");
  EXPECT_EQ(cut.state, PeerState::kDisconnected);
  EXPECT_GE(cut.since, before);
  p.faulty_a.reconnect("b");
  EXPECT_EQ(p.faulty_a.liveness("b").state, PeerState::kUnknown);
  p.faulty_a.disconnectAll(true);
  EXPECT_EQ(p.faulty_a.liveness("b").state, PeerState::kDisconnected);
  EXPECT_EQ(p.faulty_a.liveness("anyone").state, PeerState::kDisconnected);
}

TEST(FaultyTransport, DisconnectAfterSendsCutsEverythingAfterTheNth) {
  Pair p;
  ASSERT_EQ(p.faulty_a.send("b", numbered(1), 1s), SendStatus::kSent);  // before: not counted
  p.faulty_a.setDisconnectAfterSends(2);
  EXPECT_EQ(p.faulty_a.send("b", numbered(2), 1s), SendStatus::kSent);
  EXPECT_EQ(p.faulty_a.send("b", numbered(3), 1s), SendStatus::kSent);
  EXPECT_EQ(p.faulty_a.liveness("b").state, PeerState::kUnknown);
  EXPECT_EQ(p.faulty_a.send("b", numbered(4), 50ms), SendStatus::kTimedOut);
  EXPECT_EQ(p.faulty_a.liveness("b").state, PeerState::kDisconnected);
  EXPECT_EQ(drain(p.b), (std::vector<int>{1, 2, 3}));
}

TEST(FaultyTransport, DelayHoldsEachSend) {
  Pair p;
  p.faulty_a.setDelay(100ms);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(p.faulty_a.send("b", numbered(1), 1s), SendStatus::kSent);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
}

TEST(FaultyTransport, BandwidthHoldsEachSendForItsBytes) {
  Pair p;
  p.faulty_a.setBandwidth(8 * 1000.0);  // 8 float32 = 32 bytes per message: 4 ms each
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) ASSERT_EQ(p.faulty_a.send("b", numbered(i), 1s), SendStatus::kSent);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 40ms);
  EXPECT_EQ(drain(p.b).size(), 10u);
}

}  // namespace
}  // namespace cairn
