// The CPU fast device's ops on 16-bit tensors that skip the f32 staging (kernels.h,
// CT_CPU_BF16_KERNELS, and the row-wise ops run in pieces): each must give, bit for bit, what
// the same device computes in f32 on the widened inputs, with its 16-bit outputs rounded to
// nearest even -- the numbers of the staged path they replace. Sizes span several OpenMP work
// items, attention row blocks and pieces, with widths that are not multiples of the blocks.

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "tests/common/device_harness.h"
#include "tests/common/half_compare.h"

namespace ct::test {
namespace {

Device& fast_cpu() {
  static std::unique_ptr<Device> d = make_cpu_device(false);
  return *d;
}

// The fast device with 16-bit product operands widened into f32 copies for sgemm (not the
// packing GEMM, whose own order of sums cpu_half_matmul_test.cpp checks, nor, on a CPU with
// AVX512_BF16, oneDNN's bf16 matmul, which sums in its own order).
Device& widening_cpu() {
  static std::unique_ptr<Device> d = [] {
    setenv("CT_CPU_PACKED_GEMM", "0", 1);
    setenv("CT_CPU_BF16_MATMUL", "widened", 1);
    std::unique_ptr<Device> dev = make_cpu_device(false);
    unsetenv("CT_CPU_PACKED_GEMM");
    unsetenv("CT_CPU_BF16_MATMUL");
    return dev;
  }();
  return *d;
}

// v rounded to h and widened back: the values a 16-bit tensor holds.
Vec rounded(const Vec& v, DType h) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = from_h(to_h(v[i], h), h);
  return r;
}

::testing::AssertionResult bitwise(const Vec& got, const Vec& want, const std::string& what) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure()
             << what << "[" << i << "] = " << got[i] << ", f32 on widened inputs: " << want[i];
  return ::testing::AssertionSuccess();
}

const DType kHalves[] = {DType::bf16, DType::f16};

TEST(CpuHalfKernels, BiasBackwardAsWidened) {
  Device& d = fast_cpu();
  const int64_t M = 300, N = 200;  // M N > 2^15: the threaded path; N ends mid-block
  const Vec dbias0 = randn(N, 1);
  for (DType h : kHalves) {
    const Vec dout = rounded(randn(M * N, 2), h);
    Tensor got = upload(d, {N}, dbias0), want = upload(d, {N}, dbias0);
    d.bias_backward(got, up_as(d, {M, N}, dout, h));
    d.bias_backward(want, upload(d, {M, N}, dout));
    EXPECT_TRUE(bitwise(download(d, got), download(d, want), dtype_name(h)));
  }
}

TEST(CpuHalfKernels, ResidualNormsAsWidened) {
  Device& d = fast_cpu();
  const int64_t N = 301, C = 384;  // pieces of 42 rows, the last one short
  const Vec x = randn(N * C, 3), w = randn(C, 4), b = randn(C, 5);
  for (DType h : kHalves) {
    SCOPED_TRACE(dtype_name(h));
    const Vec r = rounded(randn(N * C, 6), h);
    Tensor tx = upload(d, {N, C}, x), tw = upload(d, {C}, w), tb = upload(d, {C}, b);
    Tensor res[2], out[2], mean[2], rstd[2];
    for (int p = 0; p < 2; ++p) {  // 0: 16-bit r and out; 1: f32 on the widened r
      const DType dt = p == 0 ? h : DType::f32;
      res[p] = d.empty({N, C}, DType::f32, MemCategory::kActivations);
      out[p] = d.empty({N, C}, dt, MemCategory::kActivations);
      mean[p] = d.empty({N}, DType::f32, MemCategory::kActivations);
      rstd[p] = d.empty({N}, DType::f32, MemCategory::kActivations);
      d.residual_layernorm_forward(res[p], out[p], mean[p], rstd[p], tx, up_as(d, {N, C}, r, dt),
                                   tw, tb, 1e-5f);
    }
    EXPECT_TRUE(bitwise(download(d, res[0]), download(d, res[1]), "layernorm residual"));
    EXPECT_TRUE(bitwise(download_h(d, out[0]), rounded(download(d, out[1]), h), "layernorm out"));
    EXPECT_TRUE(bitwise(download(d, mean[0]), download(d, mean[1]), "layernorm mean"));
    EXPECT_TRUE(bitwise(download(d, rstd[0]), download(d, rstd[1]), "layernorm rstd"));
    for (int p = 0; p < 2; ++p) {
      const DType dt = p == 0 ? h : DType::f32;
      out[p] = d.empty({N, C}, dt, MemCategory::kActivations);
      d.residual_rmsnorm_forward(res[p], out[p], rstd[p], tx, up_as(d, {N, C}, r, dt), tw, 1e-5f);
    }
    EXPECT_TRUE(bitwise(download(d, res[0]), download(d, res[1]), "rmsnorm residual"));
    EXPECT_TRUE(bitwise(download_h(d, out[0]), rounded(download(d, out[1]), h), "rmsnorm out"));
    EXPECT_TRUE(bitwise(download(d, rstd[0]), download(d, rstd[1]), "rmsnorm rstd"));
    for (int p = 0; p < 2; ++p) {
      out[p] = d.empty({N, C}, p == 0 ? h : DType::f32, MemCategory::kActivations);
      d.rmsnorm_forward(out[p], rstd[p], tx, tw, 1e-5f);
    }
    EXPECT_TRUE(bitwise(download_h(d, out[0]), rounded(download(d, out[1]), h), "rmsnorm"));
  }
}

