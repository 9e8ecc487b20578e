// core/device.h's mixed-precision table on Vulkan: layernorm, gelu, crossentropy, bias_backward
// and add given f16/bf16 tensors, against the CPU reference device on the same 16-bit inputs.
// 16-bit outputs: within 1 ulp of the reference (the reference computes in fp64 and rounds
// twice, fp64 -> f32 -> h; Vulkan computes in fp32 and rounds once, so a value near a rounding
// boundary may land one ulp apart; CT_PRINT_NMSE=1 prints how many are bitwise equal). NaN on
// one side only, or an inf the other side lacks, fails. f32 outputs: normalised MSE <= 1e-7.
// Sizes are odd and not multiples of the workgroup sizes; NaN and inf inputs propagate as on the
// CPU.
#include <algorithm>

#include "tests/vulkan/vk_test_util.h"

namespace ct::vktest {
namespace {

uint16_t to_h(float v, DType h) { return h == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v); }
float from_h(uint16_t v, DType h) { return h == DType::bf16 ? bf16_to_f32(v) : f16_to_f32(v); }

Tensor up_as(Device& d, const Shape& s, const Vec& v, DType dt) {
  if (dt == DType::f32) return up(d, s, v);
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = to_h(v[i], dt);
  Tensor t = d.empty(s, dt, MemCategory::kActivations);
  d.upload(t, bits.data(), bits.size() * 2);
  return t;
}
Pair both_as(const Shape& s, const Vec& v, DType dt) {
  return {up_as(vk(), s, v, dt), up_as(ref(), s, v, dt)};
}

// Position of a 16-bit float on a monotone integer line (so that neighbours differ by 1).
int32_t ordered(uint16_t b) { return (b & 0x8000u) ? -static_cast<int32_t>(b & 0x7fffu) : b; }
bool is_nan_h(uint16_t b, DType h) { return std::isnan(from_h(b, h)); }
bool is_inf_h(uint16_t b, DType h) { return std::isinf(from_h(b, h)); }

// 16-bit outputs: every element within 1 ulp of the reference, NaN where it has NaN; or, with
// abs_tol, within abs_tol of it (see the gelu test).
::testing::AssertionResult same_h(const Pair& p, const std::string& what, double abs_tol = 0) {
  DType h = p.v.dtype;
  auto got = down_as<uint16_t>(vk(), p.v), want = down_as<uint16_t>(ref(), p.r);
  size_t equal = 0, zeros = 0, tail = 0;
  int32_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    bool gn = is_nan_h(got[i], h), wn = is_nan_h(want[i], h);
    if (gn || wn) {
      if (gn != wn)
        return ::testing::AssertionFailure() << what << ": NaN mismatch at " << i << ": got "
                                             << from_h(got[i], h) << ", want "
                                             << from_h(want[i], h);
      ++equal;
      continue;
    }
    if ((is_inf_h(got[i], h) || is_inf_h(want[i], h)) && got[i] != want[i])
      return ::testing::AssertionFailure() << what << ": inf mismatch at " << i << ": got "
                                           << from_h(got[i], h) << ", want " << from_h(want[i], h);
    int32_t d = std::abs(ordered(got[i]) - ordered(want[i]));
    if (d > 1 && std::fabs(from_h(got[i], h) - from_h(want[i], h)) <= abs_tol) {
      ++tail;
      continue;
    }
    if (d > 1)
      return ::testing::AssertionFailure()
             << what << ": " << d << " ulp apart at " << i << ": got " << from_h(got[i], h)
             << ", want " << from_h(want[i], h);
    worst = std::max(worst, d);
    if (got[i] == want[i]) ++equal;
    else if (d == 0) ++zeros;  // +0 and -0: 0 ulp apart, not bitwise equal
  }
  if (std::getenv("CT_PRINT_NMSE"))
    std::printf("  16-bit %-34s %zu/%zu bitwise equal, %zu +-0, max %d ulp, %zu in the tail\n",
                what.c_str(), equal, got.size(), zeros, worst, tail);
  return ::testing::AssertionSuccess();
}

// Random normals with NaN, +-inf and a few large values spread over the first entries.
Vec with_specials(size_t n, uint64_t seed, float scale) {
  Vec v = randn(n, seed, scale);
  const float sp[] = {NAN, INFINITY, -INFINITY, 300.0f, -300.0f, 1e-6f, -0.0f};
  for (size_t i = 0; i < sizeof(sp) / sizeof(sp[0]) && i * 97 < n; ++i) v[i * 97] = sp[i];
  return v;
}

