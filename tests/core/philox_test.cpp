// Philox4x32-10: the Random123 known-answer vectors and stream properties.
#include "core/philox.h"

#include <gtest/gtest.h>

#include <cmath>

namespace ct {
namespace {

TEST(Philox, KnownAnswers) {
  // Random123's kat_vectors for philox4x32_10.
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}),
            (PhiloxBlock{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(
      philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
      (PhiloxBlock{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(
      philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
      (PhiloxBlock{0xd16cfe09u, 0x94fdcceb, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, StreamsArePureFunctions) {
  Philox a(42, 0), b(42, 0), c(42, 1), d(43, 0);
  EXPECT_EQ(a.u32(12345), b.u32(12345));
  EXPECT_NE(a.u32(7), c.u32(7));
  EXPECT_NE(a.u32(7), d.u32(7));
  EXPECT_EQ(a.u32(9), a.block(2)[1]);
}

TEST(Philox, UniformAndNormalMoments) {
  Philox p(1, 2);
  const int n = 200000;
  double su = 0, sn = 0, sn2 = 0;
  for (int i = 0; i < n; ++i) {
    float u = p.uniform(i);
    ASSERT_GT(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    su += u;
    double z = p.normal(i);
    sn += z;
    sn2 += z * z;
  }
  EXPECT_NEAR(su / n, 0.5, 0.005);
  EXPECT_NEAR(sn / n, 0.0, 0.01);
  EXPECT_NEAR(sn2 / n, 1.0, 0.01);
}

}  // namespace
}  // namespace ct
