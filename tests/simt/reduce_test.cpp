// backends/gpu/kernels/reduce.cu run by the SIMT runtime: the sum equals a plain loop, and is
// bit-identical at warp 32 and 64 and for any number of host threads (a fixed tree); likewise the
// launchers built on it (sum, norm, and Adafactor's reductions), and the finite checks' flag.
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

ct::gpu::Ctx ctx(int warp, ct::simt::Runtime& rt) {
  ct::gpu::Ctx cx;
  cx.warp = warp;
  cx.stream = &rt;
  return cx;
}

TEST(SimtReduce, SumAndNormMatchAPlainLoopAndAreTheSameForEveryWarpAndThreadCount) {
  ct::simt::Runtime one(1), three(3);
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> u(-1, 1);
  for (std::int64_t n : {1, 257, 4097, 300001}) {
    std::vector<float> x(n);
    for (auto& v : x) v = u(rng);
    double ref = 0, abs_sum = 0, squares = 0;
    for (float v : x) ref += v, abs_sum += std::fabs(v), squares += static_cast<double>(v) * v;
    std::vector<unsigned char> ws(ct::gpu::reduce_workspace(n));
    float s32 = NAN, n32 = NAN;
    ct::gpu::sum(ctx(32, one), &s32, x.data(), n, 0.5f, ws.data());
    ct::gpu::norm(ctx(32, one), &n32, x.data(), n, ws.data());
    EXPECT_NEAR(s32, 0.5 * ref, 0.5e-6 * abs_sum + 1e-7) << "n = " << n;
    EXPECT_NEAR(n32, std::sqrt(squares), 1e-6 * std::sqrt(squares)) << "n = " << n;
    for (int warp : {32, 64})
      for (ct::simt::Runtime* rt : {&one, &three}) {
        float s = NAN, q = NAN;
        ct::gpu::sum(ctx(warp, *rt), &s, x.data(), n, 0.5f, ws.data());
        ct::gpu::norm(ctx(warp, *rt), &q, x.data(), n, ws.data());
        EXPECT_EQ(0, std::memcmp(&s, &s32, sizeof(float))) << "sum n = " << n << " warp " << warp;
        EXPECT_EQ(0, std::memcmp(&q, &n32, sizeof(float))) << "norm n = " << n << " warp " << warp;
      }
  }
}

TEST(SimtReduce, FiniteChecksSetTheFlagAndNeverClearIt) {
  ct::simt::Runtime rt(2);
  for (int warp : {32, 64}) {
    const auto cx = ctx(warp, rt);
    std::vector<float> x(5003, 1.5f);
    std::int32_t flag = 0;
    ct::gpu::check_finite(cx, &flag, x.data(), 5003);
    EXPECT_EQ(flag, 0);
    x[4999] = NAN;
    ct::gpu::check_finite(cx, &flag, x.data(), 5003);
    EXPECT_NE(flag, 0);
    x[4999] = 1.5f;
    ct::gpu::check_finite(cx, &flag, x.data(), 5003);
    EXPECT_NE(flag, 0) << "a clean tensor does not clear the flag";
    flag = 0;
    x[17] = -INFINITY;
    ct::gpu::check_finite(cx, &flag, x.data(), 5003);
    EXPECT_NE(flag, 0);

    std::vector<float> y(5003, 3.0f);
    flag = 0;
    ct::gpu::unscale_check(cx, y.data(), &flag, 0.25f, 5003);
    EXPECT_EQ(flag, 0);
    for (float v : y) ASSERT_EQ(v, 0.75f);
    y[2500] = 3e38f;  // finite before scaling, inf after
    ct::gpu::unscale_check(cx, y.data(), &flag, 4.0f, 5003);
    EXPECT_NE(flag, 0) << "warp " << warp;
    EXPECT_EQ(y[0], 3.0f);
    flag = 0;
    y[2500] = NAN;  // non-finite before scaling
    ct::gpu::unscale_check(cx, y.data(), &flag, 1.0f, 5003);
    EXPECT_NE(flag, 0);
  }
}

// Adafactor's statistics (row and column means, their mean, RMS of the update and of the
// parameter) are sums inside the op: fixed trees, so one step is bit-identical at every warp size
// and host thread count, factored or not.
TEST(SimtReduce, AdafactorStepIsTheSameForEveryWarpAndThreadCount) {
  ct::simt::Runtime one(1), three(3);
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> u(-1, 1), pos(0.1f, 1);
  ct::gpu::AdafactorArgs h{1e-3f, 1e-30f, 1e-3f, 1.0f, -0.8f, 0.9f,
                           0.01f, 0.0f,   true,  true, false, 3};
  for (std::int64_t R : {0, 5, 130}) {
    const std::int64_t C = R == 0 ? 70001 : 777, n = R == 0 ? C : R * C;
    std::vector<float> p0(n), g(n), ea0(n), row0(R), col0(R ? C : 0), v0(R ? 0 : n);
    for (auto& x : p0) x = u(rng);
    for (auto& x : g) x = u(rng);
    for (auto& x : ea0) x = 0.01f * u(rng);
    for (auto* t : {&row0, &col0, &v0})
      for (auto& x : *t) x = pos(rng);
    std::vector<unsigned char> ws(ct::gpu::adafactor_workspace(R, C));
    std::vector<float> first;
    for (int warp : {32, 64})
      for (ct::simt::Runtime* rt : {&one, &three}) {
        auto p = p0, ea = ea0, row = row0, col = col0, v = v0;
        ct::gpu::adafactor(ctx(warp, *rt), p.data(), g.data(), R ? row.data() : nullptr,
                           R ? col.data() : nullptr, R ? nullptr : v.data(), ea.data(), nullptr, R,
                           C, h, ws.data());
        if (first.empty()) {
          first = p;
          EXPECT_NE(0, std::memcmp(p.data(), p0.data(), p.size() * sizeof(float)));
        } else {
          EXPECT_EQ(0, std::memcmp(p.data(), first.data(), p.size() * sizeof(float)))
              << "R = " << R << " warp " << warp << " host threads " << rt->threads();
        }
      }
  }
}

}  // namespace
