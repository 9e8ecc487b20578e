// The own GEMM's matrix-tile paths (backends/gpu/kernels/mma.h: gemm_tile_kernel of matmul.cu and
// gemm_tc_kernel of gemm_tc.cu) on the SIMT runtime, where each tile is one call of the runtime's
// matrix collective (or ldmatrix's): at warp 32 (mma.sync m16n8k16 fragments) and 64 (MFMA
// 32x32x8 fragments) they must give the scalar GEMM kernel's bits exactly -- every layout, odd
// shapes, batches, alpha/beta/bias, f32 and 16-bit c -- and both must agree with a double
// reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/gpu/kernels.h"
#include "backends/gpu/numeric.h"
#include "backends/gpu/portability.h"

namespace {

using ct::gpu::Elem;

std::uint16_t to16(Elem e, float v) {
  return e == Elem::kF16 ? ct::gpu::f32_to_f16(v) : ct::gpu::f32_to_bf16(v);
}
float from16(Elem e, std::uint16_t v) {
  return e == Elem::kF16 ? ct::gpu::f16_to_f32(v) : ct::gpu::bf16_to_f32(v);
}

struct Case {
  std::int64_t batch, M, N, K;
  bool ta, tb;
  float alpha, beta;
  bool bias;
  bool c16;
};

std::string name(const Case& c, Elem e, int warp) {
  return std::string(e == Elem::kF16 ? "f16" : "bf16") + " warp " + std::to_string(warp) +
         " batch " + std::to_string(c.batch) + " M " + std::to_string(c.M) + " N " +
         std::to_string(c.N) + " K " + std::to_string(c.K) + (c.ta ? " ta" : "") +
         (c.tb ? " tb" : "") + " alpha " + std::to_string(c.alpha) + " beta " +
         std::to_string(c.beta) + (c.bias ? " bias" : "") + (c.c16 ? " c16" : "");
}

// Runs c through the scalar kernel and through the matrix-tile path (gemm() with matrix tiles:
// gemm_tc_kernel where gemm_tc_refusal takes the call, else gemm_tile_kernel), asserts equal bits
// and both against a double reference. `path` is the start gemm_path must name for the tile run.
void run_case(ct::simt::Runtime& rt, std::mt19937& rng, const Case& c, Elem e, int warp,
              const std::string& path) {
  std::uniform_real_distribution<float> u(-1, 1);
  const std::int64_t sa = c.M * c.K, sb = c.K * c.N, sc = c.M * c.N;
  std::vector<std::uint16_t> a(c.batch * sa), b(c.batch * sb);
  for (auto& v : a) v = to16(e, u(rng));
  for (auto& v : b) v = to16(e, u(rng));
  std::vector<float> bias(c.N), c0(c.batch * sc);
  for (auto& v : bias) v = u(rng);
  for (auto& v : c0) v = u(rng);
  const Elem ce = c.c16 ? e : Elem::kF32;
  const std::size_t cbytes = c0.size() * ct::gpu::elem_size(ce);
  std::vector<unsigned char> init(cbytes);
  for (std::size_t i = 0; i < c0.size(); ++i) {
    if (c.c16) {
      const std::uint16_t h = to16(e, c0[i]);
      std::memcpy(&init[2 * i], &h, 2);
      c0[i] = from16(e, h);
    } else {
      std::memcpy(&init[4 * i], &c0[i], 4);
    }
  }
  std::vector<unsigned char> scalar = init, tiled = init;
  ct::gpu::GemmArgs g;
  g.a = a.data(), g.b = b.data(), g.bias = c.bias ? bias.data() : nullptr;
  g.ab_elem = e, g.c_elem = ce;
  g.batch = c.batch, g.M = c.M, g.N = c.N, g.K = c.K;
  g.stride_a = sa, g.stride_b = sb, g.stride_c = sc;
  g.trans_a = c.ta, g.trans_b = c.tb, g.alpha = c.alpha, g.beta = c.beta;
  ct::gpu::Ctx cx;
  cx.warp = warp, cx.stream = &rt;
  g.c = scalar.data();
  ct::gpu::gemm(cx, g);
  cx.matrix_tiles = true;
  g.c = tiled.data();
  const std::string what = name(c, e, warp);
  ASSERT_EQ(ct::gpu::gemm_path(cx, g).rfind(path, 0), 0u)
      << what << ": " << ct::gpu::gemm_path(cx, g);
  ct::gpu::gemm(cx, g);
  ASSERT_EQ(0, std::memcmp(scalar.data(), tiled.data(), cbytes)) << what;

  // And both are the product: a double reference within fp32-accumulation rounding (plus one
  // 16-bit rounding of c).
  for (std::int64_t z = 0; z < c.batch; ++z)
    for (std::int64_t m = 0; m < c.M; ++m)
      for (std::int64_t n = 0; n < c.N; ++n) {
        double ref = 0, mag = 0;
        for (std::int64_t k = 0; k < c.K; ++k) {
          const float av = from16(e, a[z * sa + (c.ta ? k * c.M + m : m * c.K + k)]);
          const float bv = from16(e, b[z * sb + (c.tb ? n * c.K + k : k * c.N + n)]);
          ref += static_cast<double>(av) * bv;
          mag += std::fabs(static_cast<double>(av) * bv);
        }
        const std::int64_t at = z * sc + m * c.N + n;
        // a 16-bit c adds the bias rounded to its type (core/device.h's matmul contract)
        const float bn = c.c16 ? from16(e, to16(e, bias[n])) : bias[n];
        ref = c.alpha * ref + c.beta * c0[at] + (c.bias ? bn : 0.0f);
        float got;
        if (c.c16) {
          std::uint16_t h;
          std::memcpy(&h, &tiled[2 * at], 2);
          got = from16(e, h);
        } else {
          std::memcpy(&got, &tiled[4 * at], 4);
        }
        const double tol = (c.c16 ? (e == Elem::kF16 ? 1e-3 : 8e-3) * std::fabs(ref) : 0) +
                           1e-6 * (std::fabs(c.alpha) * mag + 2) + 1e-6;
        ASSERT_NEAR(got, ref, tol) << what << " at " << z << "," << m << "," << n;
      }
}

// Shapes whose rows are not all 16-byte aligned: the 64 x 64 tile kernel (gemm_tile_kernel).
TEST(SimtMatrixTile, GemmThroughTheTileEqualsTheScalarKernelBitForBit) {
  ct::simt::Runtime rt(2);
  std::mt19937 rng(5);
  const Case cases[] = {
      {1, 1, 1, 1, false, false, 1, 0, false, false},
      {1, 17, 9, 16, false, false, 1, 0, false, false},
      {1, 64, 63, 32, false, false, 1, 0, true, false},
      {1, 70, 33, 19, true, false, 0.5f, 1, false, false},
      {1, 65, 130, 47, true, true, 1, 0, true, true},
      {2, 37, 50, 29, false, true, 1, 0.25f, false, false},
      {3, 9, 96, 100, true, false, 2, 0, true, true},
  };
  for (Elem e : {Elem::kF16, Elem::kBF16})
    for (const Case& c : cases)
      for (int warp : {32, 64}) {
        run_case(rt, rng, c, e, warp, "gemm_tile_kernel");
        if (HasFatalFailure()) return;
      }
}

// Aligned rows: the 128 x 128 tensor-core kernel (gemm_tc_kernel), whose fragments come by
// ldmatrix (warp 32) or 8-byte reads (warp 64) and whose slices are staged in a ring (4 stages at
// warp 32, 2 at 64). Every layout; M, N not multiples of the tile, K of the 32-deep slice; one
// slice, two, three, and more than the stages (5 to 9: each stage reused); more block rows than a
// group (kGroupM = 8); batches; alpha, beta, bias; f32 and 16-bit c.
TEST(SimtMatrixTile, TensorCoreGemmEqualsTheScalarKernelBitForBit) {
  ct::simt::Runtime rt(2);
  std::mt19937 rng(6);
  const Case cases[] = {
      {1, 8, 8, 8, false, false, 1, 0, false, false},
      {1, 24, 16, 0, false, true, 1, 0.5f, true, false},  // K = 0: beta c + bias
      {1, 24, 40, 72, false, true, 1, 0, true, false},
      {1, 136, 16, 40, true, false, 0.5f, 1, false, false},
      {1, 16, 136, 16, true, true, 1, 0, true, true},
      {2, 40, 24, 48, false, false, 1, 0.25f, false, true},
      {1, 1160, 8, 8, false, true, 1, 0, true, false},
      {3, 8, 48, 96, true, false, 2, 0, true, true},
      // More slices than stages (4 at warp 32, 2 at 64): every stage reused, a ragged last slice.
      {1, 40, 72, 200, false, false, 1, 0, true, false},
      {1, 24, 136, 136, false, true, 1, 0.5f, false, true},
      {1, 136, 24, 168, true, false, 1, 0, true, false},
      {2, 24, 40, 264, true, true, 0.5f, 0.25f, true, true},
  };
  for (Elem e : {Elem::kF16, Elem::kBF16})
    for (const Case& c : cases)
      for (int warp : {32, 64}) {
        run_case(rt, rng, c, e, warp, "gemm_tc_kernel");
        if (HasFatalFailure()) return;
      }
}

// Split-k (gemm_tc.cu): with Ctx::splitk = S and scratch memory, a batch-1 product is S k ranges
// of whole 32-deep slices (the last one shorter), each summed in order from 0 into an f32 partial
// product, the partials added in order (p0 + p1 + ...), then alpha, beta c, the bias, as the
// unsplit kernel's epilogue. Bit for bit against that computed here, at warp 32 and 64: every
// layout, ranges of one slice and of several, a ragged last slice, several block tiles, even N
// (the partials stored in pairs at warp 32) and odd, f32 and 16-bit c; and the split count
// gemm_tc_splits reports. Automatic (Ctx::splitk 0) on an H100's 132 multiprocessors: gpt2's weight
// gradients split, its forward products of short k do not.
TEST(SimtMatrixTile, SplitKAddsTheRangesPartialProductsInOrder) {
  ct::simt::Runtime rt(2);
  std::mt19937 rng(7);
  std::vector<float> scratch;
  auto provide = [](void* owner, std::size_t bytes) -> void* {
    auto& v = *static_cast<std::vector<float>*>(owner);
    v.assign(bytes / sizeof(float), NAN);  // what a range leaves unwritten shows
    return v.data();
  };
  struct SplitCase {
    Case c;
    int splits, want;  // Ctx::splitk, the ranges it gives
  };
  const SplitCase cases[] = {
      {{1, 40, 24, 72, false, false, 1, 0, false, false}, 3, 3},        // 1+1+1 slices, ragged
      {{1, 24, 40, 200, false, true, 0.5f, 0.25f, true, false}, 3, 3},  // 3+3+1
      {{1, 136, 16, 96, true, false, 1, 1, true, true}, 2, 2},          // 2+1
      {{1, 16, 136, 104, true, true, -1.5f, 0.5f, false, true}, 4, 4},  // 1+1+1+1
      {{1, 136, 144, 264, false, true, 1, 1, true, false}, 5, 5},       // 2+2+2+2+1
      {{1, 8, 8, 40, false, false, 1, 0, false, false}, 4, 2},          // 2 slices: 2 ranges
      {{1, 24, 9, 72, false, true, 1, 0.5f, true, false}, 3, 3},  // odd N (b^T's rows aligned)
  };
  for (Elem e : {Elem::kF16, Elem::kBF16})
    for (const SplitCase& sc : cases)
      for (int warp : {32, 64}) {
        const Case& c = sc.c;
        const std::string what = name(c, e, warp) + " split-k " + std::to_string(sc.splits);
        std::uniform_real_distribution<float> u(-1, 1);
        std::vector<std::uint16_t> a(c.M * c.K), b(c.K * c.N);
        for (auto& v : a) v = to16(e, u(rng));
        for (auto& v : b) v = to16(e, u(rng));
        std::vector<float> bias(c.N), c0(c.M * c.N);
        for (auto& v : bias) v = u(rng);
        for (auto& v : c0) v = c.c16 ? from16(e, to16(e, u(rng))) : u(rng);
        std::vector<unsigned char> out(c0.size() * (c.c16 ? 2 : 4));
        for (std::size_t i = 0; i < c0.size(); ++i) {
          if (c.c16) {
            const std::uint16_t h = to16(e, c0[i]);
            std::memcpy(&out[2 * i], &h, 2);
          } else {
            std::memcpy(&out[4 * i], &c0[i], 4);
          }
        }
        ct::gpu::GemmArgs g;
        g.c = out.data(), g.a = a.data(), g.b = b.data(), g.bias = c.bias ? bias.data() : nullptr;
        g.ab_elem = e, g.c_elem = c.c16 ? e : Elem::kF32;
        g.M = c.M, g.N = c.N, g.K = c.K, g.stride_a = c.M * c.K, g.stride_b = c.K * c.N;
        g.stride_c = c.M * c.N, g.trans_a = c.ta, g.trans_b = c.tb;
        g.alpha = c.alpha, g.beta = c.beta;
        g.scratch = provide, g.scratch_owner = &scratch;
        ct::gpu::Ctx cx;
        cx.warp = warp, cx.stream = &rt, cx.matrix_tiles = true, cx.splitk = sc.splits;
        ASSERT_EQ(ct::gpu::gemm_tc_splits(cx, g), sc.want) << what;
        ASSERT_EQ(ct::gpu::gemm_path(cx, g), "gemm_tc_kernel (gemm_tc.cu, 128x128 tiles, split-k " +
                                                 std::to_string(sc.want) + ")")
            << what;
        ct::gpu::gemm(cx, g);
        const std::int64_t slices = (c.K + 31) / 32, per = (slices + sc.want - 1) / sc.want;
        for (std::int64_t m = 0; m < c.M; ++m)
          for (std::int64_t n = 0; n < c.N; ++n) {
            float r = 0;
            for (std::int64_t k0 = 0; k0 < c.K; k0 += per * 32) {
              float p = 0;
              for (std::int64_t k = k0; k < std::min(c.K, k0 + per * 32); ++k)
                p += from16(e, a[c.ta ? k * c.M + m : m * c.K + k]) *
                     from16(e, b[c.tb ? n * c.K + k : k * c.N + n]);
              r = k0 == 0 ? p : r + p;
            }
            const std::int64_t at = m * c.N + n;
            float want = c.alpha * r;
            if (c.beta != 0) want += c.beta * c0[at];
            if (c.bias) want += c.c16 ? from16(e, to16(e, bias[n])) : bias[n];
            if (c.c16) {
              std::uint16_t h;
              std::memcpy(&h, &out[2 * at], 2);
              ASSERT_EQ(h, to16(e, want)) << what << " at " << m << "," << n;
            } else {
              float got;
              std::memcpy(&got, &out[4 * at], 4);
              ASSERT_EQ(ct::gpu::f32_bits(got), ct::gpu::f32_bits(want))
                  << what << " at " << m << "," << n << ": " << got << " vs " << want;
            }
          }
      }

  // Automatic: the cost model's choice for 264 blocks at once (132 multiprocessors), ranges of
  // >= 8 slices, at most 16 (the values follow from split_k's formula, worked by hand for the
  // first: 36 tiles x 7 = 252 blocks, one wave of 37-slice ranges).
  ct::gpu::Ctx h100;
  h100.multiprocessors = 132, h100.matrix_tiles = true;
  auto splits_of = [&](std::int64_t M, std::int64_t N, std::int64_t K) {
    ct::gpu::GemmArgs g;
    g.ab_elem = g.c_elem = Elem::kBF16;
    g.M = M, g.N = N, g.K = K;
    g.scratch = provide, g.scratch_owner = &scratch;
    return ct::gpu::gemm_tc_splits(h100, g);
  };
  EXPECT_EQ(splits_of(768, 768, 8192), 7);   // attn proj dW: 36 tiles
  EXPECT_EQ(splits_of(768, 2304, 8192), 2);  // qkv dW: 108 tiles
  EXPECT_EQ(splits_of(768, 3072, 8192), 5);  // fc dW: 144 tiles
  EXPECT_EQ(splits_of(8192, 768, 768), 1);   // attn proj forward: 384 tiles, short k
  EXPECT_EQ(splits_of(8192, 2304, 768), 1);  // qkv forward
  EXPECT_EQ(splits_of(768, 768, 1024), 4);   // 32 slices: at most 4 ranges of 8
  EXPECT_EQ(splits_of(128, 128, 200), 1);    // 7 slices: no range of 8 to spare
}

}  // namespace
