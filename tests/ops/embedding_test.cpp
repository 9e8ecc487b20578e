// embedding_forward / embedding_backward, with repeated tokens: every device against the
// reference (bit for bit where the op's contract fixes the order of the float adds); the
// reference against fp64 and central differences.
#include <array>

#include "tests/common/device_harness.h"
#include "tests/common/fp64_ops.h"

namespace ct::test {
namespace {

struct EmbOut {
  Vec out, dwte, dwpe;
};
EmbOut run(Device& d, int64_t B, int64_t T, int64_t C, int64_t V, int64_t maxT,
           const std::vector<int32_t>& tokens, const Vec& wte, const Vec& wpe, const Vec& dout,
           const Vec& dwte0, const Vec& dwpe0) {
  Tensor tt = upload_i32(d, {B, T}, tokens), te = upload(d, {V, C}, wte);
  Tensor tp = upload(d, {maxT, C}, wpe), to = upload(d, {B, T, C}, Vec(B * T * C, NAN));
  d.embedding_forward(to, tt, te, tp);
  Tensor td = upload(d, {B, T, C}, dout);
  Tensor dte = upload(d, {V, C}, dwte0), dtp = upload(d, {maxT, C}, dwpe0);
  d.embedding_backward(dte, dtp, td, tt);
  return {download(d, to), download(d, dte), download(d, dtp)};
}

using Embedding = DeviceTest;

TEST_P(Embedding, ForwardAndBackwardWithRepeatedTokens) {
  const int64_t B = 2, T = 7, C = 12, V = 5, maxT = 9;
  std::vector<int32_t> tokens = {3, 1, 3, 3, 0, 4, 1, 1, 1, 2, 3, 0, 0, 4};  // repeats
  Vec wte = randn(V * C, 1), wpe = randn(maxT * C, 2), dout = randn(B * T * C, 3);
  Vec dwte0 = randn(V * C, 4), dwpe0 = randn(maxT * C, 5);
  EmbOut r = run(ref(), B, T, C, V, maxT, tokens, wte, wpe, dout, dwte0, dwpe0);
  EmbOut f = run(dev(), B, T, C, V, maxT, tokens, wte, wpe, dout, dwte0, dwpe0);
  EXPECT_EQ(f.out, r.out);
  // The contract fixes the order of the float adds, so every device agrees bit for bit.
  EXPECT_EQ(f.dwte, r.dwte);
  EXPECT_EQ(f.dwpe, r.dwpe);
  // Rows of tokens that never occur are untouched.
  for (int64_t i = 0; i < C; ++i) EXPECT_EQ(f.dwte[2 * C + i], dwte0[2 * C + i] + dout[9 * C + i]);
}

// Odd sizes, few distinct tokens so rows repeat (the deterministic chain in the backward).
TEST_P(Embedding, OddSizes) {
  const int64_t B = 3, T = 13, C = 37, V = 29, maxT = 17;
  auto toks = randint(B * T, 60, V);
  toks[0] = toks[5] = toks[B * T - 1] = 7;
  Vec wte = randn(V * C, 61), wpe = randn(maxT * C, 62), dout = randn(B * T * C, 63);
  Vec dwte0 = randn(V * C, 64), dwpe0 = randn(maxT * C, 65);
  EmbOut r = run(ref(), B, T, C, V, maxT, toks, wte, wpe, dout, dwte0, dwpe0);
  EmbOut f = run(dev(), B, T, C, V, maxT, toks, wte, wpe, dout, dwte0, dwpe0);
  EXPECT_TRUE(close_nmse(f.out, r.out, tol(), "embedding_forward on " + id()));
  EXPECT_TRUE(close_nmse(f.dwte, r.dwte, tol(), "embedding_backward dwte on " + id()));
  EXPECT_TRUE(close_nmse(f.dwpe, r.dwpe, tol(), "embedding_backward dwpe on " + id()));
}

// (900 positions: several rounds of the GPU kernels' position lists, 256 at a time.)
TEST_P(Embedding, LargeIsDeterministicAndMatchesReference) {
  for (auto [B, T, C, V] :
       {std::array<int64_t, 4>{4, 64, 200, 50}, {4, 64, 24, 5}, {3, 300, 24, 40}}) {
    auto tokens = randint(B * T, 7 + C, static_cast<int32_t>(V));
    Vec dout = randn(B * T * C, 10 + C);
    Vec dwte[3];
    int k = 0;
    for (Device* d : {&ref(), &dev(), &dev()}) {
      Tensor tt = upload_i32(*d, {B, T}, tokens), td = upload(*d, {B, T, C}, dout);
      Tensor dte = d->empty({V, C}, DType::f32, MemCategory::kGrads);
      Tensor dtp = d->empty({T, C}, DType::f32, MemCategory::kGrads);
      d->fill(dte, 0.0f);
      d->fill(dtp, 0.0f);
      d->embedding_backward(dte, dtp, td, tt);
      dwte[k++] = download(*d, dte);
    }
    EXPECT_EQ(dwte[1], dwte[0]) << id() << " C " << C;
    EXPECT_EQ(dwte[2], dwte[1]) << id() << " C " << C;
  }
}

// 16-bit tables (a frozen base held in 16 bits): the f32 result of the widened tables, bit for
// bit (widening is exact and each element is one fp32 add).
TEST_P(Embedding, SixteenBitTablesGiveTheWidenedTablesBits) {
  const int64_t B = 3, T = 11, C = 40, V = 23, maxT = 16;
  auto toks = randint(B * T, 70, V);
  for (DType h : {DType::bf16, DType::f16}) {
    if (!unsupported(OpKind::kEmbedding, h).empty()) continue;
    Vec want, got;
    for (Device* d : {&ref(), &dev()}) {
      Tensor te = d->empty({V, C}, h, MemCategory::kWeights);
      Tensor tp = d->empty({maxT, C}, h, MemCategory::kWeights);
      d->copy(te, upload(*d, {V, C}, randn(V * C, 71)));
      d->copy(tp, upload(*d, {maxT, C}, randn(maxT * C, 72)));
      Tensor tt = upload_i32(*d, {B, T}, toks), to = upload(*d, {B, T, C}, Vec(B * T * C, NAN));
      d->embedding_forward(to, tt, te, tp);
      got = download(*d, to);
      if (d == &ref()) {  // the f32 kernel on the widened tables
        Tensor we = d->empty({V, C}, DType::f32, MemCategory::kWeights);
        Tensor wp = d->empty({maxT, C}, DType::f32, MemCategory::kWeights);
        d->copy(we, te);
        d->copy(wp, tp);
        d->embedding_forward(to, tt, we, wp);
        want = download(*d, to);
        EXPECT_EQ(got, want) << "reference, " << dtype_name(h);
      }
    }
    EXPECT_EQ(got, want) << id() << ", " << dtype_name(h);
  }
  CT_REQUIRE_SUPPORT(OpKind::kEmbedding, DType::bf16);
}

// No position table (rotary models: wpe / dwpe undefined): out is the token's row, exactly (f32
// and 16-bit tables), and the backward's dwte is the one with a table, bit for bit.
TEST_P(Embedding, WithoutAPositionTable) {
  const int64_t B = 3, T = 11, C = 40, V = 23, maxT = 16;
  auto toks = randint(B * T, 80, V);
  toks[1] = toks[7] = toks[20] = 5;
  const Vec wte = randn(V * C, 81), dout = randn(B * T * C, 82), dwte0 = randn(V * C, 83);
  for (DType h : {DType::f32, DType::bf16, DType::f16}) {
    if (h != DType::f32 && !unsupported(OpKind::kEmbedding, h).empty()) continue;
    Tensor te = dev().empty({V, C}, h, MemCategory::kWeights);
    dev().copy(te, upload(dev(), {V, C}, wte));
    Vec table(static_cast<size_t>(V * C));  // the table as stored, widened
    {
      Tensor w = dev().empty({V, C}, DType::f32, MemCategory::kWeights);
      dev().copy(w, te);
      table = download(dev(), w);
    }
    Tensor tt = upload_i32(dev(), {B, T}, toks), to = upload(dev(), {B, T, C}, Vec(B * T * C, NAN));
    dev().embedding_forward(to, tt, te);
    const Vec got = download(dev(), to);
    Vec want(static_cast<size_t>(B * T * C));
    for (int64_t bt = 0; bt < B * T; ++bt)
      for (int64_t c = 0; c < C; ++c)
        want[static_cast<size_t>(bt * C + c)] = table[static_cast<size_t>(toks[bt] * C + c)];
    EXPECT_EQ(got, want) << id() << ", " << dtype_name(h);
  }
  // The backward: dwte as with a position table (the reference's), dwpe absent.
  EmbOut r = run(ref(), B, T, C, V, maxT, toks, wte, randn(maxT * C, 84), dout, dwte0,
                 Vec(maxT * C, 0.0f));
  Tensor tt = upload_i32(dev(), {B, T}, toks), td = upload(dev(), {B, T, C}, dout);
  Tensor dte = upload(dev(), {V, C}, dwte0);
  dev().embedding_backward(dte, Tensor(), td, tt);
  EXPECT_EQ(download(dev(), dte), r.dwte) << id();
}

CT_INSTANTIATE_DEVICE_SUITE(Embedding);

TEST(ReferenceEmbedding, MatchesFp64AndFiniteDifferences) {
  const int64_t B = 2, T = 7, C = 12, V = 5, maxT = 9;
  std::vector<int32_t> tokens = {3, 1, 3, 3, 0, 4, 1, 1, 1, 2, 3, 0, 0, 4};
  Vec wte = randn(V * C, 1), wpe = randn(maxT * C, 2), dout = randn(B * T * C, 3);
  Vec dwte0 = randn(V * C, 4), dwpe0 = randn(maxT * C, 5);
  EmbOut r = run(ref(), B, T, C, V, maxT, tokens, wte, wpe, dout, dwte0, dwpe0);
  EXPECT_TRUE(close_nmse(r.out, f64::embedding(tokens, to_d(wte), to_d(wpe), B, T, C), kTolF64,
                         "out ref vs fp64"));
  // Against central differences of the forward, plus the initial values (+=).
  VecD g = to_d(dout);
  VecD ne = numeric_grad(
      [&](const VecD& e) { return f64::embedding(tokens, e, to_d(wpe), B, T, C); }, to_d(wte), g);
  VecD np = numeric_grad(
      [&](const VecD& p) { return f64::embedding(tokens, to_d(wte), p, B, T, C); }, to_d(wpe), g);
  for (size_t i = 0; i < ne.size(); ++i) ne[i] += dwte0[i];
  for (size_t i = 0; i < np.size(); ++i) np[i] += dwpe0[i];
  EXPECT_TRUE(close_nmse(r.dwte, ne, kTolGrad, "dwte vs finite differences"));
  EXPECT_TRUE(close_nmse(r.dwpe, np, kTolGrad, "dwpe vs finite differences"));
}

TEST(CpuEmbedding, RejectsBadTokens) {
  for (const char* spec : {"cpu:1", "cpu:0"}) {
    Device& d = open_cached(spec);
    Tensor tt = upload_i32(d, {1, 2}, {0, -1}), te = upload(d, {3, 4}, Vec(12, 0.0f));
    Tensor tp = upload(d, {2, 4}, Vec(8, 0.0f)), to = upload(d, {1, 2, 4}, Vec(8, 0.0f));
    EXPECT_THROW(d.embedding_forward(to, tt, te, tp), Error);
    Tensor tt3 = upload_i32(d, {1, 3}, {0, 1, 2}), to3 = upload(d, {1, 3, 4}, Vec(12, 0.0f));
    EXPECT_THROW(d.embedding_forward(to3, tt3, te, tp), Error);  // T=3 > maxT=2
  }
}

}  // namespace
}  // namespace ct::test
