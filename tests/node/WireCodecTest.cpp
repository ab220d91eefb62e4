#include <gtest/gtest.h>
#include <msgpack.hpp>

#include "node/transport/WireCodec.h"

namespace cairn {
namespace {

// Byte-exact equality, independent of dtype semantics (NaN payloads, -0.0, bool bytes).
bool sameBytes(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const auto ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == cb.nbytes() &&
         std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

torch::Tensor randomOf(torch::ScalarType type, std::vector<int64_t> shape) {
  if (type == torch::kBool) return torch::randint(0, 2, shape).to(torch::kBool);
  if (type == torch::kUInt8) return torch::randint(0, 256, shape).to(torch::kUInt8);
  if (type == torch::kInt32 || type == torch::kInt64)
    return torch::randint(-1000000, 1000000, shape).to(type);
  return torch::randn(shape).to(type);
}

Message roundTrip(const Message& m, const CodecLimits& limits = {}) {
  DecodeResult r = decodeMessage(encodeMessage(m, limits), limits);
  EXPECT_TRUE(r.ok()) << (r.error ? r.error->detail : "");
  return r.ok() ? *r.message : Message{};
}

class EveryDtype : public ::testing::TestWithParam<torch::ScalarType> {};

TEST_P(EveryDtype, RoundTripsByteExact) {
  const auto type = GetParam();
  Message m;
  m.kind = MessageKind::kActivation;
  m.job_id = "job";
  m.sender = "node_1";
  m.step = 123456789012ull;
  m.microbatch = 7;
  m.tag = "t";
  m.text = "{\"k\":1}";
  m.tensors = {{"small", randomOf(type, {3, 5})},
               {"scalar", randomOf(type, {})},                // 0-d
               {"empty", randomOf(type, {0, 4})},             // no elements
               {"large", randomOf(type, {300, 257})},         // above the zero-copy threshold
               {"transposed", randomOf(type, {40, 30}).t()}};  // non-contiguous
  ASSERT_FALSE(m.tensors[4].tensor.is_contiguous());
  const Message back = roundTrip(m);
  EXPECT_EQ(back.kind, m.kind);
  EXPECT_EQ(back.job_id, m.job_id);
  EXPECT_EQ(back.sender, m.sender);
  EXPECT_EQ(back.step, m.step);
  EXPECT_EQ(back.microbatch, m.microbatch);
  EXPECT_EQ(back.tag, m.tag);
  EXPECT_EQ(back.text, m.text);
  ASSERT_EQ(back.tensors.size(), m.tensors.size());
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    EXPECT_EQ(back.tensors[i].name, m.tensors[i].name);
    EXPECT_TRUE(sameBytes(back.tensors[i].tensor, m.tensors[i].tensor)) << m.tensors[i].name;
    EXPECT_TRUE(back.tensors[i].tensor.is_contiguous());
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, EveryDtype,
                         ::testing::Values(torch::kFloat32, torch::kFloat16, torch::kBFloat16,
                                           torch::kFloat64, torch::kInt64, torch::kInt32,
                                           torch::kUInt8, torch::kBool),
                         [](const auto& info) { return dtypeName(info.param); });

TEST(WireCodec, LargeTensorsTravelWithoutCopies) {
  Message m;
  m.kind = MessageKind::kActivation;
  m.tensors = {{"x", torch::randn({1 << 16})}};  // 256 KiB, above the 64 KiB threshold
  auto frames = encodeMessage(m);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[1].data(), m.tensors[0].tensor.data_ptr()) << "send side copied";
  const void* frame_data = frames[1].data();
  DecodeResult r = decodeMessage(std::move(frames));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.message->tensors[0].tensor.data_ptr(), frame_data) << "receive side copied";
  EXPECT_TRUE(sameBytes(r.message->tensors[0].tensor, m.tensors[0].tensor));
}

// Forged headers: build the header frame by hand and check the specific rejection.
struct Forged {
  std::function<void(msgpack::packer<msgpack::sbuffer>&)> pack_header;
  std::vector<size_t> frame_sizes;
};

DecodeResult decodeForged(const Forged& f, const CodecLimits& limits = {}) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> pk(buffer);
  f.pack_header(pk);
  std::vector<zmq::message_t> frames;
  frames.emplace_back(buffer.data(), buffer.size());
  for (size_t n : f.frame_sizes) frames.emplace_back(n);
  return decodeMessage(std::move(frames), limits);
}

// A valid header with one float32 tensor of `shape`, `nbytes` claimed; `version`, `dtype` tweakable.
std::function<void(msgpack::packer<msgpack::sbuffer>&)> header(uint64_t version, uint64_t kind,
                                                                uint64_t dtype,
                                                                std::vector<uint64_t> shape,
                                                                uint64_t nbytes, int tensors = 1) {
  return [=](msgpack::packer<msgpack::sbuffer>& pk) {
    pk.pack_map(3);
    pk.pack("v"), pk.pack(version);
    pk.pack("k"), pk.pack(kind);
    pk.pack("t");
    pk.pack_array(tensors);
    for (int i = 0; i < tensors; ++i) {
      pk.pack_array(4);
      pk.pack("x"), pk.pack(dtype), pk.pack(shape), pk.pack(nbytes);
    }
  };
}

TEST(WireCodecRejects, TruncatedMsgpack) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> pk(buffer);
  header(1, 1, 0, {2, 2}, 16)(pk);
  std::vector<zmq::message_t> frames;
  frames.emplace_back(buffer.data(), buffer.size() - 3);
  frames.emplace_back(16);
  auto r = decodeMessage(std::move(frames));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error->code, DecodeErrorCode::kMalformedHeader);
}

