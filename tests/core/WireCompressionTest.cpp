// core/WireCompression.h against independent references: torch's own casts for bf16/fp16, and a
// torch-computed per-row int8 reference (amax/127, torch::round = half-to-even, clamp).
#include "core/WireCompression.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include <limits>

using namespace cairn::wire;

namespace {

torch::Tensor testValues() {
  at::manual_seed(7);
  auto random = torch::randn({4096}) * torch::exp(torch::randn({4096}) * 6);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> special = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65520.0f, 65519.0f, 1e-8f,
                                5.96e-8f, 2.98e-8f, 6.1e-5f, 3.0e38f, -3.0e38f, inf, -inf,
                                1.00390625f, 1.01171875f, 3.4028235e38f, 1e-40f};
  return torch::cat({random, torch::tensor(special)});
}

}  // namespace

TEST(WireCompression, Bf16MatchesTorchCastBitForBit) {
  auto x = testValues();
  auto ref = x.to(torch::kBFloat16).to(torch::kFloat);
  auto xa = x.accessor<float, 1>();
  auto ra = ref.accessor<float, 1>();
  for (int64_t i = 0; i < x.size(0); ++i)
    ASSERT_EQ(floatBits(fromBf16(toBf16(xa[i]))), floatBits(ra[i])) << "value " << xa[i];
  EXPECT_TRUE(std::isnan(fromBf16(toBf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(WireCompression, Fp16MatchesTorchCastBitForBit) {
  auto x = testValues();
  auto ref = x.to(torch::kHalf).to(torch::kFloat);
  auto xa = x.accessor<float, 1>();
  auto ra = ref.accessor<float, 1>();
  for (int64_t i = 0; i < x.size(0); ++i)
    ASSERT_EQ(floatBits(fromFp16(toFp16(xa[i]))), floatBits(ra[i])) << "value " << xa[i];
  EXPECT_TRUE(std::isnan(fromFp16(toFp16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(WireCompression, Int8PerRowMatchesTorchReferenceAndErrorBound) {
  at::manual_seed(11);
  auto x = torch::randn({37, 53}) * torch::exp(torch::randn({37, 1}) * 3);
  x[5].zero_();
  x[6][0] = 1.5f;  // a row with a single non-zero
  auto enc = encodeInt8Rows(x.data_ptr<float>(), 37, 53);
  ASSERT_EQ(enc.size(), 37u * 4 + 37u * 53);
  auto dec = decodeInt8Rows(enc.data(), enc.size(), 37, 53);

  auto scale = x.abs().amax({1}, true) / 127.0f;
  auto q = torch::where(scale == 0, torch::zeros_like(x), torch::round(x / scale)).clamp(-127, 127);
  auto ref = q * scale;
  auto ra = ref.accessor<float, 2>();
  auto xa = x.accessor<float, 2>();
  auto sa = scale.accessor<float, 2>();
  for (int64_t r = 0; r < 37; ++r)
    for (int64_t c = 0; c < 53; ++c) {
      const float got = dec[static_cast<size_t>(r * 53 + c)];
      ASSERT_EQ(got, ra[r][c]) << r << "," << c;  // value-exact; int8 has no -0
      ASSERT_LE(std::fabs(got - xa[r][c]), sa[r][0] * 0.5f * 1.0001f);
    }
}

TEST(WireCompression, Int8RejectsHostileInput) {
  std::vector<float> x = {1.0f, -2.0f, 3.0f, 4.0f};
  auto enc = encodeInt8Rows(x.data(), 2, 2);
  EXPECT_THROW(decodeInt8Rows(enc.data(), enc.size() - 1, 2, 2), std::invalid_argument);
  EXPECT_THROW(decodeInt8Rows(enc.data(), enc.size(), 3, 2), std::invalid_argument);
  EXPECT_THROW(decodeInt8Rows(enc.data(), enc.size(), -1, 2), std::invalid_argument);
  EXPECT_THROW(decodeInt8Rows(enc.data(), enc.size(), INT64_MAX, 2), std::invalid_argument);
  auto badScale = enc;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(badScale.data(), &nan, 4);
  EXPECT_THROW(decodeInt8Rows(badScale.data(), badScale.size(), 2, 2), std::invalid_argument);
  auto negScale = enc;
  const float neg = -1.0f;
  std::memcpy(negScale.data(), &neg, 4);
  EXPECT_THROW(decodeInt8Rows(negScale.data(), negScale.size(), 2, 2), std::invalid_argument);
  auto minus128 = enc;
  minus128[8] = 0x80;
  EXPECT_THROW(decodeInt8Rows(minus128.data(), minus128.size(), 2, 2), std::invalid_argument);
  std::vector<float> inf = {std::numeric_limits<float>::infinity()};
  EXPECT_THROW(encodeInt8Rows(inf.data(), 1, 1), std::invalid_argument);
  try {
    decodeInt8Rows(enc.data(), 3, 2, 2);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("expected 12"), std::string::npos) << e.what();
  }
}
