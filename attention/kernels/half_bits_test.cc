#include "attention/kernels/half_bits.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace attnmeta {
namespace {

TEST(HalfBitsTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xc000);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: to the even 1. 1 + 3 * 2^-8 lies halfway
  // between 1 + 2^-7 and 1 + 2^-6: to the even 1 + 2^-6.
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  // Just past halfway rounds up.
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::quiet_NaN()), 0x7fc0);
}

// Every encoding decodes to a NaN exactly when it is one (all exponent bits, a mantissa bit),
// and every other one round-trips; decoded values pinned at 1, the smallest subnormal, the
// largest finite value and infinity.
TEST(HalfBitsTest, Bf16ValuesRoundTrip) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float x = Bf16ToFloat(bits);
    const bool nan_bits = (bits & 0x7f80) == 0x7f80 && (bits & 0x7f) != 0;
    ASSERT_EQ(std::isnan(x), nan_bits) << "bits 0x" << std::hex << b;
    if (nan_bits) continue;
    ASSERT_EQ(FloatToBf16(x), bits) << "bits 0x" << std::hex << b;
  }
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0x0001), std::ldexp(1.0f, -133));
  EXPECT_EQ(Bf16ToFloat(0x7f7f), std::ldexp(255.0f, 120));  // (2 - 2^-7) * 2^127
  EXPECT_EQ(Bf16ToFloat(0xff80), -std::numeric_limits<float>::infinity());
}

TEST(HalfBitsTest, Fp16RoundsToNearestEvenAndSaturatesToInfinity) {
  EXPECT_EQ(FloatToFp16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToFp16(-0.5f), 0xb800);
  EXPECT_EQ(FloatToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // halfway: to even
  EXPECT_EQ(FloatToFp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // halfway: to even
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7c00);  // rounds past the largest finite value
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -26)), 0x0000);  // below half of it
  EXPECT_EQ(FloatToFp16(std::numeric_limits<float>::quiet_NaN()) & 0x7e00, 0x7e00);
}

TEST(HalfBitsTest, Fp16ValuesRoundTrip) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float x = Fp16ToFloat(bits);
    const bool nan_bits = (bits & 0x7c00) == 0x7c00 && (bits & 0x3ff) != 0;
    ASSERT_EQ(std::isnan(x), nan_bits) << "bits 0x" << std::hex << b;
    if (nan_bits) continue;
    ASSERT_EQ(FloatToFp16(x), bits) << "bits 0x" << std::hex << b;
  }
  EXPECT_EQ(Fp16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(Fp16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(Fp16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(Fp16ToFloat(0x7c00), std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace attnmeta
