// rope_forward / rope_backward (rotary position embedding, Hugging Face's rotate-half form, the
// cos/sin tables the caller's): every device against the reference (several head sizes, GQA-like
// packings where only the q and k heads rotate), in place equal to out of place, the backward
// undoes the forward, bad arguments refused; the reference against fp64 and central differences.
// 16-bit x: tests/ops/mixed_precision_ulp_test.cpp.
#include <cmath>

#include "tests/common/device_harness.h"
#include "tests/common/fp64_ops.h"

namespace ct::test {
namespace {

struct RopeCase {
  int64_t B, T, heads, D, rot;
  double theta;
};
const RopeCase kCases[] = {
    {2, 5, 3, 8, 2, 10000.0},    {1, 7, 4, 6, 4, 500000.0},
    {3, 33, 12, 16, 9, 10000.0},  // 6 q + 3 k heads rotated, 3 v heads copied
    {1, 1, 1, 2, 1, 10000.0},    {2, 300, 2, 64, 2, 10000.0},  // angles up to ~300 rad
};

// The tables as Hugging Face builds them: inv_freq = 1 / theta^(2i/D) in fp32, angle = t *
// inv_freq in fp32, cos/sin of it rounded to fp32.
void tables(const RopeCase& c, Vec& cos, Vec& sin) {
  const int64_t half = c.D / 2;
  cos.resize(static_cast<size_t>(c.T * half));
  sin.resize(cos.size());
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float inv = static_cast<float>(1.0 / std::pow(c.theta, double(2 * i) / double(c.D)));
      const float a = static_cast<float>(t) * inv;
      cos[t * half + i] = static_cast<float>(std::cos(double(a)));
      sin[t * half + i] = static_cast<float>(std::sin(double(a)));
    }
}

struct RopeOut {
  Vec out, dx;
};

RopeOut run(Device& d, const RopeCase& c, const Vec& x, const Vec& dout, bool in_place) {
  const int64_t W = c.heads * c.D;
  Vec cs, sn;
  tables(c, cs, sn);
  Tensor tc = upload(d, {c.T, c.D / 2}, cs), ts = upload(d, {c.T, c.D / 2}, sn);
  Tensor tx = upload(d, {c.B, c.T, W}, x);
  Tensor to = in_place ? tx : upload(d, {c.B, c.T, W}, Vec(x.size(), NAN));
  d.rope_forward(to, tx, tc, ts, c.D, c.rot);
  Tensor td = upload(d, {c.B, c.T, W}, dout);
  Tensor tdx = in_place ? td : upload(d, {c.B, c.T, W}, Vec(x.size(), NAN));
  d.rope_backward(tdx, td, tc, ts, c.D, c.rot);
  return {download(d, to), download(d, tdx)};
}

Vec x_of(const RopeCase& c, uint64_t seed) {
  return randn(static_cast<size_t>(c.B * c.T * c.heads * c.D), seed, 2.0f);
}

using Rope = DeviceTest;

TEST_P(Rope, MatchesReferenceAndRunsInPlace) {
  CT_REQUIRE_SUPPORT(OpKind::kRope, DType::f32);
  uint64_t seed = 1;
  for (const RopeCase& c : kCases) {
    Vec x = x_of(c, seed), dout = x_of(c, seed + 1);
    seed += 2;
    RopeOut r = run(ref(), c, x, dout, false);
    RopeOut f = run(dev(), c, x, dout, false);
    RopeOut p = run(dev(), c, x, dout, true);
    std::string nm = " B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " heads " +
                     std::to_string(c.heads) + "x" + std::to_string(c.D) + " on " + id();
    EXPECT_TRUE(close_nmse(f.out, r.out, tol(), "out vs ref" + nm));
    EXPECT_TRUE(close_nmse(f.dx, r.dx, tol(), "dx vs ref" + nm));
    EXPECT_EQ(p.out, f.out) << "in place" << nm;
    EXPECT_EQ(p.dx, f.dx) << "in place" << nm;
    // the unrotated heads are copied exactly
    const int64_t W = c.heads * c.D;
    for (int64_t bt = 0; bt < c.B * c.T; ++bt)
      for (int64_t j = c.rot * c.D; j < W; ++j) ASSERT_EQ(f.out[bt * W + j], x[bt * W + j]) << nm;
  }
}

TEST_P(Rope, BackwardUndoesForward) {
  CT_REQUIRE_SUPPORT(OpKind::kRope, DType::f32);
  const RopeCase c = kCases[2];
  Vec x = x_of(c, 40);
  Vec cs, sn;
  tables(c, cs, sn);
  Tensor tc = upload(dev(), {c.T, c.D / 2}, cs), ts = upload(dev(), {c.T, c.D / 2}, sn);
  Tensor tx = upload(dev(), {c.B, c.T, c.heads * c.D}, x);
  dev().rope_forward(tx, tx, tc, ts, c.D, c.rot);
  dev().rope_backward(tx, tx, tc, ts, c.D, c.rot);
  EXPECT_TRUE(close_nmse(download(dev(), tx), to_d(x), 1e-12, "backward(forward(x)) vs x"));
}

TEST_P(Rope, RejectsBadArguments) {
  Device& d = dev();
  Tensor x = upload(d, {1, 4, 12}, Vec(48, 1.0f)), out = upload(d, {1, 4, 12}, Vec(48, 0.0f));
  Tensor c3 = upload(d, {4, 3}, Vec(12, 1.0f)), s3 = upload(d, {4, 3}, Vec(12, 0.0f));
  Tensor c2 = upload(d, {4, 2}, Vec(8, 1.0f));
  EXPECT_NO_THROW(d.rope_forward(out, x, c3, s3, 6, 2));
  EXPECT_THROW(d.rope_forward(out, x, c3, s3, 5, 1), Error);  // odd head_dim
  EXPECT_THROW(d.rope_forward(out, x, c3, s3, 6, 3), Error);  // rot_heads > heads
  EXPECT_THROW(d.rope_forward(out, x, c2, s3, 6, 2), Error);  // cos shape
  EXPECT_THROW(d.rope_forward(out, x, c3, s3, 8, 1), Error);  // 8 does not divide 12
  Tensor big = upload(d, {2, 4, 12}, Vec(96, 0.0f));
  EXPECT_THROW(
      d.rope_forward(big.slice_flat(6, {1, 4, 12}), big.slice_flat(0, {1, 4, 12}), c3, s3, 6, 2),
      Error);  // partial overlap
  try {
    d.rope_forward(out, x, c3, s3, 6, 3);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rot_heads"), std::string::npos) << e.what();
  }
}

CT_INSTANTIATE_DEVICE_SUITE(Rope);

TEST(ReferenceRope, MatchesFp64AndFiniteDifferences) {
  for (const RopeCase& c : kCases) {
    if (c.T > 40) continue;
    const int64_t W = c.heads * c.D;
    Vec x = x_of(c, 50), dout = x_of(c, 51), cs, sn;
    tables(c, cs, sn);
    RopeOut r = run(ref(), c, x, dout, false);
    auto f = [&](const VecD& xx) {
      return f64::rope(xx, to_d(cs), to_d(sn), c.B, c.T, W, c.D, c.rot);
    };
    EXPECT_TRUE(close_nmse(r.out, f(to_d(x)), kTolF64, "out ref vs fp64"));
    if (c.B * c.T * W > 2000) continue;
    VecD nx = numeric_grad(f, to_d(x), to_d(dout));
    EXPECT_TRUE(close_nmse(r.dx, nx, kTolGrad, "dx ref vs finite differences"));
  }
}

}  // namespace
}  // namespace ct::test
