// layernorm_forward / layernorm_backward.
#include "tests/ops/op_test_util.h"

namespace ct::test {
namespace {

struct LnOut {
  Vec out, mean, rstd, dx, dw, db;
};

LnOut run(Device& d, int64_t N, int64_t C, const Vec& x, const Vec& w, const Vec& b,
          const Vec& dout, const Vec& dx0, const Vec& dw0, const Vec& db0) {
  Tensor tx = upload(d, {N, C}, x), tw = upload(d, {C}, w), tb = upload(d, {C}, b);
  Tensor to = upload(d, {N, C}, Vec(N * C, NAN));
  Tensor tm = upload(d, {N}, Vec(N, NAN)), tr = upload(d, {N}, Vec(N, NAN));
  d.layernorm_forward(to, tm, tr, tx, tw, tb, 1e-5f);
  Tensor td = upload(d, {N, C}, dout), tdx = upload(d, {N, C}, dx0);
  Tensor tdw = upload(d, {C}, dw0), tdb = upload(d, {C}, db0);
  d.layernorm_backward(tdx, tdw, tdb, td, tx, tw, tm, tr);
  return {download(d, to), download(d, tm), download(d, tr),
          download(d, tdx), download(d, tdw), download(d, tdb)};
}

void check(int64_t N, int64_t C, uint64_t seed, bool fd) {
  Vec x = randn(N * C, seed, 2.0f), w = randn(C, seed + 1), b = randn(C, seed + 2);
  for (auto& v : x) v += 0.5f;  // a non-zero mean
  Vec dout = randn(N * C, seed + 3), dx0 = randn(N * C, seed + 4), dw0 = randn(C, seed + 5),
      db0 = randn(C, seed + 6);
  LnOut r = run(ref_dev(), N, C, x, w, b, dout, dx0, dw0, db0);
  LnOut f = run(fast_dev(), N, C, x, w, b, dout, dx0, dw0, db0);
  std::string nm = " N" + std::to_string(N) + " C" + std::to_string(C);
  EXPECT_TRUE(close_nmse(r.out, f64::layernorm(to_d(x), to_d(w), to_d(b), N, C, 1e-5), kTolF64,
                         "out ref vs fp64" + nm));
  EXPECT_TRUE(close_nmse(f.out, r.out, kTolFast, "out fast vs ref" + nm));
  EXPECT_TRUE(close_nmse(f.mean, r.mean, kTolFast, "mean fast vs ref" + nm));
  EXPECT_TRUE(close_nmse(f.rstd, r.rstd, kTolFast, "rstd fast vs ref" + nm));
  EXPECT_TRUE(close_nmse(f.dx, r.dx, kTolFast, "dx fast vs ref" + nm));
  EXPECT_TRUE(close_nmse(f.dw, r.dw, kTolFast, "dw fast vs ref" + nm));
  EXPECT_TRUE(close_nmse(f.db, r.db, kTolFast, "db fast vs ref" + nm));
  if (!fd) return;
  VecD g = to_d(dout);
  auto plus = [](VecD n, const Vec& init) {
    for (size_t i = 0; i < n.size(); ++i) n[i] += init[i];
    return n;
  };
  VecD nx = numeric_grad([&](const VecD& xx) { return f64::layernorm(xx, to_d(w), to_d(b), N, C, 1e-5); }, to_d(x), g);
  VecD nw = numeric_grad([&](const VecD& ww) { return f64::layernorm(to_d(x), ww, to_d(b), N, C, 1e-5); }, to_d(w), g);
  VecD nb = numeric_grad([&](const VecD& bb) { return f64::layernorm(to_d(x), to_d(w), bb, N, C, 1e-5); }, to_d(b), g);
  // (+=): the device adds to the initial values.
  EXPECT_TRUE(close_nmse(r.dx, plus(nx, dx0), kTolGrad, "dx ref vs finite differences" + nm));
  EXPECT_TRUE(close_nmse(r.dw, plus(nw, dw0), kTolGrad, "dw ref vs finite differences" + nm));
  EXPECT_TRUE(close_nmse(r.db, plus(nb, db0), kTolGrad, "db ref vs finite differences" + nm));
}

TEST(LayerNorm, OddSizesWithFiniteDifferences) {
  check(14, 12, 1, true);
  check(3, 5, 2, true);
  check(1, 1, 3, false);
}

TEST(LayerNorm, ManyRowsAcrossChunks) { check(1037, 96, 4, false); }

TEST(LayerNorm, BackwardIsDeterministic) {
  const int64_t N = 777, C = 48;
  Vec x = randn(N * C, 9), w = randn(C, 10), b = randn(C, 11), dout = randn(N * C, 12);
  Vec z(N * C, 0.0f), zc(C, 0.0f);
  LnOut a = run(fast_dev(), N, C, x, w, b, dout, z, zc, zc);
  LnOut c = run(fast_dev(), N, C, x, w, b, dout, z, zc, zc);
  EXPECT_EQ(a.dw, c.dw);
  EXPECT_EQ(a.db, c.db);
  EXPECT_EQ(a.dx, c.dx);
}

TEST(LayerNorm, RejectsBadShapes) {
  for (Device* d : {&ref_dev(), &fast_dev()}) {
    Tensor x = upload(*d, {4, 6}, Vec(24, 1.0f)), out = upload(*d, {4, 6}, Vec(24, 0.0f));
    Tensor w = upload(*d, {5}, Vec(5, 1.0f)), b = upload(*d, {6}, Vec(6, 0.0f));
    Tensor m = upload(*d, {4}, Vec(4, 0.0f)), r = upload(*d, {4}, Vec(4, 0.0f));
    EXPECT_THROW(d->layernorm_forward(out, m, r, x, w, b, 1e-5f), Error);
  }
}

}  // namespace
}  // namespace ct::test
