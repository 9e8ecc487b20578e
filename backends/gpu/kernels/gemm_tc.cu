// gemm_tc_kernel: the GEMM of matmul.cu (kernels.h GemmArgs: c = alpha op(a) op(b) + beta c
// (+ bias), both transposes, strided batch, c f32 or of a's type) for 16-bit a and b on the
// matrix tile of backends/gpu/kernels/mma.h, in block tiles sized for a GPU.
//
// A block is 256 threads and owns a kBM x kBN (128 x 128) tile of c; it walks k in slices of kBK
// (32) staged in shared memory, two slices in flight (double buffering): while the warps multiply
// slice s, the copies of slice s + 1 are under way (cp.async on sm_80+, plain copies elsewhere,
// matrix_ops.h). Each warp owns a part of the block's tile as a grid of matrix tiles:
//   warp 32 (mma.sync m16n8k16): 8 warps as 2 x 4, each 64 x 32 = 4 x 4 tiles of 16 x 8; the A and
//     B fragments come from shared memory by ldmatrix (.x4: one A tile, or the B fragments of two
//     n-tiles, per instruction; .trans where the staged rows run along m or n instead of k),
//   warp 64 (MFMA 32x32x8): 4 warps as 2 x 2, each 64 x 64 = 2 x 2 tiles of 32 x 32; each lane
//     reads its 4 consecutive k of a row (column) -- one 8-byte read where the staged rows run
//     along k.
// Staged slices keep the operand's stored layout (rows along k for a and for b^T, along m (n) for
// a^T (b)), as 16-byte copies, rows padded by 8 elements (16 bytes: rows stay 16-byte aligned for
// ldmatrix and the copies, and the 8 rows an ldmatrix reads fall in different banks). So the
// operands' rows must be 16-byte aligned: gemm_tc_refusal says when they are not, and matmul.cu's
// kernels take those calls.
//
// Edges: a 16-byte chunk lies wholly inside or wholly outside its matrix (the leading dimensions
// are multiples of 8), and chunks outside are zeros, so any M, N, K (K = 0 too) computes the right
// values; only the stores check m < M, n < N. Blocks are numbered in groups of kGroupM block rows
// (each group walks its columns with its kGroupM rows together), so blocks that run at the same
// time share the slices of b they read (L2 reuse on a GPU; the results do not depend on it).
//
// Arithmetic: k in order 0 .. K-1 through the tiles, f32 accumulation; alpha acc, then + beta c,
// then + bias (rounded to c's type first where c is 16-bit), each rounded once; then the GELU
// epilogue's pass over the stored outputs (gelu_math.h) (the build has FMA
// contraction off), as matmul.cu's kernels. On
// the SIMT runtime the matrix instructions sum in that order, so there the results are the
// scalar kernel's bits (tests/simt/mma_test.cpp holds them to it at warp 32 and 64); tensor
// cores and MFMA units sum a tile's k in their own order.
#include <climits>
#include <string>

#include "backends/gpu/kernels/common.h"
#include "backends/gpu/kernels/gelu_math.h"
#include "backends/gpu/kernels/mma.h"

// Loops over fragments and tiles run unrolled under nvcc (their arrays must stay in registers).
// Not under hipcc, as in flash_attention_tc.cu: its WARP 32 instantiations (the tile's scalar
// form on AMD) take minutes to compile fully unrolled; AMDGPU unrolls loops over private arrays.
#if defined(CT_GPU_CUDA)
#define CT_GEMM_UNROLL _Pragma("unroll")
#else
#define CT_GEMM_UNROLL
#endif
// The accumulators' loops (zeroing, epilogue) unrolled on both GPU compilers: indexed by a loop
// counter, AMDGPU keeps the accumulator array in scratch memory.
#if defined(CT_GPU_CUDA) || defined(CT_GPU_HIP)
#define CT_GEMM_UNROLL_ACC _Pragma("unroll")
#else
#define CT_GEMM_UNROLL_ACC
#endif

