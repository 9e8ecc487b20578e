// dropout: every device gives the reference's bits (the mask is a pure function of seed, stream
// and element index, a kept element is one fp32 multiply), in f32 and in 16 bits; the reference
// against the definition in core/device.h (core/philox.h), the keep rate, in place, argument
// checks, and the backward (the same op on dout) against central differences.
#include <cmath>

#include "core/philox.h"
#include "tests/common/device_harness.h"

namespace ct::test {
namespace {

constexpr uint64_t kSeed = 0x9E3779B97F4A7C15ull, kStream = 0x0123456789ABCDEFull;

Vec run(Device& d, const Vec& x, float p, uint64_t seed, uint64_t stream, DType dt = DType::f32) {
  const int64_t n = static_cast<int64_t>(x.size());
  Tensor tx = d.empty({n}, dt, MemCategory::kActivations);
  Tensor to = d.empty({n}, dt, MemCategory::kActivations);
  if (dt == DType::f32) {
    d.upload(tx, x.data(), x.size() * 4);
  } else {
    Tensor wide = upload(d, {n}, x);
    d.copy(tx, wide);
  }
  d.dropout(to, tx, p, seed, stream);
  if (dt == DType::f32) return download(d, to);
  Tensor wide = upload(d, {n}, Vec(static_cast<size_t>(n), NAN));
  d.copy(wide, to);
  return download(d, wide);
}

::testing::AssertionResult bitwise(const Vec& got, const Vec& want, const std::string& what) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0)
      return ::testing::AssertionFailure()
             << what << ": element " << i << " is " << got[i] << ", reference " << want[i];
  return ::testing::AssertionSuccess();
}

using Dropout = DeviceTest;

TEST_P(Dropout, SameBitsAsReference) {
  for (int64_t n : {1, 7, 1001, 100003})
    for (float p : {0.0f, 0.1f, 0.5f, 0.9f})
      for (uint64_t stream : {uint64_t{0}, uint64_t{5}, kStream}) {
        Vec x = randn(static_cast<size_t>(n), 11 + n, 2.0f);
        const std::string nm = " n=" + std::to_string(n) + " p=" + std::to_string(p) +
                               " stream=" + std::to_string(stream) + " on " + id();
        EXPECT_TRUE(bitwise(run(dev(), x, p, kSeed, stream), run(ref(), x, p, kSeed, stream),
                            "out vs ref" + nm));
      }
}

TEST_P(Dropout, SixteenBitSameBitsAsReference) {
  for (DType h : {DType::bf16, DType::f16}) {
    if (!unsupported(OpKind::kDropout, h).empty()) continue;
    Vec x = randn(4099, 3, 3.0f);
    EXPECT_TRUE(bitwise(run(dev(), x, 0.3f, kSeed, 9, h), run(ref(), x, 0.3f, kSeed, 9, h),
                        std::string(dtype_name(h)) + " out vs ref on " + id()));
  }
  CT_REQUIRE_SUPPORT(OpKind::kDropout, DType::bf16);
}

TEST_P(Dropout, InPlaceEqualsOutOfPlace) {
  Vec x = randn(5003, 4);
  Tensor t = upload(dev(), {5003}, x);
  dev().dropout(t, t, 0.25f, kSeed, 3);
  EXPECT_TRUE(bitwise(download(dev(), t), run(dev(), x, 0.25f, kSeed, 3), "in place on " + id()));
}

CT_INSTANTIATE_DEVICE_SUITE(Dropout);

TEST(ReferenceDropout, MatchesDefinition) {
  const float p = 0.35f;
  const auto threshold = static_cast<uint32_t>(std::llround(double{p} * 16777216.0));
  const auto scale = static_cast<float>(1.0 / (1.0 - double{p}));
  Vec x = uniform(20011, 6, 0.5f, 2.0f);  // never 0: a 0 in out means dropped
  Vec out = run(ref(), x, p, kSeed, kStream);
  const Philox rng(kSeed, kStream);
  for (size_t i = 0; i < x.size(); ++i) {
    const bool keep = (rng.u32(i) >> 8) >= threshold;
    ASSERT_EQ(out[i], keep ? x[i] * scale : 0.0f) << "element " << i;
  }
}

TEST(ReferenceDropout, KeepRateAndMean) {
  const int64_t n = 400000;
  Vec x(static_cast<size_t>(n), 1.0f);
  for (float p : {0.05f, 0.1f, 0.5f}) {
    Vec out = run(ref(), x, p, kSeed, 77);
    double kept = 0, sum = 0;
    for (float v : out) {
      kept += v != 0.0f;
      sum += v;
    }
    const double sigma = std::sqrt(double{p} * (1 - p) / n);
    EXPECT_NEAR(kept / n, 1.0 - p, 5 * sigma) << "p=" << p;
    EXPECT_NEAR(sum / n, 1.0, 5 * sigma / (1 - p)) << "p=" << p;  // inverted: mean kept
  }
  // different streams give different masks, p = 0 keeps everything unchanged
  EXPECT_NE(run(ref(), x, 0.5f, kSeed, 1), run(ref(), x, 0.5f, kSeed, 2));
  Vec y = randn(999, 8);
  EXPECT_TRUE(bitwise(run(ref(), y, 0.0f, kSeed, 1), y, "p = 0"));
}

// The backward is the op applied to dout with the same seed and stream: d(sum(dout * out))/dx.
TEST(ReferenceDropout, BackwardMatchesFiniteDifferences) {
  Vec x = randn(257, 5), dout = randn(257, 6);
  const float p = 0.4f;
  Vec dx = run(ref(), dout, p, kSeed, 12);
  Vec out0 = run(ref(), x, p, kSeed, 12);
  for (size_t i = 0; i < x.size(); ++i) {
    Vec xp = x, xm = x;
    const float h = 0.5f;  // the op is linear: the difference quotient is exact up to rounding
    xp[i] += h;
    xm[i] -= h;
    const double num = (double{run(ref(), xp, p, kSeed, 12)[i]} - run(ref(), xm, p, kSeed, 12)[i]) /
                       (2 * h) * dout[i];
    ASSERT_NEAR(dx[i], num, 1e-6 * (1 + std::abs(num))) << "element " << i;
    ASSERT_EQ(out0[i] == 0.0f, dx[i] == 0.0f || dout[i] == 0.0f) << "same mask, element " << i;
  }
}

TEST(ReferenceDropout, RefusesBadArguments) {
  Tensor a = upload(ref(), {16}, Vec(16, 1.0f)), b = upload(ref(), {16}, Vec(16, 1.0f));
  for (float p : {1.0f, -0.1f, NAN, 2.0f})
    EXPECT_THROW(ref().dropout(b, a, p, 1, 2), Error) << "p=" << p;
  Tensor c = upload(ref(), {15}, Vec(15, 1.0f));
  EXPECT_THROW(ref().dropout(c, a, 0.5f, 1, 2), Error);  // sizes differ
  EXPECT_THROW(ref().dropout(a.slice_flat(1, Shape{8}), a.slice_flat(0, Shape{8}), 0.5f, 1, 2),
               Error);  // partial overlap
  EXPECT_NO_THROW(ref().dropout(a, a, 0.5f, 1, 2));
}

}  // namespace
}  // namespace ct::test
