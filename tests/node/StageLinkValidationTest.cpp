// Every validation rule of MailboxStageLink, each with a forged message: the forgery is sent first,
// then the genuine message; the link must hand the trainer the genuine one (its values, checked
// against what the test sent) and count the forgery under the rule's reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "core/Error.h"
#include "core/WireCompression.h"
#include "trainer/Int8Boundary.h"
#include "node/pipeline/MailboxStageLink.h"
#include "node/transport/ZmqTransport.h"
#include "tests/node/StageLinkFixture.h"

namespace cairn {
namespace {

using namespace std::chrono_literals;
using testing::defaultChecks;
using testing::Fixture;
using testing::genuineActivation;
using testing::genuineGradient;
using testing::sentDownstream;
using testing::stemSpec;

struct Rule {
  std::string name;
  std::string reason;
  bool gradient;  // the genuine message is a gradient from downstream (else an activation)
  std::function<void(Fixture&)> forge;
};

class StageLinkValidation : public ::testing::TestWithParam<Rule> {};

TEST_P(StageLinkValidation, ForgedMessageIsDroppedAndCountedGenuineOneIsUsed) {
  const Rule& rule = GetParam();
  LinkChecks checks = defaultChecks();
  if (rule.reason == "bytes") checks.max_message_bytes = 200;  // the genuine one is 128 + 64
  Fixture f("v_" + rule.name + "_", checks);
  rule.forge(f);
  if (rule.gradient) {
    f.send(f.down, genuineGradient());
    StagePacket got = f.link.receive(Neighbour::kDownstream, PacketKind::kGradient, 0, 0, "");
    EXPECT_TRUE(torch::equal(got.tensor("y"), torch::full({8, 2}, 0.25)));
  } else {
    f.send(f.up, genuineActivation());
    StagePacket got = f.link.receive(Neighbour::kUpstream, PacketKind::kActivation, 0, 0, "");
    EXPECT_TRUE(torch::equal(got.tensor("x"), torch::full({8, 4}, 0.5)));
  }
  // A forgery from another socket may arrive after the genuine message (fair queueing): wait for a
  // message nobody sent, which screens everything that arrived meanwhile, until the peer timeout.
  EXPECT_THROW((void)f.link.receive(Neighbour::kUpstream, PacketKind::kActivation, 0, 3, ""), PeerLost);
  const LinkStats& stats = f.link.stats();
  EXPECT_EQ(stats.accepted, 1u);
  EXPECT_EQ(stats.droppedTotal(), 1u);
  EXPECT_EQ(stats.dropped.count(rule.reason), 1u) << "expected reason " << rule.reason;
}

Message activationWith(std::function<void(Message&)> change) {
  Message m = genuineActivation();
  for (auto& t : m.tensors) t.tensor = t.tensor.clone();
  m.tensors[0].tensor.fill_(99.0);  // a forgery the test would notice if it were used
  change(m);
  return m;
}

std::vector<Rule> rules() {
  return {
      {"unknown_peer", "unknown_peer", false,
       [](Fixture& f) { f.send(f.stranger, activationWith([](Message& m) { m.sender = "stranger"; })); }},
      {"activation_from_downstream", "kind_not_allowed", false,
       [](Fixture& f) { f.send(f.down, activationWith([](Message& m) { m.sender = "down"; })); }},
      {"gradient_from_upstream", "kind_not_allowed", true,
       [](Fixture& f) {
         Message g = genuineGradient();
         g.sender = "up";
         g.tensors[0].tensor = torch::full({8, 2}, 99.0);
         f.send(f.up, g);
       }},
      {"job_id", "job_id", false,
       [](Fixture& f) { f.send(f.up, activationWith([](Message& m) { m.job_id = "other"; })); }},
      {"step_window", "step_window", false,
       [](Fixture& f) { f.send(f.up, activationWith([](Message& m) { m.step = 1000; })); }},
      {"too_few_tensors", "tensor_count", false,
       [](Fixture& f) { f.send(f.up, activationWith([](Message& m) { m.tensors.clear(); })); }},
      {"too_many_tensors", "tensor_count", false,
       [](Fixture& f) {
         f.send(f.up, activationWith([](Message& m) {
           for (int i = 0; i < 6; ++i) m.tensors.push_back({"__more" + std::to_string(i), torch::zeros({1})});
         }));
       }},
      {"tensor_name", "tensor_name", false,
       [](Fixture& f) { f.send(f.up, activationWith([](Message& m) { m.tensors[0].name = "z"; })); }},
      {"extra_not_bookkeeping", "tensor_name", false,
       [](Fixture& f) { f.send(f.up, activationWith([](Message& m) { m.tensors[1].name = "targets"; })); }},
      {"dtype", "dtype", false,
       [](Fixture& f) {
         f.send(f.up, activationWith([](Message& m) { m.tensors[0].tensor = m.tensors[0].tensor.to(torch::kDouble); }));
       }},
      {"shape_inner", "shape", false,
       [](Fixture& f) {
         f.send(f.up, activationWith([](Message& m) { m.tensors[0].tensor = torch::full({8, 5}, 99.0); }));
       }},
      {"shape_rows_above_microbatch", "shape", false,
       [](Fixture& f) {
         f.send(f.up, activationWith([](Message& m) { m.tensors[0].tensor = torch::full({9, 4}, 99.0); }));
       }},
      {"shape_rank", "shape", false,
       [](Fixture& f) {
         f.send(f.up, activationWith([](Message& m) { m.tensors[0].tensor = torch::full({8, 4, 1}, 99.0); }));
       }},
      {"gradient_shape", "shape", true,
       [](Fixture& f) {
         Message g = genuineGradient();
         g.tensors[0].tensor = torch::full({8, 3}, 99.0);
         f.send(f.down, g);
       }},
      {"bytes", "bytes", false,
       [](Fixture& f) {
         f.send(f.up, activationWith([](Message& m) {
           m.tensors.push_back({"__pad", torch::zeros({64}, torch::kLong)});  // 512 more bytes
         }));
       }},
      {"nan_activation", "nonfinite", false,
       [](Fixture& f) {
         f.send(f.up, activationWith([](Message& m) { m.tensors[0].tensor[3][1] = NAN; }));
       }},
      {"inf_gradient", "nonfinite", true,
       [](Fixture& f) {
         Message g = genuineGradient();
         g.tensors[0].tensor = torch::full({8, 2}, 0.25);
         g.tensors[0].tensor[0][0] = INFINITY;
         f.send(f.down, g);
       }},
  };
}

INSTANTIATE_TEST_SUITE_P(EachRule, StageLinkValidation, ::testing::ValuesIn(rules()),
                         [](const auto& info) { return info.param.name; });

TEST(StageLinkValidationPolicy, NonFiniteStopNamesThePeer) {
  LinkChecks checks = defaultChecks();
  checks.stop_on_nonfinite = true;
  Fixture f("stop_", checks);
  Message m = genuineActivation();
  m.tensors[0].tensor[0][0] = NAN;
  f.send(f.up, m);
  try {
    (void)f.link.receive(Neighbour::kUpstream, PacketKind::kActivation, 0, 0, "");
    FAIL() << "a NaN activation was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("peer up"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("NaN"), std::string::npos) << e.what();
  }
}

TEST(StageLinkValidationPolicy, ShorterMicroBatchAndNoGradientAreAccepted) {
  Fixture f("short_", defaultChecks());
  Message a = genuineActivation(2, 1);
  a.tensors[0].tensor = torch::ones({7, 4});  // batch 31 in 4 micro-batches: 8, 8, 8, 7
  f.send(f.up, a);
  StagePacket got = f.link.receive(Neighbour::kUpstream, PacketKind::kActivation, 2, 1, "");
  EXPECT_EQ(got.tensor("x").size(0), 7);
  Message g = genuineGradient();
  g.tensors[0].tensor = torch::empty({0});  // "no gradient" for this output
  f.send(f.down, g);
  got = f.link.receive(Neighbour::kDownstream, PacketKind::kGradient, 0, 0, "");
  EXPECT_EQ(got.tensor("y").numel(), 0);
  EXPECT_EQ(f.link.stats().droppedTotal(), 0u);
}

TEST(StageLinkValidationPolicy, PlannedMessageBytesCoversTheLargerBoundary) {
  LinkChecks checks = defaultChecks();  // 16 evaluation rows
  // inputs: 16 x 4 float32 = 256 bytes; outputs: 16 x 2 float32 = 128 bytes; + 1 MiB bookkeeping
  EXPECT_EQ(plannedMessageBytes(stemSpec(), checks), 256u + (1u << 20));
}

// training_definition.wire.activations bf16 / fp16: planned float32 boundary tensors go out in the
// wire dtype (exactly torch's cast) and come back as float32 of the rounded values; bookkeeping
// and integer tensors are left alone; a planned float32 tensor in another dtype is dropped.
class StageLinkWireDtype : public ::testing::TestWithParam<torch::ScalarType> {};

TEST_P(StageLinkWireDtype, CompressedBoundaryRoundTripsThroughTheWireDtype) {
  const torch::ScalarType wire = GetParam();
  LinkChecks checks = defaultChecks();
  checks.wire_float = wire;
  const std::string p = std::string("wire_") + c10::toString(wire) + "_";
  Fixture f(p, checks);
  const torch::Tensor y = torch::randn({8, 2}, torch::TensorOptions().dtype(torch::kFloat)) * 3.7;
  const Message sent = sentDownstream(f, y);
  ASSERT_EQ(sent.tensors.size(), 3u);
  EXPECT_EQ(sent.tensors[0].tensor.scalar_type(), wire);
  EXPECT_TRUE(torch::equal(sent.tensors[0].tensor, y.to(wire)));
  EXPECT_EQ(sent.tensors[1].tensor.scalar_type(), torch::kFloat);  // bookkeeping: as it is
  EXPECT_EQ(sent.tensors[2].tensor.scalar_type(), torch::kLong);

  Message a = genuineActivation();
  const torch::Tensor x = torch::randn({8, 4}) * 11.3;
  a.tensors[0].tensor = x.to(wire);
  f.send(f.up, a);
  StagePacket got = f.link.receive(Neighbour::kUpstream, PacketKind::kActivation, 0, 0, "");
  EXPECT_EQ(got.tensor("x").scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(got.tensor("x"), x.to(wire).to(torch::kFloat)));
  EXPECT_TRUE(torch::equal(got.tensor("__targets"), torch::zeros({8}, torch::kLong)));
  EXPECT_EQ(f.link.stats().droppedTotal(), 0u);

  // An uncompressed (float32) activation while the job says compressed: dropped as "dtype", the
  // genuine compressed one that follows is used.
  Message wrong = genuineActivation(0, 1);
  wrong.tensors[0].tensor = torch::full({8, 4}, 99.0);
  f.send(f.up, wrong);
  Message right = genuineActivation(0, 1);
  right.tensors[0].tensor = right.tensors[0].tensor.to(wire);
  f.send(f.up, right);
  got = f.link.receive(Neighbour::kUpstream, PacketKind::kActivation, 0, 1, "");
  EXPECT_TRUE(torch::equal(got.tensor("x"), torch::full({8, 4}, 0.5)));
  EXPECT_EQ(f.link.stats().dropped.count("dtype"), 1u);
}

INSTANTIATE_TEST_SUITE_P(Codecs, StageLinkWireDtype,
                         ::testing::Values(torch::kBFloat16, torch::kHalf),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

TEST(StageLinkValidationPolicy, WireDtypeNamesTheKeyForUnknownCodecs) {
  EXPECT_EQ(stageWireDtype("fp32", "job.json"), torch::kFloat);
  EXPECT_EQ(stageWireDtype("bf16", "job.json"), torch::kBFloat16);
  EXPECT_EQ(stageWireDtype("fp16", "job.json"), torch::kHalf);
  EXPECT_EQ(stageWireDtype("int8", "job.json"), torch::kChar);
  try {
    (void)stageWireDtype("int4", "job.json");
    FAIL() << "int4 accepted";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("job.json: training_definition.wire.activations"),
              std::string::npos)
        << e.what();
  }
}

// The scalar reference (core/WireCompression.h, rows of the last dimension after the tensor is
// seen as [rows, cols]) relaid out as the wire form: each row's 4 scale bytes, then its values.
torch::Tensor referenceInt8(const torch::Tensor& x, int64_t cols) {
  const torch::Tensor c = x.contiguous();
  const int64_t rows = c.numel() / cols;
  const std::vector<uint8_t> enc = wire::encodeInt8Rows(c.data_ptr<float>(), rows, cols);
  torch::Tensor out = torch::empty({rows, cols + 4}, torch::kByte);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(out[r].data_ptr<uint8_t>(), enc.data() + r * 4, 4);
    std::memcpy(out[r].data_ptr<uint8_t>() + 4, enc.data() + rows * 4 + r * cols, size_t(cols));
  }
  return out;
}

TEST(StageLinkInt8, EncodingEqualsTheScalarCodecBitForBit) {
  torch::manual_seed(3);
  struct Case {
    std::vector<int64_t> shape;
    std::vector<int64_t> wire;
    int64_t cols;
  };
  for (const Case& c : {Case{{8, 10}, {8, 14}, 10}, Case{{4, 6, 5}, {4, 6, 9}, 5},
                        Case{{3, 16, 7, 7}, {3, 16, 53}, 49}, Case{{2, 3, 2, 2, 2}, {2, 3, 12}, 8}}) {
    torch::Tensor x = torch::randn(c.shape) * 4.1;
    x.reshape({-1, c.cols})[1].zero_();  // an all-zero row: scale 0, values 0
    // exact ties: x / scale = k + 0.5 rounds half to even
    torch::Tensor row = x.reshape({-1, c.cols})[2];
    row.fill_(0.0f);
    row[0] = 127.0f;
    if (c.cols > 2) row[1] = 2.5f, row[2] = -3.5f;
    const torch::Tensor wire = encodeInt8Boundary(x);
    EXPECT_EQ(wire.scalar_type(), torch::kByte);
    EXPECT_EQ(wire.sizes(), at::IntArrayRef(c.wire));
    EXPECT_EQ(int8WireShape(c.shape), c.wire);
    const torch::Tensor ref = referenceInt8(x, c.cols);
    ASSERT_TRUE(torch::equal(wire.reshape({-1, c.cols + 4}), ref)) << "shape " << x.sizes();
    bool nonfinite = true;
    EXPECT_EQ(checkInt8Boundary(wire, &nonfinite), "");
    EXPECT_FALSE(nonfinite);
    // Decoding equals the scalar decoder, and is within half a step of the input.
    const torch::Tensor back = decodeInt8Boundary(wire, c.shape);
    const torch::Tensor c2 = x.contiguous();
    const int64_t rows = c2.numel() / c.cols;
    std::vector<uint8_t> enc = wire::encodeInt8Rows(c2.data_ptr<float>(), rows, c.cols);
    const std::vector<float> dec = wire::decodeInt8Rows(enc.data(), enc.size(), rows, c.cols);
    EXPECT_TRUE(torch::equal(back.reshape({-1}), torch::from_blob(const_cast<float*>(dec.data()),
                                                                   {int64_t(dec.size())})));
    const torch::Tensor step = x.reshape({rows, c.cols}).abs().amax(1, true) / 127;
    EXPECT_TRUE(((back - x).reshape({rows, c.cols}).abs() <= step * 0.5 + 1e-6).all().item<bool>());
    EXPECT_EQ(back.reshape({-1, c.cols})[2][0].item<float>(), 127.0f);
    if (c.cols > 2) {
      EXPECT_EQ(back.reshape({-1, c.cols})[2][1].item<float>(), 2.0f);   // 2.5 -> 2
      EXPECT_EQ(back.reshape({-1, c.cols})[2][2].item<float>(), -4.0f);  // -3.5 -> -4
    }
  }
  EXPECT_FALSE(int8Carries(1));
  EXPECT_FALSE(int8Carries(0));
  // What the planner counts for a value (core float32WireBytes) is what the encoder sends.
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {8, 10}, {4, 6, 5}, {3, 16, 7, 7}, {2, 3, 2, 2, 2}, {5}, {0, 4}}) {
    const torch::Tensor x = torch::randn(shape);
    const int64_t sent = int8Carries(x.dim()) ? encodeInt8Boundary(x).numel() : x.nbytes();
    EXPECT_EQ(wire::float32WireBytes(shape, "int8"), sent) << x.sizes();
    EXPECT_EQ(wire::float32WireBytes(shape, "bf16"), x.to(torch::kBFloat16).nbytes());
    EXPECT_EQ(wire::float32WireBytes(shape, "fp32"), x.nbytes());
  }
}

