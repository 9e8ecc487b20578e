// gelu_forward / gelu_backward: every device against the reference, extreme values; the
// reference against fp64 and central differences.
#include "tests/common/device_harness.h"
#include "tests/common/fp64_ops.h"

namespace ct::test {
namespace {

std::pair<Vec, Vec> run(Device& d, const Vec& x, const Vec& dout) {
  int64_t n = static_cast<int64_t>(x.size());
  Tensor tx = upload(d, {n}, x), to = upload(d, {n}, Vec(n, NAN));
  Tensor td = upload(d, {n}, dout), tdx = upload(d, {n}, Vec(n, NAN));
  d.gelu_forward(to, tx);
  d.gelu_backward(tdx, tx, td);
  return {download(d, to), download(d, tdx)};
}

using Gelu = DeviceTest;

TEST_P(Gelu, MatchesReference) {
  for (int64_t n : {1, 7, 1001, 3003, 100003}) {
    Vec x = randn(n, 1 + n, n == 3003 ? 4.0f : 3.0f), dout = randn(n, 2 + n);
    if (n == 3003) {
      x[0] = 30.0f;  // large |x| must not produce NaN (tanh overflow)
      x[1] = -30.0f;
    }
    auto [ro, rd] = run(ref(), x, dout);
    auto [fo, fd] = run(dev(), x, dout);
    std::string nm = " n=" + std::to_string(n) + " on " + id();
    EXPECT_TRUE(close_nmse(fo, ro, tol(), "out vs ref" + nm));
    EXPECT_TRUE(close_nmse(fd, rd, tol(), "dx vs ref" + nm));
  }
}

TEST_P(Gelu, ExtremeValues) {
  // Past |x| = 7e12 x^3 overflows fp32 (NVIDIA's Vulkan driver gave NaN at 1e30 in the backward
  // before the cubic term was clamped). The last three: inf, -inf, NaN.
  Vec x = {0.0f,   -0.0f, 1e-30f, -1e-30f, 20.0f,  -20.0f,   100.0f,    -100.0f, 1e30f,
           -1e30f, 1e13f, -1e13f, 3e38f,   -3e38f, INFINITY, -INFINITY, NAN};
  const size_t n = x.size();
  Vec dout(n, 1.0f);
  auto [ro, rd] = run(ref(), x, dout);
  auto [fo, fd] = run(dev(), x, dout);
  // PyTorch's gelu(approximate='tanh'): gelu(x) = x, gelu'(x) = 1 for large x; -0 and 0 for
  // large negative x; NaN for NaN.
  EXPECT_EQ(ro[4], 20.0f);
  EXPECT_EQ(ro[5], -0.0f);
  for (size_t i : {8, 10, 12}) {
    EXPECT_EQ(ro[i], x[i]);
    EXPECT_EQ(rd[i], 1.0f);
    EXPECT_EQ(ro[i + 1], 0.0f);
    EXPECT_TRUE(std::signbit(ro[i + 1]));
    EXPECT_EQ(rd[i + 1], 0.0f);
  }
  EXPECT_TRUE(std::isnan(ro[n - 1]));
  for (size_t i = 0; i + 3 < n; ++i) {  // finite inputs: same values
    EXPECT_NEAR(fo[i], ro[i], 1e-6 * std::abs(ro[i]) + 1e-30) << "x=" << x[i];
    EXPECT_NEAR(fd[i], rd[i], 1e-6) << "x=" << x[i];
  }
  EXPECT_EQ(fo[n - 3], INFINITY);
  EXPECT_TRUE(std::isnan(fo[n - 1]) && std::isnan(fd[n - 1]));
}

CT_INSTANTIATE_DEVICE_SUITE(Gelu);

TEST(ReferenceGelu, MatchesFp64) {
  for (int64_t n : {1, 7, 1001, 100003}) {
    Vec x = randn(n, 1 + n, 3.0f), dout = randn(n, 2 + n);
    auto [ro, rd] = run(ref(), x, dout);
    EXPECT_TRUE(
        close_nmse(ro, f64::gelu(to_d(x)), kTolF64, "out ref vs fp64 n=" + std::to_string(n)));
  }
}

TEST(ReferenceGelu, GradientMatchesFiniteDifferences) {
  Vec x = randn(257, 5, 2.0f), dout = randn(257, 6);
  auto [ro, rd] = run(ref(), x, dout);
  VecD num = numeric_grad([](const VecD& v) { return f64::gelu(v); }, to_d(x), to_d(dout));
  EXPECT_TRUE(close_nmse(rd, num, kTolGrad, "dx ref vs finite differences"));
}

}  // namespace
}  // namespace ct::test
