// attention_forward / attention_backward: every device against the reference (odd sizes, several
// row blocks, the model's head sizes); the reference against fp64 and central differences.
#include <sstream>

#include "tests/common/device_harness.h"
#include "tests/common/fp64_ops.h"

namespace ct::test {
namespace {

struct AttnCase {
  int64_t B, T, C, NH;
  uint64_t seed;
  bool finite_differences;  // the reference's backward against central differences too
  bool tight;               // fp32 kernels land near 1e-13: checked against 1e-10 as well
  int64_t NKV = 0;          // key/value heads (grouped-query attention); 0: NH
  int64_t kv() const { return NKV ? NKV : NH; }
  int64_t W() const { return C + 2 * kv() * (C / NH); }  // qkv's row
};
const AttnCase kCases[] = {
    {2, 7, 12, 3, 1, true, false},
    {1, 5, 8, 1, 2, true, false},
    {3, 1, 6, 2, 3, true, false},
    {2, 11, 21, 3, 80, false, true},
    {2, 37, 12, 3, 10, false, false},
    {1, 300, 24, 2, 11, false, false},
    // The model's own head sizes, where the fast CPU path's AVX-512 kernels take full 6x64
    // tiles: tiny (T 256, 6 heads of 64) and an odd head size with an odd T.
    {1, 256, 384, 6, 12, false, false},
    {1, 77, 160, 2, 13, false, false},
    // Grouped-query attention: groups of 2 and 3 query heads, one kv head for all (multi-query),
    // and llama-tiny's / smollm's 3 query heads per kv head at head size 64.
    {2, 7, 12, 4, 20, true, false, 2},
    {1, 6, 18, 3, 21, true, false, 1},
    {2, 37, 24, 6, 22, false, false, 2},
    {1, 93, 384, 6, 23, false, false, 2},
};

struct AttnOut {
  Vec out, att, dqkv;
};

AttnOut run(Device& d, const AttnCase& c, const Vec& qkv, const Vec& dout) {
  Tensor tq = upload(d, {c.B, c.T, c.W()}, qkv);
  Tensor to = upload(d, {c.B, c.T, c.C}, Vec(c.B * c.T * c.C, NAN));
  Tensor ta = upload(d, {c.B, c.NH, c.T, c.T}, Vec(c.B * c.NH * c.T * c.T, NAN));
  Tensor td = upload(d, {c.B, c.T, c.C}, dout);
  Tensor tdq = upload(d, {c.B, c.T, c.W()}, Vec(qkv.size(), NAN));  // (=): garbage ignored
  d.attention_forward(to, ta, tq, static_cast<int>(c.NH), static_cast<int>(c.kv()));
  d.attention_backward(tdq, td, tq, ta, static_cast<int>(c.NH), static_cast<int>(c.kv()));
  return {download(d, to), download(d, ta), download(d, tdq)};
}

std::string name(const AttnCase& c) {
  std::ostringstream os;
  os << "B" << c.B << " T" << c.T << " C" << c.C << " NH" << c.NH << " NKV" << c.kv();
  return os.str();
}

using Attention = DeviceTest;

TEST_P(Attention, MatchesReference) {
  for (const AttnCase& c : kCases) {
    Vec qkv = randn(c.B * c.T * c.W(), c.seed), dout = randn(c.B * c.T * c.C, c.seed + 1);
    AttnOut r = run(ref(), c, qkv, dout), f = run(dev(), c, qkv, dout);
    std::string nm = name(c) + " on " + id();
    double t = tol(Tol::kGemm);
    EXPECT_TRUE(close_nmse(f.out, r.out, t, "out vs ref " + nm));
    EXPECT_TRUE(close_nmse(f.att, r.att, t, "att vs ref " + nm));
    EXPECT_TRUE(close_nmse(f.dqkv, r.dqkv, t, "dqkv vs ref " + nm));
    if (c.tight) {
      EXPECT_TRUE(close_nmse(f.out, r.out, 1e-10, "out vs ref (tight) " + nm));
      EXPECT_TRUE(close_nmse(f.dqkv, r.dqkv, 1e-10, "dqkv vs ref (tight) " + nm));
    }
    // Zero above the diagonal, exactly.
    for (int64_t bh = 0; bh < c.B * c.NH; ++bh)
      for (int64_t tt = 0; tt < c.T; ++tt)
        for (int64_t u = tt + 1; u < c.T; ++u) ASSERT_EQ(f.att[(bh * c.T + tt) * c.T + u], 0.0f);
  }
}

CT_INSTANTIATE_DEVICE_SUITE(Attention);

TEST(ReferenceAttention, MatchesFp64AndFiniteDifferences) {
  for (const AttnCase& c : kCases) {
    Vec qkv = randn(c.B * c.T * c.W(), c.seed), dout = randn(c.B * c.T * c.C, c.seed + 1);
    AttnOut r = run(ref(), c, qkv, dout);
    VecD att64;
    VecD out64 = f64::attention(to_d(qkv), c.B, c.T, c.C, c.NH, &att64, c.NKV);
    EXPECT_TRUE(close_nmse(r.out, out64, kTolF64, "out ref vs fp64 " + name(c)));
    EXPECT_TRUE(close_nmse(r.att, att64, kTolF64, "att ref vs fp64 " + name(c)));
    for (int64_t bh = 0; bh < c.B * c.NH; ++bh)
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t u = t + 1; u < c.T; ++u) ASSERT_EQ(r.att[(bh * c.T + t) * c.T + u], 0.0f);
    if (!c.finite_differences) continue;
    VecD num = numeric_grad(
        [&](const VecD& x) { return f64::attention(x, c.B, c.T, c.C, c.NH, nullptr, c.NKV); },
        to_d(qkv), to_d(dout));
    EXPECT_TRUE(close_nmse(r.dqkv, num, kTolGrad, "dqkv ref vs finite differences " + name(c)));
  }
}

TEST(CpuAttention, RejectsBadShapes) {
  for (const char* spec : {"cpu:1", "cpu:0"}) {
    Device& d = open_cached(spec);
    Tensor out = upload(d, {1, 4, 6}, Vec(24, 0.0f)), qkv = upload(d, {1, 4, 18}, Vec(72, 0.0f));
    Tensor att = upload(d, {1, 2, 4, 4}, Vec(32, 0.0f));
    EXPECT_THROW(d.attention_forward(out, att, qkv, 4), Error);  // C=6 not a multiple of 4
    EXPECT_THROW(d.attention_forward(out, att, qkv, 3), Error);  // att has 2 heads
    Tensor bad = upload(d, {1, 4, 12}, Vec(48, 0.0f));
    EXPECT_THROW(d.attention_forward(out, att, bad, 2), Error);     // qkv is not 3C
    EXPECT_THROW(d.attention_forward(out, att, qkv, 2, 4), Error);  // 4 kv heads do not divide 2
    EXPECT_THROW(d.attention_forward(out, att, qkv, 2, 1), Error);  // 1 kv head: qkv is C + 6
    d.attention_forward(out, att, bad, 2, 1);                       // which this one is
  }
}

}  // namespace
}  // namespace ct::test
