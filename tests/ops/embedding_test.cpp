// embedding_forward / embedding_backward, with repeated tokens.
#include "tests/ops/op_test_util.h"

namespace ct::test {
namespace {

TEST(Embedding, ForwardAndBackwardWithRepeatedTokens) {
  const int64_t B = 2, T = 7, C = 12, V = 5, maxT = 9;
  std::vector<int32_t> tokens = {3, 1, 3, 3, 0, 4, 1, 1, 1, 2, 3, 0, 0, 4};  // repeats
  Vec wte = randn(V * C, 1), wpe = randn(maxT * C, 2), dout = randn(B * T * C, 3);
  Vec dwte0 = randn(V * C, 4), dwpe0 = randn(maxT * C, 5);
  Vec out[2], dwte[2], dwpe[2];
  int k = 0;
  for (Device* d : {&ref_dev(), &fast_dev()}) {
    Tensor tt = upload_i32(*d, {B, T}, tokens), te = upload(*d, {V, C}, wte);
    Tensor tp = upload(*d, {maxT, C}, wpe), to = upload(*d, {B, T, C}, Vec(B * T * C, NAN));
    d->embedding_forward(to, tt, te, tp);
    Tensor td = upload(*d, {B, T, C}, dout);
    Tensor dte = upload(*d, {V, C}, dwte0), dtp = upload(*d, {maxT, C}, dwpe0);
    d->embedding_backward(dte, dtp, td, tt);
    out[k] = download(*d, to);
    dwte[k] = download(*d, dte);
    dwpe[k] = download(*d, dtp);
    ++k;
  }
  EXPECT_TRUE(close_nmse(out[0], f64::embedding(tokens, to_d(wte), to_d(wpe), B, T, C), kTolF64,
                         "out ref vs fp64"));
  EXPECT_EQ(out[1], out[0]);
  // The contract fixes the order of the float adds, so both devices agree bit for bit.
  EXPECT_EQ(dwte[1], dwte[0]);
  EXPECT_EQ(dwpe[1], dwpe[0]);
  // Against central differences of the forward, plus the initial values (+=).
  VecD g = to_d(dout);
  VecD ne = numeric_grad([&](const VecD& e) { return f64::embedding(tokens, e, to_d(wpe), B, T, C); }, to_d(wte), g);
  VecD np = numeric_grad([&](const VecD& p) { return f64::embedding(tokens, to_d(wte), p, B, T, C); }, to_d(wpe), g);
  for (size_t i = 0; i < ne.size(); ++i) ne[i] += dwte0[i];
  for (size_t i = 0; i < np.size(); ++i) np[i] += dwpe0[i];
  EXPECT_TRUE(close_nmse(dwte[0], ne, kTolGrad, "dwte vs finite differences"));
  EXPECT_TRUE(close_nmse(dwpe[0], np, kTolGrad, "dwpe vs finite differences"));
  // Rows of tokens that never occur are untouched.
  for (int64_t i = 0; i < C; ++i) EXPECT_EQ(dwte[1][2 * C + i], dwte0[2 * C + i] + dout[9 * C + i]);
}

TEST(Embedding, LargeIsDeterministicAndMatchesReference) {
  const int64_t B = 4, T = 64, C = 200, V = 50;
  auto tokens = randint(B * T, 7, V);
  Vec wte = randn(V * C, 8), wpe = randn(T * C, 9), dout = randn(B * T * C, 10);
  Vec dwte[3];
  int k = 0;
  for (Device* d : {&ref_dev(), &fast_dev(), &fast_dev()}) {
    Tensor tt = upload_i32(*d, {B, T}, tokens), td = upload(*d, {B, T, C}, dout);
    Tensor dte = upload(*d, {V, C}, Vec(V * C, 0.0f)), dtp = upload(*d, {T, C}, Vec(T * C, 0.0f));
    d->embedding_backward(dte, dtp, td, tt);
    dwte[k++] = download(*d, dte);
  }
  EXPECT_EQ(dwte[1], dwte[0]);
  EXPECT_EQ(dwte[2], dwte[1]);
}

TEST(Embedding, RejectsBadTokens) {
  for (Device* d : {&ref_dev(), &fast_dev()}) {
    Tensor tt = upload_i32(*d, {1, 2}, {0, -1}), te = upload(*d, {3, 4}, Vec(12, 0.0f));
    Tensor tp = upload(*d, {2, 4}, Vec(8, 0.0f)), to = upload(*d, {1, 2, 4}, Vec(8, 0.0f));
    EXPECT_THROW(d->embedding_forward(to, tt, te, tp), Error);
    Tensor tt3 = upload_i32(*d, {1, 3}, {0, 1, 2}), to3 = upload(*d, {1, 3, 4}, Vec(12, 0.0f));
    EXPECT_THROW(d->embedding_forward(to3, tt3, te, tp), Error);  // T=3 > maxT=2
  }
}

}  // namespace
}  // namespace ct::test
