// gemm_tc_kernel: the GEMM of matmul.cu (kernels.h GemmArgs: c = alpha op(a) op(b) + beta c
// (+ bias), both transposes, strided batch, c f32 or of a's type) for 16-bit a and b on the
// matrix tile of backends/gpu/kernels/mma.h, in block tiles sized for a GPU.
//
// A block is 4 warps (128 threads at warp 32, 256 at warp 64) as 2 x 2, and owns a kBM x kBN
// (128 x 128) tile of c, each warp a 64 x 64 part of it as a grid of matrix tiles:
//   warp 32 (mma.sync m16n8k16): 4 x 8 tiles of 16 x 8; the A and B fragments come from shared
//     memory by ldmatrix (.x4: one A tile, or the B fragments of two n-tiles, per instruction;
//     .trans where the staged rows run along m or n instead of k),
//   warp 64 (MFMA 32x32x8): 2 x 2 tiles of 32 x 32; each lane reads its 4 consecutive k of a row
//     (column) -- one 8-byte read where the staged rows run along k.
// The block walks k in slices of kBK (32) staged in shared memory, a ring of Cfg::kStages slices:
// 4 on CUDA (cp.async, sm_80+: three slices in flight while the warps multiply the fourth; one
// __syncthreads a slice), 2 on HIP, where the copies are plain loads and stores (matrix_ops.h).
// In registers the fragments alternate between two sets: the mma instructions of one step (16
// of k at warp 32) go while the next step's fragments load. Per slice and warp at warp 32: 16
// ldmatrix.x4 and 64 mma.sync (the 64 x 32 warp tiles before read 12 for 32), 8 cp.async a
// thread. A 64 x 64 warp tile holds 128 f32 accumulators and 2 x 32 fragment registers a lane:
// ptxas gives 232-254 registers and no spills on sm_80 and sm_90, so 2 blocks (8 warps) a
// streaming multiprocessor, with 2 x 80 KiB of shared memory.
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
//
// Split-k (split_k below): a batch-1 product with few block tiles and long k may run as s k
// ranges (grid y), each summed in order into an f32 partial product in the device's scratch
// memory, then gemm_tc_splitk_sum_kernel adds the partials in order and applies the epilogue:
// k 0 .. K-1 becomes (range 0) + (range 1) + ..., the same for a shape on a device every run.
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

constexpr int kBM = 128, kBN = 128, kBK = 32;
constexpr int kPad = 8;             // elements after each staged row
constexpr int kLdK = kBK + kPad;    // a staged row along k (kBM or kBN of them)
constexpr int kLdMN = kBM + kPad;   // a staged row along m or n (kBK of them)
constexpr int kSlice = kBM * kLdK;  // elements of one staged slice of an operand (the larger)
constexpr int kGroupM = 8;          // block rows numbered together
static_assert(kBM == kBN && kBM * kLdK >= kBK * kLdMN, "one slice size fits both layouts");

// The block at warp size WARP: 2 x 2 warps, each owning a kWM x kWN (64 x 64) part of c, and
// kStages staged slices (a's and b's) in shared memory. Four where the copies are asynchronous
// (cp.async on CUDA; the SIMT runtime runs the same schedule, each copy landing at the wait that
// retires it, so the tests walk it); two on HIP, where the copies are plain loads and stores (more
// would only take LDS), and at warp 64 (gfx90a's 64 KiB of LDS a block).
template <int WARP>
struct Cfg {
  static constexpr int kWarpsM = 2, kWarpsN = 2;
  static constexpr int kThreads = kWarpsM * kWarpsN * WARP;  // 128 at warp 32, 256 at warp 64
  static constexpr int kWM = kBM / kWarpsM, kWN = kBN / kWarpsN;
#if defined(CT_GPU_HIP)
  static constexpr int kStages = 2;
#else
  static constexpr int kStages = WARP == 32 ? 4 : 2;
#endif
  static constexpr int kSmemBytes = kStages * 2 * kSlice * 2;  // 80 KiB (4 stages), 40 KiB (2)
  using L = MmaLayout<WARP>;
  static constexpr int TI = kWM / L::TM, TJ = kWN / L::TN;  // the warp's matrix tiles
  static constexpr int kSteps = kBK / L::TK;                // matrix-tile steps through a slice
  static_assert(kSteps % 2 == 0, "fragments alternate between two sets, a pair of steps a round");
};

