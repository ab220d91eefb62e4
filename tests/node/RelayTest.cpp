// The relay (node/transport/Relay.h): two members that can only dial out reach each other through
// a ROUTER both dial. Real CurveZMQ on loopback, each client in its own context as in separate
// processes, with a small DEALER client written here from the wire in Relay.h: frames forwarded
// byte for byte both ways and the sender named by its key, never by what it claims; presence
// following attaches and closed connections; unplanned pairs and unknown keys refused; messages
// waiting for a destination that has not attached yet, in order, within the link's budget; a
// member replaced by setLinks; malformed messages counted and survived. Every receive has a
// timeout; nothing asserts on how long anything took.
#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <zmq_addon.hpp>

#include "core/CurveKeys.h"
#include "core/Error.h"
#include "node/transport/Relay.h"
#include "tests/common/LoopbackPorts.h"

namespace cairn {
namespace {

using namespace std::chrono_literals;
using RelayFrames = std::vector<std::string>;

constexpr auto kRelayTestPatience = 15s;  // generous: the loaded CI machine

std::string relayTestRoutingId(const std::string& name) {
  static std::mt19937_64 draw(std::random_device{}());
  return name + "." + std::to_string(draw());
}

// A client of the relay as a volunteer would be: a DEALER, CURVE client to the relay's key with
// its own keys, a routing id drawn afresh. Every send and receive gives up after a while.
class RelayTestClient {
 public:
  RelayTestClient(std::string name, const CurveKeyPair& keys, const Relay& relay,
                  const std::string& relay_public_key, int receive_high_water_mark = 1000)
      : name_(std::move(name)), dealer_(context_, zmq::socket_type::dealer) {
    dealer_.set(zmq::sockopt::routing_id, relayTestRoutingId(name_));
    dealer_.set(zmq::sockopt::rcvhwm, receive_high_water_mark);
    dealer_.set(zmq::sockopt::linger, 0);
    dealer_.set(zmq::sockopt::sndtimeo, 2000);  // a send blocks only without a connection (refused)
    dealer_.set(zmq::sockopt::curve_serverkey, relay_public_key);
    dealer_.set(zmq::sockopt::curve_publickey, keys.public_key);
    dealer_.set(zmq::sockopt::curve_secretkey, keys.secret_key);
    dealer_.connect(relay.boundEndpoint());
  }

  bool send(const RelayFrames& frames) {
    std::vector<zmq::message_t> out;
    for (const auto& frame : frames) out.emplace_back(frame.data(), frame.size());
    return zmq::send_multipart(dealer_, out).has_value();
  }

  // The next message, or nothing within `limit`.
  std::optional<RelayFrames> next(std::chrono::milliseconds limit) {
    zmq::pollitem_t item{static_cast<void*>(dealer_), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, limit);
    std::vector<zmq::message_t> in;
    if (!zmq::recv_multipart(dealer_, std::back_inserter(in), zmq::recv_flags::dontwait))
      return std::nullopt;
    RelayFrames frames;
    for (const auto& frame : in) frames.push_back(frame.to_string());
    return frames;
  }

  // The next message of `kind` that `accept` takes, or nothing within `limit`. Messages of that
  // kind it does not take are skipped; messages of other kinds are kept for a later call.
  std::optional<RelayFrames> nextOf(const std::string& kind, std::chrono::milliseconds limit,
                                    const std::function<bool(const RelayFrames&)>& accept = {}) {
    auto taken = [&](const RelayFrames& f) { return !accept || accept(f); };
    for (auto it = backlog_.begin(); it != backlog_.end();) {
      if ((*it)[0] != kind) {
        ++it;
        continue;
      }
      RelayFrames frames = std::move(*it);
      it = backlog_.erase(it);
      if (taken(frames)) return frames;
    }
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left <= 0ms) return std::nullopt;
      auto frames = next(left);
      if (!frames || frames->empty()) continue;
      if ((*frames)[0] != kind)
        backlog_.push_back(std::move(*frames));
      else if (taken(*frames))
        return frames;
    }
  }

  // Attaches as `claimed` (its own name unless given) and returns the first presence answered,
  // attaching again each second as a volunteer does; nothing when none came within `limit`.
  std::optional<RelayFrames> attach(std::chrono::milliseconds limit = kRelayTestPatience,
                                    const std::string& claimed = "") {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (!send({"A", claimed.empty() ? name_ : claimed})) continue;
      if (auto presence = nextOf("P", std::min<std::chrono::milliseconds>(limit, 1000ms)))
        return presence;
    }
    return std::nullopt;
  }

 private:
  std::string name_;
  zmq::context_t context_;
  zmq::socket_t dealer_;
  std::deque<RelayFrames> backlog_;  // received, of another kind than asked for then
};

