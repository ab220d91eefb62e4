// MailboxStageLink::decodeOn (issue [M]): on a GPU stage a received compressed boundary tensor
// (wire.activations bf16, fp16, int8) crosses to the device in its wire form and is decoded there,
// so a half or a quarter of the bytes cross PCIe. Checked on the CPU with a test double for the
// device that records the dtype of every tensor it is asked to move: exactly the wire forms cross,
// nothing else does, and the trainer gets the values the host decode gives. And
// MailboxStageLink::tryReceive, which a GPU stage asks before it sends what it holds back
// (StageLinkTryReceive, below).
#include <gtest/gtest.h>

#include <optional>
#include <thread>
#include <vector>

#include "node/protocol/PipelineControl.h"
#include "tests/node/StageLinkFixture.h"
#include "trainer/Device.h"
#include "trainer/Int8Boundary.h"

namespace cairn {
namespace {

class RecordingDevice final : public TensorPlacement {
 public:
  torch::Device device() const override { return torch::Device(torch::kCUDA, 0); }
  torch::Tensor toDevice(const torch::Tensor& t) const override {
    crossed.push_back(t.scalar_type());
    return t.clone();
  }
  torch::Tensor toHost(const torch::Tensor& t) const override { return t; }
  mutable std::vector<torch::ScalarType> crossed;
};

struct WireCase {
  torch::ScalarType wire_float;   // LinkChecks::wire_float
  torch::ScalarType on_the_wire;  // what crosses to the device
};

TEST(StageLinkDevice, CompressedTensorsCrossInTheirWireFormAndDecodeThere) {
  const std::vector<WireCase> cases = {{torch::kBFloat16, torch::kBFloat16},
                                       {torch::kHalf, torch::kHalf},
                                       {torch::kChar, torch::kByte},
                                       {torch::kFloat, torch::kFloat}};
  torch::manual_seed(11);
  const torch::Tensor x = torch::randn({8, 4}) * 5.1, y = torch::randn({7, 2}) * 0.3;
  for (const WireCase& c : cases) {
    SCOPED_TRACE(c10::toString(c.wire_float));
    LinkChecks checks = testing::defaultChecks();
    checks.wire_float = c.wire_float;
    testing::Fixture f(std::string("device_") + c10::toString(c.wire_float) + "_", checks);
    const auto device = std::make_shared<RecordingDevice>();
    f.link.decodeOn(device);
    // What the sender puts on the wire, and what the host decode of it gives.
    auto wireForm = [&](const torch::Tensor& t) {
      return c.wire_float == torch::kChar ? encodeInt8Boundary(t) : t.to(c.wire_float);
    };
    auto hostDecode = [&](const torch::Tensor& w, at::IntArrayRef shape) {
      return c.wire_float == torch::kChar ? decodeInt8Boundary(w, shape) : w.to(torch::kFloat);
    };
    Message a = testing::genuineActivation();
    a.tensors[0].tensor = wireForm(x);
    f.send(f.up, a);
    const StagePacket activation =
        f.link.receive(Neighbour::kUpstream, PacketKind::kActivation, 0, 0, "");
    Message g = testing::genuineGradient();
    g.tensors[0].tensor = wireForm(y);  // a shorter micro-batch: 7 rows
    f.send(f.down, g);
    const StagePacket gradient =
        f.link.receive(Neighbour::kDownstream, PacketKind::kGradient, 0, 0, "");
    EXPECT_EQ(f.link.stats().droppedTotal(), 0u);

    if (c.wire_float == torch::kFloat) {
      EXPECT_TRUE(device->crossed.empty()) << "float32 is left to the executor's own crossing";
    } else {
      // The two boundary tensors, in their wire form; not __targets, not __loss.
      EXPECT_EQ(device->crossed, std::vector<torch::ScalarType>(2, c.on_the_wire));
    }
    EXPECT_EQ(activation.tensor("x").scalar_type(), torch::kFloat);
    EXPECT_TRUE(torch::equal(activation.tensor("x"), hostDecode(wireForm(x), {8, 4})));
    EXPECT_TRUE(torch::equal(gradient.tensor("y"), hostDecode(wireForm(y), {7, 2})));
    EXPECT_TRUE(torch::equal(activation.tensor("__targets"), torch::zeros({8}, torch::kLong)));
  }
}

// MailboxStageLink::tryReceive, which a GPU stage asks before it sends what it holds back
// (TimedLink, trainer/TrainerContext.h): it takes the awaited packet when it has arrived, screened
// as receive() screens it, and never waits; a message receive() must drop, or a neighbour's
// "leaving", stays in the mailbox for receive(), which handles it as always.
// What tryReceive gives within 5 s of asking again and again (nullopt if nothing in that time).
std::optional<StagePacket> tryFor5s(testing::Fixture& f, Neighbour from, PacketKind kind,
                                    uint64_t microbatch) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    if (auto got = f.link.tryReceive(from, kind, 0, microbatch, "")) return got;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return std::nullopt;
}

// Asks tryReceive until the first message that arrived sits in the mailbox (it took it and put it
// back) and once more 50 ms later: whether any of them gave a packet.
bool anyTakenOnceSomethingArrived(testing::Fixture& f, Neighbour from, PacketKind kind,
                                  uint64_t microbatch) {
  bool taken = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (f.mailbox.buffered() == 0 && std::chrono::steady_clock::now() < until) {
    taken = taken || f.link.tryReceive(from, kind, 0, microbatch, "").has_value();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(f.mailbox.buffered(), 1u) << "nothing arrived within 5 s";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return taken || f.link.tryReceive(from, kind, 0, microbatch, "").has_value();
}

TEST(StageLinkTryReceive, TakesAnArrivedPacketAndLeavesWhatReceiveMustHandle) {
  testing::Fixture f("try_", testing::defaultChecks());
  EXPECT_FALSE(f.link.tryReceive(Neighbour::kUpstream, PacketKind::kActivation, 0, 0, ""));

  // Arrived: taken, screened and decoded as receive() would.
  Message a = testing::genuineActivation(0, 1);
  a.tensors[0].tensor = torch::full({8, 4}, 1.5);
  f.send(f.up, a);
  const std::optional<StagePacket> got =
      tryFor5s(f, Neighbour::kUpstream, PacketKind::kActivation, 1);
  ASSERT_TRUE(got) << "the activation sent did not arrive within 5 s";
  EXPECT_TRUE(torch::equal(got->tensor("x"), torch::full({8, 4}, 1.5)));
  EXPECT_EQ(f.link.stats().accepted, 1u);

  // A message to drop ahead of the awaited one (the same socket keeps their order): tryReceive
  // leaves both, receive() drops the first and takes the second.
  Message forged = testing::genuineGradient();
  forged.sender = "up";  // a gradient from upstream
  f.send(f.up, forged);
  f.send(f.up, testing::genuineActivation(0, 2));
  EXPECT_FALSE(anyTakenOnceSomethingArrived(f, Neighbour::kUpstream, PacketKind::kActivation, 2));
  EXPECT_EQ(f.link.stats().droppedTotal(), 0u) << "tryReceive drops nothing";
  const StagePacket second = f.link.receive(Neighbour::kUpstream, PacketKind::kActivation, 0, 2, "");
  EXPECT_TRUE(torch::equal(second.tensor("x"), torch::full({8, 4}, 0.5)));
  EXPECT_EQ(f.link.stats().dropped.count("kind_not_allowed"), 1u);
  EXPECT_EQ(f.link.stats().accepted, 2u);

  // A neighbour leaving: tryReceive leaves it, receive() ends the wait naming it.
  f.send(f.down, encode(ControlOrigin{"job", "down"}, Leaving{"stopped by its volunteer", ""}));
  f.send(f.down, testing::genuineGradient());
  EXPECT_FALSE(anyTakenOnceSomethingArrived(f, Neighbour::kDownstream, PacketKind::kGradient, 0));
  try {
    (void)f.link.receive(Neighbour::kDownstream, PacketKind::kGradient, 0, 0, "");
    ADD_FAILURE() << "receive() took a gradient sent after its neighbour's leaving";
  } catch (const PeerLost& e) {
    EXPECT_NE(std::string(e.what()).find("stopped by its volunteer"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cairn
