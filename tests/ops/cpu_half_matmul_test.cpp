// The CPU fast device's arithmetic for products of 16-bit operands (backends/cpu/cpu_device.cpp,
// native_bf16_chosen): `devices` says which one runs, and every path this CPU has -- the chosen
// one, and widened to f32 (CT_CPU_BF16_MATMUL=widened) -- gives the fp64 product of the
// (rounded) inputs within the mixed-precision suite's tolerances and agrees with the other. The
// shapes are tall enough that the widened path splits their rows over the threads.
#include <cstdlib>
#include <memory>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "tests/common/device_harness.h"
#include "tests/common/fp64_ops.h"
#include "tests/common/half_compare.h"

namespace ct::test {
namespace {

std::string extra(const DeviceInfo& info, const std::string& key) {
  for (const auto& [k, v] : info.extra)
    if (k == key) return v;
  return "";
}

// A fast CPU device opened with CT_CPU_BF16_MATMUL set to `choice` ("" = unset), restored after.
std::unique_ptr<Device> open_fast(const char* choice) {
  const char* old = std::getenv("CT_CPU_BF16_MATMUL");
  const std::string saved = old ? old : "";
  if (*choice)
    setenv("CT_CPU_BF16_MATMUL", choice, 1);
  else
    unsetenv("CT_CPU_BF16_MATMUL");
  std::unique_ptr<Device> d = make_cpu_device(false);
  if (old)
    setenv("CT_CPU_BF16_MATMUL", saved.c_str(), 1);
  else
    unsetenv("CT_CPU_BF16_MATMUL");
  return d;
}

Vec round_to_h(const Vec& v, DType h) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = from_h(to_h(v[i], h), h);
  return r;
}

TEST(CpuHalfMatmul, DevicesSaysWhichArithmetic) {
  std::unique_ptr<Device> chosen = open_fast(""), widened = open_fast("widened");
  const std::string row = extra(chosen->info(), "bf16 matmul");
  const bool native = row.rfind("bf16 arithmetic", 0) == 0;
  EXPECT_TRUE(native || row.rfind("f32 arithmetic (operands widened to f32", 0) == 0) << row;
  EXPECT_EQ(extra(widened->info(), "bf16 matmul").rfind("f32 arithmetic", 0), 0u)
      << extra(widened->info(), "bf16 matmul");
  EXPECT_EQ(extra(chosen->info(), "f16 matmul").rfind("f32 arithmetic", 0), 0u);
  // The reference: plain loops, which the report counts as an own kernel ("widened ...").
  EXPECT_EQ(extra(make_cpu_device(true)->info(), "bf16 matmul").rfind("widened to f32", 0), 0u);
}

// c = alpha op(a) op(b) + beta c0 (+ bias) in the layouts of a linear layer (forward with bias
// into 16-bit c, dx into 16-bit c read by beta, dW into f32 c accumulated) and a batch against a
// shared b; each path against fp64, and the two paths against each other.
TEST(CpuHalfMatmul, EveryPathWithinTolerance) {
  std::unique_ptr<Device> paths[2] = {open_fast(""), open_fast("widened")};
  struct Case {
    int64_t batch, M, N, K;
    bool ta, tb, bias;
    float beta;
    bool c16;
  };
  const Case cases[] = {{1, 160, 48, 72, false, false, true, 0.0f, true},
                        {1, 160, 72, 48, false, true, false, 0.5f, true},
                        {1, 72, 48, 160, true, false, false, 1.0f, false},
                        {3, 48, 40, 24, false, false, true, 0.0f, true}};
  for (DType h : {DType::bf16, DType::f16}) {
    for (const Case& k : cases) {
      SCOPED_TRACE(std::string(dtype_name(h)) + " M " + std::to_string(k.M) + " ta " +
                   std::to_string(k.ta) + " tb " + std::to_string(k.tb));
      const int64_t rows = k.batch * k.M;
      const Vec a = round_to_h(randn(rows * k.K, 1), h), b = round_to_h(randn(k.K * k.N, 2), h);
      const DType cdt = k.c16 ? h : DType::f32;
      const Vec c0 = round_to_h(randn(rows * k.N, 3), cdt == DType::f32 ? DType::bf16 : h);
      const Vec bias = randn(k.N, 4);
      VecD want(static_cast<size_t>(rows * k.N));
      for (int64_t p = 0; p < k.batch; ++p) {
        VecD ap(a.begin() + p * k.M * k.K, a.begin() + (p + 1) * k.M * k.K);
        VecD one = f64::matmul(ap, to_d(b), k.M, k.N, k.K, k.ta, k.tb);
        for (int64_t i = 0; i < k.M * k.N; ++i) {
          const int64_t e = p * k.M * k.N + i;
          const double bj =
              k.bias ? (k.c16 ? from_h(to_h(bias[i % k.N], h), h) : bias[i % k.N]) : 0.0;
          want[static_cast<size_t>(e)] = one[static_cast<size_t>(i)] + k.beta * c0[e] + bj;
        }
      }
      Vec got[2];
      for (int p = 0; p < 2; ++p) {
        Device& d = *paths[p];
        const Shape as =
            k.batch > 1 ? Shape{k.batch, k.M, k.K} : (k.ta ? Shape{k.K, k.M} : Shape{k.M, k.K});
        const Shape bs = k.tb ? Shape{k.N, k.K} : Shape{k.K, k.N};
        const Shape cs = k.batch > 1 ? Shape{k.batch, k.M, k.N} : Shape{k.M, k.N};
        Tensor ta = up_as(d, as, a, h), tb = up_as(d, bs, b, h), tc = up_as(d, cs, c0, cdt);
        Tensor tbias = upload(d, {k.N}, bias);
        d.matmul(tc, ta, tb, k.ta, k.tb, 1.0f, k.beta, k.bias ? &tbias : nullptr);
        got[p] = download_h(d, tc);
        const double tol = k.c16 ? (h == DType::bf16 ? 2e-5 : 4e-7) : kTolGemm;
        EXPECT_TRUE(close_nmse(got[p], want, tol, p == 0 ? "chosen path" : "widened path"));
      }
      EXPECT_TRUE(close_nmse(got[0], got[1], k.c16 ? (h == DType::bf16 ? 2e-5 : 4e-7) : kTolGemm,
                             "chosen vs widened"));
    }
  }
}

}  // namespace
}  // namespace ct::test