// layernorm_backward with a 16-bit dout (bf16: each row widened as it is reached), over
// several of the kernel's row chunks and both threads.
TEST(CpuHalfKernels, LayerNormBackwardAsWidened) {
  Device& d = fast_cpu();
  const int64_t N = 301, C = 388;
  const Vec x = randn(N * C, 13), w = randn(C, 14), b = randn(C, 15);
  Tensor tx = upload(d, {N, C}, x), tw = upload(d, {C}, w), tb = upload(d, {C}, b);
  Tensor out = d.empty({N, C}, DType::f32, MemCategory::kActivations);
  Tensor mean = d.empty({N}, DType::f32, MemCategory::kActivations);
  Tensor rstd = d.empty({N}, DType::f32, MemCategory::kActivations);
  d.layernorm_forward(out, mean, rstd, tx, tw, tb, 1e-5f);
  const Vec dx0 = randn(N * C, 16), dw0 = randn(C, 17), db0 = randn(C, 18);
  for (DType h : kHalves) {
    SCOPED_TRACE(dtype_name(h));
    const Vec dout = rounded(randn(N * C, 19), h);
    Vec dx[2], dw[2], db[2];
    for (int p = 0; p < 2; ++p) {  // 0: 16-bit dout; 1: f32 on the widened dout
      Tensor tdx = upload(d, {N, C}, dx0), tdw = upload(d, {C}, dw0), tdb = upload(d, {C}, db0);
      d.layernorm_backward(tdx, tdw, tdb, up_as(d, {N, C}, dout, p == 0 ? h : DType::f32), tx, tw,
                           mean, rstd);
      dx[p] = download(d, tdx), dw[p] = download(d, tdw), db[p] = download(d, tdb);
    }
    EXPECT_TRUE(bitwise(dx[0], dx[1], "dx"));
    EXPECT_TRUE(bitwise(dw[0], dw[1], "dw"));
    EXPECT_TRUE(bitwise(db[0], db[1], "db"));
  }
}

// The three cross-entropy ops on 16-bit logits, in pieces of rows (several rows per piece, and
// one row per piece at GPT-2's width), in place and not.
TEST(CpuHalfKernels, CrossEntropyAsWidened) {
  Device& d = fast_cpu();
  struct Case {
    int64_t N, V, Vp;
  };
  const Case cases[] = {{70, 290, 300}, {9, 19999, 20000}};
  for (DType h : kHalves) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(h)) + " Vp " + std::to_string(c.Vp));
      const Vec logits = rounded(randn(c.N * c.Vp, 12, 3.0f), h);
      Tensor targets =
          upload_i32(d, {c.N}, randint(static_cast<size_t>(c.N), 13, static_cast<int32_t>(c.V)));
      const Shape ls{c.N, c.Vp};
      const float dloss = 1.0f / static_cast<float>(c.N);
      Tensor loss[2], grad[2], fused[2], inplace[2], fused_loss[2];
      for (int p = 0; p < 2; ++p) {
        const DType dt = p == 0 ? h : DType::f32;
        loss[p] = d.empty({c.N}, DType::f32, MemCategory::kActivations);
        fused_loss[p] = d.empty({c.N}, DType::f32, MemCategory::kActivations);
        grad[p] = d.empty(ls, dt, MemCategory::kActivations);
        Tensor tl = up_as(d, ls, logits, dt);
        d.crossentropy_forward(loss[p], tl, targets, c.V);
        d.crossentropy_backward(grad[p], tl, targets, c.V, dloss);
        inplace[p] = up_as(d, ls, logits, dt);
        d.crossentropy_backward(inplace[p], inplace[p], targets, c.V, dloss);
        fused[p] = up_as(d, ls, logits, dt);
        d.crossentropy_forward_backward(fused_loss[p], fused[p], targets, c.V, dloss);
      }
      EXPECT_TRUE(bitwise(download(d, loss[0]), download(d, loss[1]), "losses"));
      EXPECT_TRUE(bitwise(download_h(d, grad[0]), rounded(download(d, grad[1]), h), "dlogits"));
      EXPECT_TRUE(
          bitwise(download_h(d, inplace[0]), rounded(download(d, inplace[1]), h), "in place"));
      EXPECT_TRUE(bitwise(download(d, fused_loss[0]), download(d, fused_loss[1]), "fused losses"));
      EXPECT_TRUE(bitwise(download_h(d, fused[0]), rounded(download(d, fused[1]), h), "fused"));
    }
  }
}

