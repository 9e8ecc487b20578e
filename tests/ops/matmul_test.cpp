// matmul (every transpose, batched, broadcast, bias, alpha/beta) and bias_backward.
#include "tests/ops/op_test_util.h"

namespace ct::test {
namespace {

struct MatmulCase {
  int64_t batch, M, N, K;
  bool ta, tb;
  bool a_batched, b_batched;
  float alpha, beta;
  bool bias;
};

std::string name(const MatmulCase& c) {
  return "batch " + std::to_string(c.batch) + " M" + std::to_string(c.M) + " N" +
         std::to_string(c.N) + " K" + std::to_string(c.K) + (c.ta ? " ta" : "") +
         (c.tb ? " tb" : "") + (c.a_batched ? "" : " a-bcast") + (c.b_batched ? "" : " b-bcast") +
         " alpha " + std::to_string(c.alpha) + " beta " + std::to_string(c.beta) +
         (c.bias ? " bias" : "");
}

Shape mat_shape(bool batched, int64_t batch, int64_t r, int64_t c) {
  return batched && batch > 1 ? Shape{batch, r, c} : Shape{r, c};
}

// Runs the case on device d from the same host inputs.
Vec run(Device& d, const MatmulCase& c, const Vec& a, const Vec& b, const Vec& c0,
        const Vec& bias) {
  Shape as = mat_shape(c.a_batched, c.batch, c.ta ? c.K : c.M, c.ta ? c.M : c.K);
  Shape bs = mat_shape(c.b_batched, c.batch, c.tb ? c.N : c.K, c.tb ? c.K : c.N);
  Shape cs = c.batch > 1 ? Shape{c.batch, c.M, c.N} : Shape{c.M, c.N};
  Tensor ta = upload(d, as, a), tb = upload(d, bs, b), tc = upload(d, cs, c0);
  Tensor tbias = upload(d, {c.N}, bias);
  d.matmul(tc, ta, tb, c.ta, c.tb, c.alpha, c.beta, c.bias ? &tbias : nullptr);
  return download(d, tc);
}

VecD expected(const MatmulCase& c, const Vec& a, const Vec& b, const Vec& c0, const Vec& bias) {
  VecD out;
  int64_t asz = c.M * c.K, bsz = c.K * c.N;
  for (int64_t p = 0; p < c.batch; ++p) {
    VecD ap(a.begin() + (c.a_batched ? p * asz : 0), a.begin() + (c.a_batched ? p * asz : 0) + asz);
    VecD bp(b.begin() + (c.b_batched ? p * bsz : 0), b.begin() + (c.b_batched ? p * bsz : 0) + bsz);
    VecD r = f64::matmul(ap, bp, c.M, c.N, c.K, c.ta, c.tb);
    for (int64_t i = 0; i < c.M * c.N; ++i) {
      double v = c.alpha * r[i];
      if (c.beta != 0.0f) v += static_cast<double>(c.beta) * c0[p * c.M * c.N + i];
      if (c.bias) v += bias[i % c.N];
      out.push_back(v);
    }
  }
  return out;
}

void check_case(const MatmulCase& c, uint64_t seed) {
  int64_t na = (c.a_batched ? c.batch : 1) * c.M * c.K, nb = (c.b_batched ? c.batch : 1) * c.K * c.N;
  Vec a = randn(static_cast<size_t>(na), seed), b = randn(static_cast<size_t>(nb), seed + 1);
  Vec c0 = randn(static_cast<size_t>(c.batch * c.M * c.N), seed + 2);
  Vec bias = randn(static_cast<size_t>(c.N), seed + 3);
  VecD want = expected(c, a, b, c0, bias);
  Vec r = run(ref_dev(), c, a, b, c0, bias);
  Vec f = run(fast_dev(), c, a, b, c0, bias);
  EXPECT_TRUE(close_nmse(r, want, kTolF64, "reference vs fp64, " + name(c)));
  EXPECT_TRUE(close_nmse(f, r, kTolGemm, "fast vs reference, " + name(c)));
}

TEST(Matmul, EveryTransposeOddSizes) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) check_case({1, 17, 33, 65, ta, tb, true, true, 1.0f, 0.0f, false}, 1);
}

TEST(Matmul, BatchedAndBroadcast) {
  uint64_t seed = 10;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [ab, bb] : {std::pair{true, true}, {true, false}, {false, true}})
        check_case({3, 17, 33, 65, ta, tb, ab, bb, 1.0f, 0.0f, false}, seed++);
}

TEST(Matmul, BiasAlphaBeta) {
  uint64_t seed = 50;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_case({1, 17, 33, 65, ta, tb, true, true, 0.7f, 0.3f, true}, seed++);
      check_case({2, 17, 33, 65, ta, tb, true, false, -1.5f, 1.0f, true}, seed++);
      check_case({1, 17, 33, 65, ta, tb, true, true, 1.0f, 0.0f, true}, seed++);
    }
}

TEST(Matmul, LargerThanOneThreadBlock) {
  check_case({1, 130, 257, 129, false, false, true, true, 1.0f, 0.0f, true}, 90);
  check_case({1, 130, 257, 129, true, false, true, true, 1.0f, 1.0f, false}, 91);
  check_case({1, 130, 257, 129, false, true, true, true, 0.5f, 0.0f, false}, 92);
  check_case({5, 64, 64, 64, false, true, true, true, 1.0f, 0.0f, false}, 93);
}

