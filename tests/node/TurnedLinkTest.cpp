// Links turned around live (ZmqTransport::repointPeer → turnDirectLink): a node whose peer we
// dialled is now held by a dial-out-only volunteer (a dial-out-only spare took over a node placed
// reachable: coordinator/Replacement.h). A reachable node then accepts the new holder's dial
// (node/transport/ReversedLinks.h); a dial-out-only node meets it at a relay
// (node/transport/RelayedLinks.h). Real CurveZMQ on loopback, each node in its own context as in
// separate processes; the reference is what was sent: each message arrives, in order, from the
// new holder's key, and a send that was waiting for the lost holder when the link turned reaches
// the new one.
#include <gtest/gtest.h>

#include <future>
#include <map>
#include <memory>

#include "core/Error.h"
#include "node/transport/CurveSecurity.h"
#include "node/transport/Relay.h"
#include "node/transport/ZmqTransport.h"
#include "tests/node/LinkTestMessages.h"

namespace cairn {
namespace {

using namespace std::chrono_literals;

using testutil::linkTestEndpoint;
using testutil::linkTestMessage;

// A node in its own context, with a ZAP handler admitting `admitted` (key → name).
struct TurnedNode {
  CurveKeyPair keys = generateCurveKeyPair();
  zmq::context_t context;
  ZapAuthenticator zap;
  std::unique_ptr<ZmqTransport> t;
  // `endpoint` empty: dial-out only.
  TurnedNode(const std::string& name, const std::string& endpoint,
             std::map<std::string, std::string> admitted, std::map<std::string, std::string> peer_keys)
      : zap(context, std::move(admitted)) {
    TransportOptions o;
    o.curve = CurveOptions{keys, std::move(peer_keys)};
    o.dial_out_only = endpoint.empty();
    o.relay_resend_after = 100ms;
    t = std::make_unique<ZmqTransport>(context, name, endpoint, o);
  }
};

// `from` sends `tag` to `to` (peer name `to_name`), receiving on both sides meanwhile so attaches
// and acknowledgements are read, until `to` has it; false when it never came within 20 s.
bool turnedDelivered(ZmqTransport& from, ZmqTransport& to, const std::string& to_name,
                     const std::string& tag) {
  if (from.send(to_name, linkTestMessage(from.name(), tag), 20s) != SendStatus::kSent) return false;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < deadline) {
    (void)from.receive(10ms);
    if (auto got = to.receive(50ms)) return got->sender == from.name() && got->tag == tag;
  }
  return false;
}

TEST(TurnedLink, APeerWeDialledNowHeldDialOutOnlyDialsUsAndASendWaitingForItsLostHolderReachesTheNewOne) {
  const std::string r_at = linkTestEndpoint(), x_at = linkTestEndpoint();
  auto x1 = std::make_unique<TurnedNode>("x", x_at, std::map<std::string, std::string>{},
                                         std::map<std::string, std::string>{});
  TurnedNode r("r", r_at, {{x1->keys.public_key, "x"}}, {{"x", x1->keys.public_key}});
  x1->zap.setAllowed({{r.keys.public_key, "r"}});
  x1->t->addPeer("r", r_at, r.keys.public_key);
  r.t->addPeer("x", x_at);
  ASSERT_TRUE(turnedDelivered(*r.t, *x1->t, "x", "before"));
  ASSERT_TRUE(turnedDelivered(*x1->t, *r.t, "r", "before-up"));

  // x's holder is lost; r goes on sending to it (the send waits: no connection takes it).
  x1.reset();
  std::future<SendStatus> waiting = std::async(std::launch::async, [&] {
    return r.t->send("x", linkTestMessage("r", "waiting"), 30s);
  });
  EXPECT_EQ(waiting.wait_for(300ms), std::future_status::timeout);
  // A dial-out-only volunteer holds x now: r admits its key and takes it as a peer that dials us.
  TurnedNode x2("x", "", {}, {{"r", r.keys.public_key}});
  r.zap.setAllowed({{x2.keys.public_key, "x"}});
  ASSERT_TRUE(r.t->repointPeer("x", kDialsUsEndpoint, x2.keys.public_key));
  EXPECT_TRUE(x2.t->boundEndpoint().empty());
  x2.t->addPeer("r", r_at);
  // The waiting send goes over x2's connection once x2 attached (its link keeper says attach).
  ASSERT_EQ(waiting.wait_for(20s), std::future_status::ready);
  EXPECT_EQ(waiting.get(), SendStatus::kSent);
  auto got = x2.t->receive(10s);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->sender, "r");
  EXPECT_EQ(got->tag, "waiting");
  EXPECT_EQ(r.t->liveness("x").state, PeerState::kConnected);
  EXPECT_EQ(r.t->acceptEndpoint(), acceptEndpointOf(r_at));
  // Both ways, in order, over the connections x2 opened.
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(r.t->send("x", linkTestMessage("r", "m" + std::to_string(i)), 10s), SendStatus::kSent);
    ASSERT_EQ(x2.t->send("r", linkTestMessage("x", "n" + std::to_string(i)), 10s), SendStatus::kSent);
  }
  for (int i = 0; i < 5; ++i) {
    auto down = x2.t->receive(10s);
    ASSERT_TRUE(down.has_value());
    EXPECT_EQ(down->tag, "m" + std::to_string(i));
    auto up = r.t->receive(10s);
    ASSERT_TRUE(up.has_value());
    EXPECT_EQ(up->tag, "n" + std::to_string(i));
  }
  // Turned once, it stays a peer that dials us.
  EXPECT_THROW(r.t->repointPeer("x", x_at, x2.keys.public_key), BadInput);
}

