#include <gtest/gtest.h>

#include <thread>

#include "core/Error.h"
#include "node/transport/ZmqTransport.h"
#include "tests/common/LoopbackPorts.h"

#include <zmq_addon.hpp>

namespace cairn {
namespace {

using namespace std::chrono_literals;

// Ports for tcp tests come from the process id so parallel ctest runs do not collide.
// Ports from the kernel, fresh in every test process (tests/common/LoopbackPorts.h).
int zmqTransportPort(int offset) {
  static const std::vector<int> ports = testutil::freeLoopbackPorts(8);
  return ports.at(offset);
}

struct Endpoints {
  std::string a, b;
};

Endpoints endpointsFor(const std::string& kind, int offset) {
  if (kind == "inproc") return {"inproc://a" + std::to_string(offset), "inproc://b" + std::to_string(offset)};
  if (kind == "tcp6")  // IPv6 addresses in brackets, as node.json and the join carry them
    return {"tcp://[::1]:" + std::to_string(zmqTransportPort(2 * offset + 4)),
            "tcp://[::1]:" + std::to_string(zmqTransportPort(2 * offset + 5))};
  return {"tcp://127.0.0.1:" + std::to_string(zmqTransportPort(2 * offset)),
          "tcp://127.0.0.1:" + std::to_string(zmqTransportPort(2 * offset + 1))};
}

// Whether this machine has an IPv6 loopback (a container may not): tcp6 is skipped, saying so, if not.
bool haveIpv6Loopback() {
  zmq::context_t context;
  zmq::socket_t probe(context, zmq::socket_type::pull);
  probe.set(zmq::sockopt::ipv6, true);
  try {
    probe.bind("tcp://[::1]:*");
    return true;
  } catch (const zmq::error_t&) {
    return false;
  }
}

class TransportKinds : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "tcp6" && !haveIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback (::1) here";
  }
};

TEST_P(TransportKinds, RoundTripOfEveryDtypeAndShapeIsByteExact) {
  zmq::context_t context;
  const auto ep = endpointsFor(GetParam(), 0);
  ZmqTransport a(context, "a", ep.a), b(context, "b", ep.b);
  a.addPeer("b", ep.b);
  b.addPeer("a", ep.a);
  Message m;
  m.kind = MessageKind::kActivation;
  m.sender = "a";
  for (auto type : {torch::kFloat32, torch::kFloat16, torch::kBFloat16, torch::kFloat64,
                    torch::kInt64, torch::kInt32, torch::kUInt8, torch::kBool}) {
    m.tensors.push_back({"t", torch::randn({17, 33}).mul(100).to(type)});
    m.tensors.push_back({"t0", torch::randn({}).to(type)});
    m.tensors.push_back({"te", torch::randn({0}).to(type)});
    m.tensors.push_back({"nc", torch::randn({64, 600}).mul(100).to(type).t()});
  }
  ASSERT_EQ(a.send("b", m, 10s), SendStatus::kSent);
  auto got = b.receive(10s);
  ASSERT_TRUE(got.has_value());
  ASSERT_EQ(got->tensors.size(), m.tensors.size());
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const auto expect = m.tensors[i].tensor.contiguous();
    const auto& actual = got->tensors[i].tensor;
    ASSERT_EQ(actual.sizes(), expect.sizes());
    ASSERT_EQ(actual.scalar_type(), expect.scalar_type());
    EXPECT_EQ(std::memcmp(actual.data_ptr(), expect.data_ptr(), expect.nbytes()), 0) << i;
  }
  // And back the other way, on the independent stream.
  Message reply;
  reply.kind = MessageKind::kGradient;
  reply.tensors = {{"g", torch::arange(10, torch::kFloat64)}};
  ASSERT_EQ(b.send("a", reply, 10s), SendStatus::kSent);
  auto back = a.receive(10s);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->kind, MessageKind::kGradient);
  EXPECT_TRUE(torch::equal(back->tensors[0].tensor, reply.tensors[0].tensor));
}