struct alignas(16) Chunk {  // the unit of the staging copies
  std::uint16_t h[8];
};

// The copies of one operand's slices into shared memory, as thread `tid` of THREADS issues them:
// the operand is stored as rows of `ld` elements (a multiple of 8, 16-byte aligned); a slice is
// ROWS x COLS of them, staged as dst[ROWS][COLS + kPad] in 16-byte chunks. KCOLS: k runs along
// the stored rows (a, b^T: a slice is rows mn0 .. + ROWS, columns k0 .. + kBK), else down the
// columns (a^T, b: rows k0 .. + kBK, columns mn0 .. + COLS). The thread's chunks keep their place
// from slice to slice (column `cc`, rows `rr`, + kRowsPer a round), so it keeps the offset of its
// first chunk of the next slice, which rounds lie inside the operand along m or n, and the limit
// for k. Chunks outside the operand are zeros.
template <int ROWS, int COLS, int THREADS, bool KCOLS>
struct Stager {
  static constexpr int kChunks = COLS / 8, kRowsPer = THREADS / kChunks;
  static constexpr int kRounds = ROWS / kRowsPer;
  static_assert(THREADS % kChunks == 0 && ROWS % kRowsPer == 0, "whole rounds of 16-byte copies");
  const std::uint16_t* base;  // the operand (the address a chunk of zeros names)
  std::int64_t off;           // the thread's first chunk of the next slice, from base
  std::int64_t ld, lim;       // KCOLS: k0 < lim keeps the chunks; else k0 + rows < lim
  unsigned in_mn;             // bit r: round r's chunks lie inside along m or n
  int dst;                    // the first chunk's place in a staged slice

  // extent: the operand's length along m or n; K its depth; mn0 the block's first row or column.
  // The first slice issued is the one at k = kb (a multiple of kBK: a split-k range's start).
  __device__ __forceinline__ Stager(const std::uint16_t* src, std::int64_t ld_, std::int64_t extent,
                                    std::int64_t K, std::int64_t mn0, int tid, std::int64_t kb)
      : base(src), ld(ld_) {
    const int rr = tid / kChunks, cc = tid % kChunks;
    dst = rr * (COLS + kPad) + 8 * cc;
    in_mn = 0;
    if constexpr (KCOLS) {
      off = (mn0 + rr) * ld + kb + 8 * cc;
      lim = K - 8 * cc;
      for (int r = 0; r < kRounds; ++r)
        in_mn |= static_cast<unsigned>(mn0 + rr + r * kRowsPer < extent) << r;
    } else {
      off = (kb + rr) * ld + mn0 + 8 * cc;
      lim = K - rr;
      in_mn = mn0 + 8 * cc < extent ? ~0u : 0u;
    }
  }
  // Slice k0 (the next one) into the staged slice at s; then on to the one after.
  __device__ __forceinline__ void issue(std::uint16_t* s, std::int64_t k0) {
    CT_GEMM_UNROLL
    for (int r = 0; r < kRounds; ++r) {
      const bool in = (in_mn >> r & 1u) && (KCOLS ? k0 < lim : k0 + r * kRowsPer < lim);
      // (no offset from base unless inside: base may be null where the operand is empty)
      const std::uint16_t* src = in ? base + (off + r * kRowsPer * ld) : base;
      ct_cp_async_16(s + dst + r * kRowsPer * (COLS + kPad), src, in ? 16 : 0);
    }
    off += KCOLS ? kBK : kBK * ld;
  }
};

