// rmsnorm_forward / rmsnorm_backward (Llama's RMSNorm): every device against the reference (odd
// sizes, many rows, a row of large values, 3-D input), deterministic backward, bad shapes
// refused; the reference against fp64 and central differences. 16-bit out / dout:
// tests/ops/mixed_precision_ulp_test.cpp. residual_rmsnorm_forward: on every device bit for bit
// what add() then rmsnorm_forward() give there, and against the reference, in f32 and 16 bits.
#include "tests/common/device_harness.h"
#include "tests/common/fp64_ops.h"
#include "tests/common/half_compare.h"

namespace ct::test {
namespace {

struct RmsOut {
  Vec out, rstd, dx, dw;
};

RmsOut run(Device& d, const Shape& xs, const Vec& x, const Vec& w, const Vec& dout, const Vec& dx0,
           const Vec& dw0, float eps) {
  int64_t C = xs[-1], N = xs.numel() / C;
  Tensor tx = upload(d, xs, x), tw = upload(d, {C}, w);
  Tensor to = upload(d, xs, Vec(N * C, NAN)), tr = upload(d, {N}, Vec(N, NAN));
  d.rmsnorm_forward(to, tr, tx, tw, eps);
  Tensor td = upload(d, xs, dout), tdx = upload(d, xs, dx0), tdw = upload(d, {C}, dw0);
  d.rmsnorm_backward(tdx, tdw, td, tx, tw, tr);
  return {download(d, to), download(d, tr), download(d, tdx), download(d, tdw)};
}

struct RmsCase {
  Shape shape;
  uint64_t seed;
  bool finite_differences;  // the reference's backward against central differences too
  float big_first_row = 0;  // added to the first row
  float eps = 1e-6f;        // Llama's rms_norm_eps (1e-5 in some configs)
};
const RmsCase kCases[] = {
    {{14, 12}, 1, true},
    {{3, 5}, 2, true, 0.0f, 1e-5f},
    {{1, 1}, 3, false},
    {{1037, 96}, 4, false},
    {{2, 19, 77}, 70, false, 100.0f},
    {{3, 4099}, 5, false},  // past the GPU kernels' 32-lanes-a-row limit (4096): a block a row
};

struct RmsInputs {
  Vec x, w, dout, dx0, dw0;
};
RmsInputs inputs(const RmsCase& c) {
  int64_t C = c.shape[-1], N = c.shape.numel() / C;
  uint64_t s = c.seed;
  RmsInputs in{randn(N * C, s, 2.0f), randn(C, s + 1), randn(N * C, s + 3), randn(N * C, s + 4),
               randn(C, s + 5)};
  for (int64_t i = 0; i < C; ++i) in.x[i] += c.big_first_row;
  return in;
}

using RMSNorm = DeviceTest;

TEST_P(RMSNorm, MatchesReference) {
  CT_REQUIRE_SUPPORT(OpKind::kRMSNorm, DType::f32);
  for (const RmsCase& c : kCases) {
    RmsInputs in = inputs(c);
    RmsOut r = run(ref(), c.shape, in.x, in.w, in.dout, in.dx0, in.dw0, c.eps);
    RmsOut f = run(dev(), c.shape, in.x, in.w, in.dout, in.dx0, in.dw0, c.eps);
    std::string nm = " " + c.shape.str() + " on " + id();
    EXPECT_TRUE(close_nmse(f.out, r.out, tol(), "out vs ref" + nm));
    EXPECT_TRUE(close_nmse(f.rstd, r.rstd, tol(), "rstd vs ref" + nm));
    EXPECT_TRUE(close_nmse(f.dx, r.dx, tol(), "dx vs ref" + nm));
    EXPECT_TRUE(close_nmse(f.dw, r.dw, tol(), "dw vs ref" + nm));
  }
}

TEST_P(RMSNorm, BackwardIsDeterministic) {
  CT_REQUIRE_SUPPORT(OpKind::kRMSNorm, DType::f32);
  const int64_t N = 777, C = 48;
  Vec x = randn(N * C, 9), w = randn(C, 10), dout = randn(N * C, 12);
  Vec z(N * C, 0.0f), zc(C, 0.0f);
  RmsOut a = run(dev(), {N, C}, x, w, dout, z, zc, 1e-6f);
  RmsOut c = run(dev(), {N, C}, x, w, dout, z, zc, 1e-6f);
  EXPECT_EQ(a.dw, c.dw);
  EXPECT_EQ(a.dx, c.dx);
}

TEST_P(RMSNorm, RejectsBadShapesAndDtypes) {
  Device& d = dev();
  Tensor x = upload(d, {4, 6}, Vec(24, 1.0f)), out = upload(d, {4, 6}, Vec(24, 0.0f));
  Tensor w5 = upload(d, {5}, Vec(5, 1.0f)), w = upload(d, {6}, Vec(6, 1.0f));
  Tensor r = upload(d, {4}, Vec(4, 0.0f)), r3 = upload(d, {3}, Vec(3, 0.0f));
  EXPECT_THROW(d.rmsnorm_forward(out, r, x, w5, 1e-6f), Error);  // w [C]
  EXPECT_THROW(d.rmsnorm_forward(out, r3, x, w, 1e-6f), Error);  // rstd [N]
  EXPECT_THROW(d.rmsnorm_forward(out, r, x, w, -1.0f), Error);   // eps >= 0
  Tensor dx = upload(d, {4, 6}, Vec(24, 0.0f)), dw = upload(d, {6}, Vec(6, 0.0f));
  EXPECT_THROW(d.rmsnorm_backward(dx, w5, out, x, w, r), Error);  // dw [C]
  Tensor xi = d.empty({4, 6}, DType::i32, MemCategory::kActivations);
  EXPECT_THROW(d.rmsnorm_forward(out, r, xi, w, 1e-6f), Error);  // x f32
  try {
    d.rmsnorm_forward(out, r3, x, w, 1e-6f);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rmsnorm_forward"), std::string::npos) << e.what();
  }
}

// residual_rmsnorm_forward's outputs, downloaded as floats (out widened from 16 bits).
struct ResRmsOut {
  Vec residual, out, rstd;
  Tensor out_t;  // out as the device holds it
};

// fused: residual_rmsnorm_forward; otherwise add() then rmsnorm_forward(), as the models did
// before the fused op. r and out of dtype h (f32 or 16-bit).
ResRmsOut run_residual(Device& d, const RmsCase& c, const RmsInputs& in, const Vec& r, DType h,
                       bool fused) {
  const Shape& xs = c.shape;
  int64_t C = xs[-1], N = xs.numel() / C;
  Tensor tx = upload(d, xs, in.x), tr = up_as(d, xs, r, h), tw = upload(d, {C}, in.w);
  Tensor tres = upload(d, xs, Vec(N * C, NAN)), to = up_as(d, xs, Vec(N * C, NAN), h);
  Tensor trs = upload(d, {N}, Vec(N, NAN));
  if (fused) {
    d.residual_rmsnorm_forward(tres, to, trs, tx, tr, tw, c.eps);
  } else {
    d.add(tres.reshape({N * C}), tx.reshape({N * C}), tr.reshape({N * C}));
    d.rmsnorm_forward(to, trs, tres, tw, c.eps);
  }
  return {download(d, tres), download_h(d, to), download(d, trs), to};
}

TEST_P(RMSNorm, ResidualFusedIsAddThenRMSNorm) {
  for (DType h : {DType::f32, DType::bf16, DType::f16}) {
    if (!unsupported(OpKind::kRMSNorm, h).empty() || !unsupported(OpKind::kAdd, h).empty())
      continue;  // the mixed-precision suites report what is missing
    for (const RmsCase& c : kCases) {
      RmsInputs in = inputs(c);
      Vec r = randn(c.shape.numel(), c.seed + 7, 3.0f);
      if (h != DType::f32)
        for (float& v : r) v = from_h(to_h(v, h), h);
      ResRmsOut f = run_residual(dev(), c, in, r, h, true);
      ResRmsOut u = run_residual(dev(), c, in, r, h, false);
      ResRmsOut want = run_residual(ref(), c, in, r, h, true);
      std::string nm = " " + c.shape.str() + " " + dtype_name(h) + " on " + id();
      // The same numbers as the unfused ops on this device.
      EXPECT_EQ(f.residual, u.residual) << "residual vs add()" << nm;
      EXPECT_EQ(f.out, u.out) << "out vs rmsnorm_forward()" << nm;
      EXPECT_EQ(f.rstd, u.rstd) << "rstd vs rmsnorm_forward()" << nm;
      // And the reference's.
      EXPECT_EQ(f.residual, want.residual) << "residual vs ref (one f32 add)" << nm;
      EXPECT_TRUE(close_nmse(f.rstd, want.rstd, tol(), "rstd vs ref" + nm));
      if (h == DType::f32)
        EXPECT_TRUE(close_nmse(f.out, want.out, tol(), "out vs ref" + nm));
      else
        EXPECT_TRUE(same_h({f.out_t, want.out_t}, "out vs ref" + nm));
    }
  }
}

CT_INSTANTIATE_DEVICE_SUITE(RMSNorm);

TEST(ReferenceRMSNorm, MatchesFp64AndFiniteDifferences) {
  for (const RmsCase& c : kCases) {
    if (c.shape.ndim != 2 || c.big_first_row != 0) continue;
    int64_t N = c.shape[0], C = c.shape[1];
    RmsInputs in = inputs(c);
    const Vec &x = in.x, &w = in.w;
    RmsOut r = run(ref(), c.shape, x, w, in.dout, in.dx0, in.dw0, c.eps);
    std::string nm = " " + c.shape.str();
    EXPECT_TRUE(close_nmse(r.out, f64::rmsnorm(to_d(x), to_d(w), N, C, c.eps), kTolF64,
                           "out ref vs fp64" + nm));
    if (!c.finite_differences) continue;
    VecD g = to_d(in.dout);
    auto plus = [](VecD n, const Vec& init) {
      for (size_t i = 0; i < n.size(); ++i) n[i] += init[i];
      return n;
    };
    VecD nx = numeric_grad([&](const VecD& xx) { return f64::rmsnorm(xx, to_d(w), N, C, c.eps); },
                           to_d(x), g);
    VecD nw = numeric_grad([&](const VecD& ww) { return f64::rmsnorm(to_d(x), ww, N, C, c.eps); },
                           to_d(w), g);
    // (+=): the device adds to the initial values.
    EXPECT_TRUE(close_nmse(r.dx, plus(nx, in.dx0), kTolGrad, "dx ref vs finite differences" + nm));
    EXPECT_TRUE(close_nmse(r.dw, plus(nw, in.dw0), kTolGrad, "dw ref vs finite differences" + nm));
  }
}

}  // namespace
}  // namespace ct::test
