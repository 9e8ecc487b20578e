// GEMM (the project's own, for every target) and the bias gradient.
//
// gemm: c_z = alpha op(a_z) op(b_z) + beta c_z (+ bias, rounded to c's type first where c is
// 16-bit; then the GELU epilogues of kernels.h's GemmArgs, gelu_math.h), batched by blockIdx.z with
// element strides (0 = one matrix for the whole batch). A block computes a kBM x kBN tile of c from
// kBK-deep slices of a and b staged in shared memory as fp32; each thread owns a kMi x kNj set of
// outputs (on GPUs 256 threads of 4 x 4 at stride 16, on the SIMT runtime 64 threads of 8 x 8
// adjacent ones) and accumulates over k in order 0 .. K-1, one rounding per product and per add
// (the build has FMA contraction off), so every output's bits depend on the inputs only -- not on
// the tile shape, the thread layout, the warp size or the target.
//
// gemm_tile_kernel: the same GEMM for 16-bit a and b through the matrix tile of
// backends/gpu/kernels/mma.h (tensor cores on sm_80+, MFMA on gfx90a, the scalar form elsewhere).
// Four warps a block, each owning a 32 x 32 part of the block's 64 x 64 tile of c. It runs what
// the 128 x 128 tensor-core kernel of gemm_tc.cu does not take (gemm() asks gemm_tc_refusal
// first): 16-bit operands whose rows are not 16-byte aligned.
#include "backends/gpu/kernels/common.h"
#include "backends/gpu/kernels/gelu_math.h"
#include "backends/gpu/kernels/mma.h"