class MixedPrecisionTest : public VulkanTest, public ::testing::WithParamInterface<DType> {
 protected:
  void SetUp() override {
    VulkanTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_TRUE(vk().supports(OpKind::kCopy, GetParam()))
        << "this Vulkan device lacks storageBuffer16BitAccess (no " << dtype_name(GetParam())
        << " tensors); lavapipe has it";
  }
  std::string tag(const char* op) const { return std::string(op) + " " + dtype_name(GetParam()); }
};

TEST_P(MixedPrecisionTest, SupportsAnswersForTheImplementedOps) {
  DType h = GetParam();
  for (OpKind k : {OpKind::kAdd, OpKind::kGelu, OpKind::kLayerNorm, OpKind::kBiasGrad,
                   OpKind::kCrossEntropy, OpKind::kMatmul, OpKind::kAttention})
    EXPECT_TRUE(vk().supports(k, h)) << static_cast<int>(k);
  for (OpKind k : {OpKind::kAccumulate, OpKind::kScale, OpKind::kEmbedding, OpKind::kSum,
                   OpKind::kNorm, OpKind::kAdamW})
    EXPECT_FALSE(vk().supports(k, h)) << static_cast<int>(k);
}

TEST_P(MixedPrecisionTest, AddF32PlusH) {
  DType h = GetParam();
  const int64_t n = 10007;
  Pair a = both({n}, with_specials(n, 11, 1.0f)), b = both_as({n}, with_specials(n, 12, 2.0f), h);
  Pair o = both_empty({n});
  vk().add(o.v, a.v, b.v);
  ref().add(o.r, a.r, b.r);
  EXPECT_TRUE(same(o, kTol, tag("add")));
  // out may be a itself
  vk().add(a.v, a.v, b.v);
  ref().add(a.r, a.r, b.r);
  EXPECT_TRUE(same(a, kTol, tag("add in place")));
}

TEST_P(MixedPrecisionTest, GeluForwardBackwardAllH) {
  DType h = GetParam();
  // random values and specials, then a sweep of [-15, 15] through the tails (gelu(-7) = -4e-14,
  // gelu(-10) = -3e-38: the smallest normal floats, then bf16 subnormals, then 0)
  const int64_t nr = 3 * 1001 + 2, ns = 6001, n = nr + ns;
  Vec xs = with_specials(nr + 1, 13, 3.0f);
  xs[5] = 30.0f;
  xs[6] = -30.0f;
  for (int64_t i = 0; i < ns; ++i)
    xs.push_back(-15.0f + 30.0f * static_cast<float>(i) / static_cast<float>(ns - 1));
  // The reference evaluates 1 + tanh z in fp64, which cancels for z << 0: its absolute error is
  // ~1e-16 |x| forward and ~1e-16 |x|^3 |dout| backward (gelu(-8) is -1e-20; the reference says
  // 0). Vulkan uses a cancellation-free form. Only bf16 can hold such values (the smallest f16
  // subnormal is 6e-8), so for bf16 differences below kTail count as agreement.
  const double kTail = 1e-10;
  Vec ds = with_specials(n, 14, 1.0f);
  for (DType dt : {h, DType::f32}) {  // the f32 variant on the same values, too
    // odd element offsets into 16-bit buffers (x starts at element 1)
    Pair xbuf = both_as({n + 1}, xs, dt);
    Pair x{xbuf.v.slice_flat(1, {n}), xbuf.r.slice_flat(1, {n})};
    Pair d = both_as({n}, ds, dt), o = both_empty({n}, dt), dx = both_empty({n}, dt);
    vk().gelu_forward(o.v, x.v);
    ref().gelu_forward(o.r, x.r);
    vk().gelu_backward(dx.v, x.v, d.v);
    ref().gelu_backward(dx.r, x.r, d.r);
    std::string t = std::string(" ") + dtype_name(dt);
    if (dt == DType::f32) {
      EXPECT_TRUE(same(o, kTol, "gelu_forward" + t));
      EXPECT_TRUE(same(dx, kTol, "gelu_backward" + t));
    } else {
      EXPECT_TRUE(same_h(o, "gelu_forward" + t, kTail));
      EXPECT_TRUE(same_h(dx, "gelu_backward" + t, kTail));
    }
  }
}

