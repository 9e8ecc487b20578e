// f32 <-> f16 / bf16 conversions: rounding, special values, exhaustive round trips.
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

namespace ct {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::u8), 1u);
  EXPECT_STREQ(dtype_name(DType::bf16), "bf16");
  EXPECT_TRUE(dtype_is_float(DType::f16));
  EXPECT_FALSE(dtype_is_float(DType::i32));
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly half way between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3f808000u)), 0x3f80);
  // 1 + 3 * 2^-8 is half way between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up to even.
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3f818000u)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3f808001u)), 0x3f81);  // above half: up
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(bits_f32(0x7f800001u)))));  // no NaN -> inf
  EXPECT_EQ(f32_to_bf16(3.4028235e38f), 0x7f80);  // max float rounds to inf
}

TEST(BFloat16, EveryValueRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), h) << std::hex << h;
  }
}

TEST(Float16, SpecialValuesAndRounding) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);  // max half
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);  // rounds down to max
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7c00);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xfc00);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  EXPECT_EQ(f32_to_f16(5.960464477539063e-08f), 0x0001);  // smallest subnormal 2^-24
  EXPECT_EQ(f32_to_f16(2.98e-08f), 0x0000);               // below half of it: zero
  EXPECT_EQ(f32_to_f16(6.103515625e-05f), 0x0400);        // smallest normal
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  // 1 + 2^-11 is half way between 1 and the next half (1 + 2^-10): ties to even.
  EXPECT_EQ(f32_to_f16(1.0f + 0.00048828125f), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0.00048828125f), 0x3c02);
}

TEST(Float16, EveryValueRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
}

TEST(Float16, MatchesRoundingOfDoubleReference) {
  // For a sweep of floats in range, the f16 result is a nearest representable half.
  for (uint32_t u = 0x33000000u; u < 0x477fe000u; u += 4099) {  // up to 65504
    float f = bits_f32(u);
    float r = f16_to_f32(f32_to_f16(f));
    float up = f16_to_f32(static_cast<uint16_t>(f32_to_f16(f) + 1));
    float down = f32_to_f16(f) ? f16_to_f32(static_cast<uint16_t>(f32_to_f16(f) - 1)) : 0.0f;
    double e = std::abs(static_cast<double>(r) - f);
    ASSERT_LE(e, std::abs(static_cast<double>(up) - f)) << f;
    ASSERT_LE(e, std::abs(static_cast<double>(down) - f)) << f;
  }
}

}  // namespace
}  // namespace ct
