// backends/gpu/kernels/reduce.cu run by the SIMT runtime: the sum equals a plain loop, and is
// bit-identical at warp 32 and 64 and for any number of host threads (a fixed tree).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/gpu/kernels.h"
#include "backends/gpu/portability.h"

namespace {

float reduce(const std::vector<float>& x, int warp, ct::simt::Runtime& rt) {
  std::vector<float> partial(ct::gpu::reduce_sum_partials(static_cast<std::int64_t>(x.size())));
  float out = NAN;
  ct::gpu::reduce_sum_f32(warp, x.data(), partial.data(), &out, static_cast<std::int64_t>(x.size()),
                          &rt);
  return out;
}

TEST(SimtReduce, SumMatchesAPlainLoopAndIsTheSameForEveryWarpAndThreadCount) {
  ct::simt::Runtime one(1), three(3);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  for (std::int64_t n : {1, 255, 256, 1000, 4097, (1 << 20) + 3}) {
    std::vector<float> x(n);
    for (auto& v : x) v = u(rng);
    double ref = 0, abs_sum = 0;
    for (float v : x) ref += v, abs_sum += std::fabs(v);
    const float got = reduce(x, 32, one);
    EXPECT_NEAR(got, ref, 1e-6 * abs_sum + 1e-7) << "n = " << n;
    for (int warp : {32, 64})
      for (ct::simt::Runtime* rt : {&one, &three}) {
        const float again = reduce(x, warp, *rt);
        EXPECT_EQ(0, std::memcmp(&got, &again, sizeof(float)))
            << "n = " << n << " warp " << warp << " host threads " << rt->threads();
      }
  }
}

TEST(SimtReduce, ExactOnValuesWhoseSumIsRepresentable) {
  ct::simt::Runtime rt(2);
  std::vector<float> x(100003);
  float plain = 0;
  for (std::size_t i = 0; i < x.size(); ++i) plain += (x[i] = static_cast<float>(i % 17) - 8.0f);
  EXPECT_EQ(reduce(x, 64, rt), plain);
}

TEST(SimtReduce, RejectsAWarpSizeOtherThan32Or64) {
  ct::simt::Runtime rt(1);
  std::vector<float> x(10, 1.0f);
  EXPECT_THROW(reduce(x, 16, rt), std::invalid_argument);
}

}  // namespace
