// The mixed-precision table of core/device.h: ops given f16/bf16 tensors compute in f32 and
// round what they store. The reference and every device against the fp64 forwards on the same
// (rounded) inputs, with tolerances of the 16-bit type's precision; a device of the reference's
// backend also against the reference (bounds the CPU backend promises). Each case runs for f16
// and bf16; a dtype the device lacks is skipped with the reason. (16-bit outputs against the
// reference to 1 ulp: mixed_precision_ulp_test.cpp.)
#include <cstring>
#include <functional>

#include "tests/common/device_harness.h"
#include "tests/common/fp64_ops.h"
#include "tests/common/half_compare.h"

namespace ct::test {
namespace {

// v rounded to h, as floats (what a 16-bit tensor holds).
Vec round_h(const Vec& v, DType h) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = from_h(to_h(v[i], h), h);
  return r;
}
// nMSE of a value stored in h: half an ulp of relative error at most, squared.
double tol_h(DType h) {
  return h == DType::bf16 ? 2e-5 : 4e-7;
}

// Runs body(h) for f16 and bf16 where the device supports op in h; skips the case (after the
// supported dtype ran) with the reasons for the others.
class MixedPrecision : public DeviceTest {
 protected:
  void for_each_half(std::initializer_list<OpKind> ops, const std::function<void(DType)>& body) {
    std::string skipped;
    for (DType h : {DType::bf16, DType::f16}) {
      std::string why;
      for (OpKind op : ops) why += unsupported(op, h);
      if (!why.empty()) {
        skipped += "; " + why;
        continue;
      }
      SCOPED_TRACE(dtype_name(h));
      body(h);
      if (HasFatalFailure()) return;
    }
    if (!skipped.empty()) GTEST_SKIP() << skipped.substr(2);
  }
};

TEST_P(MixedPrecision, MatmulInputsAndOutputIn16Bits) {
  for_each_half({OpKind::kMatmul}, [&](DType h) {
    const int64_t M = 17, N = 33, K = 65;
    Vec a = round_h(randn(M * K, 1), h), b = round_h(randn(N * K, 2), h);
    Vec c0 = round_h(randn(M * N, 3), h), bias = randn(N, 4);
    VecD want = f64::matmul(to_d(a), to_d(b), M, N, K, false, true);
    for (int64_t i = 0; i < M * N; ++i) want[i] = 0.5 * want[i] + 0.25 * c0[i] + bias[i % N];
    Vec out[2];
    int k = 0;
    for (Device* d : {&ref(), &dev()}) {
      for (DType cdt : {h, DType::f32}) {
        Tensor ta = up_as(*d, {M, K}, a, h), tb = up_as(*d, {N, K}, b, h);
        Tensor tc = up_as(*d, {M, N}, c0, cdt), tbias = upload(*d, {N}, bias);
        d->matmul(tc, ta, tb, false, true, 0.5f, 0.25f, &tbias);
        Vec got = download_h(*d, tc);
        EXPECT_TRUE(close_nmse(got, want,
                               cdt == h      ? tol_h(h)
                               : d == &ref() ? kTolSame
                                             : tol(Tol::kGemm),
                               d->info().id() + " c " + dtype_name(cdt)));
        if (cdt == h) out[k++] = got;
      }
    }
    if (same_backend_as_ref()) {
      EXPECT_TRUE(close_nmse(out[1], out[0], 1e-9, "fast vs reference"));
    }
    // a and b must share the dtype.
    Tensor ta = up_as(dev(), {M, K}, a, h), tb = upload(dev(), {N, K}, b);
    Tensor tc = upload(dev(), {M, N}, c0);
    EXPECT_THROW(dev().matmul(tc, ta, tb, false, true), Error);
  });
}

TEST_P(MixedPrecision, AttentionAndGeluAllIn16Bits) {
  for_each_half({OpKind::kAttention, OpKind::kGelu}, [&](DType h) {
    const int64_t B = 2, T = 7, C = 12, NH = 3;
    Vec qkv = round_h(randn(B * T * 3 * C, 5), h), dout = round_h(randn(B * T * C, 6), h);
    VecD att64;
    VecD out64 = f64::attention(to_d(qkv), B, T, C, NH, &att64);
    Vec res[2][3];
    int k = 0;
    for (Device* d : {&ref(), &dev()}) {
      Tensor tq = up_as(*d, {B, T, 3 * C}, qkv, h);
      Tensor to = d->empty({B, T, C}, h, MemCategory::kActivations);
      Tensor ta = d->empty({B, NH, T, T}, h, MemCategory::kActivations);
      Tensor td = up_as(*d, {B, T, C}, dout, h);
      Tensor tdq = d->empty({B, T, 3 * C}, h, MemCategory::kGrads);
      d->attention_forward(to, ta, tq, NH);
      d->attention_backward(tdq, td, tq, ta, NH);
      res[k][0] = download_h(*d, to);
      res[k][1] = download_h(*d, ta);
      res[k][2] = download_h(*d, tdq);
      EXPECT_TRUE(close_nmse(res[k][0], out64, tol_h(h), "attention out " + d->info().id()));
      EXPECT_TRUE(close_nmse(res[k][1], att64, tol_h(h), "attention att " + d->info().id()));
      // The gelu of the (rounded) output, in 16 bits.
      Tensor g = d->empty({B * T * C}, h, MemCategory::kActivations);
      Tensor gx = to.reshape({B * T * C});
      d->gelu_forward(g, gx);
      EXPECT_TRUE(close_nmse(download_h(*d, g), f64::gelu(to_d(res[k][0])), tol_h(h),
                             "gelu " + d->info().id()));
      ++k;
    }
    if (same_backend_as_ref()) {
      for (int j = 0; j < 3; ++j)
        EXPECT_TRUE(close_nmse(res[1][j], res[0][j], 1e-5, "fast vs ref"));
    }
    // Mixed dtypes within attention are rejected.
    Tensor tq = upload(dev(), {B, T, 3 * C}, qkv);
    Tensor to = dev().empty({B, T, C}, h, MemCategory::kActivations);
    Tensor ta = dev().empty({B, NH, T, T}, h, MemCategory::kActivations);
    EXPECT_THROW(dev().attention_forward(to, ta, tq, NH), Error);
  });
}

// The fused attention in 16 bits (lse f32): out against fp64, dqkv against the f32 reference of
// the same (rounded) inputs; the device against the reference.
TEST_P(MixedPrecision, FlashAttentionAllIn16Bits) {
  for_each_half({OpKind::kAttention}, [&](DType h) {
    const int64_t B = 2, T = 70, C = 24, NH = 3;
    Vec qkv = round_h(randn(B * T * 3 * C, 15), h), dout = round_h(randn(B * T * C, 16), h);
    VecD out64 = f64::attention(to_d(qkv), B, T, C, NH);
    // the f32 reference's gradient from the same inputs
    Tensor rq = upload(ref(), {B, T, 3 * C}, qkv), rd = upload(ref(), {B, T, C}, dout);
    Tensor ro = ref().empty({B, T, C}, DType::f32, MemCategory::kActivations);
    Tensor rl = ref().empty({B, NH, T}, DType::f32, MemCategory::kActivations);
    Tensor rdq = ref().empty({B, T, 3 * C}, DType::f32, MemCategory::kGrads);
    ref().flash_attention_forward(ro, rl, rq, NH);
    ref().flash_attention_backward(rdq, rd, rq, ro, rl, NH);
    const Vec dq32 = download(ref(), rdq);
    Vec res[2][2];
    int k = 0;
    for (Device* d : {&ref(), &dev()}) {
      Tensor tq = up_as(*d, {B, T, 3 * C}, qkv, h);
      Tensor to = d->empty({B, T, C}, h, MemCategory::kActivations);
      Tensor tl = d->empty({B, NH, T}, DType::f32, MemCategory::kActivations);
      Tensor td = up_as(*d, {B, T, C}, dout, h);
      Tensor tdq = d->empty({B, T, 3 * C}, h, MemCategory::kGrads);
      d->flash_attention_forward(to, tl, tq, NH);
      d->flash_attention_backward(tdq, td, tq, to, tl, NH);
      res[k][0] = download_h(*d, to);
      res[k][1] = download_h(*d, tdq);
      EXPECT_TRUE(close_nmse(res[k][0], out64, tol_h(h), "flash out " + d->info().id()));
      EXPECT_TRUE(close_nmse(res[k][1], dq32, tol_h(h), "flash dqkv " + d->info().id()));
      ++k;
    }
    // Mixed dtypes are rejected: qkv f32 with a 16-bit out.
    Tensor tq = upload(dev(), {B, T, 3 * C}, qkv);
    Tensor to = dev().empty({B, T, C}, h, MemCategory::kActivations);
    Tensor tl = dev().empty({B, NH, T}, DType::f32, MemCategory::kActivations);
    EXPECT_THROW(dev().flash_attention_forward(to, tl, tq, NH), Error);
  });
}

TEST_P(MixedPrecision, LayerNormCrossEntropyBiasGradAdd) {
  for_each_half(
      {OpKind::kLayerNorm, OpKind::kCrossEntropy, OpKind::kBiasGrad, OpKind::kAdd}, [&](DType h) {
        const int64_t N = 9, C = 24, V = 40;
        Vec x = randn(N * C, 7), w = randn(C, 8), b = randn(C, 9),
            dout = round_h(randn(N * C, 10), h);
        Vec logits = round_h(randn(N * V, 11, 3.0f), h);
        auto targets = randint(N, 12, V);
        for (Device* d : {&ref(), &dev()}) {
          std::string nm = d->info().id();
          Tensor tx = upload(*d, {N, C}, x), tw = upload(*d, {C}, w), tb = upload(*d, {C}, b);
          Tensor to = d->empty({N, C}, h, MemCategory::kActivations);
          Tensor tm = upload(*d, {N}, Vec(N)), tr = upload(*d, {N}, Vec(N));
          d->layernorm_forward(to, tm, tr, tx, tw, tb, 1e-5f);
          EXPECT_TRUE(close_nmse(download_h(*d, to),
                                 f64::layernorm(to_d(x), to_d(w), to_d(b), N, C, 1e-5), tol_h(h),
                                 "layernorm out " + nm));
          // Backward with a 16-bit dout equals the f32 backward of the rounded dout.
          Tensor tdh = up_as(*d, {N, C}, dout, h), tdf = upload(*d, {N, C}, dout);
          Tensor dx1 = upload(*d, {N, C}, Vec(N * C, 0.f)),
                 dx2 = upload(*d, {N, C}, Vec(N * C, 0.f));
          Tensor dw1 = upload(*d, {C}, Vec(C, 0.f)), dw2 = upload(*d, {C}, Vec(C, 0.f));
          Tensor db1 = upload(*d, {C}, Vec(C, 0.f)), db2 = upload(*d, {C}, Vec(C, 0.f));
          d->layernorm_backward(dx1, dw1, db1, tdh, tx, tw, tm, tr);
          d->layernorm_backward(dx2, dw2, db2, tdf, tx, tw, tm, tr);
          EXPECT_EQ(download(*d, dx1), download(*d, dx2)) << nm;
          EXPECT_EQ(download(*d, dw1), download(*d, dw2)) << nm;
          // bias_backward and add with a 16-bit operand.
          Tensor bb1 = upload(*d, {C}, Vec(C, 0.f)), bb2 = upload(*d, {C}, Vec(C, 0.f));
          d->bias_backward(bb1, tdh);
          d->bias_backward(bb2, tdf);
          EXPECT_EQ(download(*d, bb1), download(*d, bb2)) << nm;
          Tensor sum = upload(*d, {N * C}, Vec(N * C, 0.f));
          d->add(sum, tdf.reshape({N * C}), tdh.reshape({N * C}));
          Vec s = download(*d, sum);
          for (int64_t i = 0; i < N * C; ++i) ASSERT_EQ(s[i], 2.0f * dout[i]);
          // Cross-entropy on 16-bit logits, then the backward in place.
          Tensor tl = up_as(*d, {N, V}, logits, h), tt = upload_i32(*d, {N}, targets);
          Tensor loss = upload(*d, {N}, Vec(N));
          d->crossentropy_forward(loss, tl, tt, V);
          EXPECT_TRUE(close_nmse(download(*d, loss), f64::crossentropy(to_d(logits), targets, N, V),
                                 kTolF64 * 10, "losses " + nm));
          d->crossentropy_backward(tl, tl, tt, V, 0.5f);
          Tensor tlf = upload(*d, {N, V}, logits);
          d->crossentropy_backward(tlf, tlf, tt, V, 0.5f);
          EXPECT_TRUE(close_nmse(download_h(*d, tl), download(*d, tlf), tol_h(h), "dlogits " + nm));
        }
      });
}

// The CPU device stages 16-bit logits in f32 a few rows at a time (64 MiB pieces): with GPT-2's
// vocabulary and 400 rows that is two pieces. Every row must equal the f32 computation on the
// same (rounded) values: losses bitwise, dlogits as the f32 result rounded to h.
TEST_P(MixedPrecision, CrossEntropyStagedInPiecesEqualsF32) {
  for_each_half({OpKind::kCrossEntropy}, [&](DType h) {
    const int64_t N = 400, V = 50257;
    Vec logits = round_h(randn(N * V, 21, 2.0f), h);
    auto targets = randint(N, 22, V);
    Device& d = dev();
    Tensor tl = up_as(d, {N, V}, logits, h), tlf = upload(d, {N, V}, logits);
    Tensor tt = upload_i32(d, {N}, targets);
    Tensor l16 = upload(d, {N}, Vec(N)), l32 = upload(d, {N}, Vec(N));
    d.crossentropy_forward(l16, tl, tt, V);
    d.crossentropy_forward(l32, tlf, tt, V);
    EXPECT_EQ(download(d, l16), download(d, l32));
    d.crossentropy_backward(tl, tl, tt, V, 0.25f);  // in place, piece by piece
    d.crossentropy_backward(tlf, tlf, tt, V, 0.25f);
    EXPECT_EQ(download_h(d, tl), round_h(download(d, tlf), h));
  });
}

// Attention in 16 bits is staged one batch element at a time: B = 3 must equal three B = 1 calls
// on the slices, bitwise.
TEST_P(MixedPrecision, AttentionStagedPerBatchElementEqualsSlices) {
  for_each_half({OpKind::kAttention}, [&](DType h) {
    const int64_t B = 3, T = 9, C = 16, NH = 2;
    Vec qkv = round_h(randn(B * T * 3 * C, 23), h), dout = round_h(randn(B * T * C, 24), h);
    Device& d = dev();
    Tensor tq = up_as(d, {B, T, 3 * C}, qkv, h), td = up_as(d, {B, T, C}, dout, h);
    Tensor to = d.empty({B, T, C}, h, MemCategory::kActivations);
    Tensor ta = d.empty({B, NH, T, T}, h, MemCategory::kActivations);
    Tensor tdq = d.empty({B, T, 3 * C}, h, MemCategory::kGrads);
    d.attention_forward(to, ta, tq, NH);
    d.attention_backward(tdq, td, tq, ta, NH);
    Vec out = download_h(d, to), dq = download_h(d, tdq);
    for (int64_t b = 0; b < B; ++b) {
      auto slice = [&](const Vec& v, int64_t n) {
        return Vec(v.begin() + b * n, v.begin() + (b + 1) * n);
      };
      Tensor q1 = up_as(d, {1, T, 3 * C}, slice(qkv, T * 3 * C), h);
      Tensor d1 = up_as(d, {1, T, C}, slice(dout, T * C), h);
      Tensor o1 = d.empty({1, T, C}, h, MemCategory::kActivations);
      Tensor a1 = d.empty({1, NH, T, T}, h, MemCategory::kActivations);
      Tensor dq1 = d.empty({1, T, 3 * C}, h, MemCategory::kGrads);
      d.attention_forward(o1, a1, q1, NH);
      d.attention_backward(dq1, d1, q1, a1, NH);
      EXPECT_EQ(download_h(d, o1), slice(out, T * C)) << "batch element " << b;
      EXPECT_EQ(download_h(d, dq1), slice(dq, T * 3 * C)) << "batch element " << b;
    }
  });
}

TEST_P(MixedPrecision, F32OnlyOpsThrowUnsupported) {
  for_each_half({OpKind::kCopy}, [&](DType h) {
    for (Device* d : {&ref(), &dev()}) {
      Tensor t = d->empty({8}, h, MemCategory::kActivations), f = upload(*d, {8}, Vec(8, 1.0f));
      Tensor one = upload(*d, {1}, {0.0f});
      auto kind = [](const std::function<void()>& fn) {
        try {
          fn();
        } catch (const Error& e) {
          return e.kind();
        }
        return ErrorKind::kInternal;
      };
      EXPECT_EQ(kind([&] { d->sum(one, t); }), ErrorKind::kUnsupported);
      EXPECT_EQ(kind([&] { d->accumulate(f, t); }), ErrorKind::kUnsupported);
      AdamWHyper hp;
      EXPECT_EQ(kind([&] { d->adamw(t, f, f, f, Tensor{}, hp); }), ErrorKind::kUnsupported);
      EXPECT_FALSE(d->supports(OpKind::kSum, h));
      EXPECT_TRUE(d->supports(OpKind::kGelu, h));
    }
  });
}

// The fast device may hand bf16 products to a native bf16 GEMM (oneDNN, see the device's
// "bf16 matmul" info): every layout, f32 and bf16 c, bias, beta, and a flattened batch.
using MixedPrecisionBf16 = DeviceTest;

TEST_P(MixedPrecisionBf16, MatmulEveryLayoutAgainstFp64) {
  CT_REQUIRE_SUPPORT(OpKind::kMatmul, DType::bf16);
  for (auto& [k, v] : dev().info().extra)
    if (k == "bf16 matmul") std::printf("  bf16 matmul on %s: %s\n", id().c_str(), v.c_str());
  const DType h = DType::bf16;
  const int64_t M = 67, N = 45, K = 130;
  uint64_t seed = 100;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (DType cdt : {DType::f32, h})
        for (float beta : {0.0f, 1.0f})
          for (bool with_bias : {false, true}) {
            Vec a = round_h(randn(M * K, seed++), h), b = round_h(randn(N * K, seed++), h);
            Vec c0 = round_h(randn(M * N, seed++), h), bias = randn(N, seed++);
            VecD want = f64::matmul(to_d(a), to_d(b), M, N, K, ta, tb);
            for (int64_t i = 0; i < M * N; ++i)
              want[i] += beta * c0[i] + (with_bias ? bias[i % N] : 0.0f);
            Vec got[2];
            int j = 0;
            for (Device* d : {&ref(), &dev()}) {
              Tensor tA = up_as(*d, ta ? Shape{K, M} : Shape{M, K}, a, h);
              Tensor tB = up_as(*d, tb ? Shape{N, K} : Shape{K, N}, b, h);
              Tensor tC = up_as(*d, {M, N}, c0, cdt), tb2 = upload(*d, {N}, bias);
              d->matmul(tC, tA, tB, ta, tb, 1.0f, beta, with_bias ? &tb2 : nullptr);
              got[j++] = download_h(*d, tC);
            }
            std::string nm = std::string(ta ? "ta " : "") + (tb ? "tb " : "") + "c " +
                             dtype_name(cdt) + " beta " + std::to_string(beta) +
                             (with_bias ? " bias" : "");
            EXPECT_TRUE(
                close_nmse(got[0], want, cdt == h ? tol_h(h) : kTolSame, "reference " + nm));
            EXPECT_TRUE(
                close_nmse(got[1], want, cdt == h ? tol_h(h) : tol(Tol::kGemm), id() + " " + nm));
          }
  // A batch of row-major a against one shared b (flattened into one product).
  Vec a = round_h(randn(3 * M * K, 1), h), b = round_h(randn(K * N, 2), h);
  Tensor tA = up_as(dev(), {3, M, K}, a, h), tB = up_as(dev(), {K, N}, b, h);
  Tensor tC = dev().empty({3, M, N}, DType::f32, MemCategory::kActivations);
  dev().matmul(tC, tA, tB, false, false);
  VecD want;
  for (int p = 0; p < 3; ++p) {
    VecD ap(a.begin() + p * M * K, a.begin() + (p + 1) * M * K);
    VecD r = f64::matmul(ap, to_d(b), M, N, K, false, false);
    want.insert(want.end(), r.begin(), r.end());
  }
  EXPECT_TRUE(close_nmse(download(dev(), tC), want, tol(Tol::kGemm), id() + " batched"));
}

CT_INSTANTIATE_DEVICE_SUITE(MixedPrecision);
CT_INSTANTIATE_DEVICE_SUITE(MixedPrecisionBf16);

}  // namespace
}  // namespace ct::test