TEST(StageLinkInt8, NonFiniteRowsAndBadEncodingsAreFound) {
  torch::Tensor x = torch::randn({4, 6});
  x[1][3] = NAN;
  x[2][0] = INFINITY;
  const torch::Tensor wire = encodeInt8Boundary(x);
  bool nonfinite = false;
  EXPECT_EQ(checkInt8Boundary(wire, &nonfinite), "");
  EXPECT_TRUE(nonfinite);
  const torch::Tensor back = decodeInt8Boundary(wire, {4, 6});
  EXPECT_TRUE(torch::isnan(back[1]).all().item<bool>());
  EXPECT_TRUE(torch::isnan(back[2]).all().item<bool>());
  EXPECT_TRUE(torch::isfinite(back[0]).all().item<bool>());

  torch::Tensor negative = encodeInt8Boundary(torch::randn({4, 6}));
  const float minus = -1.0f;
  std::memcpy(negative[3].data_ptr<uint8_t>(), &minus, 4);
  EXPECT_NE(checkInt8Boundary(negative, &nonfinite).find("row 3"), std::string::npos);
  torch::Tensor inf = encodeInt8Boundary(torch::randn({4, 6}));
  const float infinite = INFINITY;
  std::memcpy(inf[0].data_ptr<uint8_t>(), &infinite, 4);
  EXPECT_NE(checkInt8Boundary(inf, &nonfinite).find("row 0"), std::string::npos);
  torch::Tensor minus128 = encodeInt8Boundary(torch::randn({4, 6}));
  minus128[2][5] = 128;
  EXPECT_NE(checkInt8Boundary(minus128, &nonfinite).find("-128"), std::string::npos);
}