TEST_P(MixedPrecisionTest, LayerNormForwardOutH) {
  DType h = GetParam();
  const int64_t N = 37, C = 769;
  Vec xs = randn(N * C, 15, 2.0f);
  xs[3 * C + 5] = NAN;       // row 3: NaN everywhere
  xs[5 * C + 7] = INFINITY;  // row 5: NaN (inf - inf) everywhere
  Vec ws = randn(C, 16), bs = randn(C, 17);
  ws[9] = 3e4f;  // channel 9 overflows f16 (inf) where |xhat| > 2.2, stays finite in bf16
  xs[9] = 50.0f;  // row 0: xhat ~ 18 there
  Pair x = both({N, C}, xs), w = both({C}, ws), b = both({C}, bs);
  Pair mean = both_empty({N}), rstd = both_empty({N}), out = both_empty({N, C}, h);
  vk().layernorm_forward(out.v, mean.v, rstd.v, x.v, w.v, b.v, 1e-5f);
  ref().layernorm_forward(out.r, mean.r, rstd.r, x.r, w.r, b.r, 1e-5f);
  EXPECT_TRUE(same_h(out, tag("layernorm_forward out")));
  uint16_t o9 = down_as<uint16_t>(ref(), out.r)[9];
  EXPECT_EQ(std::isinf(from_h(o9, h)), h == DType::f16) << "the overflow case is not exercised";
  EXPECT_TRUE(same(mean, kTol, tag("layernorm_forward mean")));
  EXPECT_TRUE(same(rstd, kTol, tag("layernorm_forward rstd")));
}

TEST_P(MixedPrecisionTest, LayerNormBackwardDoutH) {
  DType h = GetParam();
  const int64_t N = 29, C = 131;
  Pair x = both({N, C}, randn(N * C, 18, 2.0f)), w = both({C}, randn(C, 19));
  Pair b = both({C}, randn(C, 20)), mean = both_empty({N}), rstd = both_empty({N});
  Pair out = both_empty({N, C});
  vk().layernorm_forward(out.v, mean.v, rstd.v, x.v, w.v, b.v, 1e-5f);
  ref().layernorm_forward(out.r, mean.r, rstd.r, x.r, w.r, b.r, 1e-5f);
  Vec dos = randn(N * C, 21);
  dos[2 * C + 3] = NAN;  // row 2 of dx and column 3 of dw, db become NaN
  dos[4 * C + 6] = INFINITY;
  Pair dout = both_as({N, C}, dos, h);
  Pair dx = both({N, C}, randn(N * C, 22)), dw = both({C}, randn(C, 23)),
       db = both({C}, randn(C, 24));
  vk().layernorm_backward(dx.v, dw.v, db.v, dout.v, x.v, w.v, mean.v, rstd.v);
  ref().layernorm_backward(dx.r, dw.r, db.r, dout.r, x.r, w.r, mean.r, rstd.r);
  EXPECT_TRUE(same(dx, kTol, tag("layernorm_backward dx")));
  EXPECT_TRUE(same(dw, kTol, tag("layernorm_backward dw")));
  EXPECT_TRUE(same(db, kTol, tag("layernorm_backward db")));
}

TEST_P(MixedPrecisionTest, BiasBackwardDoutH) {
  DType h = GetParam();
  const int64_t M = 67, N = 301;
  Vec dos = randn(M * N, 25);
  dos[10 * N + 4] = NAN;
  dos[11 * N + 8] = -INFINITY;
  Pair dout = both_as({M, N}, dos, h), dbias = both({N}, randn(N, 26));
  vk().bias_backward(dbias.v, dout.v);
  ref().bias_backward(dbias.r, dout.r);
  EXPECT_TRUE(same(dbias, kTol, tag("bias_backward")));
}

TEST_P(MixedPrecisionTest, CrossEntropyLogitsH) {
  DType h = GetParam();
  const int64_t N = 9, V = 1031;
  Vec ls = randn(N * V, 27, 3.0f);
  ls[2 * V + 17] = NAN;        // row 2: NaN loss and gradient
  ls[4 * V + 33] = INFINITY;   // row 4: NaN (inf - inf)
  ls[6 * V + 40] = -INFINITY;  // row 6: probability 0 there, the rest finite
  ls[7 * V + 3] = 60.0f;       // row 7: one dominant logit
  std::vector<int32_t> ts = randint(N, 28, static_cast<int32_t>(V));
  ts[6] = 40;                  // row 6: the target is the -inf logit: loss inf
  Pair logits = both_as({N, V}, ls, h), tgt = both_i32({N}, ts), losses = both_empty({N});
  vk().crossentropy_forward(losses.v, logits.v, tgt.v);
  ref().crossentropy_forward(losses.r, logits.r, tgt.r);
  EXPECT_TRUE(same(losses, kTol, tag("crossentropy_forward")));
  Pair dl = both_empty({N, V}, h);
  vk().crossentropy_backward(dl.v, logits.v, tgt.v, 1.0f / N);
  ref().crossentropy_backward(dl.r, logits.r, tgt.r, 1.0f / N);
  EXPECT_TRUE(same_h(dl, tag("crossentropy_backward")));
  // in place: dlogits is logits
  vk().crossentropy_backward(logits.v, logits.v, tgt.v, 1.0f / N);
  ref().crossentropy_backward(logits.r, logits.r, tgt.r, 1.0f / N);
  EXPECT_TRUE(same_h(logits, tag("crossentropy_backward in place")));
}