namespace ct::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kBM = 128, kBN = 128, kBK = 32;
constexpr int kPad = 8;             // elements after each staged row
constexpr int kLdK = kBK + kPad;    // a staged row along k (kBM or kBN of them)
constexpr int kLdMN = kBM + kPad;   // a staged row along m or n (kBK of them)
constexpr int kSlice = kBM * kLdK;  // elements of one staged slice of an operand (the larger)
constexpr int kGroupM = 8;          // block rows numbered together
static_assert(kBM == kBN && kBM * kLdK >= kBK * kLdMN, "one slice size fits both layouts");
static_assert(kBM * kBK / 8 % kThreads == 0, "whole rounds of 16-byte copies");

// The warps of a block: kM x kN of them, each owning (kBM / kM) x (kBN / kN) of c (warp 32: 2 x 4
// warps of 64 x 32; warp 64: 2 x 2 of 64 x 64).
template <int WARP>
struct Warps {
  static constexpr int kM = 2, kN = kThreads / WARP / kM;
};

struct alignas(16) Chunk {  // the unit of the staging copies
  std::uint16_t h[8];
};

// One slice of a stored operand into shared memory: ROWS stored rows from r0, COLS stored columns
// from c0 of a matrix of `rows` x `cols` elements, `ld` a row (a multiple of 8, src 16-byte
// aligned), into dst[ROWS][COLS + kPad]. Chunks outside the matrix are zeros.
template <int ROWS, int COLS>
__device__ __forceinline__ void stage(std::uint16_t* dst, const std::uint16_t* src, std::int64_t ld,
                                      std::int64_t rows, std::int64_t cols, std::int64_t r0,
                                      std::int64_t c0) {
  constexpr int kChunks = COLS / 8;
  CT_GEMM_UNROLL
  for (int r = 0; r < ROWS * kChunks / kThreads; ++r) {
    const int idx = static_cast<int>(threadIdx.x) + r * kThreads;
    const int rr = idx / kChunks, cc = idx % kChunks;
    const std::int64_t row = r0 + rr, col = c0 + 8 * cc;
    const bool in = row < rows && col < cols;
    ct_cp_async_16(dst + rr * (COLS + kPad) + 8 * cc, in ? src + row * ld + col : src, in ? 16 : 0);
  }
}

// Slice k0 .. k0 + kBK of a (rows m0 ..) and b (columns n0 ..) into as, bs.
template <bool TA, bool TB>
__device__ __forceinline__ void stage_slice(std::uint16_t* as, std::uint16_t* bs,
                                            const std::uint16_t* a, const std::uint16_t* b,
                                            std::int64_t M, std::int64_t N, std::int64_t K,
                                            std::int64_t m0, std::int64_t n0, std::int64_t k0) {
  if constexpr (TA)
    stage<kBK, kBM>(as, a, M, K, M, k0, m0);  // a stored (K, M): rows along m
  else
    stage<kBM, kBK>(as, a, K, M, K, m0, k0);  // a stored (M, K): rows along k
  if constexpr (TB)
    stage<kBN, kBK>(bs, b, K, N, K, n0, k0);  // b stored (N, K): rows along k
  else
    stage<kBK, kBN>(bs, b, N, K, N, k0, n0);  // b stored (K, N): rows along n
}

// Warp 32: c[TI][TJ] += the warp's rows wm .. +64 and columns wn .. +32 of one staged slice, by
// ldmatrix and mma.sync m16n8k16 (MmaLayout<32>; the lane arithmetic below is the PTX ISA's
// ldmatrix row assignment: lane l gives row l % 8 of matrix l / 8).
template <typename AB, bool TA, bool TB, int TI, int TJ>
__device__ __forceinline__ void slice_w32(float (&c)[TI][TJ][4], const std::uint16_t* as,
                                          const std::uint16_t* bs, int wm, int wn, int lane) {
  CT_GEMM_UNROLL
  for (int kk = 0; kk < kBK; kk += 16) {
    std::uint32_t fa[TI][4], fb[TJ][2];
    CT_GEMM_UNROLL
    for (int i = 0; i < TI; ++i) {
      // Matrices 0-3: (rows +0, k +0), (rows +8, k +0), (rows +0, k +8), (rows +8, k +8) = a0..a7.
      const int m = wm + 16 * i;
      if constexpr (TA)
        ct_ldmatrix_x4_trans(fa[i],
                             as + (kk + lane / 16 * 8 + lane % 8) * kLdMN + m + lane / 8 % 2 * 8);
      else
        ct_ldmatrix_x4(fa[i], as + (m + lane % 16) * kLdK + kk + lane / 16 * 8);
    }
    CT_GEMM_UNROLL
    for (int j = 0; j < TJ; j += 2) {
      // Matrices 0-3: (n +0, k +0), (n +0, k +8), (n +8, k +0), (n +8, k +8): b0..b3 of n-tiles
      // j and j + 1.
      const int n = wn + 8 * j;
      std::uint32_t r[4];
      if constexpr (TB)
        ct_ldmatrix_x4(r, bs + (n + lane / 16 * 8 + lane % 8) * kLdK + kk + lane / 8 % 2 * 8);
      else
        ct_ldmatrix_x4_trans(r,
                             bs + (kk + lane / 8 % 2 * 8 + lane % 8) * kLdMN + n + lane / 16 * 8);
      fb[j][0] = r[0], fb[j][1] = r[1], fb[j + 1][0] = r[2], fb[j + 1][1] = r[3];
    }
    CT_GEMM_UNROLL
    for (int i = 0; i < TI; ++i) CT_GEMM_UNROLL
    for (int j = 0; j < TJ; ++j) mma_regs<32, AB>(c[i][j], fa[i], fb[j]);
  }
}

