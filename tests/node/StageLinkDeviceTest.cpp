// MailboxStageLink::decodeOn (issue [M]): on a GPU stage a received compressed boundary tensor
// (wire.activations bf16, fp16, int8) crosses to the device in its wire form and is decoded there,
// so a half or a quarter of the bytes cross PCIe. Checked on the CPU with a test double for the
// device that records the dtype of every tensor it is asked to move: exactly the wire forms cross,
// nothing else does, and the trainer gets the values the host decode gives.
#include <gtest/gtest.h>

#include <vector>

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

}  // namespace
}  // namespace cairn