// matmul with a, b in h and c in f32 or h, against the reference on the same 16-bit inputs, for
// every variant (16-bit MM_VEC runs MM_REG): odd sizes (scalar loads) and multiples of 4 (vec4
// loads along k, m, n), all transposes, batch, bias, alpha/beta (beta reads the 16-bit c).
// 16-bit outputs of sums: within 1 ulp, or within kAccTol absolutely where the sum cancels to
// a value whose ulp is below the fp32 accumulation-order difference (values O(1..10) here; the
// reference and Vulkan add in different orders; measured up to ~1e-6).
constexpr double kAccTol = 1e-5;

TEST_P(MixedPrecisionTest, MatmulH) {
  DType h = GetParam();
  struct Case {
    int64_t batch, M, N, K;
  };
  uint64_t seed = 100;
  for (const char* kind : {"vsg", "reg", "tiled"}) {
    setenv("CROSSTRAIN_VK_MATMUL", kind, 1);
    for (Case k : {Case{1, 37, 53, 29}, Case{2, 68, 76, 36}, Case{1, 65, 66, 37}})
      for (int tr = 0; tr < 4; ++tr)
        for (DType tc : {DType::f32, h}) {
          bool ta = tr & 1, tb = tr & 2;
          bool bias = tr == 1, beta = tr == 2;
          auto shp = [&](int64_t r, int64_t c) {
            return k.batch > 1 ? Shape{k.batch, r, c} : Shape{r, c};
          };
          Shape sa = ta ? shp(k.K, k.M) : shp(k.M, k.K), sb = tb ? shp(k.N, k.K) : shp(k.K, k.N);
          Shape sc = shp(k.M, k.N);
          Pair a = both_as(sa, randn(sa.numel(), seed), h);
          Pair b = both_as(sb, randn(sb.numel(), seed + 1), h);
          Pair c = both_as(sc, randn(sc.numel(), seed + 2), tc);
          Pair bs = both({k.N}, randn(k.N, seed + 3));
          seed += 4;
          float alpha = bias ? 0.5f : 1.0f, bt = beta ? 0.75f : 0.0f;
          vk().matmul(c.v, a.v, b.v, ta, tb, alpha, bt, bias ? &bs.v : nullptr);
          ref().matmul(c.r, a.r, b.r, ta, tb, alpha, bt, bias ? &bs.r : nullptr);
          std::string what = std::string("matmul ") + kind + " " + std::to_string(k.M) + "x" +
                             std::to_string(k.N) + "x" + std::to_string(k.K) +
                             (ta ? " ta" : "") + (tb ? " tb" : "") + " c " + dtype_name(tc) +
                             " " + dtype_name(h);
          if (tc == DType::f32) EXPECT_TRUE(same(c, kTol, what));
          else EXPECT_TRUE(same_h(c, what, kAccTol));
        }
  }
  unsetenv("CROSSTRAIN_VK_MATMUL");
}