namespace ct::gpu {
namespace {

constexpr int kThreads = 256;  // the bias gradient's blocks
constexpr int kBM = 64, kBN = 64;
constexpr std::int64_t kChunk = 64;  // rows per partial of the bias gradient

// gemm_kernel's thread layout. Thread t = ty * kTX + tx owns kMi x kNj outputs, rows
// ty * kRowA + i * kRowB and columns tx * kColA + j * kColB of the block's tile.
#if defined(CT_GPU_SIMT)
// The SIMT runtime: every thread is a fiber, and every __syncthreads a round of fiber switches;
// nothing vectorises across threads. So few threads, each with a large micro-tile of adjacent
// columns (the inner product vectorises within the thread), and a deeper k slice per barrier.
constexpr int kBK = 64, kMi = 8, kNj = 8;
constexpr int kTX = kBN / kNj, kTY = kBM / kMi;
constexpr int kRowA = kMi, kRowB = 1, kColA = kNj, kColB = 1;
#else
// GPUs: 256 threads of 4 x 4 outputs at stride 16 (conflict-free shared memory reads).
constexpr int kBK = 32, kMi = 4, kNj = 4;
constexpr int kTX = kBN / kNj, kTY = kBM / kMi;
constexpr int kRowA = 1, kRowB = kTY, kColA = 1, kColB = kTX;
#endif
constexpr int kGemmThreads = kTX * kTY;
static_assert(kBK * kBM % kGemmThreads == 0 && kBK * kBN % kGemmThreads == 0,
              "gemm_kernel: the staging loops need whole rounds");

// c (batch, M, N) of element Cel; a (M, K) or (K, M) with TA, b (K, N) or (N, K) with TB, both
// of element AB; bias (N) f32 or nullptr, added as Cel rounds it. Block (x, y, z) computes
// rows m_base + kBM y .., columns kBN x .. of batch element z_base + z.
template <int WARP, typename AB, typename Cel, bool TA, bool TB>
__global__ void CT_LAUNCH_BOUNDS(kGemmThreads)
    gemm_kernel(void* c, const void* a, const void* b, const float* bias, void* gelu_out,
                const void* gelu_pre, std::int64_t M, std::int64_t N, std::int64_t K,
                std::int64_t stride_a, std::int64_t stride_b, std::int64_t stride_c, float alpha,
                float beta, std::int64_t m_base, std::int64_t z_base) {
  CT_CHECK_LAUNCH_BOUNDS(kGemmThreads);
  CT_SHARED(float, as, kBK* kBM);  // as[k * kBM + m]
  CT_SHARED(float, bs, kBK* kBN);  // bs[k * kBN + n]
  const int t = threadIdx.x, tx = t % kTX, ty = t / kTX;
  const int row0 = ty * kRowA, col0 = tx * kColA;
  const std::int64_t z = z_base + blockIdx.z;
  const std::int64_t m0 = m_base + static_cast<std::int64_t>(blockIdx.y) * kBM;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * kBN;
  const std::int64_t a_off = z * stride_a, b_off = z * stride_b, c_off = z * stride_c;

  float acc[kMi][kNj];
  for (int i = 0; i < kMi; ++i)
    for (int j = 0; j < kNj; ++j) acc[i][j] = 0.0f;

  for (std::int64_t k0 = 0; k0 < K; k0 += kBK) {
    // Stage a[m0 .. +kBM, k0 .. +kBK] and b[k0 .. +kBK, n0 .. +kBN]; consecutive threads read
    // consecutive addresses of the stored layout. Outside the matrices: zeros. A slice wholly
    // inside its matrix (the same branch for every thread) skips the per-element bounds checks.
    if (m0 + kBM <= M && k0 + kBK <= K) {
      const std::int64_t base = a_off + (TA ? k0 * M + m0 : m0 * K + k0);
      for (int r = 0; r < kBK * kBM / kGemmThreads; ++r) {
        const int idx = t + r * kGemmThreads;
        const int mm = TA ? idx % kBM : idx / kBK;
        const int kk = TA ? idx / kBM : idx % kBK;
        as[kk * kBM + mm] = AB::load(a, base + (TA ? kk * M + mm : mm * K + kk));
      }
    } else {
      for (int r = 0; r < kBK * kBM / kGemmThreads; ++r) {
        const int idx = t + r * kGemmThreads;
        const int mm = TA ? idx % kBM : idx / kBK;
        const int kk = TA ? idx / kBM : idx % kBK;
        const std::int64_t m = m0 + mm, k = k0 + kk;
        float v = 0.0f;
        if (m < M && k < K) v = AB::load(a, a_off + (TA ? k * M + m : m * K + k));
        as[kk * kBM + mm] = v;
      }
    }
    if (n0 + kBN <= N && k0 + kBK <= K) {
      const std::int64_t base = b_off + (TB ? n0 * K + k0 : k0 * N + n0);
      for (int r = 0; r < kBK * kBN / kGemmThreads; ++r) {
        const int idx = t + r * kGemmThreads;
        const int nn = TB ? idx / kBK : idx % kBN;
        const int kk = TB ? idx % kBK : idx / kBN;
        bs[kk * kBN + nn] = AB::load(b, base + (TB ? nn * K + kk : kk * N + nn));
      }
    } else {
      for (int r = 0; r < kBK * kBN / kGemmThreads; ++r) {
        const int idx = t + r * kGemmThreads;
        const int nn = TB ? idx / kBK : idx % kBN;
        const int kk = TB ? idx % kBK : idx / kBN;
        const std::int64_t n = n0 + nn, k = k0 + kk;
        float v = 0.0f;
        if (n < N && k < K) v = AB::load(b, b_off + (TB ? n * K + k : k * N + n));
        bs[kk * kBN + nn] = v;
      }
    }
    __syncthreads();
    const int kend = K - k0 < kBK ? static_cast<int>(K - k0) : kBK;
    for (int kk = 0; kk < kend; ++kk) {
      float av[kMi], bv[kNj];
      for (int i = 0; i < kMi; ++i) av[i] = as[kk * kBM + row0 + i * kRowB];
      for (int j = 0; j < kNj; ++j) bv[j] = bs[kk * kBN + col0 + j * kColB];
      for (int i = 0; i < kMi; ++i)
        for (int j = 0; j < kNj; ++j) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }

  for (int i = 0; i < kMi; ++i) {
    const std::int64_t m = m0 + row0 + i * kRowB;
    if (m >= M) continue;
    for (int j = 0; j < kNj; ++j) {
      const std::int64_t n = n0 + col0 + j * kColB;
      if (n >= N) continue;
      const std::int64_t at = c_off + m * N + n;
      float r = alpha * acc[i][j];
      if (beta != 0.0f) r += beta * Cel::load(c, at);
      if (bias) r += Cel::rounded(bias[n]);
      Cel::store(c, at, r);
    }
  }
  if (!gelu_out && !gelu_pre) return;
  for (int i = 0; i < kMi; ++i) {
    const std::int64_t m = m0 + row0 + i * kRowB;
    if (m >= M) continue;
    for (int j = 0; j < kNj; ++j) {
      const std::int64_t n = n0 + col0 + j * kColB;
      if (n < N) gemm_gelu_pass<Cel>(c, c_off + m * N + n, gelu_out, gelu_pre);
    }
  }
}

// As gemm_kernel, for AB = F16 or BF16 through the matrix tile. Block (x, y, z) computes rows
// m_base + kBM y .., columns kBN x .. of batch element z_base + z; warp w owns rows
// 32 (w / 2) .., columns 32 (w % 2) .. of that tile, as (32 / TM) x (32 / TN) tiles.
template <int WARP, typename AB, typename Cel, bool TA, bool TB>
__global__ void CT_LAUNCH_BOUNDS(4 * WARP)
    gemm_tile_kernel(void* c, const void* a, const void* b, const float* bias, void* gelu_out,
                     const void* gelu_pre, std::int64_t M, std::int64_t N, std::int64_t K,
                     std::int64_t stride_a, std::int64_t stride_b, std::int64_t stride_c,
                     float alpha, float beta, std::int64_t m_base, std::int64_t z_base) {
  CT_CHECK_LAUNCH_BOUNDS(4 * WARP);
  using L = MmaLayout<WARP>;
  constexpr int kThreadsT = 4 * WARP, kTK = 16, kPad = 8;  // kTK: a multiple of every L::TK
  constexpr int kTilesM = 32 / L::TM, kTilesN = 32 / L::TN;
  constexpr int kLdA = kTK + kPad, kLdB = kBN + kPad;
  CT_SHARED(std::uint16_t, as, kBM * kLdA);  // as[m * kLdA + k]
  CT_SHARED(std::uint16_t, bs, kTK * kLdB);  // bs[k * kLdB + n]
  const int t = threadIdx.x, lane = t % WARP, warp = t / WARP;
  const int wm = 32 * (warp / 2), wn = 32 * (warp % 2);
  const std::int64_t z = z_base + blockIdx.z;
  const std::int64_t m0 = m_base + static_cast<std::int64_t>(blockIdx.y) * kBM;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * kBN;
  const auto* ga = static_cast<const std::uint16_t*>(a) + z * stride_a;
  const auto* gb = static_cast<const std::uint16_t*>(b) + z * stride_b;

  float acc[kTilesM][kTilesN][L::NC];
  for (int i = 0; i < kTilesM; ++i)
    for (int j = 0; j < kTilesN; ++j)
      for (int e = 0; e < L::NC; ++e) acc[i][j][e] = 0.0f;

  for (std::int64_t k0 = 0; k0 < K; k0 += kTK) {
    // Stage a[m0 .. +kBM, k0 .. +kTK] and b[k0 .. +kTK, n0 .. +kBN] as stored bits; consecutive
    // threads read consecutive addresses of the stored layout. Outside the matrices: zeros.
    for (int idx = t; idx < kBM * kTK; idx += kThreadsT) {
      const int mm = TA ? idx % kBM : idx / kTK;
      const int kk = TA ? idx / kBM : idx % kTK;
      const std::int64_t m = m0 + mm, k = k0 + kk;
      std::uint16_t v = 0;
      if (m < M && k < K) v = ga[TA ? k * M + m : m * K + k];
      as[mm * kLdA + kk] = v;
    }
    for (int idx = t; idx < kTK * kBN; idx += kThreadsT) {
      const int nn = TB ? idx / kTK : idx % kBN;
      const int kk = TB ? idx % kTK : idx / kBN;
      const std::int64_t n = n0 + nn, k = k0 + kk;
      std::uint16_t v = 0;
      if (n < N && k < K) v = gb[TB ? n * K + k : k * N + n];
      bs[kk * kLdB + nn] = v;
    }
    __syncthreads();
    for (int kk = 0; kk < kTK; kk += L::TK) {
      std::uint16_t fa[kTilesM][L::NA], fb[kTilesN][L::NB];
      for (int i = 0; i < kTilesM; ++i)
        for (int s = 0; s < L::NA; ++s)
          fa[i][s] = as[(wm + i * L::TM + L::a_row(lane, s)) * kLdA + kk + L::a_k(lane, s)];
      for (int j = 0; j < kTilesN; ++j)
        for (int s = 0; s < L::NB; ++s)
          fb[j][s] = bs[(kk + L::b_k(lane, s)) * kLdB + wn + j * L::TN + L::b_col(lane, s)];
      for (int i = 0; i < kTilesM; ++i)
        for (int j = 0; j < kTilesN; ++j) mma<WARP, AB>(acc[i][j], fa[i], fb[j]);
    }
    __syncthreads();
  }

  const std::int64_t c_off = z * stride_c;
  for (int i = 0; i < kTilesM; ++i)
    for (int j = 0; j < kTilesN; ++j)
      for (int e = 0; e < L::NC; ++e) {
        const std::int64_t m = m0 + wm + i * L::TM + L::c_row(lane, e);
        const std::int64_t n = n0 + wn + j * L::TN + L::c_col(lane, e);
        if (m >= M || n >= N) continue;
        const std::int64_t at = c_off + m * N + n;
        float r = alpha * acc[i][j][e];
        if (beta != 0.0f) r += beta * Cel::load(c, at);
        if (bias) r += Cel::rounded(bias[n]);
        Cel::store(c, at, r);
      }
  if (!gelu_out && !gelu_pre) return;
  for (int i = 0; i < kTilesM; ++i)
    for (int j = 0; j < kTilesN; ++j)
      for (int e = 0; e < L::NC; ++e) {
        const std::int64_t m = m0 + wm + i * L::TM + L::c_row(lane, e);
        const std::int64_t n = n0 + wn + j * L::TN + L::c_col(lane, e);
        if (m < M && n < N) gemm_gelu_pass<Cel>(c, c_off + m * N + n, gelu_out, gelu_pre);
      }
}

// partial (chunks, N): for chunk k = blockIdx.y, the column sums of its kChunk rows of dout
// (M, N) of element D, rows in order. Thread n of the grid's x handles column n.
template <int WARP, typename D>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    bias_partial_kernel(float* partial, const void* dout, std::int64_t M, std::int64_t N) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (n >= N) return;
  const std::int64_t k = blockIdx.y;
  const std::int64_t end = (k + 1) * kChunk < M ? (k + 1) * kChunk : M;
  float s = 0.0f;
  for (std::int64_t m = k * kChunk; m < end; ++m) s += D::load(dout, m * N + n);
  partial[k * N + n] = s;
}

// dbias (N) += the partials (chunks, N), each column's chunks summed by common.h's column_sum.
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kColumnSumThreads)
    bias_sum_kernel(float* dbias, const float* partial, std::int64_t chunks, std::int64_t N) {
  CT_CHECK_LAUNCH_BOUNDS(kColumnSumThreads);
  CT_SHARED(float, smem, kColumnSumThreads);
  const float s = column_sum(partial, N, chunks, N, smem);
  const std::int64_t n = column_sum_col();
  if (threadIdx.x < kColumnSumCols && n < N) dbias[n] += s;
}

template <int W, typename AB, typename Cel, bool TA, bool TB>
void gemm_launch(const Ctx& cx, const GemmArgs& g) {
  constexpr bool kTile = !std::is_same_v<AB, F32>;
  const bool tile = kTile && cx.matrix_tiles;
  const unsigned gx = static_cast<unsigned>((g.N + kBN - 1) / kBN);
  const std::int64_t row_tiles = (g.M + kBM - 1) / kBM;
  // Grid y and z are limited to 65535 on every target: row tiles and batches go in slices.
  for (std::int64_t z0 = 0; z0 < g.batch; z0 += 65535) {
    const std::int64_t zs = g.batch - z0 < 65535 ? g.batch - z0 : 65535;
    for (std::int64_t y0 = 0; y0 < row_tiles; y0 += 65535) {
      const std::int64_t ys = row_tiles - y0 < 65535 ? row_tiles - y0 : 65535;
      const dim3 grid(gx, static_cast<unsigned>(ys), static_cast<unsigned>(zs));
      if constexpr (kTile) {
        if (tile) {
          launch<W>(CT_KERNEL(gemm_tile_kernel<W, AB, Cel, TA, TB>), grid, dim3(4 * W), 0,
                    stream_of(cx), g.c, g.a, g.b, g.bias, g.gelu_out, g.gelu_pre, g.M, g.N, g.K,
                    g.stride_a, g.stride_b, g.stride_c, g.alpha, g.beta, y0 * kBM, z0);
          continue;
        }
      }
      launch<W>(CT_KERNEL(gemm_kernel<W, AB, Cel, TA, TB>), grid, dim3(kGemmThreads), 0,
                stream_of(cx), g.c, g.a, g.b, g.bias, g.gelu_out, g.gelu_pre, g.M, g.N, g.K,
                g.stride_a, g.stride_b, g.stride_c, g.alpha, g.beta, y0 * kBM, z0);
    }
  }
}

}  // namespace