TEST(Matmul, BetaZeroIgnoresGarbageInC) {
  for (Device* d : {&ref_dev(), &fast_dev()}) {
    MatmulCase c{1, 5, 6, 7, false, false, true, true, 1.0f, 0.0f, false};
    Vec a = randn(35, 1), b = randn(42, 2), c0(30, NAN), bias(6, 0.0f);
    Vec got = run(*d, c, a, b, c0, bias);
    EXPECT_TRUE(close_nmse(got, expected(c, a, b, c0, bias), kTolGemm, d->info().name));
  }
}

TEST(Matmul, EmptyInnerDimension) {
  for (Device* d : {&ref_dev(), &fast_dev()}) {
    Tensor a = d->empty({4, 0}, DType::f32, MemCategory::kActivations);
    Tensor b = d->empty({0, 3}, DType::f32, MemCategory::kActivations);
    Tensor c = upload(*d, {4, 3}, Vec(12, 2.0f));
    Tensor bias = upload(*d, {3}, {1.0f, 2.0f, 3.0f});
    d->matmul(c, a, b, false, false, 1.0f, 0.5f, &bias);
    EXPECT_EQ(download(*d, c), (Vec{2, 3, 4, 2, 3, 4, 2, 3, 4, 2, 3, 4})) << d->info().name;
  }
}

// The backward of y = x W^T + b as the model computes it with matmul and bias_backward,
// against central differences of the fp64 forward.
TEST(Matmul, GradientsMatchFiniteDifferences) {
  const int64_t M = 7, K = 9, N = 5;
  Vec x = randn(M * K, 200), w = randn(N * K, 201), dy = randn(M * N, 202);
  Device& d = ref_dev();
  Tensor tx = upload(d, {M, K}, x), tw = upload(d, {N, K}, w), tdy = upload(d, {M, N}, dy);
  Tensor dx = upload(d, {M, K}, Vec(M * K, 0.0f)), dw = upload(d, {N, K}, Vec(N * K, 0.0f));
  Tensor db = upload(d, {N}, Vec(N, 0.0f));
  d.matmul(dx, tdy, tw, false, false);          // dx = dy W
  d.matmul(dw, tdy, tx, true, false, 1.0f, 1.0f);  // dw += dy^T x
  d.bias_backward(db, tdy);
  VecD g = to_d(dy);
  VecD nx = numeric_grad([&](const VecD& xx) { return f64::matmul(xx, to_d(w), M, N, K, false, true); }, to_d(x), g);
  VecD nw = numeric_grad([&](const VecD& ww) { return f64::matmul(to_d(x), ww, M, N, K, false, true); }, to_d(w), g);
  VecD nb = numeric_grad([&](const VecD& bb) {
    VecD y(M * N);
    for (int64_t i = 0; i < M * N; ++i) y[i] = bb[i % N];
    return y;
  }, VecD(N, 0.0), g);
  EXPECT_TRUE(close_nmse(download(d, dx), nx, kTolGrad, "dx"));
  EXPECT_TRUE(close_nmse(download(d, dw), nw, kTolGrad, "dw"));
  EXPECT_TRUE(close_nmse(download(d, db), nb, kTolGrad, "db"));
}

TEST(BiasBackward, FastMatchesReferenceAndAccumulates) {
  for (auto [M, N] : {std::pair<int64_t, int64_t>{17, 33}, {1000, 130}, {3, 1}}) {
    Vec dout = randn(M * N, 300 + M), init = randn(N, 301);
    VecD want(N);
    for (int64_t j = 0; j < N; ++j) {
      want[j] = init[j];
      for (int64_t i = 0; i < M; ++i) want[j] += dout[i * N + j];
    }
    Vec out[2];
    int k = 0;
    for (Device* d : {&ref_dev(), &fast_dev()}) {
      Tensor db = upload(*d, {N}, init), td = upload(*d, {M, N}, dout);
      d->bias_backward(db, td);
      out[k++] = download(*d, db);
    }
    EXPECT_TRUE(close_nmse(out[0], want, kTolF64, "reference"));
    EXPECT_TRUE(close_nmse(out[1], out[0], kTolFast, "fast"));
  }
}

TEST(Matmul, RejectsBadShapes) {
  for (Device* d : {&ref_dev(), &fast_dev()}) {
    Tensor a = upload(*d, {3, 4}, Vec(12, 1.0f)), b = upload(*d, {5, 6}, Vec(30, 1.0f));
    Tensor c = upload(*d, {3, 6}, Vec(18, 0.0f));
    try {
      d->matmul(c, a, b, false, false);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("matmul"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("[5, 6]"), std::string::npos) << e.what();
    }
    Tensor a3 = upload(*d, {2, 3, 4}, Vec(24, 1.0f)), c3 = upload(*d, {3, 3, 6}, Vec(54, 0.0f));
    Tensor b2 = upload(*d, {4, 6}, Vec(24, 1.0f));
    EXPECT_THROW(d->matmul(c3, a3, b2, false, false), Error);
  }
}

}  // namespace
}  // namespace ct::test
