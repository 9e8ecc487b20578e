// flash_attention_forward / flash_attention_backward (the fused attention): every device against
// the reference (odd sizes, several row blocks and key tiles, the model's head sizes); the
// reference against fp64 (out, lse), against central differences of fp64 attention (dqkv), and
// against the unfused ops (the same function: out and dqkv agree).
#include <cmath>
#include <sstream>

#include "tests/common/device_harness.h"
#include "tests/common/fp64_ops.h"
#include "tests/common/half_compare.h"

namespace ct::test {
namespace {

struct FlashCase {
  int64_t B, T, C, NH;
  uint64_t seed;
  bool finite_differences;
  int64_t NKV = 0;  // key/value heads (grouped-query attention); 0: NH
  int64_t kv() const { return NKV ? NKV : NH; }
  int64_t W() const { return C + 2 * kv() * (C / NH); }  // qkv's row
};
const FlashCase kCases[] = {
    {2, 7, 12, 3, 1, true},
    {1, 5, 8, 1, 2, true},
    {3, 1, 6, 2, 3, true},
    {2, 37, 12, 3, 10, false},
    {1, 300, 24, 2, 11, false},
    {1, 130, 40, 2, 14, false},
    // The model's head sizes: tiny (T 256, 6 heads of 64), gpt2's 64 at an odd T, and the
    // kernels' largest bucket (hs 128) with a T that ends mid-tile.
    {1, 256, 384, 6, 12, false},
    {1, 77, 160, 2, 13, false},
    {1, 70, 256, 2, 15, false},
    // Grouped-query attention: groups of 2 and 3 query heads, one kv head for all (multi-query),
    // llama-tiny's / smollm's 3 query heads per kv head at head size 64, past one key tile.
    {2, 7, 12, 4, 20, true, 2},
    {1, 6, 18, 3, 21, true, 1},
    {2, 37, 24, 6, 22, false, 2},
    {1, 93, 384, 6, 23, false, 2},
};

struct FlashOut {
  Vec out, lse, dqkv;
};

FlashOut run(Device& d, const FlashCase& c, const Vec& qkv, const Vec& dout) {
  Tensor tq = upload(d, {c.B, c.T, c.W()}, qkv);
  Tensor to = upload(d, {c.B, c.T, c.C}, Vec(c.B * c.T * c.C, NAN));
  Tensor tl = upload(d, {c.B, c.NH, c.T}, Vec(c.B * c.NH * c.T, NAN));
  Tensor td = upload(d, {c.B, c.T, c.C}, dout);
  Tensor tdq = upload(d, {c.B, c.T, c.W()}, Vec(qkv.size(), NAN));  // (=): garbage ignored
  d.flash_attention_forward(to, tl, tq, static_cast<int>(c.NH), static_cast<int>(c.kv()));
  d.flash_attention_backward(tdq, td, tq, to, tl, static_cast<int>(c.NH), static_cast<int>(c.kv()));
  return {download(d, to), download(d, tl), download(d, tdq)};
}

std::string name(const FlashCase& c) {
  std::ostringstream os;
  os << "B" << c.B << " T" << c.T << " C" << c.C << " NH" << c.NH << " NKV" << c.kv();
  return os.str();
}

using FlashAttention = DeviceTest;

TEST_P(FlashAttention, MatchesReference) {
  for (const FlashCase& c : kCases) {
    Vec qkv = randn(c.B * c.T * c.W(), c.seed), dout = randn(c.B * c.T * c.C, c.seed + 1);
    FlashOut r = run(ref(), c, qkv, dout), f = run(dev(), c, qkv, dout);
    std::string nm = name(c) + " on " + id();
    double t = tol(Tol::kGemm);
    EXPECT_TRUE(close_nmse(f.out, r.out, t, "out vs ref " + nm));
    EXPECT_TRUE(close_nmse(f.lse, r.lse, t, "lse vs ref " + nm));
    EXPECT_TRUE(close_nmse(f.dqkv, r.dqkv, t, "dqkv vs ref " + nm));
  }
}

// The fused and the unfused ops are the same function on every device.
TEST_P(FlashAttention, EqualsTheUnfusedOps) {
  for (const FlashCase& c : kCases) {
    Vec qkv = randn(c.B * c.T * c.W(), c.seed), dout = randn(c.B * c.T * c.C, c.seed + 1);
    FlashOut f = run(dev(), c, qkv, dout);
    Device& d = dev();
    Tensor tq = upload(d, {c.B, c.T, c.W()}, qkv), td = upload(d, {c.B, c.T, c.C}, dout);
    Tensor to = upload(d, {c.B, c.T, c.C}, Vec(c.B * c.T * c.C, NAN));
    Tensor ta = upload(d, {c.B, c.NH, c.T, c.T}, Vec(c.B * c.NH * c.T * c.T, NAN));
    Tensor tdq = upload(d, {c.B, c.T, c.W()}, Vec(qkv.size(), NAN));
    d.attention_forward(to, ta, tq, static_cast<int>(c.NH), static_cast<int>(c.kv()));
    d.attention_backward(tdq, td, tq, ta, static_cast<int>(c.NH), static_cast<int>(c.kv()));
    std::string nm = name(c) + " on " + id();
    EXPECT_TRUE(close_nmse(f.out, download(d, to), kTolGemm, "flash out vs unfused " + nm));
    EXPECT_TRUE(close_nmse(f.dqkv, download(d, tdq), kTolGemm, "flash dqkv vs unfused " + nm));
  }
}

// The forward of the last Tq rows only (sampling's key/value cache: out [B,Tq,C], lse
// [B,NH,Tq]) gives the rows of positions T - Tq .. T - 1 of the whole window's forward: against
// the reference in f32, and in bf16 against the device's own whole-window rows.
TEST_P(FlashAttention, LastRowsAreTheWholeWindowsRows) {
  for (const FlashCase& c : kCases) {
    for (int64_t Tq : {int64_t{1}, (c.T + 1) / 2, c.T}) {
      const std::string nm = name(c) + " Tq" + std::to_string(Tq) + " on " + id();
      const Vec qkv = randn(c.B * c.T * c.W(), c.seed);
      // the whole window's rows T - Tq .. T - 1 of out (B,T,C) and lse (B,NH,T)
      auto last_rows = [&](const Vec& out, const Vec& lse) {
        Vec o, l;
        for (int64_t b = 0; b < c.B; ++b) {
          o.insert(o.end(), out.begin() + (b * c.T + c.T - Tq) * c.C,
                   out.begin() + (b + 1) * c.T * c.C);
          for (int64_t h = 0; h < c.NH; ++h)
            l.insert(l.end(), lse.begin() + ((b * c.NH + h) * c.T + c.T - Tq),
                     lse.begin() + (b * c.NH + h + 1) * c.T);
        }
        return std::make_pair(o, l);
      };
      auto forward = [&](Device& d, DType dt, int64_t rows) {
        Tensor tq = up_as(d, {c.B, c.T, c.W()}, qkv, dt);
        Tensor to = up_as(d, {c.B, rows, c.C}, Vec(c.B * rows * c.C, NAN), dt);
        Tensor tl = upload(d, {c.B, c.NH, rows}, Vec(c.B * c.NH * rows, NAN));
        d.flash_attention_forward(to, tl, tq, static_cast<int>(c.NH), static_cast<int>(c.kv()));
        return std::make_pair(download_h(d, to), download(d, tl));
      };
      const auto whole = forward(ref(), DType::f32, c.T);
      const auto want = last_rows(whole.first, whole.second);
      const auto got = forward(dev(), DType::f32, Tq);
      EXPECT_TRUE(close_nmse(got.first, want.first, tol(Tol::kGemm), "out f32 " + nm));
      EXPECT_TRUE(close_nmse(got.second, want.second, tol(Tol::kGemm), "lse f32 " + nm));
      // the reference's rows are the same sums, bit for bit
      const auto ref_rows = forward(ref(), DType::f32, Tq);
      EXPECT_EQ(ref_rows.first, want.first) << "reference out " << nm;
      EXPECT_EQ(ref_rows.second, want.second) << "reference lse " << nm;
      if (!dev().supports(OpKind::kAttention, DType::bf16)) continue;
      const auto whole16 = forward(dev(), DType::bf16, c.T);
      const auto want16 = last_rows(whole16.first, whole16.second);
      const auto got16 = forward(dev(), DType::bf16, Tq);
      EXPECT_TRUE(close_nmse(got16.first, want16.first, 1e-5, "out bf16 " + nm));
      EXPECT_TRUE(close_nmse(got16.second, want16.second, 1e-10, "lse bf16 " + nm));
    }
  }
}

CT_INSTANTIATE_DEVICE_SUITE(FlashAttention);

TEST(ReferenceFlashAttention, MatchesFp64AndFiniteDifferences) {
  for (const FlashCase& c : kCases) {
    Vec qkv = randn(c.B * c.T * c.W(), c.seed), dout = randn(c.B * c.T * c.C, c.seed + 1);
    FlashOut r = run(ref(), c, qkv, dout);
    VecD att64;
    VecD out64 = f64::attention(to_d(qkv), c.B, c.T, c.C, c.NH, &att64, c.NKV);
    EXPECT_TRUE(close_nmse(r.out, out64, kTolF64, "out ref vs fp64 " + name(c)));
    // lse from fp64 scores: log sum_u exp(scale q_t . k_u), u <= t.
    const int64_t hs = c.C / c.NH;
    VecD lse64(static_cast<size_t>(c.B * c.NH * c.T));
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.NH; ++h)
        for (int64_t t = 0; t < c.T; ++t) {
          double mx = -INFINITY, sum = 0;
          std::vector<double> s(static_cast<size_t>(t + 1));
          for (int64_t u = 0; u <= t; ++u) {
            double dot = 0;
            for (int64_t i = 0; i < hs; ++i)
              dot += static_cast<double>(qkv[(b * c.T + t) * c.W() + h * hs + i]) *
                     qkv[(b * c.T + u) * c.W() + c.C + (h / (c.NH / c.kv())) * hs + i];
            s[u] = dot / std::sqrt(static_cast<double>(hs));
            mx = std::max(mx, s[u]);
          }
          for (double v : s) sum += std::exp(v - mx);
          lse64[(b * c.NH + h) * c.T + t] = mx + std::log(sum);
        }
    EXPECT_TRUE(close_nmse(r.lse, lse64, kTolF64, "lse ref vs fp64 " + name(c)));
    if (!c.finite_differences) continue;
    VecD num = numeric_grad(
        [&](const VecD& x) { return f64::attention(x, c.B, c.T, c.C, c.NH, nullptr, c.NKV); },
        to_d(qkv), to_d(dout));
    EXPECT_TRUE(close_nmse(r.dqkv, num, kTolGrad, "dqkv ref vs finite differences " + name(c)));
  }
}

TEST(CpuFlashAttention, RejectsBadShapesAndDtypes) {
  for (const char* spec : {"cpu:1", "cpu:0"}) {
    Device& d = open_cached(spec);
    Tensor out = upload(d, {1, 4, 6}, Vec(24, 0.0f)), qkv = upload(d, {1, 4, 18}, Vec(72, 0.0f));
    Tensor lse = upload(d, {1, 2, 4}, Vec(8, 0.0f));
    EXPECT_THROW(d.flash_attention_forward(out, lse, qkv, 4), Error);  // C=6 not a multiple of 4
    EXPECT_THROW(d.flash_attention_forward(out, lse, qkv, 3), Error);  // lse has 2 heads
    Tensor short_lse = upload(d, {1, 2, 3}, Vec(6, 0.0f));
    EXPECT_THROW(d.flash_attention_forward(out, short_lse, qkv, 2), Error);  // lse T=3
    Tensor lse16 = d.empty({1, 2, 4}, DType::bf16, MemCategory::kActivations);
    EXPECT_THROW(d.flash_attention_forward(out, lse16, qkv, 2), Error);  // lse must be f32
    Tensor dqkv = upload(d, {1, 4, 18}, Vec(72, 0.0f)), bad = upload(d, {1, 4, 12}, Vec(48, 0.0f));
    EXPECT_THROW(d.flash_attention_backward(dqkv, out, qkv, bad, lse, 2), Error);  // out shape
    EXPECT_THROW(d.flash_attention_forward(out, lse, qkv, 2, 4), Error);           // 4 kv heads > 2
    EXPECT_THROW(d.flash_attention_forward(out, lse, qkv, 2, 1), Error);  // qkv is 3C, not 2C
    Tensor out5 = upload(d, {1, 5, 6}, Vec(30, 0.0f)), lse5 = upload(d, {1, 2, 5}, Vec(10, 0.0f));
    EXPECT_THROW(d.flash_attention_forward(out5, lse5, qkv, 2), Error);  // 5 rows of 4 positions
    Tensor out2 = upload(d, {1, 2, 6}, Vec(12, 0.0f)), lse2 = upload(d, {1, 2, 2}, Vec(4, 0.0f));
    EXPECT_THROW(d.flash_attention_forward(out2, lse, qkv, 2), Error);  // lse of 4 rows, out 2
    EXPECT_THROW(d.flash_attention_backward(dqkv, out2, qkv, out2, lse2, 2),
                 Error);                                   // forward only
    d.flash_attention_forward(out2, lse2, qkv, 2);         // the last 2 rows
    d.flash_attention_forward(out, lse, qkv, 2);           // and the good call passes
    Tensor qkv_mq = upload(d, {1, 4, 12}, Vec(48, 0.0f));  // one kv head: C + 2 * 3
    d.flash_attention_forward(out, lse, qkv_mq, 2, 1);
  }
}

}  // namespace
}  // namespace ct::test
