// A node's transport when a peer's volunteer is replaced (docs/OPERATIONS.md "A lost volunteer is
// replaced by a spare"): a connection the peer's ZAP refused is dialled again once the peer
// admits the key (ZeroMQ itself never would), and repointPeer / LivePeers move a named peer to
// another address and CURVE key while the transport is in use. Real CurveZMQ on loopback. And
// redial: a peer restarted at the same address gets the next message over a new connection.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <thread>

#include "core/Error.h"
#include "node/transport/CurveSecurity.h"
#include "node/transport/LivePeers.h"
#include "node/transport/ZmqTransport.h"
#include "tests/common/LoopbackPorts.h"
#include "tests/common/TcpForwarder.h"

namespace cairn {
namespace {

using namespace std::chrono_literals;

int peerRepointPort(int offset) {
  static const std::vector<int> ports = testutil::freeLoopbackPorts(14);
  return ports.at(offset);
}
std::string address(int offset) { return "127.0.0.1:" + std::to_string(peerRepointPort(offset)); }
std::string peerRepointTcp(int offset) { return "tcp://" + address(offset); }

Message peerRepointTagged(const std::string& sender, float value) {
  Message m;
  m.kind = MessageKind::kActivation;
  m.sender = sender;
  m.tensors = {{"x", torch::full({4}, value)}};
  return m;
}

// A server "b" in its own context admitting `admitted` (public key → name).
struct Server {
  CurveKeyPair keys = generateCurveKeyPair();
  zmq::context_t context;
  ZapAuthenticator zap;
  std::unique_ptr<ZmqTransport> t;
  Server(int offset, std::map<std::string, std::string> admitted, const std::string& client_key)
      : zap(context, std::move(admitted)) {
    TransportOptions o;
    o.curve = CurveOptions{keys, {{"a", client_key}}};
    t = std::make_unique<ZmqTransport>(context, "b", peerRepointTcp(offset), o);
  }
};

TEST(PeerRepoint, ARefusedKeyIsDialledAgainOnceThePeerAdmitsIt) {
  const CurveKeyPair a_keys = generateCurveKeyPair();
  Server b(0, {}, a_keys.public_key);  // admits nobody yet
  zmq::context_t ctx;
  TransportOptions o;
  o.curve = CurveOptions{a_keys, {{"b", b.keys.public_key}}};
  ZmqTransport a(ctx, "a", peerRepointTcp(1), o);
  a.addPeer("b", peerRepointTcp(0));
  EXPECT_EQ(a.send("b", peerRepointTagged("a", 1), 1s), SendStatus::kTimedOut);
  b.zap.setAllowed({{a_keys.public_key, "a"}});
  // Each send looks at the refusal and dials again; within a few the peer admits us.
  SendStatus status = SendStatus::kTimedOut;
  for (int i = 0; i < 20 && status != SendStatus::kSent; ++i) status = a.send("b", peerRepointTagged("a", 2), 500ms);
  ASSERT_EQ(status, SendStatus::kSent);
  auto got = b.t->receive(5s);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->sender, "a");
  EXPECT_TRUE(torch::equal(got->tensors[0].tensor, torch::full({4}, 2.0f)));
  EXPECT_GE(b.zap.rejected(), 1u);
}

TEST(PeerRepoint, APeerMovedToAnotherAddressAndKeyGetsTheNextMessages) {
  const CurveKeyPair a_keys = generateCurveKeyPair();
  auto old_b = std::make_unique<Server>(2, std::map<std::string, std::string>{{a_keys.public_key, "a"}},
                                        a_keys.public_key);
  const std::string old_key = old_b->keys.public_key;
  Server new_b(3, {{a_keys.public_key, "a"}}, a_keys.public_key);
  zmq::context_t ctx;
  TransportOptions o;
  o.curve = CurveOptions{a_keys, {{"b", old_key}}};
  ZmqTransport a(ctx, "a", peerRepointTcp(4), o);
  a.addPeer("b", peerRepointTcp(2));
  ASSERT_EQ(a.send("b", peerRepointTagged("a", 1), 5s), SendStatus::kSent);
  ASSERT_TRUE(old_b->t->receive(5s).has_value());
  // The old b is lost (its process gone); a sees its connection drop.
  old_b.reset();
  for (int i = 0; i < 100 && a.liveness("b").state != PeerState::kDisconnected; ++i)
    (void)a.receiveOrLivenessChange(100ms);
  ASSERT_EQ(a.liveness("b").state, PeerState::kDisconnected);
  // node.json now says b is at new_b's address with new_b's key.
  NodeSpec before;
  before.name = "a";
  RingSpec ring;
  ring.id = "ring_0";
  ring.members = {{"a", address(4), a_keys.public_key}, {"b", address(2), old_key}};
  before.rings = {ring};
  LivePeers live(a, nullptr, before);
  NodeSpec after = before;
  after.rings[0].members[1] = {"b", address(3), new_b.keys.public_key};
  EXPECT_EQ(live.apply(after), std::vector<std::string>{"b at " + address(3)});
  EXPECT_TRUE(live.apply(after).empty());  // nothing changed the second time
  ASSERT_EQ(a.send("b", peerRepointTagged("a", 7), 5s), SendStatus::kSent);
  auto got = new_b.t->receive(5s);
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(torch::equal(got->tensors[0].tensor, torch::full({4}, 7.0f)));
  EXPECT_FALSE(a.repointPeer("nobody", peerRepointTcp(3), new_b.keys.public_key));
  NodeSpec other = after;
  other.name = "c";
  EXPECT_THROW(live.apply(other), BadInput);
}

TEST(PeerRepoint, LivePeersAdmitsExactlyTheUpdatedKeys) {
  // The server side: its ZAP list becomes the updated node.json's keys (old key out, new key in).
  const CurveKeyPair old_a = generateCurveKeyPair(), new_a = generateCurveKeyPair();
  Server b(5, {{old_a.public_key, "a"}}, old_a.public_key);
  NodeSpec node;
  node.name = "b";
  node.downstream = PeerRef{"a", address(6), old_a.public_key};
  LivePeers live(*b.t, &b.zap, node);
  node.downstream->public_key = new_a.public_key;
  live.apply(node);
  zmq::context_t ctx;
  TransportOptions o;
  o.curve = CurveOptions{new_a, {{"b", b.keys.public_key}}};
  ZmqTransport a(ctx, "a", peerRepointTcp(6), o);
  a.addPeer("b", peerRepointTcp(5));
  ASSERT_EQ(a.send("b", peerRepointTagged("a", 3), 5s), SendStatus::kSent);
  auto got = b.t->receive(5s);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->sender, "a");  // the ZAP named the new key "a"
  // The old key is no longer admitted.
  zmq::context_t ctx2;
  o.curve = CurveOptions{old_a, {{"b", b.keys.public_key}}};
  ZmqTransport stale(ctx2, "a", peerRepointTcp(7), o);
  stale.addPeer("b", peerRepointTcp(5));
  EXPECT_EQ(stale.send("b", peerRepointTagged("a", 4), 1s), SendStatus::kTimedOut);
  EXPECT_FALSE(b.t->receive(300ms).has_value());
}