// A relay on a loopback port with members a, b, c and the pair {a, b}.
struct RelayTestSetup {
  CurveKeyPair relay_keys = generateCurveKeyPair();
  std::map<std::string, CurveKeyPair> keys{
      {"a", generateCurveKeyPair()}, {"b", generateCurveKeyPair()}, {"c", generateCurveKeyPair()}};
  std::unique_ptr<Relay> relay;

  explicit RelayTestSetup(RelayOptions options = {}) {
    options.bind_endpoint = testutil::freeTcpEndpoints(1).at(0);
    options.own = relay_keys;
    relay = std::make_unique<Relay>(options);
    std::map<std::string, std::string> members;
    for (const auto& [name, pair] : keys) members[name] = pair.public_key;
    relay->setLinks(members, {{"a", "b"}});
  }
  std::unique_ptr<RelayTestClient> client(const std::string& name) {
    return clientWith(name, keys.at(name));
  }
  std::unique_ptr<RelayTestClient> clientWith(const std::string& name, const CurveKeyPair& pair,
                                              int receive_high_water_mark = 1000) {
    return std::make_unique<RelayTestClient>(name, pair, *relay, relay_keys.public_key,
                                             receive_high_water_mark);
  }
};

// Waits (generously) until the relay's counters satisfy `ready`; false when they never did.
bool relayStatsReach(const Relay& relay, const std::function<bool(const RelayStats&)>& ready) {
  const auto deadline = std::chrono::steady_clock::now() + kRelayTestPatience;
  while (!ready(relay.stats())) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

std::string relayTestBytes(size_t n, uint32_t seed) {
  std::mt19937 draw(seed);
  std::string bytes(n, '\0');
  for (auto& byte : bytes) byte = static_cast<char>(draw());
  return bytes;
}

TEST(RelayForwarding, BothWaysByteForByteNamedByTheSendersKey) {
  RelayTestSetup setup;
  auto a = setup.client("a");
  auto b = setup.client("b");
  ASSERT_TRUE(a->attach());
  ASSERT_TRUE(b->attach());
  const std::string big = relayTestBytes(4 << 20, 1);
  const std::string zeros("\0x\0\0y", 5);
  ASSERT_TRUE(a->send({"D", "b", "header", big, "", zeros}));
  auto at_b = b->nextOf("D", kRelayTestPatience);
  ASSERT_TRUE(at_b);
  ASSERT_EQ(at_b->size(), 6u);
  EXPECT_EQ((*at_b)[1], "a");
  EXPECT_EQ((*at_b)[2], "header");
  EXPECT_TRUE((*at_b)[3] == big);
  EXPECT_EQ((*at_b)[4], "");
  EXPECT_EQ((*at_b)[5], zeros);

  const std::string back = relayTestBytes(70000, 2);
  ASSERT_TRUE(b->send({"D", "a", back, "tail"}));
  auto at_a = a->nextOf("D", kRelayTestPatience);
  ASSERT_TRUE(at_a);
  EXPECT_EQ(*at_a, (RelayFrames{"D", "b", back, "tail"}));

  // a claims to be b: not taken, and its data still comes from "a" (and still reaches the real b).
  ASSERT_TRUE(a->send({"A", "b"}));
  ASSERT_TRUE(
      relayStatsReach(*setup.relay, [](const RelayStats& s) { return s.forged_attaches == 1; }));
  ASSERT_TRUE(a->send({"D", "b", "after the forged attach"}));
  at_b = b->nextOf("D", kRelayTestPatience);
  ASSERT_TRUE(at_b);
  EXPECT_EQ(*at_b, (RelayFrames{"D", "a", "after the forged attach"}));

  // The relay counts a message just after handing it over: wait for the count.
  ASSERT_TRUE(
      relayStatsReach(*setup.relay, [](const RelayStats& s) { return s.messages_forwarded == 3; }));
  const RelayStats stats = setup.relay->stats();
  EXPECT_EQ(stats.bytes_per_link.at({"a", "b"}),
            6 + big.size() + zeros.size() + std::string("after the forged attach").size());
  EXPECT_EQ(stats.bytes_per_link.at({"b", "a"}), back.size() + 4);
  EXPECT_EQ(stats.malformed, 0u);
}

TEST(RelayPresence, FollowsAttachesAndClosedConnections) {
  RelayTestSetup setup;
  auto b = setup.client("b");
  ASSERT_EQ(b->attach(), (RelayFrames{"P"}));  // a is not there yet
  auto a = setup.client("a");
  ASSERT_EQ(a->attach(), (RelayFrames{"P", "b"}));
  // b hears of a at once (without attaching again).
  EXPECT_TRUE(b->nextOf("P", kRelayTestPatience, [](const RelayFrames& f) {
    return f == RelayFrames{"P", "a"};
  }));
  // c is a member but no partner of a: never in a's presence.
  auto c = setup.client("c");
  ASSERT_EQ(c->attach(), (RelayFrames{"P"}));

  b.reset();  // its connection closes
  EXPECT_TRUE(a->nextOf("P", kRelayTestPatience,
                        [](const RelayFrames& f) { return f == RelayFrames{"P"}; }));
  EXPECT_EQ(a->attach(), (RelayFrames{"P"}));
}

TEST(RelayRefusals, UnplannedPairsAndUnknownKeys) {
  RelayTestSetup setup;
  auto a = setup.client("a");
  auto b = setup.client("b");
  auto c = setup.client("c");
  ASSERT_TRUE(a->attach());
  ASSERT_TRUE(b->attach());
  ASSERT_TRUE(c->attach());
  ASSERT_TRUE(a->send({"D", "c", "not planned"}));
  ASSERT_TRUE(a->send({"D", "nobody", "no such member"}));
  ASSERT_TRUE(
      relayStatsReach(*setup.relay, [](const RelayStats& s) { return s.refused_unplanned == 2; }));
  EXPECT_FALSE(c->nextOf("D", 500ms));

  // A key the relay was not given: ZAP refuses it, it never attaches, nothing it sends arrives.
  auto stranger = setup.clientWith("a", generateCurveKeyPair());
  (void)stranger->send({"D", "b", "from a stranger"});
  EXPECT_FALSE(stranger->attach(2s));
  ASSERT_TRUE(
      relayStatsReach(*setup.relay, [](const RelayStats& s) { return s.refused_keys >= 1; }));
  ASSERT_TRUE(a->send({"D", "b", "from a"}));
  auto at_b = b->nextOf("D", kRelayTestPatience);
  ASSERT_TRUE(at_b);
  EXPECT_EQ(*at_b, (RelayFrames{"D", "a", "from a"}));
  EXPECT_FALSE(b->nextOf("D", 300ms));
  ASSERT_TRUE(
      relayStatsReach(*setup.relay, [](const RelayStats& s) { return s.messages_forwarded >= 1; }));
  EXPECT_EQ(setup.relay->stats().messages_forwarded, 1u);
}

TEST(RelayQueueing, MessagesWaitForTheDestinationInOrder) {
  RelayTestSetup setup;
  auto a = setup.client("a");
  ASSERT_TRUE(a->attach());
  auto numbered = [](int i) { return RelayFrames{"D", "b", std::to_string(i), "second frame"}; };
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(a->send(numbered(i)));
  ASSERT_TRUE(
      relayStatsReach(*setup.relay, [](const RelayStats& s) { return s.messages_waiting == 50; }));
  auto b = setup.client("b");
  ASSERT_TRUE(b->attach());
  // More while the waiting ones go out: behind them.
  for (int i = 50; i < 100; ++i) ASSERT_TRUE(a->send(numbered(i)));
  for (int i = 0; i < 100; ++i) {
    auto at_b = b->nextOf("D", kRelayTestPatience);
    ASSERT_TRUE(at_b) << "message " << i;
    EXPECT_EQ(*at_b, (RelayFrames{"D", "a", std::to_string(i), "second frame"}));
  }
  EXPECT_TRUE(relayStatsReach(*setup.relay, [](const RelayStats& s) {
    return s.messages_waiting == 0 && s.bytes_waiting == 0 && s.messages_forwarded == 100;
  }));
}

TEST(RelayQueueing, AFullPipeKeepsMessagesWaitingInOrder) {
  // b reads nothing for a while: the relay's pipe to it (4 messages), the sockets' buffers and b's
  // own queue (1 message) fill, well before 50 MiB, and the rest waits at the relay.
  RelayOptions options;
  options.send_high_water_mark = 4;
  RelayTestSetup setup(options);
  auto a = setup.client("a");
  auto b = setup.clientWith("b", setup.keys.at("b"), /*receive_high_water_mark=*/1);
  ASSERT_TRUE(a->attach());
  ASSERT_TRUE(b->attach());
  const int count = 200;
  const std::string block = relayTestBytes(256 << 10, 3);
  for (int i = 0; i < count; ++i) ASSERT_TRUE(a->send({"D", "b", std::to_string(i), block}));
  ASSERT_TRUE(relayStatsReach(*setup.relay, [&](const RelayStats& s) {
    return s.messages_waiting > 0 && s.messages_forwarded + s.messages_waiting == count;
  }));
  for (int i = 0; i < count; ++i) {
    auto at_b = b->nextOf("D", kRelayTestPatience);
    ASSERT_TRUE(at_b) << "message " << i;
    ASSERT_EQ(at_b->size(), 4u);
    EXPECT_EQ((*at_b)[2], std::to_string(i));
    EXPECT_TRUE((*at_b)[3] == block);
  }
  EXPECT_EQ(setup.relay->stats().refused_over_budget, 0u);
}

TEST(RelayQueueing, BeyondTheLinkBudgetMessagesAreDropped) {
  // Ten messages of one 1000-byte frame fit, each counting its frame's bookkeeping too.
  RelayOptions options;
  options.link_budget_bytes = 10 * (1000 + kRelayFrameOverhead);
  RelayTestSetup setup(options);
  auto a = setup.client("a");
  ASSERT_TRUE(a->attach());
  auto numbered = [](int i) {
    return std::to_string(i) + std::string(1000 - std::to_string(i).size(), '.');
  };
  for (int i = 0; i < 15; ++i) ASSERT_TRUE(a->send({"D", "b", numbered(i)}));
  ASSERT_TRUE(relayStatsReach(*setup.relay, [](const RelayStats& s) {
    return s.messages_waiting == 10 && s.refused_over_budget == 5;
  }));
  auto b = setup.client("b");
  ASSERT_TRUE(b->attach());
  for (int i = 0; i < 10; ++i) {
    auto at_b = b->nextOf("D", kRelayTestPatience);
    ASSERT_TRUE(at_b) << "message " << i;
    EXPECT_EQ(*at_b, (RelayFrames{"D", "a", numbered(i)}));
  }
  // 10..14 were dropped: the next one b gets is the one sent now.
  ASSERT_TRUE(a->send({"D", "b", "after"}));
  auto at_b = b->nextOf("D", kRelayTestPatience);
  ASSERT_TRUE(at_b);
  EXPECT_EQ(*at_b, (RelayFrames{"D", "a", "after"}));
}

TEST(RelayQueueing, QueuesForALongAbsentDestinationAreDropped) {
  RelayOptions options;
  options.unattached_drop_after = 200ms;
  RelayTestSetup setup(options);
  auto a = setup.client("a");
  ASSERT_TRUE(a->attach());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(a->send({"D", "b", "old " + std::to_string(i)}));
  ASSERT_TRUE(relayStatsReach(*setup.relay, [](const RelayStats& s) {
    return s.dropped_waiting == 5 && s.messages_waiting == 0 && s.bytes_waiting == 0;
  }));
  auto b = setup.client("b");
  ASSERT_TRUE(b->attach());
  ASSERT_TRUE(a->send({"D", "b", "new"}));
  auto at_b = b->nextOf("D", kRelayTestPatience);
  ASSERT_TRUE(at_b);
  EXPECT_EQ(*at_b, (RelayFrames{"D", "a", "new"}));
}

TEST(RelayPacing, ForwardsInOrderNoFasterThanTheCap) {
  RelayOptions options;
  options.max_mbps = 8;  // 1 MB/s, a burst of 256 KiB
  RelayTestSetup setup(options);
  auto a = setup.client("a");
  auto b = setup.client("b");
  ASSERT_TRUE(a->attach());
  ASSERT_TRUE(b->attach());
  const auto start = std::chrono::steady_clock::now();
  const int count = 20;
  const size_t size = 100000;
  for (int i = 0; i < count; ++i) ASSERT_TRUE(a->send({"D", "b", relayTestBytes(size, i)}));
  for (int i = 0; i < count; ++i) {
    auto at_b = b->nextOf("D", kRelayTestPatience);
    ASSERT_TRUE(at_b) << "message " << i;
    EXPECT_TRUE(*at_b == (RelayFrames{"D", "a", relayTestBytes(size, i)})) << "message " << i;
  }
  // A lower bound only (no load makes the relay faster than its cap): the bytes out by any time
  // stay within rate × time + burst + one message.
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(seconds, (count * size - (256 << 10) - size) / 1e6 * 0.95);
}

TEST(RelayMembers, AReplacedMemberKeyIsRefusedAndItsConnectionIgnored) {
  RelayTestSetup setup;
  auto a = setup.client("a");
  auto b = setup.client("b");
  ASSERT_TRUE(a->attach());
  ASSERT_TRUE(b->attach());
  // b's volunteer is replaced by another machine under the same name, with its own keys.
  const CurveKeyPair b2_keys = generateCurveKeyPair();
  setup.relay->setLinks({{"a", setup.keys.at("a").public_key}, {"b", b2_keys.public_key}},
                        {{"a", "b"}});
  // a hears b is gone (the old connection no longer counts).
  EXPECT_TRUE(a->nextOf("P", kRelayTestPatience,
                        [](const RelayFrames& f) { return f == RelayFrames{"P"}; }));
  auto b2 = setup.clientWith("b", b2_keys);
  ASSERT_EQ(b2->attach(), (RelayFrames{"P", "a"}));
  ASSERT_TRUE(a->send({"D", "b", "to the new b"}));
  auto at_b2 = b2->nextOf("D", kRelayTestPatience);
  ASSERT_TRUE(at_b2);
  EXPECT_EQ(*at_b2, (RelayFrames{"D", "a", "to the new b"}));
  EXPECT_FALSE(b->nextOf("D", 300ms));

  // The old b's connection, still open: its data and attaches are ignored.
  const uint64_t revoked = setup.relay->stats().revoked;
  ASSERT_TRUE(b->send({"D", "a", "from the old b"}));
  ASSERT_TRUE(b->send({"A", "b"}));
  ASSERT_TRUE(
      relayStatsReach(*setup.relay, [&](const RelayStats& s) { return s.revoked == revoked + 2; }));
  // A new connection with the old key: refused by ZAP.
  const uint64_t refused = setup.relay->stats().refused_keys;
  auto old_b = setup.clientWith("b", setup.keys.at("b"));
  EXPECT_FALSE(old_b->attach(2s));
  EXPECT_TRUE(
      relayStatsReach(*setup.relay, [&](const RelayStats& s) { return s.refused_keys > refused; }));
  ASSERT_TRUE(b2->send({"D", "a", "from the new b"}));
  auto at_a = a->nextOf("D", kRelayTestPatience);
  ASSERT_TRUE(at_a);
  EXPECT_EQ(*at_a, (RelayFrames{"D", "b", "from the new b"}));
}

TEST(RelayHostileClient, MalformedMessagesAreCountedAndForwardingGoesOn) {
  RelayTestSetup setup;
  auto a = setup.client("a");
  auto b = setup.client("b");
  auto c = setup.client("c");  // a member, its messages malformed
  ASSERT_TRUE(a->attach());
  ASSERT_TRUE(b->attach());
  ASSERT_TRUE(c->attach());
  const std::vector<RelayFrames> bad{
      {""},                      // an empty frame for a kind
      {"X", "b", "payload"},     // an unknown kind
      {"Data", "b", "payload"},  // a kind of more than one letter
      {"D"},                     // no TO
      {"D", "b"},                // no payload
      {"A"},                     // attach without a name
      {"A", "c", "extra"},       // attach with too much
      RelayFrames(1000, "A"),    // a thousand frames
  };
  for (const auto& frames : bad) ASSERT_TRUE(c->send(frames));
  RelayFrames too_long{"D", "a"};
  for (int i = 0; i < 1100; ++i) too_long.push_back("x");  // past max_payload_frames (1025)
  ASSERT_TRUE(c->send(too_long));
  ASSERT_TRUE(relayStatsReach(*setup.relay,
                              [&](const RelayStats& s) { return s.malformed == bad.size() + 1; }));
  ASSERT_TRUE(a->send({"D", "b", "still"}));
  auto at_b = b->nextOf("D", kRelayTestPatience);
  ASSERT_TRUE(at_b);
  EXPECT_EQ(*at_b, (RelayFrames{"D", "a", "still"}));
  ASSERT_TRUE(b->send({"D", "a", "relayed"}));
  auto at_a = a->nextOf("D", kRelayTestPatience);
  ASSERT_TRUE(at_a);
  EXPECT_EQ(*at_a, (RelayFrames{"D", "b", "relayed"}));
  EXPECT_FALSE(a->nextOf("D", 300ms));  // nothing of c's reached a
  EXPECT_EQ(setup.relay->stats().refused_unplanned, 0u);
}

TEST(RelaySetup, BindFailureNamesTheEndpoint) {
  RelayOptions options;
  options.own = generateCurveKeyPair();
  options.bind_endpoint = "tcp://256.0.0.1:1";
  try {
    Relay relay(options);
    FAIL() << "bound " << relay.boundEndpoint();
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("tcp://256.0.0.1:1"), std::string::npos) << e.what();
  }
  options.bind_endpoint = "tcp://127.0.0.1:*";
  Relay relay(options);
  EXPECT_EQ(relay.boundEndpoint().rfind("tcp://127.0.0.1:", 0), 0u) << relay.boundEndpoint();
}

}  // namespace
}  // namespace cairn