// attention forward and backward all in h: out, att, dqkv within 1 ulp of the reference (which
// also computes in f32 from the widened inputs and rounds the outputs).
TEST_P(MixedPrecisionTest, AttentionAllH) {
  DType h = GetParam();
  struct Case {
    int64_t B, T, C;
    int NH;
  };
  uint64_t seed = 200;
  for (Case k : {Case{2, 67, 48, 4}, Case{1, 64, 64, 2}}) {
    Shape sq{k.B, k.T, 3 * k.C}, so{k.B, k.T, k.C}, sa{k.B, k.NH, k.T, k.T};
    Pair qkv = both_as(sq, randn(sq.numel(), seed, 1.5f), h);
    Pair dout = both_as(so, randn(so.numel(), seed + 1), h);
    seed += 2;
    Pair out = both_empty(so, h), att = both_empty(sa, h), dqkv = both_empty(sq, h);
    vk().attention_forward(out.v, att.v, qkv.v, k.NH);
    ref().attention_forward(out.r, att.r, qkv.r, k.NH);
    std::string t = " T" + std::to_string(k.T) + " " + dtype_name(h);
    EXPECT_TRUE(same_h(att, "attention_forward att" + t));
    EXPECT_TRUE(same_h(out, "attention_forward out" + t, kAccTol));
    // the backward on the same att (the two forwards' att may differ by 1 ulp)
    auto bits = down_as<uint16_t>(ref(), att.r);
    vk().upload(att.v, bits.data(), bits.size() * 2);
    vk().attention_backward(dqkv.v, dout.v, qkv.v, att.v, k.NH);
    ref().attention_backward(dqkv.r, dout.r, qkv.r, att.r, k.NH);
    EXPECT_TRUE(same_h(dqkv, "attention_backward dqkv" + t, kAccTol));
  }
}

TEST_P(MixedPrecisionTest, DtypeRulesOfTheTable) {
  DType h = GetParam();
  const int64_t n = 33;
  Tensor xf = vk().empty({n}, DType::f32, MemCategory::kActivations);
  Tensor xh = vk().empty({n}, h, MemCategory::kActivations);
  vk().fill(xf, 1.0f);
  vk().fill(xh, 1.0f);
  EXPECT_THROW(vk().gelu_forward(xf, xh), Error);  // gelu: one dtype throughout
  EXPECT_THROW(vk().add(xh, xf, xf), Error);        // add: out and a are f32
  EXPECT_THROW(vk().accumulate(xf, xh), Error);     // accumulate: f32 only
  Tensor dbh = vk().empty({n}, h, MemCategory::kActivations);
  EXPECT_THROW(vk().bias_backward(dbh, xf), Error);  // dbias is f32
  // matmul: a and b share a dtype; c is f32 or a's dtype; bias f32
  DType other = h == DType::f16 ? DType::bf16 : DType::f16;
  Tensor mh = vk().empty({4, 4}, h, MemCategory::kActivations);
  Tensor mf = vk().empty({4, 4}, DType::f32, MemCategory::kActivations);
  Tensor mo = vk().empty({4, 4}, other, MemCategory::kActivations);
  Tensor bh = vk().empty({4}, h, MemCategory::kActivations);
  vk().fill(mh, 1.0f);
  vk().fill(mf, 1.0f);
  EXPECT_THROW(vk().matmul(mf, mh, mf, false, false), Error);
  EXPECT_THROW(vk().matmul(mf, mf, mh, false, false), Error);
  EXPECT_THROW(vk().matmul(mh, mf, mf, false, false), Error);
  EXPECT_THROW(vk().matmul(mo, mh, mh, false, false), Error);
  EXPECT_THROW(vk().matmul(mf, mh, mh, false, false, 1.0f, 0.0f, &bh), Error);
  // attention: one dtype throughout
  Tensor qkv = vk().empty({1, 4, 12}, h, MemCategory::kActivations);
  Tensor outf = vk().empty({1, 4, 4}, DType::f32, MemCategory::kActivations);
  Tensor atth = vk().empty({1, 2, 4, 4}, h, MemCategory::kActivations);
  EXPECT_THROW(vk().attention_forward(outf, atth, qkv, 2), Error);
}

// out and a past maxStorageBufferRange (lavapipe: 128 MiB), b in bf16: chunked dispatches
// that bind the 16-bit tensor at the chunk offsets.
using MixedPrecisionLargeTest = VulkanTest;
TEST_F(MixedPrecisionLargeTest, AddBf16PastTheBindingRange) {
  ASSERT_TRUE(vk().supports(OpKind::kAdd, DType::bf16));
  const int64_t n = vk().info().max_buffer_range_bytes / 4 + 1001;
  Vec bs = randn(static_cast<size_t>(n), 31);
  bs[static_cast<size_t>(n) - 1] = NAN;
  Pair a = both({n}, randn(static_cast<size_t>(n), 30)), b = both_as({n}, bs, DType::bf16);
  Pair o = both_empty({n});
  vk().add(o.v, a.v, b.v);
  ref().add(o.r, a.r, b.r);
  EXPECT_TRUE(same(o, kTol, "add bf16, large"));
}

INSTANTIATE_TEST_SUITE_P(Vulkan, MixedPrecisionTest, ::testing::Values(DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace ct::vktest