// Warp 64: the 4 consecutive k (from k) of staged row or column `mn` as two registers. KMAJOR:
// the slice's rows run along k (one 8-byte read), else along m or n.
template <bool KMAJOR>
__device__ __forceinline__ void frag_w64(std::uint32_t (&r)[2], const std::uint16_t* s, int mn,
                                         int k) {
  if constexpr (KMAJOR) {
    const auto* p = reinterpret_cast<const std::uint32_t*>(s + mn * kLdK + k);
    r[0] = p[0], r[1] = p[1];
  } else {
    const std::uint16_t* p = s + k * kLdMN + mn;
    r[0] = p[0] | static_cast<std::uint32_t>(p[kLdMN]) << 16;
    r[1] = p[2 * kLdMN] | static_cast<std::uint32_t>(p[3 * kLdMN]) << 16;
  }
}

// Warp 64: c[TI][TJ] += the warp's rows wm .. +64 and columns wn .. +64 of one staged slice, by
// MFMA 32x32x8 (MmaLayout<64>: lane l holds k 4 (l / 32) .. +3 of row (column) l % 32).
template <typename AB, bool TA, bool TB, int TI, int TJ>
__device__ __forceinline__ void slice_w64(float (&c)[TI][TJ][16], const std::uint16_t* as,
                                          const std::uint16_t* bs, int wm, int wn, int lane) {
  CT_GEMM_UNROLL
  for (int kk = 0; kk < kBK; kk += 8) {
    std::uint32_t fa[TI][2], fb[TJ][2];
    CT_GEMM_UNROLL
    for (int i = 0; i < TI; ++i)
      frag_w64<!TA>(fa[i], as, wm + 32 * i + lane % 32, kk + lane / 32 * 4);
    CT_GEMM_UNROLL
    for (int j = 0; j < TJ; ++j)
      frag_w64<TB>(fb[j], bs, wn + 32 * j + lane % 32, kk + lane / 32 * 4);
    CT_GEMM_UNROLL
    for (int i = 0; i < TI; ++i) CT_GEMM_UNROLL
    for (int j = 0; j < TJ; ++j) mma_regs<64, AB>(c[i][j], fa[i], fb[j]);
  }
}