// The warp's fragments for one matrix-tile step: a's TI row tiles and b's TJ column tiles, 16-bit
// elements two to a register, as mma_regs takes them.
template <int WARP>
struct Frags {
  using C = Cfg<WARP>;
  std::uint32_t a[C::TI][C::L::NA / 2], b[C::TJ][C::L::NB / 2];
};

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

// f = the fragments of step `step` (k from step * TK) of staged slice st for the warp's rows
// wm .. +kWM and columns wn .. +kWN.
//   warp 32 (mma.sync m16n8k16, MmaLayout<32>): by ldmatrix .x4 -- one A tile, or the B fragments
//     of two n-tiles, per instruction; .trans where the staged rows run along m or n. The lane
//     arithmetic is the PTX ISA's ldmatrix row assignment: lane l gives row l % 8 of matrix l / 8.
//   warp 64 (MFMA 32x32x8, MmaLayout<64>: lane l holds k 4 (l / 32) .. +3 of row (column)
//     l % 32): frag_w64.
template <int WARP, bool TA, bool TB>
__device__ __forceinline__ void load_frags(Frags<WARP>& f, const std::uint16_t* st, int step,
                                           int wm, int wn, int lane) {
  using C = Cfg<WARP>;
  const std::uint16_t* as = st;
  const std::uint16_t* bs = st + kSlice;
  const int kk = step * C::L::TK;
  if constexpr (WARP == 32) {
    CT_GEMM_UNROLL
    for (int i = 0; i < C::TI; ++i) {
      // Matrices 0-3: (rows +0, k +0), (rows +8, k +0), (rows +0, k +8), (rows +8, k +8) = a0..a7.
      const int m = wm + 16 * i;
      if constexpr (TA)
        ct_ldmatrix_x4_trans(f.a[i],
                             as + (kk + lane / 16 * 8 + lane % 8) * kLdMN + m + lane / 8 % 2 * 8);
      else
        ct_ldmatrix_x4(f.a[i], as + (m + lane % 16) * kLdK + kk + lane / 16 * 8);
    }
    CT_GEMM_UNROLL
    for (int j = 0; j < C::TJ; j += 2) {
      // Matrices 0-3: (n +0, k +0), (n +0, k +8), (n +8, k +0), (n +8, k +8): b0..b3 of n-tiles
      // j and j + 1.
      const int n = wn + 8 * j;
      std::uint32_t r[4];
      if constexpr (TB)
        ct_ldmatrix_x4(r, bs + (n + lane / 16 * 8 + lane % 8) * kLdK + kk + lane / 8 % 2 * 8);
      else
        ct_ldmatrix_x4_trans(r,
                             bs + (kk + lane / 8 % 2 * 8 + lane % 8) * kLdMN + n + lane / 16 * 8);
      f.b[j][0] = r[0], f.b[j][1] = r[1], f.b[j + 1][0] = r[2], f.b[j + 1][1] = r[3];
    }
  } else {
    CT_GEMM_UNROLL
    for (int i = 0; i < C::TI; ++i)
      frag_w64<!TA>(f.a[i], as, wm + 32 * i + lane % 32, kk + lane / 32 * 4);
    CT_GEMM_UNROLL
    for (int j = 0; j < C::TJ; ++j)
      frag_w64<TB>(f.b[j], bs, wn + 32 * j + lane % 32, kk + lane / 32 * 4);
  }
}

// c[TI][TJ] += the step's product from its fragments.
template <int WARP, typename AB>
__device__ __forceinline__ void mma_frags(
    float (&c)[Cfg<WARP>::TI][Cfg<WARP>::TJ][Cfg<WARP>::L::NC], const Frags<WARP>& f) {
  CT_GEMM_UNROLL
  for (int i = 0; i < Cfg<WARP>::TI; ++i) CT_GEMM_UNROLL
  for (int j = 0; j < Cfg<WARP>::TJ; ++j) mma_regs<WARP, AB>(c[i][j], f.a[i], f.b[j]);
}