// Growing (docs/OPERATIONS.md "Growing"): a peers update naming a ring member node.json did not
// have adds it to the transport (with its key) and to the ZAP list, while another thread is
// blocked receiving on the same transport.
TEST(PeerRepoint, ANewRingMemberIsAddedWhileAnotherThreadReceives) {
  const CurveKeyPair a_keys = generateCurveKeyPair();
  Server b(8, {{a_keys.public_key, "a"}}, a_keys.public_key);
  zmq::context_t ctx;
  ZapAuthenticator zap(ctx, std::map<std::string, std::string>{});  // a admits nobody yet
  TransportOptions o;
  o.curve = CurveOptions{a_keys, {}};
  ZmqTransport a(ctx, "a", peerRepointTcp(9), o);
  NodeSpec before;
  before.name = "a";
  RingSpec ring;
  ring.id = "ring_0";
  ring.members = {{"a", address(9), a_keys.public_key}};
  before.rings = {ring};
  LivePeers live(a, &zap, before);
  std::optional<Message> got;
  std::thread receiver([&] { got = a.receive(20s); });
  NodeSpec after = before;
  after.rings[0].members.push_back({"b", address(8), b.keys.public_key});
  EXPECT_EQ(live.apply(after), std::vector<std::string>{"b at " + address(8) + " (new)"});
  EXPECT_TRUE(live.apply(after).empty());  // nothing new the second time
  ASSERT_EQ(a.send("b", peerRepointTagged("a", 5), 5s), SendStatus::kSent);
  auto at_b = b.t->receive(5s);
  ASSERT_TRUE(at_b.has_value());
  EXPECT_EQ(at_b->sender, "a");
  b.t->addPeer("a", peerRepointTcp(9));
  ASSERT_EQ(b.t->send("a", peerRepointTagged("b", 6), 5s), SendStatus::kSent);  // a's ZAP now admits b
  receiver.join();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->sender, "b");
  EXPECT_TRUE(torch::equal(got->tensors[0].tensor, torch::full({4}, 6.0f)));
}

// Transport::redial (what a ring member does when a peer asks to join with a new life,
// RingState.h PeerLives): the peer's process restarted at the same address, but this node's
// connection still ends at the old process, its close not seen yet — here the forwarder holds it
// open and carries nothing more, and heartbeats are off, so it never is seen. A message sent over
// it is lost; after redial the next one goes over a new connection, to the new process. Without
// redial it would go the same way as the lost one (this test then fails: nothing reaches new_b).
TEST(PeerRepoint, ARedialledPeerGetsTheNextMessageOverANewConnection) {
  zmq::context_t ctx;
  ZmqTransport old_b(ctx, "b", peerRepointTcp(10));
  ZmqTransport new_b(ctx, "b", peerRepointTcp(11));
  testing::TcpForwarder forwarder(peerRepointPort(12), peerRepointPort(10), peerRepointPort(11));
  TransportOptions o;
  o.heartbeat_interval = 0ms;  // the old connection is never found dead by itself
  ZmqTransport a(ctx, "a", peerRepointTcp(13), o);
  a.addPeer("b", peerRepointTcp(12));
  ASSERT_EQ(a.send("b", peerRepointTagged("a", 1), 5s), SendStatus::kSent);
  auto first = old_b.receive(5s);
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(torch::equal(first->tensors[0].tensor, torch::full({4}, 1.0f)));
  forwarder.freezeFirst();
  ASSERT_EQ(a.send("b", peerRepointTagged("a", 2), 5s), SendStatus::kSent);  // lost with the old one
  a.redial("b");
  a.redial("nobody");  // an unknown peer: nothing to do
  ASSERT_EQ(a.send("b", peerRepointTagged("a", 3), 5s), SendStatus::kSent);
  auto got = new_b.receive(10s);
  ASSERT_TRUE(got.has_value()) << "the message after redial went over the old connection";
  EXPECT_TRUE(torch::equal(got->tensors[0].tensor, torch::full({4}, 3.0f)));
  EXPECT_EQ(forwarder.accepted(), 2);
  EXPECT_FALSE(old_b.receive(100ms).has_value());  // the frozen connection carried nothing more
  EXPECT_FALSE(new_b.receive(100ms).has_value());  // and the lost message was not sent again
}

}  // namespace
}  // namespace cairn