// c (batch, M, N) f32 (c32) or AB; a (M, K) or with TA (K, M), b (K, N) or with TB (N, K), of
// element AB, rows 16-byte aligned (gemm_tc_refusal); bias (N) f32 or nullptr, added as AB
// rounds it where c is AB (!c32). Block x of the grid is block tile (tm, tn) in kGroupM-row
// groups (tiles_m x tiles_n tiles), block z batch element z_base + z.
template <int WARP, typename AB, bool TA, bool TB>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    gemm_tc_kernel(void* c, const void* a, const void* b, const float* bias, void* gelu_out,
                   const void* gelu_pre, bool c32, std::int64_t M, std::int64_t N, std::int64_t K,
                   std::int64_t stride_a, std::int64_t stride_b, std::int64_t stride_c, float alpha,
                   float beta, std::int64_t tiles_m, std::int64_t tiles_n, std::int64_t z_base) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  using L = MmaLayout<WARP>;
  using W = Warps<WARP>;
  constexpr int kWM = kBM / W::kM, kWN = kBN / W::kN;  // the warp's part of the block's tile
  constexpr int TI = kWM / L::TM, TJ = kWN / L::TN;    // its matrix tiles
  static_assert(W::kM * W::kN * WARP == kThreads, "the warps fill the block");
  CT_SHARED(Chunk, as8, 2 * kSlice / 8);  // two staged slices of a, then two of b
  CT_SHARED(Chunk, bs8, 2 * kSlice / 8);
  auto* as = reinterpret_cast<std::uint16_t*>(as8);
  auto* bs = reinterpret_cast<std::uint16_t*>(bs8);

  const int lane = static_cast<int>(threadIdx.x) % WARP,
            warp = static_cast<int>(threadIdx.x) / WARP;
  const int wm = kWM * (warp / W::kN), wn = kWN * (warp % W::kN);
  // Block x -> (tm, tn): groups of kGroupM block rows, column-major within a group.
  const std::int64_t id = blockIdx.x, per_group = kGroupM * tiles_n;
  const std::int64_t first = id / per_group * kGroupM;
  const std::int64_t rows = tiles_m - first < kGroupM ? tiles_m - first : kGroupM;
  const std::int64_t tm = first + id % per_group % rows, tn = id % per_group / rows;
  const std::int64_t m0 = tm * kBM, n0 = tn * kBN;
  const std::int64_t z = z_base + blockIdx.z;
  const auto* ga = static_cast<const std::uint16_t*>(a) + z * stride_a;
  const auto* gb = static_cast<const std::uint16_t*>(b) + z * stride_b;

  float acc[TI][TJ][L::NC];
  CT_GEMM_UNROLL_ACC
  for (int i = 0; i < TI; ++i) CT_GEMM_UNROLL_ACC
  for (int j = 0; j < TJ; ++j) CT_GEMM_UNROLL_ACC
  for (int e = 0; e < L::NC; ++e) acc[i][j][e] = 0.0f;

  // Double buffering: slice s + 1 is copied into the other buffer while slice s is multiplied.
  // The barrier at the end of step s - 1 keeps step s's copies off the buffer step s - 1 read.
  const std::int64_t slices = (K + kBK - 1) / kBK;
  stage_slice<TA, TB>(as, bs, ga, gb, M, N, K, m0, n0, 0);
  ct_cp_async_commit();
  for (std::int64_t s = 0; s < slices; ++s) {
    const int cur = static_cast<int>(s % 2) * kSlice, next = kSlice - cur;
    if (s + 1 < slices)
      stage_slice<TA, TB>(as + next, bs + next, ga, gb, M, N, K, m0, n0, (s + 1) * kBK);
    ct_cp_async_commit();   // (an empty group on the last step: the wait below stays uniform)
    ct_cp_async_wait<1>();  // this thread's copies of slice s are done
    __syncthreads();        // and everyone's
    if constexpr (WARP == 32)
      slice_w32<AB, TA, TB, TI, TJ>(acc, as + cur, bs + cur, wm, wn, lane);
    else
      slice_w64<AB, TA, TB, TI, TJ>(acc, as + cur, bs + cur, wm, wn, lane);
    __syncthreads();
  }
  ct_cp_async_wait<0>();  // K = 0: slice 0's copies (zeros) were issued but never waited for

  const std::int64_t c_off = z * stride_c;
  CT_GEMM_UNROLL_ACC
  for (int i = 0; i < TI; ++i) CT_GEMM_UNROLL_ACC
  for (int j = 0; j < TJ; ++j) CT_GEMM_UNROLL_ACC
  for (int e = 0; e < L::NC; ++e) {
    const std::int64_t m = m0 + wm + i * L::TM + L::c_row(lane, e);
    const std::int64_t n = n0 + wn + j * L::TN + L::c_col(lane, e);
    if (m >= M || n >= N) continue;
    const std::int64_t at = c_off + m * N + n;
    float r = alpha * acc[i][j][e];
    if (beta != 0.0f) r += beta * (c32 ? F32::load(c, at) : AB::load(c, at));
    if (bias) r += c32 ? bias[n] : AB::rounded(bias[n]);
    if (c32)
      F32::store(c, at, r);
    else
      AB::store(c, at, r);
  }
  if (!gelu_out && !gelu_pre) return;
  for (int i = 0; i < TI; ++i)
    for (int j = 0; j < TJ; ++j)
      for (int e = 0; e < L::NC; ++e) {
        const std::int64_t m = m0 + wm + i * L::TM + L::c_row(lane, e);
        const std::int64_t n = n0 + wn + j * L::TN + L::c_col(lane, e);
        if (m >= M || n >= N) continue;
        if (c32)
          gemm_gelu_pass<F32>(c, c_off + m * N + n, gelu_out, gelu_pre);
        else
          gemm_gelu_pass<AB>(c, c_off + m * N + n, gelu_out, gelu_pre);
      }
}