// f(m, n, v) for each accumulator v of the warp's part of c (its rows from wm0, columns from
// wn0) whose output (m, n) lies inside c.
template <int WARP, typename F>
__device__ __forceinline__ void for_each_output(
    const float (&acc)[Cfg<WARP>::TI][Cfg<WARP>::TJ][Cfg<WARP>::L::NC], std::int64_t wm0,
    std::int64_t wn0, std::int64_t M, std::int64_t N, int lane, F&& f) {
  using L = typename Cfg<WARP>::L;
  CT_GEMM_UNROLL_ACC
  for (int i = 0; i < Cfg<WARP>::TI; ++i) CT_GEMM_UNROLL_ACC
  for (int j = 0; j < Cfg<WARP>::TJ; ++j) CT_GEMM_UNROLL_ACC
  for (int e = 0; e < L::NC; ++e) {
    const std::int64_t m = wm0 + i * L::TM + L::c_row(lane, e);
    const std::int64_t n = wn0 + j * L::TN + L::c_col(lane, e);
    if (m < M && n < N) f(m, n, acc[i][j][e]);
  }
}

// The epilogue of one output: c[at] (column n) = alpha acc + beta c + bias (rounded to AB first
// where c is AB), each step rounded once; c f32 (c32) or AB.
template <typename AB>
__device__ __forceinline__ void epilogue(void* c, std::int64_t at, std::int64_t n, float acc,
                                         float alpha, float beta, const float* bias, bool c32) {
  float r = alpha * acc;
  if (beta != 0.0f) r += beta * (c32 ? F32::load(c, at) : AB::load(c, at));
  if (bias) r += c32 ? bias[n] : AB::rounded(bias[n]);
  if (c32)
    F32::store(c, at, r);
  else
    AB::store(c, at, r);
}