// A weight gradient's product, dW (f32, +=) = a^T b on 16-bit a [K,M] and b [K,N]: one
// threaded OpenBLAS product of the widened values, as the f32 op. (The products that
// split_rows splits over the threads, a b, differ from OpenBLAS's threaded f32 product in the
// last bit of some sums, as they did before; the weight gradients are left unsplit to keep
// theirs.)
TEST(CpuHalfKernels, WeightGradientAsWidened) {
  Device& d = widening_cpu();
  struct Case {
    int64_t M, N, K;
    bool ta;
  };
  const Case cases[] = {{200, 72, 256, true}, {77, 130, 64, true}};
  for (DType h : kHalves) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(h)) + " M " + std::to_string(c.M) + " ta " +
                   std::to_string(c.ta));
      const Vec a = rounded(randn(c.K * c.M, 9), h), b = rounded(randn(c.K * c.N, 10), h);
      const Vec c0 = randn(c.M * c.N, 11);
      const Shape as = c.ta ? Shape{c.K, c.M} : Shape{c.M, c.K};
      Tensor got = upload(d, {c.M, c.N}, c0), want = upload(d, {c.M, c.N}, c0);
      d.matmul(got, up_as(d, as, a, h), up_as(d, {c.K, c.N}, b, h), c.ta, false, 1.0f, 1.0f);
      d.matmul(want, upload(d, as, a), upload(d, {c.K, c.N}, b), c.ta, false, 1.0f, 1.0f);
      EXPECT_TRUE(bitwise(download(d, got), download(d, want), "c"));
    }
  }
}

// Forward, then backward from the 16-bit forward's out (what the model saves), both ways.
TEST(CpuHalfKernels, FlashAttentionAsWidened) {
  struct Case {
    int64_t B, T, C, NH, NKV;
  };
  // several row blocks (32 rows at these T) ending mid-block; grouped-query heads
  const Case cases[] = {{2, 100, 48, 3, 3}, {1, 70, 64, 4, 2}};
  Device& d = fast_cpu();
  for (DType h : kHalves) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(h)) + " T " + std::to_string(c.T) + " NKV " +
                   std::to_string(c.NKV));
      const int64_t W = c.C + 2 * c.NKV * (c.C / c.NH), NH = c.NH, NKV = c.NKV;
      const Vec qkv = rounded(randn(c.B * c.T * W, 7), h);
      const Vec dout = rounded(randn(c.B * c.T * c.C, 8), h);
      Tensor out[2], lse[2], dqkv[2];
      Vec out16;
      for (int p = 0; p < 2; ++p) {
        const DType dt = p == 0 ? h : DType::f32;
        out[p] = d.empty({c.B, c.T, c.C}, dt, MemCategory::kActivations);
        lse[p] = d.empty({c.B, NH, c.T}, DType::f32, MemCategory::kActivations);
        dqkv[p] = d.empty({c.B, c.T, W}, dt, MemCategory::kActivations);
        Tensor tq = up_as(d, {c.B, c.T, W}, qkv, dt);
        d.flash_attention_forward(out[p], lse[p], tq, static_cast<int>(NH), static_cast<int>(NKV));
        if (p == 0) out16 = download_h(d, out[0]);
        d.flash_attention_backward(dqkv[p], up_as(d, {c.B, c.T, c.C}, dout, dt), tq,
                                   up_as(d, {c.B, c.T, c.C}, out16, dt), lse[0],
                                   static_cast<int>(NH), static_cast<int>(NKV));
      }
      EXPECT_TRUE(bitwise(out16, rounded(download(d, out[1]), h), "out"));
      EXPECT_TRUE(bitwise(download(d, lse[0]), download(d, lse[1]), "lse"));
      EXPECT_TRUE(bitwise(download_h(d, dqkv[0]), rounded(download(d, dqkv[1]), h), "dqkv"));
    }
  }
}

}  // namespace
}  // namespace ct::test
