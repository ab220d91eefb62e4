// Transport liveness over real livenessTcp loopback: ZeroMQ socket monitors (and ZMTP heartbeats) tell a
// node whether its connection to a peer is up. The reference is the peer's actual lifetime: the
// peer transport exists (kConnected), is destroyed (kDisconnected), exists again (kConnected).
#include <gtest/gtest.h>

#include <memory>

#include "node/transport/CurveSecurity.h"
#include "node/transport/ZmqTransport.h"
#include "tests/common/LoopbackPorts.h"

namespace cairn {
namespace {

using namespace std::chrono_literals;

// Ports from the kernel, fresh in every test process (tests/common/LoopbackPorts.h).
int livenessPort(int offset) {
  static const std::vector<int> ports = testutil::freeLoopbackPorts(8);
  return ports.at(offset);
}
std::string livenessTcp(int offset) { return "tcp://127.0.0.1:" + std::to_string(livenessPort(offset)); }

// Waits (blocking in receiveOrLivenessChange, woken by monitor events) until `peer` is in `want`
// or `limit` passed; returns the state seen last.
PeerState waitFor(ZmqTransport& t, const std::string& peer, PeerState want,
                  std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (t.liveness(peer).state != want) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left <= 0ms) break;
    (void)t.receiveOrLivenessChange(left);
  }
  return t.liveness(peer).state;
}

TEST(Liveness, PeerGoneIsDisconnectedAndBackIsConnected) {
  zmq::context_t a_context, b_context;  // separate contexts, as separate processes have
  ZmqTransport a(a_context, "a", livenessTcp(0));
  EXPECT_EQ(a.liveness("b").state, PeerState::kUnknown);  // not even added
  a.addPeer("b", livenessTcp(1));
  EXPECT_EQ(a.liveness("b").state, PeerState::kUnknown);  // nobody listens yet
  auto b = std::make_unique<ZmqTransport>(b_context, "b", livenessTcp(1));
  ASSERT_EQ(waitFor(a, "b", PeerState::kConnected, 10s), PeerState::kConnected);
  const auto connected_since = a.liveness("b").since;

  // A message still flows while connected.
  Message m;
  m.kind = MessageKind::kControl;
  m.sender = "a";
  m.tag = "ping";
  ASSERT_EQ(a.send("b", m, 5s), SendStatus::kSent);
  ASSERT_TRUE(b->receive(5s).has_value());

  b.reset();  // the peer goes away (its sockets close, as when its process dies)
  ASSERT_EQ(waitFor(a, "b", PeerState::kDisconnected, 10s), PeerState::kDisconnected);
  EXPECT_GT(a.liveness("b").since, connected_since);

  b = std::make_unique<ZmqTransport>(b_context, "b", livenessTcp(1));  // back at the same address
  ASSERT_EQ(waitFor(a, "b", PeerState::kConnected, 10s), PeerState::kConnected);
  ASSERT_EQ(a.send("b", m, 5s), SendStatus::kSent);
  auto got = b->receive(5s);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->tag, "ping");
}

TEST(Liveness, WorksOverCurveAndAWrongKeyNeverConnects) {
  const CurveKeyPair a_keys = generateCurveKeyPair(), b_keys = generateCurveKeyPair();
  zmq::context_t a_context, b_context;
  TransportOptions a_options;
  a_options.curve = CurveOptions{a_keys, {{"b", b_keys.public_key}, {"c", generateCurveKeyPair().public_key}}};
  ZmqTransport a(a_context, "a", livenessTcp(2), a_options);
  a.addPeer("b", livenessTcp(3));
  a.addPeer("c", livenessTcp(4));  // c listens with a key other than the one a expects: never "connected"

  auto makeServer = [&](zmq::context_t& context, const std::string& name, const CurveKeyPair& keys,
                        int offset) {
    TransportOptions options;
    options.curve = CurveOptions{keys, {{"a", a_keys.public_key}}};
    return std::make_unique<ZmqTransport>(context, name, livenessTcp(offset), options);
  };
  zmq::context_t c_context;
  ZapAuthenticator b_zap{b_context, {{a_keys.public_key, "a"}}};
  ZapAuthenticator c_zap{c_context, {{a_keys.public_key, "a"}}};
  auto c = makeServer(c_context, "c", generateCurveKeyPair(), 4);
  auto b = makeServer(b_context, "b", b_keys, 3);
  ASSERT_EQ(waitFor(a, "b", PeerState::kConnected, 10s), PeerState::kConnected);
  b.reset();
  ASSERT_EQ(waitFor(a, "b", PeerState::kDisconnected, 10s), PeerState::kDisconnected);
  b = makeServer(b_context, "b", b_keys, 3);
  ASSERT_EQ(waitFor(a, "b", PeerState::kConnected, 10s), PeerState::kConnected);
  EXPECT_EQ(a.liveness("c").state, PeerState::kUnknown);  // handshakes with c keep failing
}

}  // namespace
}  // namespace cairn