TEST(WireCodecRejects, GarbageHeader) {
  std::vector<zmq::message_t> frames;
  frames.emplace_back("\xc1\xc1\xc1", 3);  // 0xc1 is never used in msgpack
  auto r = decodeMessage(std::move(frames));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error->code, DecodeErrorCode::kMalformedHeader);
}

TEST(WireCodecRejects, NoFrames) {
  auto r = decodeMessage({});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error->code, DecodeErrorCode::kNoFrames);
}

TEST(WireCodecRejects, WrongVersion) {
  auto r = decodeForged({header(2, 1, 0, {2, 2}, 16), {16}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error->code, DecodeErrorCode::kWrongVersion);
}

TEST(WireCodecRejects, UnknownKind) {
  auto r = decodeForged({header(1, 99, 0, {2, 2}, 16), {16}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error->code, DecodeErrorCode::kUnknownKind);
}

TEST(WireCodecRejects, UnknownDtype) {
  auto r = decodeForged({header(1, 1, 42, {2, 2}, 16), {16}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error->code, DecodeErrorCode::kUnknownDtype);
}

TEST(WireCodecRejects, ShapeDisagreesWithDescribedLength) {
  auto r = decodeForged({header(1, 1, 0, {2, 2}, 12), {12}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error->code, DecodeErrorCode::kShapeMismatch);
}

TEST(WireCodecRejects, FrameShorterThanDescribed) {
  auto r = decodeForged({header(1, 1, 0, {2, 2}, 16), {15}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error->code, DecodeErrorCode::kShapeMismatch);
}

TEST(WireCodecRejects, MoreFramesThanDescribed) {
  auto r = decodeForged({header(1, 1, 0, {2, 2}, 16), {16, 16}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error->code, DecodeErrorCode::kFrameCountMismatch);
}

TEST(WireCodecRejects, FewerFramesThanDescribed) {
  auto r = decodeForged({header(1, 1, 0, {2, 2}, 16, /*tensors=*/2), {16}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error->code, DecodeErrorCode::kFrameCountMismatch);
}

TEST(WireCodecRejects, HeaderClaimingTwoToTheSixtyTwoElements) {
  // 2^62 float32 elements = 2^64 bytes: must be refused from the header alone, before any
  // allocation (an attempt would abort the test with bad_alloc).
  const uint64_t huge = uint64_t{1} << 62;
  auto r = decodeForged({header(1, 1, 0, {huge}, 0), {0}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error->code, DecodeErrorCode::kTooLarge);
  auto r2 = decodeForged({header(1, 1, 0, {uint64_t{1} << 31, uint64_t{1} << 31}, 16), {16}});
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(r2.error->code, DecodeErrorCode::kTooLarge);
}

TEST(WireCodecRejects, HugeDimensionsBesideAZeroDimension) {
  // 0 elements, so 0 bytes, but libtorch checks the whole product of the dimensions when it
  // allocates and throws for [2^40, 2^40, 0]; the decoder must refuse it itself, not throw (a
  // fuzzer found this: the exception ended the receiving node).
  const uint64_t big = uint64_t{1} << 40;
  for (const auto& shape : {std::vector<uint64_t>{big, big, 0}, std::vector<uint64_t>{0, big, big},
                            std::vector<uint64_t>{big, 0, big}}) {
    DecodeResult r;
    ASSERT_NO_THROW(r = decodeForged({header(1, 1, 0, shape, 0), {0}}));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error->code, DecodeErrorCode::kTooLarge);
  }
  // Zero-size tensors whose other dimensions are sane still decode, with their shape.
  auto ok = decodeForged({header(1, 1, 0, {big, 0, 3}, 0), {0}});
  ASSERT_TRUE(ok.ok()) << ok.error->detail;
  EXPECT_EQ(ok.message->tensors.at(0).tensor.sizes(), (std::vector<int64_t>{int64_t(big), 0, 3}));
}

TEST(WireCodecRejects, MessageOverTheConfiguredLimit) {
  CodecLimits limits;
  limits.max_message_bytes = 1024;
  auto r = decodeForged({header(1, 1, 0, {512}, 2048), {2048}}, limits);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error->code, DecodeErrorCode::kTooLarge);
}

TEST(WireCodecRejects, TooManyDimensions) {
  auto r = decodeForged({header(1, 1, 0, std::vector<uint64_t>(17, 1), 4), {4}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error->code, DecodeErrorCode::kTooManyDimensions);
}

TEST(WireCodecRejects, BoolByteOutsideZeroOne) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> pk(buffer);
  header(1, 1, 7, {4}, 4)(pk);
  std::vector<zmq::message_t> frames;
  frames.emplace_back(buffer.data(), buffer.size());
  frames.emplace_back("\x01\x00\x02\x01", 4);
  auto r = decodeMessage(std::move(frames));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error->code, DecodeErrorCode::kBadValue);
}

TEST(WireCodecRejects, FieldOfWrongType) {
  auto r = decodeForged({[](msgpack::packer<msgpack::sbuffer>& pk) {
                           pk.pack_map(3);
                           pk.pack("v"), pk.pack(1);
                           pk.pack("k"), pk.pack("activation");  // string, not an integer
                           pk.pack("t"), pk.pack_array(0);
                         },
                         {}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error->code, DecodeErrorCode::kMalformedHeader);
}

}  // namespace
}  // namespace cairn
