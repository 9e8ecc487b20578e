// swiglu_forward / swiglu_backward (Llama's MLP activation over a fused gate/up projection):
// every device against the reference (odd widths, many rows, 3-D, large |gate|), in place equal
// to out of place, bad shapes refused; the reference against fp64 and central differences.
// 16-bit tensors: tests/ops/mixed_precision_ulp_test.cpp.
#include "tests/common/device_harness.h"
#include "tests/common/fp64_ops.h"

namespace ct::test {
namespace {

struct SwOut {
  Vec out, dgu;
};

SwOut run(Device& d, const Shape& os, const Vec& gu, const Vec& dout, bool in_place = false) {
  Shape gs = os;
  gs[-1] *= 2;
  Tensor tg = upload(d, gs, gu), to = upload(d, os, Vec(os.numel(), NAN));
  d.swiglu_forward(to, tg);
  Tensor td = upload(d, os, dout);
  Tensor tdg = in_place ? tg : upload(d, gs, Vec(gs.numel(), NAN));
  d.swiglu_backward(tdg, tg, td);
  return {download(d, to), download(d, tdg)};
}

struct SwCase {
  Shape out;
  uint64_t seed;
  bool finite_differences;
  float scale = 2.0f;  // of the gate/up values
};
const SwCase kCases[] = {
    {{6, 5}, 1, true},      {{3, 1}, 2, true},          {{1037, 43}, 3, false},
    {{2, 7, 96}, 4, false}, {{9, 33}, 5, false, 40.0f},  // |gate| up to ~150: sigmoid saturates
                                                         // both ways
};

Vec gu_of(const SwCase& c) {
  return randn(static_cast<size_t>(2 * c.out.numel()), c.seed, c.scale);
}

using SwiGLU = DeviceTest;

TEST_P(SwiGLU, MatchesReferenceAndRunsInPlace) {
  CT_REQUIRE_SUPPORT(OpKind::kSwiGLU, DType::f32);
  for (const SwCase& c : kCases) {
    Vec gu = gu_of(c), dout = randn(static_cast<size_t>(c.out.numel()), c.seed + 1);
    SwOut r = run(ref(), c.out, gu, dout);
    SwOut f = run(dev(), c.out, gu, dout);
    SwOut p = run(dev(), c.out, gu, dout, /*in_place=*/true);
    std::string nm = " " + c.out.str() + " on " + id();
    EXPECT_TRUE(close_nmse(f.out, r.out, tol(), "out vs ref" + nm));
    EXPECT_TRUE(close_nmse(f.dgu, r.dgu, tol(), "dgu vs ref" + nm));
    EXPECT_EQ(p.dgu, f.dgu) << "in place" << nm;
  }
}

TEST_P(SwiGLU, RejectsBadShapes) {
  Device& d = dev();
  Tensor gu = upload(d, {4, 6}, Vec(24, 1.0f)), out = upload(d, {4, 3}, Vec(12, 0.0f));
  Tensor bad = upload(d, {4, 4}, Vec(16, 0.0f)), rows = upload(d, {3, 3}, Vec(9, 0.0f));
  EXPECT_THROW(d.swiglu_forward(bad, gu), Error);        // 2F != 6
  EXPECT_THROW(d.swiglu_forward(rows, gu), Error);       // rows differ
  EXPECT_THROW(d.swiglu_backward(bad, gu, out), Error);  // dgu shape
  EXPECT_THROW(d.swiglu_backward(gu, gu, bad), Error);   // dout shape
  try {
    d.swiglu_forward(bad, gu);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("swiglu_forward"), std::string::npos) << e.what();
  }
}

CT_INSTANTIATE_DEVICE_SUITE(SwiGLU);

TEST(ReferenceSwiGLU, MatchesFp64AndFiniteDifferences) {
  for (const SwCase& c : kCases) {
    if (c.out.ndim != 2) continue;
    const int64_t N = c.out[0], F = c.out[1];
    Vec gu = gu_of(c), dout = randn(static_cast<size_t>(N * F), c.seed + 1);
    SwOut r = run(ref(), c.out, gu, dout);
    std::string nm = " " + c.out.str();
    EXPECT_TRUE(close_nmse(r.out, f64::swiglu(to_d(gu), N, F), kTolF64, "out ref vs fp64" + nm));
    if (!c.finite_differences) continue;
    VecD ngu =
        numeric_grad([&](const VecD& g) { return f64::swiglu(g, N, F); }, to_d(gu), to_d(dout));
    EXPECT_TRUE(close_nmse(r.dgu, ngu, kTolGrad, "dgu ref vs finite differences" + nm));
  }
}

}  // namespace
}  // namespace ct::test