TEST(TurnedLink, ADialOutOnlyNodesPeerNowHeldDialOutOnlyIsReachedThroughARelay) {
  const std::string x_at = linkTestEndpoint();
  auto x1 = std::make_unique<TurnedNode>("x", x_at, std::map<std::string, std::string>{},
                                         std::map<std::string, std::string>{});
  TurnedNode d("d", "", {{x1->keys.public_key, "x"}}, {{"x", x1->keys.public_key}});
  x1->zap.setAllowed({{d.keys.public_key, "d"}});
  x1->t->addPeer("d", kDialsUsEndpoint, d.keys.public_key);
  d.t->addPeer("x", x_at);
  ASSERT_TRUE(turnedDelivered(*d.t, *x1->t, "x", "before-up"));
  ASSERT_TRUE(turnedDelivered(*x1->t, *d.t, "d", "before"));

  // x's holder is lost; a dial-out-only volunteer holds x now, and the two meet at a relay.
  x1.reset();
  const CurveKeyPair relay_keys = generateCurveKeyPair();
  RelayOptions ro;
  ro.bind_endpoint = "tcp://127.0.0.1:*";
  ro.own = relay_keys;
  Relay relay(ro);
  TurnedNode x2("x", "", {}, {{"d", d.keys.public_key}});
  relay.setLinks({{"d", d.keys.public_key}, {"x", x2.keys.public_key}}, {{"d", "x"}});
  const std::string via = relayedEndpoint(relay_keys.public_key,
                                          relay.boundEndpoint().substr(std::strlen("tcp://")));
  ASSERT_TRUE(d.t->repointPeer("x", via, x2.keys.public_key));
  x2.t->addPeer("d", via);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(turnedDelivered(*d.t, *x2.t, "x", "m" + std::to_string(i))) << i;
    EXPECT_TRUE(turnedDelivered(*x2.t, *d.t, "d", "n" + std::to_string(i))) << i;
  }
  EXPECT_GE(relay.stats().messages_forwarded, 10u);  // they went through the relay
}

TEST(TurnedLink, ADialOutOnlyNodeCannotBeDialledByAPeerNowHeldDialOutOnly) {
  const std::string x_at = linkTestEndpoint();
  TurnedNode x("x", x_at, {}, {});
  TurnedNode d("d", "", {{x.keys.public_key, "x"}}, {{"x", x.keys.public_key}});
  x.zap.setAllowed({{d.keys.public_key, "d"}});
  x.t->addPeer("d", kDialsUsEndpoint, d.keys.public_key);
  d.t->addPeer("x", x_at);
  try {
    d.t->repointPeer("x", kDialsUsEndpoint, generateCurveKeyPair().public_key);
    FAIL() << "a link between two dial-out-only nodes was made without a relay";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("needs a relay"), std::string::npos) << e.what();
  }
  // Refused, the link is as it was: d still reaches x directly, both ways.
  EXPECT_TRUE(turnedDelivered(*d.t, *x.t, "x", "still-up"));
  EXPECT_TRUE(turnedDelivered(*x.t, *d.t, "d", "still-down"));
}

}  // namespace
}  // namespace cairn
