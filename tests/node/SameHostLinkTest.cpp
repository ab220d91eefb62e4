// Same-host links (node/transport/ZmqTransport.h, docs/PROTOCOL.md "Same-host links"): peers on loopback
// addresses talk over a Unix-domain socket in the user's 0700 directory instead of CURVE over TCP.
// The reference for "which path a message took" is the receiving ZAP authenticator: every CURVE
// connection passes it, a same-host one never does.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/Error.h"
#include "node/transport/CurveSecurity.h"
#include "node/transport/ZmqTransport.h"
#include "tests/common/LoopbackPorts.h"

namespace cairn {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

int sameHostLinkPort(int offset) {
  static const std::vector<int> ports = testutil::freeLoopbackPorts(8);
  return ports.at(offset);
}
std::string sameHostLinkTcp(int offset) { return "tcp://127.0.0.1:" + std::to_string(sameHostLinkPort(offset)); }

std::string tempDir() {
  std::string pattern = (fs::temp_directory_path() / "cairn_same_host_XXXXXX").string();
  char* made = ::mkdtemp(pattern.data());  // mode 0700
  if (!made) throw std::runtime_error("mkdtemp failed");
  return made;
}

Message tensorFrom(const std::string& sender, float first) {
  Message m;
  m.kind = MessageKind::kActivation;
  m.sender = sender;
  m.tensors = {{"x", torch::arange(first, first + 1000, torch::kFloat32)}};
  return m;
}

// One node: its own context (as a process), CURVE keys admitting the other, and a transport.
struct SameHostLinkNode {
  zmq::context_t context;
  std::unique_ptr<ZapAuthenticator> zap;
  std::unique_ptr<ZmqTransport> transport;
};

// Two nodes "a" and "b" on loopback, both with CURVE, both with `dir` as their same-host directory
// (empty: off).
struct SameHostLinkPair {
  CurveKeyPair a_keys = generateCurveKeyPair();
  CurveKeyPair b_keys = generateCurveKeyPair();
  SameHostLinkNode a, b;
  SameHostLinkPair(const std::string& dir, int a_offset, int b_offset) {
    auto make = [&](SameHostLinkNode& n, const std::string& name, const CurveKeyPair& own,
                    const std::string& other, const CurveKeyPair& other_keys, int offset) {
      n.zap = std::make_unique<ZapAuthenticator>(
          n.context, std::map<std::string, std::string>{{other_keys.public_key, other}});
      TransportOptions o;
      o.curve = CurveOptions{own, {{other, other_keys.public_key}}};
      o.same_host_dir = dir;
      n.transport = std::make_unique<ZmqTransport>(n.context, name, sameHostLinkTcp(offset), o);
    };
    make(a, "a", a_keys, "b", b_keys, a_offset);
    make(b, "b", b_keys, "a", a_keys, b_offset);
    a.transport->addPeer("b", sameHostLinkTcp(b_offset));
    b.transport->addPeer("a", sameHostLinkTcp(a_offset));
  }
};

void exchange(SameHostLinkPair& p) {
  ASSERT_EQ(p.a.transport->send("b", tensorFrom("a", 0), 5s), SendStatus::kSent);
  ASSERT_EQ(p.b.transport->send("a", tensorFrom("b", 7), 5s), SendStatus::kSent);
  auto at_b = p.b.transport->receive(5s);
  auto at_a = p.a.transport->receive(5s);
  ASSERT_TRUE(at_b && at_a);
  EXPECT_EQ(at_b->sender, "a");
  EXPECT_EQ(at_a->sender, "b");
  EXPECT_TRUE(torch::equal(at_b->tensors.at(0).tensor, torch::arange(0, 1000, torch::kFloat32)));
  EXPECT_TRUE(torch::equal(at_a->tensors.at(0).tensor, torch::arange(7, 1007, torch::kFloat32)));
}

TEST(SameHostLink, LoopbackPeersTalkOverTheUserSocketAndNeverThroughCurve) {
  const std::string dir = tempDir();
  {
    SameHostLinkPair p(dir, 0, 1);
    EXPECT_EQ(p.a.transport->sameHostEndpoint(), "ipc://" + dir + "/" + std::to_string(sameHostLinkPort(0)));
    EXPECT_TRUE(fs::exists(dir + "/" + std::to_string(sameHostLinkPort(0))));
    EXPECT_TRUE(fs::exists(dir + "/" + std::to_string(sameHostLinkPort(1))));
    EXPECT_TRUE(p.a.transport->isSameHostPeer("b"));
    exchange(p);
    EXPECT_EQ(p.a.transport->stats().messages_sent_same_host, 1u);
    EXPECT_EQ(p.b.transport->stats().messages_received_same_host, 1u);
    EXPECT_EQ(p.a.zap->accepted() + p.b.zap->accepted(), 0u);  // no CURVE handshake happened
    p.a.transport->flushAndClose(0ms);
    EXPECT_FALSE(fs::exists(dir + "/" + std::to_string(sameHostLinkPort(0))));  // its socket file is removed
  }
  fs::remove_all(dir);
}

// The control: the same pair without the directory authenticates both connections with CURVE.
TEST(SameHostLink, WithoutTheDirectoryLoopbackPeersUseCurveOverTcp) {
  SameHostLinkPair p("", 2, 3);
  EXPECT_EQ(p.a.transport->sameHostEndpoint(), "");
  EXPECT_FALSE(p.a.transport->isSameHostPeer("b"));
  exchange(p);
  EXPECT_EQ(p.a.transport->stats().messages_sent_same_host, 0u);
  EXPECT_EQ(p.b.transport->stats().messages_received_same_host, 0u);
  EXPECT_EQ(p.a.zap->accepted(), 1u);
  EXPECT_EQ(p.b.zap->accepted(), 1u);
}

// provider --bind 0.0.0.0: peers dial the advertised loopback address, so the same-host socket is
// named after the advertised sameHostLinkPort.
TEST(SameHostLink, TheSocketIsNamedAfterTheAdvertisedEndpoint) {
  const std::string dir = tempDir();
  {
    zmq::context_t ctx_b, ctx_a;
    TransportOptions ob;
    ob.same_host_dir = dir;
    ob.advertised_endpoint = sameHostLinkTcp(4);
    ZmqTransport b(ctx_b, "b", "tcp://0.0.0.0:" + std::to_string(sameHostLinkPort(4)), ob);
    EXPECT_EQ(b.sameHostEndpoint(), "ipc://" + dir + "/" + std::to_string(sameHostLinkPort(4)));
    TransportOptions oa;
    oa.same_host_dir = dir;
    ZmqTransport a(ctx_a, "a", sameHostLinkTcp(5), oa);
    a.addPeer("b", sameHostLinkTcp(4));
    ASSERT_EQ(a.send("b", tensorFrom("a", 3), 5s), SendStatus::kSent);
    auto got = b.receive(5s);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(b.stats().messages_received_same_host, 1u);
  }
  fs::remove_all(dir);
}

TEST(SameHostLink, OnlyATcpLoopbackEndpointIsOnThisHost) {
  for (const char* e : {"tcp://127.0.0.1:5600", "tcp://127.3.4.5:80", "tcp://localhost:1",
                        "tcp://[::1]:9"})
    EXPECT_TRUE(isLoopbackTcpEndpoint(e)) << e;
  for (const char* e : {"tcp://10.0.0.1:5600", "tcp://0.0.0.0:5600", "tcp://1270.0.0.1:5",
                        "tcp://127.0.0.1", "tcp://127.0.0.1:*", "ipc:///tmp/x", "inproc://a",
                        "tcp://localhost.example.org:5", "tcp://127.example.org:5"})
    EXPECT_FALSE(isLoopbackTcpEndpoint(e)) << e;
}

TEST(SameHostLink, APeerOnThisHostCannotBeRepointedElsewhere) {
  const std::string dir = tempDir();
  {
    zmq::context_t ctx;
    TransportOptions o;
    o.same_host_dir = dir;
    ZmqTransport a(ctx, "a", sameHostLinkTcp(6), o);
    a.addPeer("b", sameHostLinkTcp(7));
    EXPECT_THROW(a.repointPeer("b", "tcp://192.0.2.1:5600", ""), BadInput);  // nothing dialled
    EXPECT_TRUE(a.isSameHostPeer("b"));
  }
  fs::remove_all(dir);
}

TEST(SameHostLink, OnlyAPrivateDirectoryOfThisUserIsUsed) {
  const std::string base = tempDir();
  const std::string fresh = base + "/fresh";
  EXPECT_EQ(sameHostDir(fresh), fresh);  // made, mode 0700
  struct stat st {};
  ASSERT_EQ(::stat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(sameHostDir(fresh), fresh);  // and accepted again

  const std::string open_dir = base + "/open";
  ASSERT_EQ(::mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open_dir.c_str(), 0755), 0);
  EXPECT_EQ(sameHostDir(open_dir), "");

  const std::string link = base + "/link";
  fs::create_directory_symlink(fresh, link);
  EXPECT_EQ(sameHostDir(link), "");

  const std::string file = base + "/file";
  { std::ofstream(file) << "x"; }
  EXPECT_EQ(sameHostDir(file), "");
  fs::remove_all(base);
}

// A node that runs its stage again on the same sameHostLinkPort (provider --resume after a restart, or in the
// same process): the new transport's same-host socket is the one peers reach.
TEST(SameHostLink, ATransportOpenedAgainOnTheSamePortIsReached) {
  const std::string dir = tempDir();
  {
    TransportOptions o;
    o.same_host_dir = dir;
    zmq::context_t ctx_a;
    ZmqTransport a(ctx_a, "a", sameHostLinkTcp(0), o);
    a.addPeer("b", sameHostLinkTcp(1));
    {
      zmq::context_t ctx_b;
      ZmqTransport b(ctx_b, "b", sameHostLinkTcp(1), o);
      b.addPeer("a", sameHostLinkTcp(0));
      ASSERT_EQ(a.send("b", tensorFrom("a", 1), 5s), SendStatus::kSent);
      ASSERT_TRUE(b.receive(5s).has_value());
      b.flushAndClose(0ms);
    }
    zmq::context_t ctx_b2;
    ZmqTransport b2(ctx_b2, "b", sameHostLinkTcp(1), o);
    b2.addPeer("a", sameHostLinkTcp(0));
    // As the start-up handshake does: say hello again until it is heard (the first may have gone
    // into the connection to the closed transport).
    std::optional<Message> got;
    for (int i = 0; i < 300 && !got; ++i) {  // at most 30 s: a bound on the wait, not a figure
      ASSERT_EQ(a.send("b", tensorFrom("a", 2), 5s), SendStatus::kSent);
      got = b2.receive(100ms);
    }
    ASSERT_TRUE(got.has_value());
    EXPECT_GE(b2.stats().messages_received_same_host, 1u);
    ASSERT_EQ(b2.send("a", tensorFrom("b", 3), 5s), SendStatus::kSent);
    EXPECT_TRUE(a.receive(5s).has_value());
  }
  fs::remove_all(dir);
}
}  // namespace
}  // namespace cairn