void gemm(const Ctx& cx, const GemmArgs& g) {
  if (g.batch <= 0 || g.M <= 0 || g.N <= 0) return;
  if (g.c_elem != Elem::kF32 && g.c_elem != g.ab_elem)
    throw std::invalid_argument("gemm: c must be f32 or of a's and b's element type");
  if (!gemm_tc_refusal(cx, g)) return gemm_tc(cx, g);
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_elem(g.ab_elem, [&](auto abt) {
      using AB = decltype(abt);
      auto by_c = [&](auto ct) {
        using Cel = decltype(ct);
        if (!g.trans_a && !g.trans_b) gemm_launch<W, AB, Cel, false, false>(cx, g);
        if (!g.trans_a && g.trans_b) gemm_launch<W, AB, Cel, false, true>(cx, g);
        if (g.trans_a && !g.trans_b) gemm_launch<W, AB, Cel, true, false>(cx, g);
        if (g.trans_a && g.trans_b) gemm_launch<W, AB, Cel, true, true>(cx, g);
      };
      if (g.c_elem == Elem::kF32)
        by_c(F32{});
      else
        by_c(AB{});
    });
  });
}

std::string gemm_path(const Ctx& cx, const GemmArgs& g) {
  const char* no = gemm_tc_refusal(cx, g);
  if (!no) {
    const int splits = gemm_tc_splits(cx, g);
    return splits > 1 ? "gemm_tc_kernel (gemm_tc.cu, 128x128 tiles, split-k " +
                            std::to_string(splits) + ")"
                      : "gemm_tc_kernel (gemm_tc.cu, 128x128 tiles)";
  }
  if (g.ab_elem != Elem::kF32 && cx.matrix_tiles)
    return std::string("gemm_tile_kernel (matmul.cu, 64x64 tiles): ") + no;
  return std::string("gemm_kernel (matmul.cu, scalar): ") + no;
}

