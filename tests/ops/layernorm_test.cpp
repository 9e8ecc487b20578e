// layernorm_forward / layernorm_backward: every device against the reference (odd sizes, many
// rows, a row with a large mean, 3-D input); the reference against fp64 and central differences.
// residual_layernorm_forward: on every device bit for bit what add() then layernorm_forward()
// give there, and against the reference, in f32 and 16 bits.
#include "tests/common/device_harness.h"
#include "tests/common/fp64_ops.h"
#include "tests/common/half_compare.h"

namespace ct::test {
namespace {

struct LnOut {
  Vec out, mean, rstd, dx, dw, db;
};

LnOut run(Device& d, const Shape& xs, const Vec& x, const Vec& w, const Vec& b, const Vec& dout,
          const Vec& dx0, const Vec& dw0, const Vec& db0) {
  int64_t C = xs[-1], N = xs.numel() / C;
  Tensor tx = upload(d, xs, x), tw = upload(d, {C}, w), tb = upload(d, {C}, b);
  Tensor to = upload(d, xs, Vec(N * C, NAN));
  Tensor tm = upload(d, {N}, Vec(N, NAN)), tr = upload(d, {N}, Vec(N, NAN));
  d.layernorm_forward(to, tm, tr, tx, tw, tb, 1e-5f);
  Tensor td = upload(d, xs, dout), tdx = upload(d, xs, dx0);
  Tensor tdw = upload(d, {C}, dw0), tdb = upload(d, {C}, db0);
  d.layernorm_backward(tdx, tdw, tdb, td, tx, tw, tm, tr);
  return {download(d, to),  download(d, tm),  download(d, tr),
          download(d, tdx), download(d, tdw), download(d, tdb)};
}

struct LnCase {
  Shape shape;
  uint64_t seed;
  bool finite_differences;  // the reference's backward against central differences too
  float big_first_row = 0;  // added to the first row: a large mean
};
const LnCase kCases[] = {
    {{14, 12}, 1, true},
    {{3, 5}, 2, true},
    {{1, 1}, 3, false},
    {{1037, 96}, 4, false},
    {{2, 19, 77}, 70, false, 100.0f},
    {{3, 4099}, 5, false},  // past the GPU kernels' 32-lanes-a-row limit (4096): a block a row
};

struct LnInputs {
  Vec x, w, b, dout, dx0, dw0, db0;
};
LnInputs inputs(const LnCase& c) {
  int64_t C = c.shape[-1], N = c.shape.numel() / C;
  uint64_t s = c.seed;
  LnInputs in{randn(N * C, s, 2.0f), randn(C, s + 1), randn(C, s + 2), randn(N * C, s + 3),
              randn(N * C, s + 4),   randn(C, s + 5), randn(C, s + 6)};
  for (auto& v : in.x) v += 0.5f;  // a non-zero mean
  for (int64_t i = 0; i < C; ++i) in.x[i] += c.big_first_row;
  return in;
}

using LayerNorm = DeviceTest;

TEST_P(LayerNorm, MatchesReference) {
  for (const LnCase& c : kCases) {
    LnInputs in = inputs(c);
    LnOut r = run(ref(), c.shape, in.x, in.w, in.b, in.dout, in.dx0, in.dw0, in.db0);
    LnOut f = run(dev(), c.shape, in.x, in.w, in.b, in.dout, in.dx0, in.dw0, in.db0);
    std::string nm = " " + c.shape.str() + " on " + id();
    EXPECT_TRUE(close_nmse(f.out, r.out, tol(), "out vs ref" + nm));
    EXPECT_TRUE(close_nmse(f.mean, r.mean, tol(), "mean vs ref" + nm));
    EXPECT_TRUE(close_nmse(f.rstd, r.rstd, tol(), "rstd vs ref" + nm));
    EXPECT_TRUE(close_nmse(f.dx, r.dx, tol(), "dx vs ref" + nm));
    EXPECT_TRUE(close_nmse(f.dw, r.dw, tol(), "dw vs ref" + nm));
    EXPECT_TRUE(close_nmse(f.db, r.db, tol(), "db vs ref" + nm));
  }
}

TEST_P(LayerNorm, BackwardIsDeterministic) {
  const int64_t N = 777, C = 48;
  Vec x = randn(N * C, 9), w = randn(C, 10), b = randn(C, 11), dout = randn(N * C, 12);
  Vec z(N * C, 0.0f), zc(C, 0.0f);
  LnOut a = run(dev(), {N, C}, x, w, b, dout, z, zc, zc);
  LnOut c = run(dev(), {N, C}, x, w, b, dout, z, zc, zc);
  EXPECT_EQ(a.dw, c.dw);
  EXPECT_EQ(a.db, c.db);
  EXPECT_EQ(a.dx, c.dx);
}

// v as a tensor of dtype h holds it (rounded to nearest even; f32: v).
Vec round_to_dtype(const Vec& v, DType h) {
  if (h == DType::f32) return v;
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = from_h(to_h(v[i], h), h);
  return r;
}

// residual_layernorm_forward's outputs, downloaded as floats (out widened from 16 bits).
struct ResLnOut {
  Vec residual, out, mean, rstd;
  Tensor out_t;  // out as the device holds it
};

// fused: residual_layernorm_forward; otherwise add() then layernorm_forward(), as the models
// did before the fused op. r and out of dtype h (f32 or 16-bit).
ResLnOut run_residual(Device& d, const Shape& xs, const LnInputs& in, const Vec& r, DType h,
                      bool fused) {
  int64_t C = xs[-1], N = xs.numel() / C;
  Tensor tx = upload(d, xs, in.x), tr = up_as(d, xs, r, h);
  Tensor tw = upload(d, {C}, in.w), tb = upload(d, {C}, in.b);
  Tensor tres = upload(d, xs, Vec(N * C, NAN)), to = up_as(d, xs, Vec(N * C, NAN), h);
  Tensor tm = upload(d, {N}, Vec(N, NAN)), trs = upload(d, {N}, Vec(N, NAN));
  if (fused) {
    d.residual_layernorm_forward(tres, to, tm, trs, tx, tr, tw, tb, 1e-5f);
  } else {
    d.add(tres.reshape({N * C}), tx.reshape({N * C}), tr.reshape({N * C}));
    d.layernorm_forward(to, tm, trs, tres, tw, tb, 1e-5f);
  }
  return {download(d, tres), download_h(d, to), download(d, tm), download(d, trs), to};
}

TEST_P(LayerNorm, ResidualFusedIsAddThenLayerNorm) {
  for (DType h : {DType::f32, DType::bf16, DType::f16}) {
    if (h != DType::f32 &&
        (!unsupported(OpKind::kLayerNorm, h).empty() || !unsupported(OpKind::kAdd, h).empty()))
      continue;  // the f32 case still ran; the mixed-precision suite reports what is missing
    for (const LnCase& c : kCases) {
      LnInputs in = inputs(c);
      Vec r = round_to_dtype(randn(c.shape.numel(), c.seed + 7, 3.0f), h);
      ResLnOut f = run_residual(dev(), c.shape, in, r, h, true);
      ResLnOut u = run_residual(dev(), c.shape, in, r, h, false);
      ResLnOut want = run_residual(ref(), c.shape, in, r, h, true);
      std::string nm = " " + c.shape.str() + " " + dtype_name(h) + " on " + id();
      // The same numbers as the unfused ops on this device: the same f32 sum, normalised by the
      // same arithmetic.
      EXPECT_EQ(f.residual, u.residual) << "residual vs add()" << nm;
      EXPECT_EQ(f.out, u.out) << "out vs layernorm_forward()" << nm;
      EXPECT_EQ(f.mean, u.mean) << "mean vs layernorm_forward()" << nm;
      EXPECT_EQ(f.rstd, u.rstd) << "rstd vs layernorm_forward()" << nm;
      // And the reference's (the reference's own fused op against its unfused ops above).
      EXPECT_EQ(f.residual, want.residual) << "residual vs ref (one f32 add)" << nm;
      EXPECT_TRUE(close_nmse(f.mean, want.mean, tol(), "mean vs ref" + nm));
      EXPECT_TRUE(close_nmse(f.rstd, want.rstd, tol(), "rstd vs ref" + nm));
      if (h == DType::f32) {
        EXPECT_TRUE(close_nmse(f.out, want.out, tol(), "out vs ref" + nm));
      } else {
        // 1 ulp, or within f32's own error where (x - mean) * rstd * w + b nearly cancels
        EXPECT_TRUE(same_h({f.out_t, want.out_t}, "out vs ref" + nm, 2e-6));
      }
    }
  }
}

CT_INSTANTIATE_DEVICE_SUITE(LayerNorm);

TEST(ReferenceLayerNorm, MatchesFp64AndFiniteDifferences) {
  for (const LnCase& c : kCases) {
    if (c.shape.ndim != 2 || c.big_first_row != 0) continue;
    int64_t N = c.shape[0], C = c.shape[1];
    LnInputs in = inputs(c);
    const Vec &x = in.x, &w = in.w, &b = in.b;
    LnOut r = run(ref(), c.shape, x, w, b, in.dout, in.dx0, in.dw0, in.db0);
    std::string nm = " " + c.shape.str();
    EXPECT_TRUE(close_nmse(r.out, f64::layernorm(to_d(x), to_d(w), to_d(b), N, C, 1e-5), kTolF64,
                           "out ref vs fp64" + nm));
    if (!c.finite_differences) continue;
    VecD g = to_d(in.dout);
    auto plus = [](VecD n, const Vec& init) {
      for (size_t i = 0; i < n.size(); ++i) n[i] += init[i];
      return n;
    };
    VecD nx = numeric_grad(
        [&](const VecD& xx) { return f64::layernorm(xx, to_d(w), to_d(b), N, C, 1e-5); }, to_d(x),
        g);
    VecD nw = numeric_grad(
        [&](const VecD& ww) { return f64::layernorm(to_d(x), ww, to_d(b), N, C, 1e-5); }, to_d(w),
        g);
    VecD nb = numeric_grad(
        [&](const VecD& bb) { return f64::layernorm(to_d(x), to_d(w), bb, N, C, 1e-5); }, to_d(b),
        g);
    // (+=): the device adds to the initial values.
    EXPECT_TRUE(close_nmse(r.dx, plus(nx, in.dx0), kTolGrad, "dx ref vs finite differences" + nm));
    EXPECT_TRUE(close_nmse(r.dw, plus(nw, in.dw0), kTolGrad, "dw ref vs finite differences" + nm));
    EXPECT_TRUE(close_nmse(r.db, plus(nb, in.db0), kTolGrad, "db ref vs finite differences" + nm));
  }
}

TEST(CpuLayerNorm, RejectsBadShapes) {
  for (const char* spec : {"cpu:1", "cpu:0"}) {
    Device& d = open_cached(spec);
    Tensor x = upload(d, {4, 6}, Vec(24, 1.0f)), out = upload(d, {4, 6}, Vec(24, 0.0f));
    Tensor w = upload(d, {5}, Vec(5, 1.0f)), b = upload(d, {6}, Vec(6, 0.0f));
    Tensor m = upload(d, {4}, Vec(4, 0.0f)), r = upload(d, {4}, Vec(4, 0.0f));
    EXPECT_THROW(d.layernorm_forward(out, m, r, x, w, b, 1e-5f), Error);
  }
}

TEST(CpuLayerNorm, ResidualRejectsOverlapAndMixedDtypes) {
  Device& d = open_cached("cpu:0");
  Tensor x = upload(d, {4, 6}, Vec(24, 1.0f)), r = upload(d, {4, 6}, Vec(24, 0.5f));
  Tensor res = upload(d, {4, 6}, Vec(24, 0.0f)), out = upload(d, {4, 6}, Vec(24, 0.0f));
  Tensor w = upload(d, {6}, Vec(6, 1.0f)), b = upload(d, {6}, Vec(6, 0.0f));
  Tensor m = upload(d, {4}, Vec(4, 0.0f)), s = upload(d, {4}, Vec(4, 0.0f));
  EXPECT_NO_THROW(d.residual_layernorm_forward(res, out, m, s, x, r, w, b, 1e-5f));
  EXPECT_THROW(d.residual_layernorm_forward(x, out, m, s, x, r, w, b, 1e-5f), Error);  // in place
  Tensor out_h = up_as(d, {4, 6}, Vec(24, 0.0f), DType::bf16);
  EXPECT_THROW(d.residual_layernorm_forward(res, out_h, m, s, x, r, w, b, 1e-5f), Error);
}

}  // namespace
}  // namespace ct::test