template <int W, typename AB, bool TA, bool TB>
void gemm_tc_launch(const Ctx& cx, const GemmArgs& g) {
  const std::int64_t tiles_m = (g.M + kBM - 1) / kBM, tiles_n = (g.N + kBN - 1) / kBN;
  // Grid z is limited to 65535 on every target: batches go in slices.
  for (std::int64_t z0 = 0; z0 < g.batch; z0 += 65535) {
    const std::int64_t zs = g.batch - z0 < 65535 ? g.batch - z0 : 65535;
    const dim3 grid(static_cast<unsigned>(tiles_m * tiles_n), 1, static_cast<unsigned>(zs));
    launch<W>(CT_KERNEL(gemm_tc_kernel<W, AB, TA, TB>), grid, dim3(kThreads), 0, stream_of(cx), g.c,
              g.a, g.b, g.bias, g.gelu_out, g.gelu_pre, g.c_elem == Elem::kF32, g.M, g.N, g.K,
              g.stride_a, g.stride_b, g.stride_c, g.alpha, g.beta, tiles_m, tiles_n, z0);
  }
}

bool rows_16_byte_aligned(const void* p, std::int64_t ld, std::int64_t stride) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && ld % 8 == 0 && stride % 8 == 0;
}

}  // namespace

const char* gemm_tc_refusal(const Ctx& cx, const GemmArgs& g) {
  if (g.ab_elem == Elem::kF32) return "f32 inputs (the tile takes f16 and bf16)";
  if (!cx.matrix_tiles) return "the device runs no matrix tiles";
  if (!rows_16_byte_aligned(g.a, g.trans_a ? g.M : g.K, g.stride_a))
    return "a's rows are not 16-byte aligned (leading dimension or batch stride not a multiple "
           "of 8 elements, or an offset view)";
  if (!rows_16_byte_aligned(g.b, g.trans_b ? g.K : g.N, g.stride_b))
    return "b's rows are not 16-byte aligned (leading dimension or batch stride not a multiple "
           "of 8 elements, or an offset view)";
  const std::int64_t tiles_n = g.N > 0 ? (g.N + kBN - 1) / kBN : 1;
  if ((g.M + kBM - 1) / kBM > INT_MAX / tiles_n) return "more block tiles than a grid holds";
  return nullptr;
}

void gemm_tc(const Ctx& cx, const GemmArgs& g) {
  if (g.batch <= 0 || g.M <= 0 || g.N <= 0) return;
  if (const char* no = gemm_tc_refusal(cx, g))
    throw std::invalid_argument(std::string("gemm_tc: ") + no);
  if (g.c_elem != Elem::kF32 && g.c_elem != g.ab_elem)
    throw std::invalid_argument("gemm_tc: c must be f32 or of a's and b's element type");
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    auto by_ab = [&](auto abt) {
      using AB = decltype(abt);
      if (!g.trans_a && !g.trans_b) gemm_tc_launch<W, AB, false, false>(cx, g);
      if (!g.trans_a && g.trans_b) gemm_tc_launch<W, AB, false, true>(cx, g);
      if (g.trans_a && !g.trans_b) gemm_tc_launch<W, AB, true, false>(cx, g);
      if (g.trans_a && g.trans_b) gemm_tc_launch<W, AB, true, true>(cx, g);
    };
    if (g.ab_elem == Elem::kBF16)
      by_ab(BF16{});
    else
      by_ab(F16{});
  });
}

}  // namespace ct::gpu
