// A node's transport when a peer's volunteer is replaced (docs/OPERATIONS.md "A lost volunteer is
// replaced by a spare"): a connection the peer's ZAP refused is dialled again once the peer
// admits the key (ZeroMQ itself never would), and repointPeer / LivePeers move a named peer to
// another address and CURVE key while the transport is in use. Real CurveZMQ on loopback. And
// redial: a peer restarted at the same address gets the next message over a new connection.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <thread>

#include "core/Error.h"
#include "node/transport/CurveSecurity.h"
#include "node/transport/LivePeers.h"
#include "node/transport/ZmqTransport.h"
#include "tests/common/LoopbackPorts.h"

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

// A TCP forwarder on loopback: the first connection it accepts is carried to port `first`, every
// later one to `later`. freezeFirst() stops the first from carrying anything more while its
// sockets stay open: to the dialling side, a connection whose far end went away without a word
// (a peer's process that closed a moment ago, its close not seen yet). Written by hand: no library
// here forwards TCP; poll() and blocking writes are enough for a few small messages on loopback.
class SwitchingForwarder {
 public:
  SwitchingForwarder(int listen_port, int first, int later) : first_(first), later_(later) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const sockaddr_in addr = loopback(listen_port);
    if (::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listen_fd_, 8) != 0)
      throw std::runtime_error("forwarder: cannot listen on port " + std::to_string(listen_port));
    thread_ = std::thread([this] { run(); });
  }
  ~SwitchingForwarder() {
    stop_ = true;
    thread_.join();
    for (const Pair& p : pairs_) {
      ::close(p.client);
      ::close(p.server);
    }
    ::close(listen_fd_);
  }
  // Returns once the forwarder carries nothing more on the first connection (its loop has seen it).
  void freezeFirst() {
    const int turn = turns_;
    frozen_ = true;
    while (turns_ < turn + 2) std::this_thread::sleep_for(1ms);
  }
  int accepted() const { return accepted_; }

 private:
  struct Pair {
    int client, server;
    bool first;
  };
  static sockaddr_in loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    return addr;
  }
  // Reads what `from` has and writes it all to `to`; false when `from` closed.
  static bool carry(int from, int to) {
    char buffer[65536];
    const ssize_t n = ::read(from, buffer, sizeof buffer);
    if (n <= 0) return false;
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = ::write(to, buffer + done, size_t(n - done));
      if (w <= 0) return false;
      done += w;
    }
    return true;
  }
  void run() {  // pairs_ is this thread's until the destructor joins it
    for (; !stop_; ++turns_) {
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
      std::vector<std::pair<size_t, bool>> owner;  // pair index, client side
      for (size_t i = 0; i < pairs_.size(); ++i) {
        if (pairs_[i].first && frozen_) continue;
        fds.push_back({pairs_[i].client, POLLIN, 0});
        owner.push_back({i, true});
        fds.push_back({pairs_[i].server, POLLIN, 0});
        owner.push_back({i, false});
      }
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) accept();
      for (size_t k = 1; k < fds.size(); ++k) {
        if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        Pair& p = pairs_[owner[k - 1].first];
        const bool client = owner[k - 1].second;
        if (!carry(client ? p.client : p.server, client ? p.server : p.client)) {
          ::shutdown(p.client, SHUT_RDWR);  // both ends see the close; the fds go at destruction
          ::shutdown(p.server, SHUT_RDWR);
        }
      }
    }
  }
  void accept() {
    const int client = ::accept(listen_fd_, nullptr, nullptr);
    if (client < 0) return;
    const bool first = accepted_ == 0;
    const int server = ::socket(AF_INET, SOCK_STREAM, 0);
    const sockaddr_in addr = loopback(first ? first_ : later_);
    if (::connect(server, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(client);
      ::close(server);
      return;
    }
    ++accepted_;
    pairs_.push_back({client, server, first});
  }

  int first_, later_;
  int listen_fd_ = -1;
  std::vector<Pair> pairs_;
  std::atomic<bool> stop_{false}, frozen_{false};
  std::atomic<int> accepted_{0};
  std::atomic<int> turns_{0};  // loop turns begun: each builds its poll list anew
  std::thread thread_;
};

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
  SwitchingForwarder forwarder(peerRepointPort(12), peerRepointPort(10), peerRepointPort(11));
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