// c (batch, M, N) f32 (c32) or AB; a (M, K) or with TA (K, M), b (K, N) or with TB (N, K), of
// element AB, rows 16-byte aligned (gemm_tc_refusal); bias (N) f32 or nullptr, added as AB
// rounds it where c is AB (!c32). Block x of the grid is block tile (tm, tn) in kGroupM-row
// groups (tiles_m x tiles_n tiles), block y split-k range y (k from y k_len, k_len a multiple of
// kBK), block z batch element z_base + z. part: nullptr, or (batch 1, split-k) the f32 partial
// products part[y][M][N] of the ranges, stored as summed (no epilogue: gemm_tc_splitk_sum_kernel
// adds them in order and applies it). Cfg<WARP>::kSmemBytes of dynamic shared memory.
template <int WARP, typename AB, bool TA, bool TB>
__global__ void CT_LAUNCH_BOUNDS(Cfg<WARP>::kThreads)
    gemm_tc_kernel(void* c, const void* a, const void* b, const float* bias, void* gelu_out,
                   const void* gelu_pre, bool c32, std::int64_t M, std::int64_t N, std::int64_t K,
                   std::int64_t stride_a, std::int64_t stride_b, std::int64_t stride_c, float alpha,
                   float beta, std::int64_t tiles_m, std::int64_t tiles_n, std::int64_t z_base,
                   std::int64_t k_len, float* part) {
  CT_CHECK_LAUNCH_BOUNDS(Cfg<WARP>::kThreads);
  CT_ONLY_ON_ITS_WARP(WARP);
  using C = Cfg<WARP>;
  using L = typename C::L;
  constexpr int TI = C::TI, TJ = C::TJ, S = C::kStages;
  CT_DYNAMIC_SHARED(Chunk, smem8);  // S stages, each a's slice then b's
  auto* smem = reinterpret_cast<std::uint16_t*>(smem8);

  const int lane = static_cast<int>(threadIdx.x) % WARP,
            warp = static_cast<int>(threadIdx.x) / WARP;
  const int wm = C::kWM * (warp / C::kWarpsN), wn = C::kWN * (warp % C::kWarpsN);
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

  // The pipeline: slices 0 .. S - 2 are copied first; step 0 of slice s issues the copies of
  // slice s + S - 1 into the stage slice s - 1 had (every warp has read it: the barrier below, in
  // step kSteps - 1 of slice s - 1, came after its last fragments). Each thread commits one group
  // of copies per slice, empty past the end, so before the last step of slice s, S - 2 groups
  // pending means slice s + 1 has landed; the barrier makes that so for every thread's copies.
  // Fragments alternate between f0 and f1: a step's mma instructions go while the next step's
  // fragments load (the next slice's first step, after the barrier, at the last step).
  // This block's k range: [kb, ke), slices of it from kb.
  const std::int64_t kb = static_cast<std::int64_t>(blockIdx.y) * k_len;
  const std::int64_t ke = K - kb < k_len ? K : kb + k_len;
  const std::int64_t slices = ke > kb ? (ke - kb + kBK - 1) / kBK : 0;
  auto stage_at = [&](int st) { return smem + st * 2 * kSlice; };
  const int tid = static_cast<int>(threadIdx.x);
  // a (M, K) / (K, M), b^T (N, K) / b (K, N): the stored operands' rows of one slice.
  Stager<TA ? kBK : kBM, TA ? kBM : kBK, C::kThreads, !TA> sa(ga, TA ? M : K, M, K, m0, tid, kb);
  Stager<TB ? kBN : kBK, TB ? kBK : kBN, C::kThreads, TB> sb(gb, TB ? K : N, N, K, n0, tid, kb);
  auto stage_slice = [&](int st, std::int64_t k0) {
    sa.issue(stage_at(st), k0);
    sb.issue(stage_at(st) + kSlice, k0);
  };
  for (int p = 0; p < S - 1; ++p) {
    if (p < slices) stage_slice(p, kb + p * kBK);
    ct_cp_async_commit();
  }
  ct_cp_async_wait<S - 2>();
  __syncthreads();
  Frags<WARP> f0, f1;
  if (slices > 0) load_frags<WARP, TA, TB>(f0, stage_at(0), 0, wm, wn, lane);
  int rd = 0, wr = S - 1;  // the stage slice s is read from, the one slice s + S - 1 goes to
  for (std::int64_t s = 0; s < slices; ++s) {
    const int next = rd + 1 == S ? 0 : rd + 1;
    CT_GEMM_UNROLL
    for (int step = 0; step < C::kSteps; step += 2) {
      load_frags<WARP, TA, TB>(f1, stage_at(rd), step + 1, wm, wn, lane);
      if (step == 0) {
        if (s + S - 1 < slices) stage_slice(wr, kb + (s + S - 1) * kBK);
        ct_cp_async_commit();
      }
      mma_frags<WARP, AB>(acc, f0);
      if (step + 2 < C::kSteps) {
        load_frags<WARP, TA, TB>(f0, stage_at(rd), step + 2, wm, wn, lane);
      } else {
        ct_cp_async_wait<S - 2>();
        __syncthreads();
        if (s + 1 < slices) load_frags<WARP, TA, TB>(f0, stage_at(next), 0, wm, wn, lane);
      }
      mma_frags<WARP, AB>(acc, f1);
    }
    rd = next;
    wr = wr + 1 == S ? 0 : wr + 1;
  }
  ct_cp_async_wait<0>();  // the empty groups past the end

  if (part) {  // a split-k range: its partial product as summed
    float* pr = part + static_cast<std::int64_t>(blockIdx.y) * M * N;
    if constexpr (WARP == 32) {
      // m16n8k16's C elements 2h, 2h + 1 are columns 2q, 2q + 1 of one row: one 8-byte store
      // where N is even (then n + 1 < N wherever n < N, and the pair is 8-byte aligned).
      if (N % 2 == 0) {
        struct alignas(8) Pair {
          float x, y;
        };
        CT_GEMM_UNROLL_ACC
        for (int i = 0; i < TI; ++i) CT_GEMM_UNROLL_ACC
        for (int j = 0; j < TJ; ++j) CT_GEMM_UNROLL_ACC
        for (int h = 0; h < L::NC / 2; ++h) {
          const std::int64_t m = m0 + wm + i * L::TM + L::c_row(lane, 2 * h);
          const std::int64_t n = n0 + wn + j * L::TN + L::c_col(lane, 2 * h);
          if (m < M && n < N)
            *reinterpret_cast<Pair*>(pr + m * N + n) = Pair{acc[i][j][2 * h], acc[i][j][2 * h + 1]};
        }
        return;
      }
    }
    for_each_output<WARP>(acc, m0 + wm, n0 + wn, M, N, lane,
                          [&](std::int64_t m, std::int64_t n, float v) { pr[m * N + n] = v; });
    return;
  }
  const std::int64_t c_off = z * stride_c;
  for_each_output<WARP>(acc, m0 + wm, n0 + wn, M, N, lane,
                        [&](std::int64_t m, std::int64_t n, float v) {
                          epilogue<AB>(c, c_off + m * N + n, n, v, alpha, beta, bias, c32);
                        });
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

constexpr int kSumThreads = 256;

// c (M, N) (f32 where c32, else AB) = the epilogue (as gemm_tc_kernel's) of the sum of the
// `splits` partial products part[s][M][N], added in order s = 0, 1, ...
template <int WARP, typename AB>
__global__ void CT_LAUNCH_BOUNDS(kSumThreads)
    gemm_tc_splitk_sum_kernel(void* c, const float* part, int splits, const float* bias,
                              void* gelu_out, const void* gelu_pre, bool c32, std::int64_t M,
                              std::int64_t N, float alpha, float beta) {
  CT_CHECK_LAUNCH_BOUNDS(kSumThreads);
  CT_ONLY_ON_ITS_WARP(WARP);
  const std::int64_t MN = M * N;
  CT_FOR_EACH_ELEMENT(at, MN, kSumThreads) {
    float acc = part[at];
    for (int s = 1; s < splits; ++s) acc += part[s * MN + at];
    epilogue<AB>(c, at, at % N, acc, alpha, beta, bias, c32);
    if (gelu_out || gelu_pre) {
      if (c32)
        gemm_gelu_pass<F32>(c, at, gelu_out, gelu_pre);
      else
        gemm_gelu_pass<AB>(c, at, gelu_out, gelu_pre);
    }
  }
}

// Split-k: [splits, k_len] for g (k_len a multiple of kBK; splits 1 and k_len >= K: none). Only
// batch-1 products with a scratch provider split. Every range but the last has the same whole
// number of slices. Ctx::splitk n >= 1: n ranges (fewer where there are fewer slices). Automatic
// (Ctx::splitk 0), for the products with few block tiles and long k (the weight gradients): the
// number s of ranges, 1 to 16 of at least 8 slices each, that costs least in a model of a GPU
// running 2 blocks a multiprocessor (`fill` at once) in waves: waves(s) x a range's k, against
// the partial products' round trip through memory (written and read once, 8 s M N bytes) at
// kFlopPerByte FLOP a byte (a tensor-core rate over the memory bandwidth: ~90 on an H100 at
// 300 TFLOP/s and 3.35 TB/s). The same s for a shape on a device, run after run.
struct SplitK {
  int splits;
  std::int64_t k_len;
};
constexpr double kFlopPerByte = 100;
SplitK split_k(const Ctx& cx, const GemmArgs& g) {
  const std::int64_t slices = (g.K + kBK - 1) / kBK;
  const SplitK none{1, slices * kBK > g.K ? slices * kBK : g.K};
  if (g.batch != 1 || !g.scratch || slices < 2) return none;
  std::int64_t want = cx.splitk;
  if (want == 0) {
    const std::int64_t tiles = ((g.M + kBM - 1) / kBM) * ((g.N + kBN - 1) / kBN);
    const std::int64_t fill = 2 * static_cast<std::int64_t>(cx.multiprocessors);
    const std::int64_t most = slices / 8 < 16 ? slices / 8 : 16;
    double best = 0;
    for (std::int64_t s = 1; s <= (most > 1 ? most : 1); ++s) {
      const std::int64_t per = (slices + s - 1) / s;
      const std::int64_t waves = (tiles * s + fill - 1) / fill;
      const double cost = static_cast<double>(waves) * 2.0 * kBM * kBN * per * kBK * fill +
                          (s > 1 ? kFlopPerByte * 8.0 * s * g.M * g.N : 0.0);
      if (s == 1 || cost < best) best = cost, want = s;
    }
  }
  if (want > slices) want = slices;
  if (want <= 1) return none;
  const std::int64_t per = (slices + want - 1) / want;  // slices a range
  return SplitK{static_cast<int>((slices + per - 1) / per), per * kBK};
}

template <int W, typename AB, bool TA, bool TB>
void gemm_tc_launch(const Ctx& cx, const GemmArgs& g) {
  const std::int64_t tiles_m = (g.M + kBM - 1) / kBM, tiles_n = (g.N + kBN - 1) / kBN;
  constexpr std::size_t kBytes = Cfg<W>::kSmemBytes;
  const SplitK sk = split_k(cx, g);
#if defined(CT_GPU_CUDA)
  // Past 48 KiB a kernel takes dynamic shared memory only when asked (per device: every call).
  const cudaError_t e = cudaFuncSetAttribute(gemm_tc_kernel<W, AB, TA, TB>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("gemm_tc: cudaFuncSetAttribute failed: ") +
                             cudaGetErrorString(e));
#endif
  const bool c32 = g.c_elem == Elem::kF32;
  if (sk.splits > 1) {  // batch 1: the ranges' partial products, then their sum and the epilogue
    auto* part = static_cast<float*>(g.scratch(
        g.scratch_owner, static_cast<std::size_t>(sk.splits) * g.M * g.N * sizeof(float)));
    const dim3 grid(static_cast<unsigned>(tiles_m * tiles_n), static_cast<unsigned>(sk.splits));
    launch<W>(CT_KERNEL(gemm_tc_kernel<W, AB, TA, TB>), grid, dim3(Cfg<W>::kThreads), kBytes,
              stream_of(cx), g.c, g.a, g.b, g.bias, g.gelu_out, g.gelu_pre, c32, g.M, g.N, g.K,
              g.stride_a, g.stride_b, g.stride_c, g.alpha, g.beta, tiles_m, tiles_n,
              std::int64_t{0}, sk.k_len, part);
    launch<W>(CT_KERNEL(gemm_tc_splitk_sum_kernel<W, AB>),
              dim3(grid_for(cx, g.M * g.N, kSumThreads)), dim3(kSumThreads), 0, stream_of(cx), g.c,
              static_cast<const float*>(part), sk.splits, g.bias, g.gelu_out, g.gelu_pre, c32, g.M,
              g.N, g.alpha, g.beta);
    return;
  }
  // Grid z is limited to 65535 on every target: batches go in slices.
  for (std::int64_t z0 = 0; z0 < g.batch; z0 += 65535) {
    const std::int64_t zs = g.batch - z0 < 65535 ? g.batch - z0 : 65535;
    const dim3 grid(static_cast<unsigned>(tiles_m * tiles_n), 1, static_cast<unsigned>(zs));
    launch<W>(CT_KERNEL(gemm_tc_kernel<W, AB, TA, TB>), grid, dim3(Cfg<W>::kThreads), kBytes,
              stream_of(cx), g.c, g.a, g.b, g.bias, g.gelu_out, g.gelu_pre, c32, g.M, g.N, g.K,
              g.stride_a, g.stride_b, g.stride_c, g.alpha, g.beta, tiles_m, tiles_n, z0, sk.k_len,
              static_cast<float*>(nullptr));
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

int gemm_tc_splits(const Ctx& cx, const GemmArgs& g) {
  return g.M > 0 && g.N > 0 ? split_k(cx, g).splits : 1;
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