std::size_t bias_backward_workspace(std::int64_t M, std::int64_t N) {
  return static_cast<std::size_t>((M + kChunk - 1) / kChunk * N) * sizeof(float);
}

void bias_backward(const Ctx& cx, float* dbias, const void* dout, Elem dout_elem, std::int64_t M,
                   std::int64_t N, void* workspace) {
  if (M <= 0 || N <= 0) return;
  const std::int64_t chunks = (M + kChunk - 1) / kChunk;
  const std::int64_t esz = static_cast<std::int64_t>(elem_size(dout_elem));
  auto* partial = static_cast<float*>(workspace);
  const unsigned col_blocks = static_cast<unsigned>((N + kThreads - 1) / kThreads);
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_elem(dout_elem, [&](auto el) {
      using D = decltype(el);
      for (std::int64_t k = 0; k < chunks; k += 65535) {
        const std::int64_t ks = chunks - k < 65535 ? chunks - k : 65535;
        const std::int64_t row = k * kChunk;
        launch<W>(CT_KERNEL(bias_partial_kernel<W, D>), dim3(col_blocks, static_cast<unsigned>(ks)),
                  dim3(kThreads), 0, stream_of(cx), partial + k * N,
                  static_cast<const char*>(dout) + row * N * esz, M - row, N);
      }
    });
    launch<W>(CT_KERNEL(bias_sum_kernel<W>), dim3(column_sum_blocks(N)), dim3(kColumnSumThreads), 0,
              stream_of(cx), dbias, partial, chunks, N);
  });
}

}  // namespace ct::gpu
