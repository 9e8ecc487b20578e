// matmul (every transpose, batched, broadcast, bias, alpha/beta, odd sizes, vec4-friendly sizes,
// whole blocks and edges, K long enough to run in pieces) and bias_backward, on every device
// against the reference; the reference against fp64 and central differences.
#include "tests/common/device_harness.h"
#include "tests/common/fp64_ops.h"

namespace ct::test {
namespace {

struct MatmulCase {
  const char* group;
  int64_t batch, M, N, K;
  bool ta, tb;
  bool a_batched, b_batched;  // false: a 2-D operand broadcast over the batch
  float alpha, beta;
  bool bias;
  uint64_t seed;
};

// The cases, by group (one TEST_P each). Odd sizes; multiples of 4 with and without a K % 4
// tail (vec4 loads); K % 8 == 0 with M past one 128-row tile and vec4-aligned rows (whole blocks
// and edge blocks); K long enough that CPU-type Vulkan devices run it in pieces chained through
// beta (a transposed past 512, b with N >= 768 past 768).
std::vector<MatmulCase> table() {
  std::vector<MatmulCase> t;
  uint64_t s = 1;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      t.push_back({"odd", 1, 17, 33, 65, ta, tb, true, true, 1.0f, 0.0f, false, s++});
      t.push_back({"odd", 1, 37, 53, 29, ta, tb, true, true, 1.0f, 0.0f, false, s++});
      for (auto [ab, bb] : {std::pair{true, true}, {true, false}, {false, true}})
        t.push_back({"batched", 3, 17, 33, 65, ta, tb, ab, bb, 1.0f, 0.0f, false, s++});
      t.push_back({"bias", 1, 17, 33, 65, ta, tb, true, true, 0.7f, 0.3f, true, s++});
      t.push_back({"bias", 2, 17, 33, 65, ta, tb, true, false, -1.5f, 1.0f, true, s++});
      t.push_back({"bias", 1, 17, 33, 65, ta, tb, true, true, 1.0f, 0.0f, true, s++});
      for (int64_t K : {36, 37})
        t.push_back({"vec4", 2, 68, 76, K, ta, tb, true, true, 1.0f, 0.5f, true, s++});
      t.push_back({"blocks", 2, 136, 132, 40, ta, tb, true, true, 0.75f, 0.5f, true, s++});
      t.push_back({"blocks", 1, 144, 64, 16, ta, tb, true, true, 1.0f, 0.0f, false, s++});
    }
  t.push_back({"bias", 1, 65, 33, 70, false, true, true, true, 0.5f, 0.25f, true, 100});
  t.push_back({"bias", 1, 1, 1, 1, false, false, true, true, 1.0f, 1.0f, true, 101});
  t.push_back({"bias", 1, 129, 7, 3, true, false, true, true, -2.0f, 0.0f, true, 102});
  t.push_back({"batched", 3, 17, 45, 66, false, false, true, true, 1.0f, 0.0f, false, 110});
  t.push_back({"batched", 4, 33, 20, 31, true, true, true, true, 1.0f, 0.5f, false, 111});
  t.push_back({"batched", 3, 19, 23, 41, false, false, true, false, 1.0f, 0.0f, true, 112});
  t.push_back({"batched", 2, 21, 25, 9, false, true, false, true, 1.0f, 0.0f, false, 113});
  t.push_back({"large", 1, 130, 257, 129, false, false, true, true, 1.0f, 0.0f, true, 90});
  t.push_back({"large", 1, 130, 257, 129, true, false, true, true, 1.0f, 1.0f, false, 91});
  t.push_back({"large", 1, 130, 257, 129, false, true, true, true, 0.5f, 0.0f, false, 92});
  t.push_back({"large", 5, 64, 64, 64, false, true, true, true, 1.0f, 0.0f, false, 93});
  t.push_back({"longk", 1, 70, 66, 1100, true, false, true, true, 0.5f, 0.25f, true, 60});
  t.push_back({"longk", 2, 36, 40, 1032, true, true, true, true, 1.0f, 0.0f, true, 61});
  t.push_back({"longk", 1, 20, 772, 1540, false, false, true, true, 0.5f, 0.25f, true, 62});
  return t;
}

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

struct Inputs {
  Vec a, b, c0, bias;
};
Inputs inputs(const MatmulCase& c) {
  int64_t na = (c.a_batched ? c.batch : 1) * c.M * c.K,
          nb = (c.b_batched ? c.batch : 1) * c.K * c.N;
  return {randn(static_cast<size_t>(na), c.seed), randn(static_cast<size_t>(nb), c.seed + 1),
          randn(static_cast<size_t>(c.batch * c.M * c.N), c.seed + 2),
          randn(static_cast<size_t>(c.N), c.seed + 3)};
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

using Matmul = DeviceTest;

class MatmulTable : public DeviceTest {
 protected:
  void run_group(const std::string& group) {
    int n = 0;
    for (const MatmulCase& c : table()) {
      if (group != c.group) continue;
      ++n;
      Inputs in = inputs(c);
      Vec r = run(ref(), c, in.a, in.b, in.c0, in.bias);
      Vec f = run(dev(), c, in.a, in.b, in.c0, in.bias);
      EXPECT_TRUE(close_nmse(f, r, tol(Tol::kGemm), id() + " vs reference, " + name(c)));
    }
    EXPECT_GT(n, 0) << group;
  }
};

TEST_P(MatmulTable, EveryTransposeOddSizes) {
  run_group("odd");
}
TEST_P(MatmulTable, BatchedAndBroadcast) {
  run_group("batched");
}
TEST_P(MatmulTable, BiasAlphaBeta) {
  run_group("bias");
}
TEST_P(MatmulTable, Vec4Sizes) {
  run_group("vec4");
}
TEST_P(MatmulTable, WholeBlocksAndEdgesK8) {
  run_group("blocks");
}
TEST_P(MatmulTable, LargerThanOneThreadBlock) {
  run_group("large");
}
TEST_P(MatmulTable, LongKInPieces) {
  run_group("longk");
}
CT_INSTANTIATE_DEVICE_SUITE(MatmulTable);

// The reference against fp64, every case of the table.
TEST(ReferenceMatmul, EveryCaseMatchesFp64) {
  for (const MatmulCase& c : table()) {
    Inputs in = inputs(c);
    EXPECT_TRUE(close_nmse(run(ref(), c, in.a, in.b, in.c0, in.bias),
                           expected(c, in.a, in.b, in.c0, in.bias), kTolF64,
                           "reference vs fp64, " + name(c)));
  }
}

TEST_P(Matmul, BetaZeroIgnoresGarbageInC) {
  MatmulCase c{"", 1, 5, 6, 7, false, false, true, true, 1.0f, 0.0f, false, 0};
  Vec a = randn(35, 1), b = randn(42, 2), c0(30, NAN), bias(6, 0.0f);
  VecD want = expected(c, a, b, c0, bias);
  EXPECT_TRUE(close_nmse(run(ref(), c, a, b, c0, bias), want, kTolSame, "reference"));
  EXPECT_TRUE(close_nmse(run(dev(), c, a, b, c0, bias), want, tol(Tol::kGemm), id()));
}

TEST_P(Matmul, EmptyInnerDimension) {
  // K = 0 with a bias: c = beta c + bias on the CPU backend; Vulkan rejects it (kUnsupported).
  if (!same_backend_as_ref()) GTEST_SKIP() << "K = 0 is specified for the CPU backend only";
  Device& d = dev();
  Tensor a = d.empty({4, 0}, DType::f32, MemCategory::kActivations);
  Tensor b = d.empty({0, 3}, DType::f32, MemCategory::kActivations);
  Tensor c = upload(d, {4, 3}, Vec(12, 2.0f));
  Tensor bias = upload(d, {3}, {1.0f, 2.0f, 3.0f});
  d.matmul(c, a, b, false, false, 1.0f, 0.5f, &bias);
  EXPECT_EQ(download(d, c), (Vec{2, 3, 4, 2, 3, 4, 2, 3, 4, 2, 3, 4})) << id();
}

TEST_P(Matmul, BiasBackwardAccumulatesColumnSums) {
  for (Shape s : {Shape{17, 33}, Shape{1000, 130}, Shape{3, 1}, Shape{3, 41, 77}}) {
    int64_t N = s[-1], M = s.numel() / N;
    Vec dout = randn(M * N, 300 + M), init = randn(N, 301);
    VecD want(N);
    for (int64_t j = 0; j < N; ++j) {
      want[j] = init[j];
      for (int64_t i = 0; i < M; ++i) want[j] += dout[i * N + j];
    }
    Pair db = both({N}, init), td = both(s, dout);
    dev().bias_backward(db.d, td.d);
    ref().bias_backward(db.r, td.r);
    EXPECT_TRUE(close_nmse(download(ref(), db.r), want, kTolF64, "reference " + s.str()));
    EXPECT_TRUE(same(db, tol(), "bias_backward " + s.str()));
  }
}
CT_INSTANTIATE_DEVICE_SUITE(Matmul);

// The backward of y = x W^T + b as the model computes it with matmul and bias_backward,
// against central differences of the fp64 forward.
TEST(ReferenceMatmul, GradientsMatchFiniteDifferences) {
  const int64_t M = 7, K = 9, N = 5;
  Vec x = randn(M * K, 200), w = randn(N * K, 201), dy = randn(M * N, 202);
  Device& d = ref();
  Tensor tx = upload(d, {M, K}, x), tw = upload(d, {N, K}, w), tdy = upload(d, {M, N}, dy);
  Tensor dx = upload(d, {M, K}, Vec(M * K, 0.0f)), dw = upload(d, {N, K}, Vec(N * K, 0.0f));
  Tensor db = upload(d, {N}, Vec(N, 0.0f));
  d.matmul(dx, tdy, tw, false, false);             // dx = dy W
  d.matmul(dw, tdy, tx, true, false, 1.0f, 1.0f);  // dw += dy^T x
  d.bias_backward(db, tdy);
  VecD g = to_d(dy);
  VecD nx = numeric_grad(
      [&](const VecD& xx) { return f64::matmul(xx, to_d(w), M, N, K, false, true); }, to_d(x), g);
  VecD nw = numeric_grad(
      [&](const VecD& ww) { return f64::matmul(to_d(x), ww, M, N, K, false, true); }, to_d(w), g);
  VecD nb = numeric_grad(
      [&](const VecD& bb) {
        VecD y(M * N);
        for (int64_t i = 0; i < M * N; ++i) y[i] = bb[i % N];
        return y;
      },
      VecD(N, 0.0), g);
  EXPECT_TRUE(close_nmse(download(d, dx), nx, kTolGrad, "dx"));
  EXPECT_TRUE(close_nmse(download(d, dw), nw, kTolGrad, "dw"));
  EXPECT_TRUE(close_nmse(download(d, db), nb, kTolGrad, "db"));
}

// Argument checks of the CPU backend's two devices (the rules every backend shares move to
// core/device.h, with their own tests).
TEST(CpuMatmul, RejectsBadShapes) {
  for (const char* spec : {"cpu:1", "cpu:0"}) {
    Device& d = open_cached(spec);
    Tensor a = upload(d, {3, 4}, Vec(12, 1.0f)), b = upload(d, {5, 6}, Vec(30, 1.0f));
    Tensor c = upload(d, {3, 6}, Vec(18, 0.0f));
    try {
      d.matmul(c, a, b, false, false);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("matmul"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("[5, 6]"), std::string::npos) << e.what();
    }
    Tensor a3 = upload(d, {2, 3, 4}, Vec(24, 1.0f)), c3 = upload(d, {3, 3, 6}, Vec(54, 0.0f));
    Tensor b2 = upload(d, {4, 6}, Vec(24, 1.0f));
    EXPECT_THROW(d.matmul(c3, a3, b2, false, false), Error);
  }
}

}  // namespace
}  // namespace ct::test
