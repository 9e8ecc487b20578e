// The matrix tile: the one abstraction the GEMM's matrix-core path is written against.
//
// One warp computes C (TM x TN, f32) += A (TM x TK) B (TK x TN), A and B 16-bit (F16 or BF16)
// (MmaLayoutTf32 below is the f32 tile under TF32, warp 32 only, for kernels that take f32).
// Each operand is spread over the warp's lanes as a *fragment*: lane l holds NA elements of A,
// NB of B and NC of C, and the layout functions below say which. They are the layouts of the
// hardware instruction that executes the tile where there is one:
//   WARP 32: PTX mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16} (sm_80 and later; NVIDIA
//            PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"),
//   WARP 64: CDNA v_mfma_f32_32x32x8{f16,bf16_1k} (gfx90a, gfx94x; AMD's matrix instruction
//   tables).
// On the CPU SIMT runtime the tile is one call of the runtime's warp collective for that
// instruction (backends/gpu/matrix_ops.h, backends/simt/matrix.cpp): all lanes' fragments at
// once, the same layouts, k summed in order from c. Everywhere else -- RDNA, HIP without MFMA,
// CUDA devices before sm_80 -- the *scalar form* computes the same tile from the same fragments:
// each lane gathers the rows of A and columns of B it needs from the lanes holding them (warp
// shuffles, decoded by the same layout functions) and adds the products for k = 0 .. TK-1 in
// order, one rounding per product-add. That order is the scalar GEMM kernel's, so on the SIMT
// runtime the tile path reproduces the scalar kernel bit for bit: the tests use that to check
// the tile kernel's staging, fragment indexing and edge handling at both warp sizes.
// tests/simt/matrix_collectives_test.cpp holds the layouts (these and matrix_layouts.h) to the
// PTX ISA and CDNA2 tables lane by lane; that the hardware agrees with its documents only
// scripts/gpu-check.sh can show, through the op harness on a real GPU.
#pragma once

#include <cstdint>

#include "backends/gpu/kernels/common.h"
#include "backends/gpu/matrix_ops.h"