TEST_P(TransportKinds, Sends256MiBTensorIntact) {
  zmq::context_t context;
  const auto ep = endpointsFor(GetParam(), 1);
  ZmqTransport a(context, "a", ep.a), b(context, "b", ep.b);
  a.addPeer("b", ep.b);
  Message m;
  m.kind = MessageKind::kActivation;
  // 64 Mi float32 = 256 MiB; integers so equality is exact and cheap to recompute.
  m.tensors = {{"big", torch::arange(int64_t{64} << 20, torch::kInt32).to(torch::kFloat32)}};
  ASSERT_EQ(a.send("b", m, 30s), SendStatus::kSent);
  auto got = b.receive(60s);
  ASSERT_TRUE(got.has_value());
  const auto& t = got->tensors[0].tensor;
  ASSERT_EQ(t.numel(), int64_t{64} << 20);
  EXPECT_EQ(std::memcmp(t.data_ptr(), m.tensors[0].tensor.data_ptr(), t.nbytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(Loopback, TransportKinds, ::testing::Values("inproc", "tcp", "tcp6"));

TEST(ZmqTransport, ReceiveTimesOutWhenNothingArrives) {
  zmq::context_t context;
  ZmqTransport a(context, "a", "inproc://lonely");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(a.receive(200ms).has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - start, 190ms);
}

TEST(ZmqTransport, SendToAbsentPeerTimesOutInsteadOfBlocking) {
  zmq::context_t context;
  ZmqTransport a(context, "a", "tcp://127.0.0.1:" + std::to_string(zmqTransportPort(6)));
  a.addPeer("ghost", "tcp://127.0.0.1:" + std::to_string(zmqTransportPort(7)));  // nobody listens
  Message m;
  m.tensors = {{"x", torch::ones({4})}};
  EXPECT_EQ(a.send("ghost", m, 200ms), SendStatus::kTimedOut);
  EXPECT_EQ(a.send("nobody", m, 200ms), SendStatus::kUnknownPeer);
  EXPECT_EQ(a.stats().send_timeouts, 1u);
}

TEST(ZmqTransport, BackPressureBoundsTheQueue) {
  // Nobody reads b: once both high-water marks are full, send() must time out, not queue forever.
  zmq::context_t context;
  TransportOptions options;
  options.send_high_water_mark = 2;
  options.receive_high_water_mark = 2;
  ZmqTransport a(context, "a", "inproc://bp_a", options), b(context, "b", "inproc://bp_b", options);
  a.addPeer("b", "inproc://bp_b");
  Message m;
  m.tensors = {{"x", torch::ones({4})}};
  int sent = 0;
  while (sent < 100 && a.send("b", m, 100ms) == SendStatus::kSent) ++sent;
  EXPECT_LT(sent, 100);
  EXPECT_GE(sent, 2);
  // Draining the receiver frees room again.
  while (b.receive(50ms)) {
  }
  EXPECT_EQ(a.send("b", m, 1s), SendStatus::kSent);
}

// --max-mbps: every message sent reserves its bytes (its tensor bytes and its header) in the
// pacer before it goes; a receive reserves nothing.
TEST(ZmqTransport, EverySendGoesThroughThePacer) {
  zmq::context_t context;
  TransportOptions options;
  options.pacer = std::make_shared<SendPacer>(1e6, 1 << 20);  // fast enough never to wait here
  ZmqTransport a(context, "a", "inproc://paced_a", options), b(context, "b", "inproc://paced_b");
  a.addPeer("b", "inproc://paced_b");
  b.addPeer("a", "inproc://paced_a");
  Message m;
  m.tensors = {{"x", torch::ones({1000})}};
  for (int i = 0; i < 5; ++i) ASSERT_EQ(a.send("b", m, 1s), SendStatus::kSent);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(b.receive(1s).has_value());
  const uint64_t tensors = a.stats().bytes_sent;
  EXPECT_EQ(tensors, 5u * 4000u);
  EXPECT_GT(options.pacer->reservedBytes(), tensors);                 // headers too
  EXPECT_LT(options.pacer->reservedBytes(), tensors + 5u * 1024u);    // and no more
  ASSERT_EQ(b.send("a", m, 1s), SendStatus::kSent);                   // b has no pacer
  const uint64_t before = options.pacer->reservedBytes();
  ASSERT_TRUE(a.receive(1s).has_value());
  EXPECT_EQ(options.pacer->reservedBytes(), before);
}

TEST(ZmqTransport, MalformedMessagesAreDroppedAndCounted) {
  zmq::context_t context;
  ZmqTransport b(context, "b", "inproc://victim");
  zmq::socket_t raw(context, zmq::socket_type::push);
  raw.connect("inproc://victim");
  raw.send(zmq::str_buffer("not msgpack at all \xc1"), zmq::send_flags::none);
  // Then a valid one: the transport must skip the bad one and deliver this.
  Message good;
  good.kind = MessageKind::kControl;
  good.text = "hello";
  auto frames = encodeMessage(good);
  zmq::send_multipart(raw, frames);
  auto got = b.receive(5s);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->text, "hello");
  EXPECT_EQ(b.stats().messages_dropped, 1u);
  ASSERT_TRUE(b.lastDecodeError().has_value());
  EXPECT_EQ(b.lastDecodeError()->code, DecodeErrorCode::kMalformedHeader);
}

TEST(ZmqTransport, OversizedMessageIsRefusedByZeroMq) {
  zmq::context_t context;
  TransportOptions options;
  options.codec.max_message_bytes = 4096;
  options.codec.max_header_bytes = 1024;
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(zmqTransportPort(5));
  ZmqTransport b(context, "b", ep, options);
  ZmqTransport a(context, "a", "inproc://sender_of_big");
  a.addPeer("b", ep);
  Message big;
  big.tensors = {{"x", torch::ones({100000})}};
  // The connection is dropped by ZMQ_MAXMSGSIZE; the send itself may succeed locally.
  (void)a.send("b", big, 1s);
  EXPECT_FALSE(b.receive(500ms).has_value());
}

TEST(ZmqTransport, BindingAPortInUseIsABadInputNamingIt) {
  zmq::context_t context;
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(zmqTransportPort(4));
  ZmqTransport first(context, "first", ep);
  try {
    ZmqTransport second(context, "second", ep);
    FAIL();
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen on " + ep), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cairn
