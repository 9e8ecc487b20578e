// sum, norm, check_finite, unscale_check: values, determinism, non-finite detection, on every
// device.
#include "tests/common/device_harness.h"

namespace ct::test {
namespace {

float run_sum(Device& d, const Vec& x, float scale) {
  Tensor tx = upload(d, {static_cast<int64_t>(x.size())}, x), out = upload(d, {1}, {NAN});
  d.sum(out, tx, scale);
  return download(d, out)[0];
}
float run_norm(Device& d, const Vec& x) {
  Tensor tx = upload(d, {static_cast<int64_t>(x.size())}, x), out = upload(d, {1}, {NAN});
  d.norm(out, tx);
  return download(d, out)[0];
}

using Reduce = DeviceTest;

// Against fp64 sums: to 1e-12 on the reference and on devices of its backend, to the
// cross-backend tolerance elsewhere.
TEST_P(Reduce, SumAndNormMatchFp64) {
  double t = same_backend_as_ref() ? kTolF64 : kTol;
  for (size_t n :
       {size_t{1}, size_t{7}, size_t{255}, size_t{1000}, size_t{4097}, size_t{1000003}}) {
    Vec x = randn(n, n);
    double s = 0.0, q = 0.0;
    for (float v : x) {
      s += v;
      q += static_cast<double>(v) * v;
    }
    for (Device* d : {&ref(), &dev()}) {
      double td = d == &ref() ? kTolF64 : t;
      std::string nm = d->info().id() + " " + std::to_string(n);
      EXPECT_TRUE(close_nmse(Vec{run_sum(*d, x, 0.5f)}, VecD{0.5 * s}, td, "sum " + nm));
      EXPECT_TRUE(close_nmse(Vec{run_norm(*d, x)}, VecD{std::sqrt(q)}, td, "norm " + nm));
    }
  }
}

TEST_P(Reduce, SumAndNormAreDeterministic) {
  for (size_t n : {size_t{777777}, size_t{3000017}}) {
    Vec x = randn(n, 5, 100.0f);
    float s0 = run_sum(dev(), x, 1.0f), n0 = run_norm(dev(), x);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(run_sum(dev(), x, 1.0f), s0);
      EXPECT_EQ(run_norm(dev(), x), n0);
    }
  }
  EXPECT_EQ(run_sum(dev(), Vec{}, 1.0f), 0.0f);
  EXPECT_EQ(run_norm(dev(), Vec{}), 0.0f);
}

TEST_P(Reduce, CheckFiniteFindsInfAndNan) {
  Device& d = dev();
  for (size_t n : {size_t{5}, size_t{3001}, size_t{100003}}) {
    for (float bad : {INFINITY, -INFINITY, NAN}) {
      for (size_t pos : {size_t{0}, n / 2, n - 2, n - 1}) {
        Vec x = randn(n, 3);
        x[pos] = bad;
        Tensor tx = upload(d, {static_cast<int64_t>(n)}, x);
        Tensor flag = upload_i32(d, {1}, {0});
        d.check_finite(flag, tx);
        EXPECT_EQ(download_i32(d, flag)[0], 1)
            << id() << " n " << n << " bad " << bad << " at " << pos;
      }
    }
    Vec x = randn(n, 4, 1e30f);  // huge but finite
    x[0] = 3.4028235e38f;
    Tensor tx = upload(d, {static_cast<int64_t>(n)}, x);
    Tensor flag = upload_i32(d, {1}, {0});
    d.check_finite(flag, tx);
    EXPECT_EQ(download_i32(d, flag)[0], 0);
    d.upload(flag, std::vector<int32_t>{1}.data(), 4);  // a set flag stays set (or-ed into it)
    d.check_finite(flag, tx);
    EXPECT_EQ(download_i32(d, flag)[0], 1);
  }
}

TEST_P(Reduce, UnscaleCheckScalesAndFlags) {
  Device& d = dev();
  for (size_t n : {size_t{9}, size_t{5003}, size_t{100003}}) {
    Vec x = randn(n, 8, 1000.0f);
    Tensor tx = upload(d, {static_cast<int64_t>(n)}, x);
    Tensor flag = upload_i32(d, {1}, {0});
    d.unscale_check(tx, flag, 1.0f / 1024.0f);
    Vec got = download(d, tx);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], x[i] * (1.0f / 1024.0f));  // one multiply
    EXPECT_EQ(download_i32(d, flag)[0], 0);
    // Non-finite before scaling, and finite values that overflow after it.
    for (float bad : {NAN, INFINITY}) {
      x[n / 3] = bad;
      d.upload(tx, x.data(), n * 4);
      d.unscale_check(tx, flag, 0.5f);
      EXPECT_EQ(download_i32(d, flag)[0], 1) << id() << " " << bad;
      d.upload(flag, std::vector<int32_t>{0}.data(), 4);
    }
    x[n / 3] = 3e38f;
    d.upload(tx, x.data(), n * 4);
    d.unscale_check(tx, flag, 4.0f);
    EXPECT_EQ(download_i32(d, flag)[0], 1) << id() << " overflow";
  }
}

// The fused loss-scaler step against the reference device's, exactly.
TEST_P(Reduce, UnscaleCheckLikeTheReference) {
  Vec xs = randn(5003, 121, 1000.0f);
  Pair x = both({5003}, xs);
  Pair flag = both_i32({1}, {0});
  dev().unscale_check(x.d, flag.d, 1.0f / 1024.0f);
  ref().unscale_check(x.r, flag.r, 1.0f / 1024.0f);
  EXPECT_TRUE(same(x, 0.0, "unscaled"));
  EXPECT_EQ(download_i32(dev(), flag.d)[0], 0);
  EXPECT_EQ(download_i32(ref(), flag.r)[0], 0);
}

CT_INSTANTIATE_DEVICE_SUITE(Reduce);

}  // namespace
}  // namespace ct::test