// wire.activations int8 through a real link: out as the wire form, back as its decoded values;
// forged encodings, shapes and NaN rows are dropped under their reasons, the genuine one is used.
TEST(StageLinkInt8, BoundaryTravelsAsInt8RowsAndForgeriesAreDropped) {
  LinkChecks checks = defaultChecks();
  checks.wire_float = torch::kChar;
  Fixture f("int8_", checks);
  const torch::Tensor y = torch::randn({8, 2}) * 3.7;
  const Message sent = sentDownstream(f, y);
  ASSERT_EQ(sent.tensors.size(), 3u);
  EXPECT_TRUE(torch::equal(sent.tensors[0].tensor, referenceInt8(y, 2).reshape({8, 6})));
  EXPECT_EQ(sent.tensors[1].tensor.scalar_type(), torch::kFloat);  // bookkeeping: as it is
  EXPECT_EQ(sent.tensors[2].tensor.scalar_type(), torch::kLong);

  const torch::Tensor x = torch::randn({8, 4}) * 11.3;
  auto activation = [&](uint64_t mb, torch::Tensor t) {
    Message a = genuineActivation(0, mb);
    a.tensors[0].tensor = std::move(t);
    return a;
  };
  torch::Tensor negative = encodeInt8Boundary(x);
  const float minus = -2.0f;
  std::memcpy(negative[5].data_ptr<uint8_t>(), &minus, 4);
  torch::Tensor nan_row = x.clone();
  nan_row[6][1] = NAN;
  f.send(f.up, activation(0, x));                                // float32 while int8: dtype
  f.send(f.up, activation(0, encodeInt8Boundary(x).narrow(1, 0, 7)));  // 3 values a row: shape
  f.send(f.up, activation(0, negative));                         // encoding
  f.send(f.up, activation(0, encodeInt8Boundary(nan_row)));      // nonfinite
  f.send(f.up, activation(0, encodeInt8Boundary(x)));
  StagePacket got = f.link.receive(Neighbour::kUpstream, PacketKind::kActivation, 0, 0, "");
  EXPECT_EQ(got.tensor("x").scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(got.tensor("x"), decodeInt8Boundary(encodeInt8Boundary(x), {8, 4})));
  EXPECT_FALSE(torch::equal(got.tensor("x"), x));  // it did go through int8
  EXPECT_TRUE(torch::equal(got.tensor("__targets"), torch::zeros({8}, torch::kLong)));
  const auto& dropped = f.link.stats().dropped;
  for (const char* reason : {"dtype", "shape", "encoding", "nonfinite"})
    EXPECT_EQ(dropped.count(reason) ? dropped.at(reason) : 0u, 1u) << reason;
  EXPECT_EQ(f.link.stats().droppedTotal(), 4u);

  // A shorter micro-batch (7 rows) decodes to its own first dimension.
  f.send(f.up, activation(1, encodeInt8Boundary(x.narrow(0, 0, 7))));
  got = f.link.receive(Neighbour::kUpstream, PacketKind::kActivation, 0, 1, "");
  EXPECT_EQ(got.tensor("x").sizes(), at::IntArrayRef({7, 4}));
}

TEST(StageLinkInt8, PlannedMessageBytesCoversTheInt8Form) {
  NodeSpec n = stemSpec();
  n.inputs = {BoundaryValue{"x", "tensor", "float32", {8, 3, 1, 1}}};  // 1 value a row: grows
  n.outputs = {BoundaryValue{"y", "tensor", "float32", {8, 2}}};
  LinkChecks checks = defaultChecks();  // 16 rows
  EXPECT_EQ(plannedMessageBytes(n, checks), 16u * 3 * 4 + (1u << 20));
  checks.wire_float = torch::kChar;
  EXPECT_EQ(plannedMessageBytes(n, checks), 16u * 3 * 5 + (1u << 20));
}

}  // namespace
}  // namespace cairn