namespace ct::gpu {

template <int WARP>
struct MmaLayout;

// mma.sync m16n8k16: g = lane / 4 (the "groupID"), q = lane % 4 ("threadID_in_group").
template <>
struct MmaLayout<32> {
  static constexpr int TM = 16, TN = 8, TK = 16;
  static constexpr int NA = 8, NB = 4, NC = 4;
  // A: a0..a7 = (g, 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1), then the same at k + 8.
  static __device__ __forceinline__ int a_row(int lane, int i) {
    return lane / 4 + 8 * (i / 2 % 2);
  }
  static __device__ __forceinline__ int a_k(int lane, int i) {
    return lane % 4 * 2 + i % 2 + 8 * (i / 4);
  }
  // B: b0..b3 = (2q, g), (2q+1, g), (2q+8, g), (2q+9, g) as (k, column).
  static __device__ __forceinline__ int b_k(int lane, int i) {
    return lane % 4 * 2 + i % 2 + 8 * (i / 2);
  }
  static __device__ __forceinline__ int b_col(int lane, int /*i*/) { return lane / 4; }
  // C: c0..c3 = (g, 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1).
  static __device__ __forceinline__ int c_row(int lane, int i) { return lane / 4 + 8 * (i / 2); }
  static __device__ __forceinline__ int c_col(int lane, int i) { return lane % 4 * 2 + i % 2; }
  // The scalar form: lane `lane` needs rows g, g+8 of A (held by lanes 4g .. 4g+3) and
  // columns 2q, 2q+1 of B (lanes 4 (2q) .. and 4 (2q+1) ..).
  static constexpr int kASources = 4, kBSources = 8;
  static __device__ __forceinline__ int a_source(int lane, int j) { return lane / 4 * 4 + j; }
  static __device__ __forceinline__ int b_source(int lane, int j) {
    return (lane % 4 * 2 + j / 4) * 4 + j % 4;
  }
};

// v_mfma_f32_32x32x8: h = lane / 32 selects the half of k (A, B) or the row group (C).
template <>
struct MmaLayout<64> {
  static constexpr int TM = 32, TN = 32, TK = 8;
  static constexpr int NA = 4, NB = 4, NC = 16;
  static __device__ __forceinline__ int a_row(int lane, int /*i*/) { return lane % 32; }
  static __device__ __forceinline__ int a_k(int lane, int i) { return lane / 32 * 4 + i; }
  static __device__ __forceinline__ int b_k(int lane, int i) { return lane / 32 * 4 + i; }
  static __device__ __forceinline__ int b_col(int lane, int /*i*/) { return lane % 32; }
  static __device__ __forceinline__ int c_row(int lane, int i) {
    return 8 * (i / 4) + 4 * (lane / 32) + i % 4;
  }
  static __device__ __forceinline__ int c_col(int lane, int /*i*/) { return lane % 32; }
  // The lane's 16 C rows, each held (k 0-3 and 4-7) by lanes row and row + 32; its column by
  // lanes col and col + 32.
  static constexpr int kASources = 32, kBSources = 2;
  static __device__ __forceinline__ int a_source(int lane, int j) {
    return c_row(lane, j / 2) + 32 * (j % 2);
  }
  static __device__ __forceinline__ int b_source(int lane, int j) { return lane % 32 + 32 * j; }
};

// The TF32 tile (warp 32 only): C (16 x 8, f32) += A (16 x 8) B (8 x 8), mma.sync m16n8k8 .tf32
// (matrix_layouts.h's M16N8K8Tf32, here in MmaLayout's terms). A fragment element is a whole
// 32-bit register: f32 bits whose low 13 mantissa bits the instruction ignores, so kernels round
// their operands first (ct_f32_to_tf32). C's layout is m16n8k16's.
struct MmaLayoutTf32 {
  static constexpr int TM = 16, TN = 8, TK = 8;
  static constexpr int NA = 4, NB = 2, NC = 4;
  // A: a0..a3 = (g, q), (g+8, q), (g, q+4), (g+8, q+4). B: b0, b1 = (q, g), (q+4, g) as (k, n).
  static __device__ __forceinline__ int a_row(int lane, int i) {
    return layout::M16N8K8Tf32::a(lane, i).row;
  }
  static __device__ __forceinline__ int a_k(int lane, int i) {
    return layout::M16N8K8Tf32::a(lane, i).col;
  }
  static __device__ __forceinline__ int b_k(int lane, int i) {
    return layout::M16N8K8Tf32::b(lane, i).row;
  }
  static __device__ __forceinline__ int b_col(int lane, int i) {
    return layout::M16N8K8Tf32::b(lane, i).col;
  }
  static __device__ __forceinline__ int c_row(int lane, int i) {
    return MmaLayout<32>::c_row(lane, i);
  }
  static __device__ __forceinline__ int c_col(int lane, int i) {
    return MmaLayout<32>::c_col(lane, i);
  }
};

// c += a b on the TF32 tile: the instruction on sm_80+, the runtime's collective on SIMT, the
// portable form of matrix_ops.h elsewhere (all three ignore the low 13 mantissa bits).
__device__ __forceinline__ void mma_tf32(float (&c)[MmaLayoutTf32::NC],
                                         const std::uint32_t (&a)[MmaLayoutTf32::NA],
                                         const std::uint32_t (&b)[MmaLayoutTf32::NB]) {
  ct_mma_m16n8k8_tf32(c, a, b, c);
}

// A fragment's 16-bit elements packed four to a 64-bit word (shuffles move up to 8 bytes).
template <int N>
struct Packed {
  std::uint64_t w[(N + 3) / 4];
};
template <int N>
__device__ __forceinline__ Packed<N> pack(const std::uint16_t (&v)[N]) {
  Packed<N> p{};
  for (int i = 0; i < N; ++i) p.w[i / 4] |= static_cast<std::uint64_t>(v[i]) << (16 * (i % 4));
  return p;
}
__device__ __forceinline__ std::uint16_t unpack(std::uint64_t w, int slot) {
  return static_cast<std::uint16_t>(w >> (16 * slot));
}

// The scalar form of the tile (see the top of the file).
template <int WARP, typename AB>
__device__ __forceinline__ void mma_scalar(float (&c)[MmaLayout<WARP>::NC],
                                           const std::uint16_t (&a)[MmaLayout<WARP>::NA],
                                           const std::uint16_t (&b)[MmaLayout<WARP>::NB]) {
  using L = MmaLayout<WARP>;
  const int lane = static_cast<int>(threadIdx.x) % WARP;
  // Whole-tile scratch; only the entries this lane's C needs are filled. NaN elsewhere, so a
  // wrong source list shows up in the results instead of passing by luck.
  float at[L::TM][L::TK], bt[L::TK][L::TN];
  for (int m = 0; m < L::TM; ++m)
    for (int k = 0; k < L::TK; ++k) at[m][k] = NAN;
  for (int k = 0; k < L::TK; ++k)
    for (int n = 0; n < L::TN; ++n) bt[k][n] = NAN;
  const Packed<L::NA> pa = pack(a);
  const Packed<L::NB> pb = pack(b);
  for (int j = 0; j < L::kASources; ++j) {
    const int src = L::a_source(lane, j);
    for (int w = 0; w < (L::NA + 3) / 4; ++w) {
      const std::uint64_t got = ct_shfl_idx(pa.w[w], src, WARP);
      for (int s = 0; s < 4 && 4 * w + s < L::NA; ++s) {
        const std::uint16_t h = unpack(got, s);
        at[L::a_row(src, 4 * w + s)][L::a_k(src, 4 * w + s)] = AB::load(&h, 0);
      }
    }
  }
  for (int j = 0; j < L::kBSources; ++j) {
    const int src = L::b_source(lane, j);
    for (int w = 0; w < (L::NB + 3) / 4; ++w) {
      const std::uint64_t got = ct_shfl_idx(pb.w[w], src, WARP);
      for (int s = 0; s < 4 && 4 * w + s < L::NB; ++s) {
        const std::uint16_t h = unpack(got, s);
        bt[L::b_k(src, 4 * w + s)][L::b_col(src, 4 * w + s)] = AB::load(&h, 0);
      }
    }
  }
  for (int i = 0; i < L::NC; ++i) {
    const int m = L::c_row(lane, i), n = L::c_col(lane, i);
    float acc = c[i];
    for (int k = 0; k < L::TK; ++k) acc += at[m][k] * bt[k][n];
    c[i] = acc;
  }
}

// The targets where mma() runs one matrix instruction per tile (backends/gpu/matrix_ops.h): the
// hardware's, or on the SIMT runtime its warp collective, which sums in the scalar form's order.
#if defined(CT_GPU_SIMT) || (defined(CT_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800)
inline constexpr bool kMmaTile32 = true;
#else
inline constexpr bool kMmaTile32 = false;
#endif
#if defined(CT_GPU_SIMT) || defined(CT_HIP_MFMA)
inline constexpr bool kMmaTile64 = true;
#else
inline constexpr bool kMmaTile64 = false;
#endif

// c += a b on the warp from the instruction's operand registers (16-bit elements two to a 32-bit
// register, element 2r in the low half of register r, as ldmatrix delivers them): the matrix
// instruction where the target has one (on SIMT: the runtime's collective, one call per tile),
// else the scalar form.
template <int WARP, typename AB>
__device__ __forceinline__ void mma_regs(float (&c)[MmaLayout<WARP>::NC],
                                         const std::uint32_t (&a)[MmaLayout<WARP>::NA / 2],
                                         const std::uint32_t (&b)[MmaLayout<WARP>::NB / 2]) {
  using L = MmaLayout<WARP>;
  constexpr bool kBf = std::is_same_v<AB, BF16>;
  if constexpr (WARP == 32 && kMmaTile32) {
    if constexpr (kBf)
      ct_mma_m16n8k16_bf16(c, a, b, c);
    else
      ct_mma_m16n8k16_f16(c, a, b, c);
  } else if constexpr (WARP == 64 && kMmaTile64) {
    if constexpr (kBf)
      ct_mfma_32x32x8_bf16(c, a, b, c);
    else
      ct_mfma_32x32x8_f16(c, a, b, c);
  } else {
    std::uint16_t ua[L::NA], ub[L::NB];
    for (int e = 0; e < L::NA; ++e) ua[e] = static_cast<std::uint16_t>(a[e / 2] >> (16 * (e % 2)));
    for (int e = 0; e < L::NB; ++e) ub[e] = static_cast<std::uint16_t>(b[e / 2] >> (16 * (e % 2)));
    mma_scalar<WARP, AB>(c, ua, ub);
  }
}

// c += a b on the warp from the fragments' elements (MmaLayout's numbering): mma_regs.
template <int WARP, typename AB>
__device__ __forceinline__ void mma(float (&c)[MmaLayout<WARP>::NC],
                                    const std::uint16_t (&a)[MmaLayout<WARP>::NA],
                                    const std::uint16_t (&b)[MmaLayout<WARP>::NB]) {
  using L = MmaLayout<WARP>;
  // Elements 2r and 2r + 1 go to the low and high half of register r, as the instructions take
  // them (matrix_layouts.h numbers them so; MmaLayout's a_row/a_k agree, see the tests).
  std::uint32_t ra[L::NA / 2], rb[L::NB / 2];
  for (int r = 0; r < L::NA / 2; ++r)
    ra[r] = a[2 * r] | static_cast<std::uint32_t>(a[2 * r + 1]) << 16;
  for (int r = 0; r < L::NB / 2; ++r)
    rb[r] = b[2 * r] | static_cast<std::uint32_t>(b[2 * r + 1]) << 16;
  mma_regs<WARP, AB>(c, ra, rb);
}

}  // namespace ct::gpu
