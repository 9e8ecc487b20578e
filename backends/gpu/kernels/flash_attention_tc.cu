// Fused causal attention (core/device.h flash_attention_*) on the matrix tile of
// backends/gpu/kernels/mma.h: FlashAttention-2's work split for 16-bit q, k, v (F16, BF16), and
// for f32 ones under TF32 (Ctx::tf32, crosstrain train --tf32) at warp 32; f32 accumulation, head
// sizes 64 and 128, grouped-query attention. The same contract as
// flash_attention.cu (lse saved, D = dout . out in the workspace, dqkv (=)); the general kernels
// there take every other case (gpu_device.cpp asks flash_attention_tc_refusal which runs).
//
// A block is kThreads threads, kRows (64) query (or key) rows of one head; each warp owns TM
// rows of them (16 at warp 32: mma.sync m16n8k16, or m16n8k8 .tf32 for f32; 32 at warp 64:
// v_mfma_f32_32x32x8), and every matrix product is a sequence of tiles c += a b on that warp.
// The forward of 16-bit operands at head size 64 gives each warp two m-tiles (32 rows, 128 a
// block: kFwdMTiles), so every K or V fragment read from shared memory feeds two products.
//   forward (per query block, key tiles of kKeys in order, the causal ones only):
//     S = Q K^T, online softmax on S's C fragments per row (running max m and per-lane partial
//     sums l, rescaled when m grows), O += P V with P rounded to the operand type; at the end
//     out = O / l, lse = m + log l (l summed over the lanes of a row in a fixed butterfly).
//     Of the last Tq rows only (out [B,Tq,C], lse [B,NH,Tq]: positions T - Tq .. T - 1, for
//     sampling's key/value cache): the query blocks holding them, each as in the whole window's
//     forward (the same bits); rows of the first one before T - Tq are not stored.
//   backward, query kernel (per query block, key tiles in order): D = dout . out per row (saved
//     to the workspace), S = Q K^T, P = exp(scale S - lse), dP = dO V^T, dS = P (dP - D) scale,
//     dQ += dS K.
//   backward, key kernel (per key block of a key/value head; after the query kernel): for the
//     G query heads of the group in order, query tiles of kQueries(HS) in order:
//     S^T = K Q^T, P^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q.
// Every output has one owner (a warp) that sums in an order fixed by the shapes: no atomics,
// the same bits run after run. (The bits differ from the general kernels': P and dS go through
// the tile in the operand type, and the tile's k order is the hardware's; on GPUs so are the
// softmax's exponentials, ct_exp_le0_tile.) The causal mask is applied only to the tiles that
// reach the diagonal or T (warp-uniform tests); the others take every score as it is.
//
// Operands (Tc below): the element type's stored bits for F16 and BF16; for f32, the f32 bits
// rounded to TF32 (ct_f32_to_tf32, to nearest) where they enter the tile -- when staged, when
// loaded into A fragments, and P and dS from their f32 C fragments. k, v (forward, query kernel)
// and q, dout (key kernel) tiles are staged in shared memory, 16 bytes a copy (hence the 16-byte
// alignment the refusal checks), rows padded by 16 bytes (bank spread for both operand sizes:
// the 8 rows an ldmatrix reads fall in 8 different 16-byte bank groups). The copies are
// ct_cp_async_16 (cp.async on sm_80+) in a pipeline over the two staged tiles of each kernel:
// while the warps multiply with one, the next tile of the other is on its way (the kernels say
// which; one group of copies per tile and thread, waited for before the barrier that precedes its
// reads). On the m16n8k16 tile (sm_80+, and the SIMT runtime's collectives) the B fragments come
// from the staged tiles by ldmatrix.x4 (.trans for V, dO, Q in the P V-like products), two
// n-tiles a k-step; elsewhere each lane reads its fragment elements through the tile's layout
// functions. The block's own
// rows (q, dout in the forward and query kernels, k in the key kernel) go straight from global
// memory into A fragments, once; the key kernel's v rows are staged once in dynamic shared memory
// and read into registers a k-step's A fragment at a time. P and dS change from the C layout to the
// A layout: at warp 32 in registers (m16n8k16's C fragments of n-tiles 2j, 2j+1 are the A fragment
// of k-step j; m16n8k8's C fragment of n-tile j is the A fragment of k-step j when k position q +
// 4h stands for column 2q + h, so the B operand of those products reads its rows in that order), at
// warp 64 through a per-warp shared scratch. Static shared memory stays under 48 KB: f32 rows take
// twice the bytes, so head size 128 stages 32 keys a tile in f32 (kKeys).
#include <climits>
#include <string>
#include <type_traits>

#include "backends/gpu/kernels/common.h"
#include "backends/gpu/kernels/mma.h"
#include "backends/gpu/kernels/safe_math.h"

// Loops over fragments and tiles run unrolled under nvcc and for gfx90a (their arrays must stay
// in registers: without the pragma nvcc keeps some in local memory, and AMDGPU's heuristics left
// the hs-128 key kernel's dK and dV, 512 bytes a lane, in scratch). Not for gfx1030 (wave 32, no
// matrix cores, tiles off by default): the tile's scalar form unrolled takes minutes to compile
// and keeps its ~2 KB of scratch a lane either way; there AMDGPU's own heuristics decide.
#if defined(CT_GPU_CUDA) || (defined(__HIP_DEVICE_COMPILE__) && __AMDGCN_WAVEFRONT_SIZE == 64)
#define CT_TC_UNROLL _Pragma("unroll")
#else
#define CT_TC_UNROLL
#endif

namespace ct::gpu {
namespace {

// Whether this target builds the TF32 tile: not under hipcc (the MFMA f32 form is not written;
// HIP devices have no TF32 matmuls either, so the f32 kernels would never run there).
#if defined(CT_GPU_HIP)
constexpr bool kTf32Tile = false;
#else
constexpr bool kTf32Tile = true;
#endif

// The tile an instantiation runs on, and what its operands (Op) hold:
//   F16, BF16: MmaLayout<WARP>; the stored bits.
//   F32 (warp 32, under TF32): MmaLayoutTf32; f32 bits rounded to TF32.
// enter: a stored element as an operand; of: a computed value (P, dS) as an operand; pv_k: the
// k-step row of B element e in products whose A fragments came from C fragments (c_to_a's k
// order); mma: c += a b.
template <int WARP, typename E>
struct Tc : MmaLayout<WARP> {
  using L = MmaLayout<WARP>;
  using Op = std::uint16_t;
  static __device__ __forceinline__ Op enter(Op stored) { return stored; }
  static __device__ __forceinline__ Op of(float v) {
    Op b;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // One cvt.rn (round to nearest even, subnormals kept): E::store's bits for every value but
    // NaN, whose products are NaN either way; the software rounding takes 5 (bf16) to 12 (f16)
    // instructions and branches an element.
    if constexpr (std::is_same_v<E, BF16>)
      asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(v));
    else
      asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(v));
#elif defined(__HIP_DEVICE_COMPILE__)
    // f16: v_cvt_f16_f32 (the mode's round to nearest even, f16 subnormals kept), E::store's bits
    // but for NaN's; bf16 has no conversion instruction before gfx950: the software rounding.
    if constexpr (std::is_same_v<E, F16>)
      b = __builtin_bit_cast(std::uint16_t, static_cast<_Float16>(v));
    else
      E::store(&b, 0, v);
#else
    E::store(&b, 0, v);
#endif
    return b;
  }
  static __device__ __forceinline__ int pv_k(int lane, int e) {
    return L::b_k(lane, e);
  }
  static __device__ __forceinline__ void mma(float (&c)[L::NC], const Op (&a)[L::NA],
                                             const Op (&b)[L::NB]) {
    ::ct::gpu::mma<WARP, E>(c, a, b);
  }
  // B fragments by ldmatrix where mma.sync runs (or the SIMT runtime's collective): the
  // m16n8k16 tile. Elsewhere (gfx1030, gfx90a's warp-32 instantiations, CUDA before sm_80) the
  // tile's scalar form takes elements, read one by one.
  static constexpr bool kLdmatrix = WARP == 32 && kMmaTile32;
  // c += a b with b as its two registers (ldmatrix's; elements 2r, 2r + 1 in register r).
  static __device__ __forceinline__ void mma_r(float (&c)[L::NC], const Op (&a)[L::NA],
                                               std::uint32_t b0, std::uint32_t b1) {
    std::uint32_t ra[L::NA / 2];
    CT_TC_UNROLL
    for (int r = 0; r < L::NA / 2; ++r)
      ra[r] = a[2 * r] | static_cast<std::uint32_t>(a[2 * r + 1]) << 16;
    const std::uint32_t rb[2] = {b0, b1};
    mma_regs<WARP, E>(c, ra, rb);
  }
};
template <>
struct Tc<32, F32> : MmaLayoutTf32 {
  using L = MmaLayoutTf32;
  using Op = std::uint32_t;
  static __device__ __forceinline__ Op enter(Op stored) { return of(bits_f32(stored)); }
  static __device__ __forceinline__ Op of(float v) { return f32_bits(ct_f32_to_tf32(v)); }
  static __device__ __forceinline__ int pv_k(int lane, int e) { return lane % 4 * 2 + e; }
  static __device__ __forceinline__ void mma(float (&c)[L::NC], const Op (&a)[L::NA],
                                             const Op (&b)[L::NB]) {
    mma_tf32(c, a, b);
  }
  static constexpr bool kLdmatrix = false;  // 32-bit elements: read one by one
  static __device__ __forceinline__ void mma_r(float (&)[L::NC], const Op (&)[L::NA], std::uint32_t,
                                               std::uint32_t) {}
};

constexpr int kRows = 64;  // query (key) rows a block
template <typename Op>
constexpr int kPad = 16 / sizeof(Op);  // elements after each staged row (keeps 16-byte rows)
template <typename E, int HS>          // key rows a staged tile (forward, query kernel)
constexpr int kKeys = sizeof(typename E::Storage) == 4 && HS == 128 ? 32 : 64;
template <int HS>
constexpr int kQueries = HS == 128 ? 32 : 64;  // query rows a staged tile (key kernel)
template <int WARP>
constexpr int kThreads = kRows / MmaLayout<WARP>::TM* WARP;  // 128 at warp 32 and 64
template <typename Op, int HS>  // the key kernel's v rows (dynamic shared memory)
constexpr std::size_t kVRowBytes = sizeof(Op) * kRows*(HS + kPad<Op>);

struct TcDims {
  std::int64_t T;
  std::int64_t Tq;  // rows of out and lse: positions T - Tq .. T - 1 (the forward's; else T)
  std::int64_t C, NH, NKV, hs;
  std::int64_t C3;  // C + 2 NKV hs, the row of qkv
  std::int64_t G;   // NH / NKV query heads a key/value head
  float scale;
};

// 16 bytes of operands: the unit of the staging copies.
template <typename Op>
struct alignas(16) Vec16 {
  Op h[16 / sizeof(Op)];
};

// The rows of C fragments (MmaLayout<WARP>::c_row): lane l's NC values lie on kSlots rows, kPer
// consecutive values a row; the kRowLanes lanes of a row are those that differ in the low
// log2(kRowLanes) bits of the lane (m16n8k16: lanes 4g .. 4g+3 hold row g; 32x32x8: lanes
// 0-31 and 32-63 each hold a whole row).
template <int WARP>
struct CRows {
  static constexpr int kPer = WARP == 32 ? 2 : 1;
  static constexpr int kSlots = MmaLayout<WARP>::NC / kPer;
  static constexpr int kRowLanes = MmaLayout<WARP>::TN / kPer;
};
template <int WARP>
__device__ __forceinline__ int c_slot_row(int lane, int slot) {
  return MmaLayout<WARP>::c_row(lane, slot * CRows<WARP>::kPer);
}

// Max and sum over the lanes of a row (a butterfly: every lane ends with the same bits, since
// each level adds the same two values in either order).
template <int WARP>
__device__ __forceinline__ float row_max(float v) {
  CT_TC_UNROLL
  for (int m = 1; m < CRows<WARP>::kRowLanes; m *= 2) v = fmaxf(v, ct_shfl_xor(v, m, WARP));
  return v;
}
template <int WARP>
__device__ __forceinline__ float row_sum(float v) {
  CT_TC_UNROLL
  for (int m = 1; m < CRows<WARP>::kRowLanes; m *= 2) v += ct_shfl_xor(v, m, WARP);
  return v;
}

// Rows r0 .. r0 + N of a tensor with rows of `stride` elements, HS elements from element `at`
// of row 0, into dst[N][HS + kPad] as operands; rows at or past T are zeros. 16-bit operands (the
// stored bits) go by ct_cp_async_16: asynchronous on sm_80+ (the caller commits the group and
// waits for it before a barrier; on SIMT the copy lands at that wait), a plain copy on HIP and
// older CUDA. f32 ones are rounded to TF32 on the
// way (T::enter), so they are loaded and stored by the thread.
template <typename T, int N, int HS, int THREADS>
__device__ __forceinline__ void stage(typename T::Op* dst, const void* src, std::int64_t at,
                                      std::int64_t stride, std::int64_t r0, std::int64_t TT) {
  using Op = typename T::Op;
  constexpr int kPer = 16 / sizeof(Op), kChunks = HS / kPer, kLd = HS + kPad<Op>;
  // Each thread copies one 16-byte column c of rows rr, rr + kRowsPer, ...
  constexpr int kRowsPer = THREADS / kChunks;
  static_assert(THREADS % kChunks == 0 && N % kRowsPer == 0, "whole rounds of 16-byte copies");
  const auto* s = static_cast<const Op*>(src) + at;
  const int c = static_cast<int>(threadIdx.x) % kChunks,
            rr = static_cast<int>(threadIdx.x) / kChunks;
  Op* d = dst + rr * kLd + kPer * c;
  CT_TC_UNROLL
  for (int i = 0; i < N / kRowsPer; ++i) {
    const std::int64_t r = r0 + rr + i * kRowsPer;
    Op* di = d + i * kRowsPer * kLd;
    if constexpr (sizeof(Op) == 2) {
      // (no offset from s unless inside: a row past T may lie past the tensor)
      ct_cp_async_16(di, r < TT ? s + r * stride + kPer * c : s, r < TT ? 16 : 0);
    } else {
      Vec16<Op> v{};
      if (r < TT) v = *reinterpret_cast<const Vec16<Op>*>(s + r * stride + kPer * c);
      for (int k = 0; k < kPer; ++k) v.h[k] = T::enter(v.h[k]);
      *reinterpret_cast<Vec16<Op>*>(di) = v;
    }
  }
}

// The A fragments (rows r0 .. r0 + TM of a tensor with rows of `stride` elements, HS columns
// from element `at` of row 0) of the HS / TK k-steps, straight from global memory; rows at or
// past T are zeros.
template <typename T, int HS>
__device__ __forceinline__ void load_a(typename T::Op (&a)[HS / T::TK][T::NA], const void* src,
                                       std::int64_t at, std::int64_t stride, std::int64_t r0,
                                       std::int64_t TT, int lane) {
  using Op = typename T::Op;
  const auto* s = static_cast<const Op*>(src) + at;
  CT_TC_UNROLL
  for (int kk = 0; kk < HS / T::TK; ++kk) CT_TC_UNROLL
  for (int e = 0; e < T::NA; ++e) {
    const std::int64_t r = r0 + T::a_row(lane, e);
    a[kk][e] = r < TT ? T::enter(s[r * stride + kk * T::TK + T::a_k(lane, e)]) : Op{0};
  }
}

// The A fragment of k-step kk of a warp's TM staged rows (rows[TM][HS + kPad]), as load_a gives
// it. On the m16n8k16 tile one ldmatrix.x4: matrices 0-3 are (rows +0, k +0), (rows +8, k +0),
// (rows +0, k +8), (rows +8, k +8), A's registers 0-3 in mma.sync's order (elements 2r, 2r + 1
// in register r); lane l addresses row l % 8 of matrix l / 8.
template <typename T, int HS>
__device__ __forceinline__ void a_of_staged(typename T::Op (&a)[T::NA], const typename T::Op* rows,
                                            int kk, int lane) {
  using Op = typename T::Op;
  constexpr int kLd = HS + kPad<Op>;
  if constexpr (T::kLdmatrix) {
    static_assert(T::NA == 8 && T::TK == 16, "the m16n8k16 tile");
    std::uint32_t r[4];
    ct_ldmatrix_x4(r, rows + (lane / 8 % 2 * 8 + lane % 8) * kLd + lane / 16 * 8 + kk * T::TK);
    CT_TC_UNROLL
    for (int i = 0; i < 4; ++i)
      a[2 * i] = static_cast<Op>(r[i] & 0xffffu), a[2 * i + 1] = static_cast<Op>(r[i] >> 16);
  } else {
    CT_TC_UNROLL
    for (int e = 0; e < T::NA; ++e)
      a[e] = rows[T::a_row(lane, e) * kLd + kk * T::TK + T::a_k(lane, e)];
  }
}

// c[mt][NT] += a[mt][ka] b^T for k-step kk of the head dimension and each of the warp's MT
// m-tiles (TM rows each): a[mt][ka] the m-tile's A fragment (rows x TK), b the staged rows n0 ..
// n0 + NT TN of a tile [.][HS + kPad] (B[k][n] = tile[n][k]). On the m16n8k16 tile one
// ldmatrix.x4 gives the B fragments of n-tiles nt and nt + 1: matrices 0-3 are (keys +0, k +0),
// (keys +0, k +8), (keys +8, k +0), (keys +8, k +8), whose rows (8 consecutive k of one staged
// row) lane l addresses as row l % 8 of matrix l / 8; those fragments feed the MT m-tiles'
// products (2 MT mma.sync an ldmatrix.x4).
template <typename T, int HS, int NT, int MT, int KS>
__device__ __forceinline__ void mma_abt_step(float (&c)[MT][NT][T::NC],
                                             const typename T::Op (&a)[MT][KS][T::NA], int ka,
                                             const typename T::Op* tile, int kk, int lane) {
  constexpr int kLd = HS + kPad<typename T::Op>;
  if constexpr (T::kLdmatrix) {
    static_assert(NT % 2 == 0 && T::TK == 16 && T::TN == 8, "the m16n8k16 tile");
    const typename T::Op* row = tile + (lane / 16 * 8 + lane % 8) * kLd + lane / 8 % 2 * 8;
    CT_TC_UNROLL
    for (int nt = 0; nt < NT; nt += 2) {
      std::uint32_t r[4];
      ct_ldmatrix_x4(r, row + nt * T::TN * kLd + kk * T::TK);
      CT_TC_UNROLL
      for (int mt = 0; mt < MT; ++mt) {
        T::mma_r(c[mt][nt], a[mt][ka], r[0], r[1]);
        T::mma_r(c[mt][nt + 1], a[mt][ka], r[2], r[3]);
      }
    }
  } else {
    CT_TC_UNROLL
    for (int nt = 0; nt < NT; ++nt) {
      typename T::Op b[T::NB];
      CT_TC_UNROLL
      for (int e = 0; e < T::NB; ++e)
        b[e] = tile[(nt * T::TN + T::b_col(lane, e)) * kLd + kk * T::TK + T::b_k(lane, e)];
      CT_TC_UNROLL
      for (int mt = 0; mt < MT; ++mt) T::mma(c[mt][nt], a[mt][ka], b);
    }
  }
}

// c[mt][NT] += a[mt] b^T over the head dimension (mma_abt_step's b), a the MT m-tiles' A
// fragments (rows x HS) in registers. Each c[mt][nt] adds its k-steps in order.
template <typename T, int HS, int NT, int MT>
__device__ __forceinline__ void mma_abt(float (&c)[MT][NT][T::NC],
                                        const typename T::Op (&a)[MT][HS / T::TK][T::NA],
                                        const typename T::Op* tile, int lane) {
  CT_TC_UNROLL
  for (int kk = 0; kk < HS / T::TK; ++kk) mma_abt_step<T, HS, NT>(c, a, kk, tile, kk, lane);
}
// The same for one m-tile (the backward kernels' warps).
template <typename T, int HS, int NT>
__device__ __forceinline__ void mma_abt(float (&c)[NT][T::NC],
                                        const typename T::Op (&a)[HS / T::TK][T::NA],
                                        const typename T::Op* tile, int lane) {
  using A = const typename T::Op(&)[1][HS / T::TK][T::NA];
  mma_abt<T, HS, NT>(reinterpret_cast<float(&)[1][NT][T::NC]>(c), reinterpret_cast<A>(a), tile,
                     lane);
}

// The same with a as the warp's TM staged rows (a_of_staged, one k-step's fragment at a time):
// the same products in the same order, without HS / TK fragments held in registers.
template <typename T, int HS, int NT>
__device__ __forceinline__ void mma_abt_staged(float (&c)[NT][T::NC], const typename T::Op* rows,
                                               const typename T::Op* tile, int lane) {
  CT_TC_UNROLL
  for (int kk = 0; kk < HS / T::TK; ++kk) {
    typename T::Op a[1][1][T::NA];
    a_of_staged<T, HS>(a[0][0], rows, kk, lane);
    mma_abt_step<T, HS, NT>(reinterpret_cast<float(&)[1][NT][T::NC]>(c), a, 0, tile, kk, lane);
  }
}

// c[mt][HS / TN] += a[mt] b for each of the MT m-tiles: a[mt] the A fragments (from c_to_a) of
// KT k-steps over the staged tile's rows, b the staged tile [KT TK][HS + kPad] (B[k][n] =
// tile[k][n], k in c_to_a's order). On the m16n8k16 tile one ldmatrix.x4.trans gives the B
// fragments of n-tiles dt and dt + 1 (head columns) for one k-step: matrices 0-3 are (k +0,
// n +0), (k +8, n +0), (k +0, n +8), (k +8, n +8), each 8 staged rows (k) of 8 columns,
// transposed on the way; they feed the MT m-tiles' products.
template <typename T, int HS, int KT, int MT>
__device__ __forceinline__ void mma_ab(float (&c)[MT][HS / T::TN][T::NC],
                                       const typename T::Op (&a)[MT][KT][T::NA],
                                       const typename T::Op* tile, int lane) {
  constexpr int kLd = HS + kPad<typename T::Op>;
  if constexpr (T::kLdmatrix) {
    static_assert((HS / T::TN) % 2 == 0 && T::TK == 16 && T::TN == 8, "the m16n8k16 tile");
    const typename T::Op* row = tile + (lane / 8 % 2 * 8 + lane % 8) * kLd + lane / 16 * 8;
    CT_TC_UNROLL
    for (int dt = 0; dt < HS / T::TN; dt += 2) CT_TC_UNROLL
    for (int kk = 0; kk < KT; ++kk) {
      std::uint32_t r[4];
      ct_ldmatrix_x4_trans(r, row + kk * T::TK * kLd + dt * T::TN);
      CT_TC_UNROLL
      for (int mt = 0; mt < MT; ++mt) {
        T::mma_r(c[mt][dt], a[mt][kk], r[0], r[1]);
        T::mma_r(c[mt][dt + 1], a[mt][kk], r[2], r[3]);
      }
    }
  } else {
    CT_TC_UNROLL
    for (int dt = 0; dt < HS / T::TN; ++dt) CT_TC_UNROLL
    for (int kk = 0; kk < KT; ++kk) {
      typename T::Op b[T::NB];
      CT_TC_UNROLL
      for (int e = 0; e < T::NB; ++e)
        b[e] = tile[(kk * T::TK + T::pv_k(lane, e)) * kLd + dt * T::TN + T::b_col(lane, e)];
      CT_TC_UNROLL
      for (int mt = 0; mt < MT; ++mt) T::mma(c[mt][dt], a[mt][kk], b);
    }
  }
}
// The same for one m-tile (the backward kernels' warps).
template <typename T, int HS, int KT>
__device__ __forceinline__ void mma_ab(float (&c)[HS / T::TN][T::NC],
                                       const typename T::Op (&a)[KT][T::NA],
                                       const typename T::Op* tile, int lane) {
  using A = const typename T::Op(&)[1][KT][T::NA];
  mma_ab<T, HS, KT>(reinterpret_cast<float(&)[1][HS / T::TN][T::NC]>(c), reinterpret_cast<A>(a),
                    tile, lane);
}

// The C fragments c[NT] (the warp's TM rows x NT TN columns), as operands (Tc::of), as the A
// fragments of NT TN / TK k-steps over those columns. scratch: the warp's TM x (NT TN + kPad)
// elements of shared memory (used at warp 64 only). Called by the whole warp.
template <int WARP, typename T, int NT>
__device__ __forceinline__ void c_to_a(typename T::Op (&a)[NT * T::TN / T::TK][T::NA],
                                       const float (&c)[NT][T::NC], typename T::Op* scratch,
                                       int lane) {
  if constexpr (WARP == 32 && T::TK == 8) {
    // m16n8k8: A element e of k-step j is row g + 8 (e % 2), k position q + 4 (e / 2), which
    // stands for column 2q + e / 2 (pv_k): C element 2 (e % 2) + e / 2 of n-tile j.
    (void)scratch;
    CT_TC_UNROLL
    for (int j = 0; j < NT; ++j) CT_TC_UNROLL
    for (int e = 0; e < T::NA; ++e) a[j][e] = T::of(c[j][2 * (e % 2) + e / 2]);
  } else if constexpr (WARP == 32) {
    // m16n8k16: A element e of k-step j: row g + 8 (e / 2 % 2), column 2q + e % 2 + 8 (e / 4),
    // which is C element e % 4 of n-tile 2j + e / 4 (c_row, c_col) -- the same lane.
    (void)scratch;
    CT_TC_UNROLL
    for (int j = 0; j < NT / 2; ++j) CT_TC_UNROLL
    for (int e = 0; e < T::NA; ++e) a[j][e] = T::of(c[2 * j + e / 4][e % 4]);
  } else {
    constexpr int kLd = NT * T::TN + kPad<typename T::Op>;
    CT_TC_UNROLL
    for (int nt = 0; nt < NT; ++nt) CT_TC_UNROLL
    for (int e = 0; e < T::NC; ++e)
      scratch[T::c_row(lane, e) * kLd + nt * T::TN + T::c_col(lane, e)] = T::of(c[nt][e]);
    ct_syncwarp();
    CT_TC_UNROLL
    for (int kk = 0; kk < NT * T::TN / T::TK; ++kk) CT_TC_UNROLL
    for (int e = 0; e < T::NA; ++e)
      a[kk][e] = scratch[T::a_row(lane, e) * kLd + kk * T::TK + T::a_k(lane, e)];
    ct_syncwarp();  // before the scratch is written again
  }
}

// Where key / value head j starts in a row of qkv.
__device__ __forceinline__ std::int64_t k_col(const TcDims& d, std::int64_t j) {
  return d.C + j * d.hs;
}
__device__ __forceinline__ std::int64_t v_col(const TcDims& d, std::int64_t j) {
  return d.C + (d.NKV + j) * d.hs;
}

// A position (a warp's first row or key, T) minus a tile's first position, as an int for the
// masks' 32-bit compares, saturated (past either end of a tile's 64 columns it decides the same).
__device__ __forceinline__ int tile_offset(std::int64_t x) {
  return static_cast<int>(x < INT_MIN ? INT_MIN : x > INT_MAX ? INT_MAX : x);
}

// The forward's scores: s = S scale, or -kFltMax where MASKED and the key (column) is after the
// row or at or past T. r: the warp's first row minus the tile's first key; n: T minus the tile's
// first key (tile_offset). Column kc of m-tile row rc is masked when kc - rc > r or kc >= n: key
// u0 + kc against row w0 + rc.
template <typename L, int MT, int NT, bool MASKED>
__device__ __forceinline__ void scale_scores(float (&s)[MT][NT][L::NC], float scale, int r, int n,
                                             int lane) {
  CT_TC_UNROLL
  for (int mt = 0; mt < MT; ++mt) CT_TC_UNROLL
  for (int t = 0; t < NT; ++t) CT_TC_UNROLL
  for (int e = 0; e < L::NC; ++e) {
    const int kc = t * L::TN + L::c_col(lane, e), rc = mt * L::TM + L::c_row(lane, e);
    s[mt][t][e] = !MASKED || (kc - rc <= r && kc < n) ? s[mt][t][e] * scale : -kFltMax;
  }
}

// The forward's m-tiles a warp: two at warp 32 for 16-bit operands at head size 64 (32 query
// rows a warp, 128 a block, as FlashAttention-2's forward: each B fragment the warps read from
// shared memory, a K or V tile's, feeds two m-tiles' mma.sync, so the ldmatrix traffic a product
// halves), else one (head size 128 and TF32's 32-bit operands would not fit the registers twice;
// warp 64's 32 x 32 tile has its 32 rows already). The same sums for every row either way.
template <int WARP, typename E, int HS>
constexpr int kFwdMTiles = WARP == 32 && sizeof(typename E::Storage) == 2 && HS == 64 ? 2 : 1;
template <int WARP, typename E, int HS>  // query rows a forward block (kThreads<WARP> threads)
constexpr int kFwdRows = kFwdMTiles<WARP, E, HS>* kRows;

// The first block of `rows` query rows holding a row of out: that of position T - Tq (0 when
// Tq = T).
__host__ __device__ __forceinline__ std::int64_t first_block(std::int64_t T, std::int64_t Tq,
                                                             int rows) {
  return (T - Tq) / rows;
}

// out (B, Tq, C), lse (B, NH, Tq) f32, qkv (B, T, C3). Block (x, y): query rows kFwdRows x' ..
// of head y = b NH + h, x' = first_block + gridDim.x - 1 - x (the longest causal rows start
// first); out's row i is position T - Tq + i. Warp w owns rows kFwdRows x' + MT TM w .., its
// m-tile mt the TM rows from MT TM w + mt TM.
template <int WARP, typename E, int HS>
__global__ void CT_LAUNCH_BOUNDS(kThreads<WARP>)
    flash_tc_forward_kernel(void* out, float* lse, const void* qkv, TcDims d) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads<WARP>);
  CT_ONLY_ON_ITS_WARP(WARP);
  using L = Tc<WARP, E>;
  using Op = typename L::Op;
  using R = CRows<WARP>;
  constexpr int MT = kFwdMTiles<WARP, E, HS>, kBlockRows = kFwdRows<WARP, E, HS>;
  constexpr int kK = kKeys<E, HS>, kPd = kPad<Op>, kV = 16 / sizeof(Op);
  constexpr int kLd = HS + kPd, NT = kK / L::TN, KT = kK / L::TK, DT = HS / L::TN;
  constexpr int kScratch = WARP == 32 ? kV : kRows * (kK + kPd);
  // A warp's rows start at a multiple of MT TM and key tiles at multiples of kK, so an m-tile
  // sees a key tile exactly when its warp does (below: `sees`).
  static_assert(MT == 1 || kK % (MT * L::TM) == 0, "key tiles of whole warps' rows");
  static_assert(WARP == 32 || MT == 1, "the per-warp scratch of c_to_a holds one m-tile");
  CT_SHARED(Vec16<Op>, ks16, kK * kLd / kV);
  CT_SHARED(Vec16<Op>, vs16, kK * kLd / kV);
  CT_SHARED(Vec16<Op>, ps16, kScratch / kV);
  auto* ks = reinterpret_cast<Op*>(ks16);
  auto* vs = reinterpret_cast<Op*>(vs16);
  const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
  Op* ps = reinterpret_cast<Op*>(ps16) + warp * L::TM * (kK + kPd);
  const std::int64_t b = blockIdx.y / d.NH, h = blockIdx.y % d.NH, j = h / d.G;
  const std::int64_t p0 = d.T - d.Tq;  // the position of out's row 0
  const std::int64_t q0 =
      (first_block(d.T, d.Tq, kBlockRows) + static_cast<std::int64_t>(gridDim.x - 1 - blockIdx.x)) *
      kBlockRows;
  const std::int64_t w0 = q0 + warp * MT * L::TM;  // the warp's first row
  const std::int64_t row0 = b * d.T * d.C3;        // qkv's row 0 of batch b

  Op qa[MT][HS / L::TK][L::NA];
  CT_TC_UNROLL
  for (int mt = 0; mt < MT; ++mt)
    load_a<L, HS>(qa[mt], qkv, row0 + h * d.hs, d.C3, w0 + mt * L::TM, d.T, lane);
  float o[MT][DT][L::NC];
  CT_TC_UNROLL
  for (int mt = 0; mt < MT; ++mt) CT_TC_UNROLL
  for (int t = 0; t < DT; ++t) CT_TC_UNROLL
  for (int e = 0; e < L::NC; ++e) o[mt][t][e] = 0.0f;
  float m[MT][R::kSlots], l[MT][R::kSlots];
  CT_TC_UNROLL
  for (int mt = 0; mt < MT; ++mt) CT_TC_UNROLL
  for (int s = 0; s < R::kSlots; ++s) m[mt][s] = -kFltMax, l[mt][s] = 0.0f;

  // The pipeline (FlashAttention-2's): k of tile u0 + kK is copied while the warps compute
  // O += P V of tile u0, v of tile u0 while they compute S = Q K^T. Each copy is one group of
  // ct_cp_async_16 per thread, waited for before the barrier that precedes its first read; the
  // barrier before each copy is after the last read of what it overwrites.
  const std::int64_t last = q0 + kBlockRows - 1 < d.T - 1 ? q0 + kBlockRows - 1 : d.T - 1;
  stage<L, kK, HS, kThreads<WARP>>(ks, qkv, row0 + k_col(d, j), d.C3, 0, d.T);
  ct_cp_async_commit();
  for (std::int64_t u0 = 0; u0 <= last; u0 += kK) {
    ct_cp_async_wait<0>();
    __syncthreads();  // k of tile u0 is in; every warp is done with v of the tile before
    stage<L, kK, HS, kThreads<WARP>>(vs, qkv, row0 + v_col(d, j), d.C3, u0, d.T);
    ct_cp_async_commit();
    // Some row of the warp sees a key of the tile (warp-uniform).
    const bool sees = u0 <= w0 + MT * L::TM - 1;
    float s[MT][NT][L::NC];
    if (sees) {
      CT_TC_UNROLL
      for (int mt = 0; mt < MT; ++mt) CT_TC_UNROLL
      for (int t = 0; t < NT; ++t) CT_TC_UNROLL
      for (int e = 0; e < L::NC; ++e) s[mt][t][e] = 0.0f;
      mma_abt<L, HS, NT>(s, qa, ks, lane);
      // Scaled scores; -kFltMax for keys after the row or past T, which only tiles reaching the
      // warp's first row or T have (warp-uniform): the others skip the mask.
      const bool whole = u0 + kK - 1 <= w0 && u0 + kK <= d.T;
      if (whole)
        scale_scores<L, MT, NT, false>(s, d.scale, 0, 0, lane);
      else
        scale_scores<L, MT, NT, true>(s, d.scale, tile_offset(w0 - u0), tile_offset(d.T - u0),
                                      lane);
      CT_TC_UNROLL
      for (int mt = 0; mt < MT; ++mt) {
        float mx[R::kSlots];
        CT_TC_UNROLL
        for (int r = 0; r < R::kSlots; ++r) mx[r] = -kFltMax;
        CT_TC_UNROLL
        for (int t = 0; t < NT; ++t) CT_TC_UNROLL
        for (int e = 0; e < L::NC; ++e) mx[e / R::kPer] = fmaxf(mx[e / R::kPer], s[mt][t][e]);
        // Masked scores are -kFltMax (finite: fast-math builds may assume no infinities), so a
        // row without a key so far has m = -kFltMax; its exponentials use 0 instead, and give 0.
        float mu[R::kSlots];
        CT_TC_UNROLL
        for (int r = 0; r < R::kSlots; ++r) {
          const float mnew = fmaxf(m[mt][r], row_max<WARP>(mx[r]));
          mu[r] = mnew == -kFltMax ? 0.0f : mnew;
          const float corr = ct_exp_le0_tile(m[mt][r] - mu[r]);  // 0 while m is -kFltMax
          l[mt][r] *= corr;
          CT_TC_UNROLL
          for (int t = 0; t < DT; ++t) CT_TC_UNROLL
          for (int e = 0; e < R::kPer; ++e) o[mt][t][r * R::kPer + e] *= corr;
          m[mt][r] = mnew;
        }
        CT_TC_UNROLL
        for (int t = 0; t < NT; ++t) CT_TC_UNROLL
        for (int e = 0; e < L::NC; ++e) {
          const float p = ct_exp_le0_tile(s[mt][t][e] - mu[e / R::kPer]);
          s[mt][t][e] = p;
          l[mt][e / R::kPer] += p;
        }
      }
    }
    ct_cp_async_wait<0>();
    __syncthreads();  // v of tile u0 is in; every warp is done with its k
    if (u0 + kK <= last)
      stage<L, kK, HS, kThreads<WARP>>(ks, qkv, row0 + k_col(d, j), d.C3, u0 + kK, d.T);
    ct_cp_async_commit();
    if (sees) {
      Op pa[MT][KT][L::NA];
      CT_TC_UNROLL
      for (int mt = 0; mt < MT; ++mt) c_to_a<WARP, L, NT>(pa[mt], s[mt], ps, lane);
      mma_ab<L, HS, KT>(o, pa, vs, lane);
    }
  }
  ct_cp_async_wait<0>();  // the empty group of the last tile

  CT_TC_UNROLL
  for (int mt = 0; mt < MT; ++mt) {
    float inv[R::kSlots];
    CT_TC_UNROLL
    for (int r = 0; r < R::kSlots; ++r) {
      l[mt][r] = row_sum<WARP>(l[mt][r]);
      inv[r] = 1.0f / l[mt][r];
      const std::int64_t row = w0 + mt * L::TM + c_slot_row<WARP>(lane, r);
      if (row >= p0 && row < d.T && lane % R::kRowLanes == 0)
        lse[(b * d.NH + h) * d.Tq + row - p0] = m[mt][r] + logf(l[mt][r]);
    }
    CT_TC_UNROLL
    for (int t = 0; t < DT; ++t) CT_TC_UNROLL
    for (int e = 0; e < L::NC; ++e) {
      const std::int64_t row = w0 + mt * L::TM + L::c_row(lane, e);
      if (row >= p0 && row < d.T)
        E::store(out, (b * d.Tq + row - p0) * d.C + h * d.hs + t * L::TN + L::c_col(lane, e),
                 o[mt][t][e] * inv[e / R::kPer]);
    }
  }
}

// Per query row: D (B, NH, T) f32 into the workspace, and dq into the q columns of dqkv
// (B, T, C3). Blocks as the forward's.
template <int WARP, typename E, int HS>
__global__ void CT_LAUNCH_BOUNDS(kThreads<WARP>)
    flash_tc_backward_query_kernel(void* dqkv, float* Dsave, const void* dout, const void* out,
                                   const void* qkv, const float* lse, TcDims d) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads<WARP>);
  CT_ONLY_ON_ITS_WARP(WARP);
  using L = Tc<WARP, E>;
  using Op = typename L::Op;
  using R = CRows<WARP>;
  constexpr int kK = kKeys<E, HS>, kPd = kPad<Op>, kV = 16 / sizeof(Op);
  constexpr int kLd = HS + kPd, NT = kK / L::TN, KT = kK / L::TK, DT = HS / L::TN;
  constexpr int kScratch = WARP == 32 ? kV : kRows * (kK + kPd);
  CT_SHARED(Vec16<Op>, ks16, kK * kLd / kV);
  CT_SHARED(Vec16<Op>, vs16, kK * kLd / kV);
  CT_SHARED(Vec16<Op>, ps16, kScratch / kV);
  auto* ks = reinterpret_cast<Op*>(ks16);
  auto* vs = reinterpret_cast<Op*>(vs16);
  const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
  Op* ps = reinterpret_cast<Op*>(ps16) + warp * L::TM * (kK + kPd);
  const std::int64_t b = blockIdx.y / d.NH, h = blockIdx.y % d.NH, j = h / d.G;
  const std::int64_t q0 = static_cast<std::int64_t>(gridDim.x - 1 - blockIdx.x) * kRows;
  const std::int64_t w0 = q0 + warp * L::TM;
  const std::int64_t row0 = b * d.T * d.C3, orow0 = b * d.T * d.C;

  Op qa[HS / L::TK][L::NA], ga[HS / L::TK][L::NA];
  load_a<L, HS>(qa, qkv, row0 + h * d.hs, d.C3, w0, d.T, lane);
  load_a<L, HS>(ga, dout, orow0 + h * d.hs, d.C, w0, d.T, lane);
  // D of the warp's rows: each of the kRowLanes lanes holding a row sums its part of the HS
  // products in order, then the row's butterfly (row_sum) adds the parts.
  float D[R::kSlots], ls[R::kSlots];
  constexpr int kPart = HS / R::kRowLanes;
  const int part = lane % R::kRowLanes;
  CT_TC_UNROLL
  for (int r = 0; r < R::kSlots; ++r) {
    const std::int64_t row = w0 + c_slot_row<WARP>(lane, r);
    float acc = 0.0f;
    if (row < d.T) {
      const std::int64_t o0 = orow0 + row * d.C + h * d.hs + part * kPart;
      CT_TC_UNROLL
      for (int i = 0; i < kPart; ++i) acc += E::load(dout, o0 + i) * E::load(out, o0 + i);
    }
    D[r] = row_sum<WARP>(acc);
    ls[r] = row < d.T ? lse[(b * d.NH + h) * d.T + row] : 0.0f;
    if (row < d.T && part == 0) Dsave[(b * d.NH + h) * d.T + row] = D[r];
  }
  float dq[DT][L::NC];
  CT_TC_UNROLL
  for (int t = 0; t < DT; ++t) CT_TC_UNROLL
  for (int e = 0; e < L::NC; ++e) dq[t][e] = 0.0f;

  // The pipeline: v of tile u0 + kK is copied while the warps compute dS and dQ += dS K of tile
  // u0, k of tile u0 + kK while they compute dP = dO V^T of tile u0 + kK. Groups are committed in
  // the order v, k, so waiting until at most one is pending means v is in.
  const std::int64_t last = q0 + kRows - 1 < d.T - 1 ? q0 + kRows - 1 : d.T - 1;
  stage<L, kK, HS, kThreads<WARP>>(vs, qkv, row0 + v_col(d, j), d.C3, 0, d.T);
  ct_cp_async_commit();
  stage<L, kK, HS, kThreads<WARP>>(ks, qkv, row0 + k_col(d, j), d.C3, 0, d.T);
  ct_cp_async_commit();
  for (std::int64_t u0 = 0; u0 <= last; u0 += kK) {
    const bool sees = u0 <= w0 + L::TM - 1;  // as the forward's
    const bool more = u0 + kK <= last;
    ct_cp_async_wait<1>();
    __syncthreads();  // v of tile u0 is in
    float s[NT][L::NC], dp[NT][L::NC];
    if (sees) {
      CT_TC_UNROLL
      for (int t = 0; t < NT; ++t) CT_TC_UNROLL
      for (int e = 0; e < L::NC; ++e) s[t][e] = 0.0f, dp[t][e] = 0.0f;
      mma_abt<L, HS, NT>(dp, ga, vs, lane);
    }
    ct_cp_async_wait<0>();
    __syncthreads();  // k of tile u0 is in; every warp is done with v
    if (more) stage<L, kK, HS, kThreads<WARP>>(vs, qkv, row0 + v_col(d, j), d.C3, u0 + kK, d.T);
    ct_cp_async_commit();
    if (sees) {
      mma_abt<L, HS, NT>(s, qa, ks, lane);
      // P, 0 for keys after the row or past T (the forward's mask, only on tiles reaching the
      // warp's first row or T), and dS.
      auto ds = [&](auto masked) {
        const int dr = tile_offset(w0 - u0), dt = tile_offset(d.T - u0);
        CT_TC_UNROLL
        for (int t = 0; t < NT; ++t) CT_TC_UNROLL
        for (int e = 0; e < L::NC; ++e) {
          const int kc = t * L::TN + L::c_col(lane, e), rc = L::c_row(lane, e), r = e / R::kPer;
          const bool in = !decltype(masked)::value || (kc - rc <= dr && kc < dt);
          const float p = in ? ct_exp_le0_tile(s[t][e] * d.scale - ls[r]) : 0.0f;
          s[t][e] = p * (dp[t][e] - D[r]) * d.scale;
        }
      };
      // (At head size 128 the masked form only: with both, ptxas spilled the 16-bit kernels.)
      if (HS == 64 && u0 + kK - 1 <= w0 && u0 + kK <= d.T)
        ds(std::false_type{});
      else
        ds(std::true_type{});
      Op da[KT][L::NA];
      c_to_a<WARP, L, NT>(da, s, ps, lane);
      mma_ab<L, HS, KT>(dq, da, ks, lane);
    }
    __syncthreads();  // every warp is done with k
    if (more) stage<L, kK, HS, kThreads<WARP>>(ks, qkv, row0 + k_col(d, j), d.C3, u0 + kK, d.T);
    ct_cp_async_commit();
  }
  ct_cp_async_wait<0>();  // the empty groups of the last tile

  CT_TC_UNROLL
  for (int t = 0; t < DT; ++t) CT_TC_UNROLL
  for (int e = 0; e < L::NC; ++e) {
    const std::int64_t row = w0 + L::c_row(lane, e);
    if (row < d.T)
      E::store(dqkv, row0 + row * d.C3 + h * d.hs + t * L::TN + L::c_col(lane, e), dq[t][e]);
  }
}

// Per key row u of key/value head j: dk, dv into the k and v columns of dqkv (B, T, C3), from
// the query heads h = j G .. j G + G - 1 in order and, for each, the query tiles from u's in
// order, into one accumulator. Blocks over (b, j) key/value heads, kRows keys a block. Reads
// the D that flash_tc_backward_query_kernel saved.
template <int WARP, typename E, int HS>
__global__ void CT_LAUNCH_BOUNDS(kThreads<WARP>)
    flash_tc_backward_key_kernel(void* dqkv, const float* Dsave, const void* dout, const void* qkv,
                                 const float* lse, TcDims d) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads<WARP>);
  CT_ONLY_ON_ITS_WARP(WARP);
  using L = Tc<WARP, E>;
  using Op = typename L::Op;
  constexpr int kQ = kQueries<HS>, kPd = kPad<Op>, kV = 16 / sizeof(Op);
  constexpr int kLd = HS + kPd, NT = kQ / L::TN, KT = kQ / L::TK, DT = HS / L::TN;
  constexpr int kScratch = WARP == 32 ? kV : kRows * (kQ + kPd);
  CT_SHARED(Vec16<Op>, qs16, kQ * kLd / kV);
  CT_SHARED(Vec16<Op>, gs16, kQ * kLd / kV);
  CT_SHARED(Vec16<Op>, ps16, kScratch / kV);
  CT_SHARED(float, lq, kQ);
  CT_SHARED(float, Dq, kQ);
  // The block's v rows (kVRowBytes<Op, HS> of dynamic shared memory: with the static arrays past
  // 48 KB in f32): dP^T = V dO^T reads their A fragments a k-step at a time, so K's and V's
  // fragments, dK and dV are not all held in registers (at hs 128 they spilled).
  CT_DYNAMIC_SHARED(Op, vs);
  auto* qs = reinterpret_cast<Op*>(qs16);
  auto* gs = reinterpret_cast<Op*>(gs16);
  const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
  Op* ps = reinterpret_cast<Op*>(ps16) + warp * L::TM * (kQ + kPd);
  const Op* vrows = vs + warp * L::TM * kLd;
  const std::int64_t b = blockIdx.y / d.NKV, j = blockIdx.y % d.NKV;
  const std::int64_t k0 = static_cast<std::int64_t>(blockIdx.x) * kRows;
  const std::int64_t w0 = k0 + warp * L::TM;  // the warp's first key
  const std::int64_t row0 = b * d.T * d.C3, orow0 = b * d.T * d.C;

  Op ka[HS / L::TK][L::NA];
  load_a<L, HS>(ka, qkv, row0 + k_col(d, j), d.C3, w0, d.T, lane);
  // v in the first group, with the first dout
  stage<L, kRows, HS, kThreads<WARP>>(vs, qkv, row0 + v_col(d, j), d.C3, k0, d.T);
  float dk[DT][L::NC], dv[DT][L::NC];
  CT_TC_UNROLL
  for (int t = 0; t < DT; ++t) CT_TC_UNROLL
  for (int e = 0; e < L::NC; ++e) dk[t][e] = 0.0f, dv[t][e] = 0.0f;

  // The query tiles (h, t0): the G query heads of the group in order, each from k0 (kQ divides
  // kRows, so t0 = k0 starts a tile) to T. The pipeline: dout of the next tile is copied while
  // the warps compute dK += dS^T Q of this one, q (and its lse and D rows, plain stores) of the
  // next while they compute dP^T = V dO^T of the next. Groups are committed in the order dout,
  // q, so waiting until at most one is pending means dout is in.
  auto stage_dout = [&](std::int64_t h, std::int64_t t0) {
    stage<L, kQ, HS, kThreads<WARP>>(gs, dout, orow0 + h * d.hs, d.C, t0, d.T);
  };
  auto stage_q = [&](std::int64_t h, std::int64_t t0) {
    stage<L, kQ, HS, kThreads<WARP>>(qs, qkv, row0 + h * d.hs, d.C3, t0, d.T);
    const std::int64_t hrow = (b * d.NH + h) * d.T;
    for (int i = threadIdx.x; i < kQ; i += kThreads<WARP>) {
      const std::int64_t t = t0 + i;
      lq[i] = t < d.T ? lse[hrow + t] : 0.0f;
      Dq[i] = t < d.T ? Dsave[hrow + t] : 0.0f;
    }
  };
  const std::int64_t h_end = (j + 1) * d.G;
  if (k0 < d.T) {  // (always: the grid has no block past T)
    stage_dout(j * d.G, k0);
    ct_cp_async_commit();
    stage_q(j * d.G, k0);
    ct_cp_async_commit();
  }
  for (std::int64_t h = j * d.G, t0 = k0; h < h_end && t0 < d.T;) {
    // the tile after this one
    std::int64_t hn = h, tn = t0 + kQ;
    if (tn >= d.T) ++hn, tn = k0;
    const bool more = hn < h_end;
    // some query of the tile sees a key of the warp (warp-uniform)
    const bool sees = t0 + kQ - 1 >= w0;
    ct_cp_async_wait<1>();
    __syncthreads();  // dout of the tile is in
    float s[NT][L::NC], dp[NT][L::NC];
    if (sees) {
      CT_TC_UNROLL
      for (int t = 0; t < NT; ++t) CT_TC_UNROLL
      for (int e = 0; e < L::NC; ++e) s[t][e] = 0.0f, dp[t][e] = 0.0f;
      mma_abt_staged<L, HS, NT>(dp, vrows, gs, lane);  // dP^T
    }
    ct_cp_async_wait<0>();
    __syncthreads();  // q, lse and D of the tile are in
    Op pa[KT][L::NA];
    if (sees) {
      mma_abt<L, HS, NT>(s, ka, qs, lane);  // S^T: keys x queries
      // P^T, 0 for queries before the key or past T (only on tiles that start before the
      // warp's last key or reach T), and dS^T.
      auto ds = [&](auto masked) {
        const int dk = tile_offset(w0 - t0), dt = tile_offset(d.T - t0);
        CT_TC_UNROLL
        for (int t = 0; t < NT; ++t) CT_TC_UNROLL
        for (int e = 0; e < L::NC; ++e) {
          const int qq = t * L::TN + L::c_col(lane, e), kr = L::c_row(lane, e);
          const bool in = !decltype(masked)::value || (qq - kr >= dk && qq < dt);
          const float p = in ? ct_exp_le0_tile(s[t][e] * d.scale - lq[qq]) : 0.0f;
          s[t][e] = p;
          dp[t][e] = p * (dp[t][e] - Dq[qq]) * d.scale;
        }
      };
      if (t0 >= w0 + L::TM - 1 && t0 + kQ <= d.T)
        ds(std::false_type{});
      else
        ds(std::true_type{});
      c_to_a<WARP, L, NT>(pa, s, ps, lane);
      mma_ab<L, HS, KT>(dv, pa, gs, lane);
    }
    __syncthreads();  // every warp is done with dout
    if (more) stage_dout(hn, tn);
    ct_cp_async_commit();
    if (sees) {
      c_to_a<WARP, L, NT>(pa, dp, ps, lane);
      mma_ab<L, HS, KT>(dk, pa, qs, lane);
    }
    __syncthreads();  // every warp is done with q, lse and D
    if (more) stage_q(hn, tn);
    ct_cp_async_commit();
    h = hn, t0 = tn;
  }
  ct_cp_async_wait<0>();  // the empty groups of the last tile

  CT_TC_UNROLL
  for (int t = 0; t < DT; ++t) CT_TC_UNROLL
  for (int e = 0; e < L::NC; ++e) {
    const std::int64_t key = w0 + L::c_row(lane, e);
    if (key >= d.T) continue;
    const std::int64_t col = t * L::TN + L::c_col(lane, e);
    E::store(dqkv, row0 + key * d.C3 + k_col(d, j) + col, dk[t][e]);
    E::store(dqkv, row0 + key * d.C3 + v_col(d, j) + col, dv[t][e]);
  }
}

TcDims tc_dims_of(std::int64_t T, std::int64_t Tq, std::int64_t C, std::int64_t NH,
                  std::int64_t NKV) {
  const std::int64_t hs = C / NH;
  return TcDims{
      T, Tq, C, NH, NKV, hs, C + 2 * NKV * hs, NH / NKV, 1.0f / sqrtf(static_cast<float>(hs))};
}

// Calls fn(warp, element type, head size) as compile-time constants (the refusal passed).
template <typename Fn>
void with_tc(const Ctx& cx, Elem e, std::int64_t hs, Fn&& fn) {
  with_warp(cx.warp, [&](auto w) {
    auto by_hs = [&](auto el) {
      if (hs == 64)
        fn(w, el, std::integral_constant<int, 64>{});
      else
        fn(w, el, std::integral_constant<int, 128>{});
    };
    if (e == Elem::kBF16)
      by_hs(BF16{});
    else if (e == Elem::kF16)
      by_hs(F16{});
    else if constexpr (kTf32Tile && decltype(w)::value == 32)
      by_hs(F32{});  // the refusal passed: under TF32
  });
}

// Blocks of `rows` rows over B x heads heads: those from first_block(T, Tq, rows) (the forward
// of the last Tq rows; Tq = T: all of them).
dim3 tc_grid(std::int64_t B, std::int64_t T, std::int64_t heads, std::int64_t Tq, int rows) {
  return dim3(static_cast<unsigned>((T + rows - 1) / rows - first_block(T, Tq, rows)),
              static_cast<unsigned>(B * heads));
}

}  // namespace

std::string flash_attention_tc_refusal(const Ctx& cx, Elem e, std::int64_t hs,
                                       std::initializer_list<const void*> staged) {
  if (!cx.matrix_tiles) return "the device runs no matrix tiles";
  if (e == Elem::kF32 && !cx.tf32) return "f32 without TF32 (--tf32 on a device that has it)";
  if (e == Elem::kF32 && !kTf32Tile) return "f32 (no TF32 tile on HIP; the tile takes f16, bf16)";
  if (e == Elem::kF32 && cx.warp != 32)
    return "f32 at warp 64 (the TF32 tile is mma.sync m16n8k8, warp 32; no MFMA f32 form)";
  if (hs != 64 && hs != 128) return "head size " + std::to_string(hs) + " (the tile takes 64, 128)";
  for (const void* p : staged)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return "an operand not 16-byte aligned";
  return "";
}

void flash_attention_tc_forward(const Ctx& cx, void* out, float* lse, const void* qkv, Elem e,
                                std::int64_t B, std::int64_t T, std::int64_t Tq, std::int64_t C,
                                std::int64_t NH, std::int64_t NKV) {
  if (B * Tq * C <= 0) return;
  const TcDims d = tc_dims_of(T, Tq, C, NH, NKV);
  with_tc(cx, e, d.hs, [&](auto w, auto el, auto hsz) {
    constexpr int W = decltype(w)::value, HS = decltype(hsz)::value;
    using E = decltype(el);
    launch<W>(CT_KERNEL(flash_tc_forward_kernel<W, E, HS>),
              tc_grid(B, T, NH, Tq, kFwdRows<W, E, HS>), dim3(kThreads<W>), 0, stream_of(cx), out,
              lse, qkv, d);
  });
}

void flash_attention_tc_backward(const Ctx& cx, void* dqkv, const void* dout, const void* qkv,
                                 const void* out, const float* lse, Elem e, std::int64_t B,
                                 std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t NKV,
                                 void* workspace) {
  if (B * T * C <= 0) return;
  const TcDims d = tc_dims_of(T, T, C, NH, NKV);
  auto* D = static_cast<float*>(workspace);
  with_tc(cx, e, d.hs, [&](auto w, auto el, auto hsz) {
    constexpr int W = decltype(w)::value, HS = decltype(hsz)::value;
    using E = decltype(el);
    launch<W>(CT_KERNEL(flash_tc_backward_query_kernel<W, E, HS>), tc_grid(B, T, NH, T, kRows),
              dim3(kThreads<W>), 0, stream_of(cx), dqkv, D, dout, out, qkv, lse, d);
    constexpr std::size_t kVBytes = kVRowBytes<typename Tc<W, E>::Op, HS>;
#if defined(CT_GPU_CUDA)
    // Past 48 KB with the static arrays (f32: 52 KB at hs 64, 67 KB at hs 128; 16-bit 28-35 KB)
    // a kernel takes dynamic shared memory only when asked (per device: every call, as gemm_tc
    // and FlashAttention-2 do, also while a graph is captured).
    if constexpr (sizeof(typename Tc<W, E>::Op) == 4) {
      const cudaError_t err = cudaFuncSetAttribute(flash_tc_backward_key_kernel<W, E, HS>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(kVBytes));
      if (err != cudaSuccess)
        throw std::runtime_error(std::string("flash_attention_tc: cudaFuncSetAttribute failed: ") +
                                 cudaGetErrorString(err));
    }
#endif
    launch<W>(CT_KERNEL(flash_tc_backward_key_kernel<W, E, HS>), tc_grid(B, T, NKV, T, kRows),
              dim3(kThreads<W>), kVBytes, stream_of(cx), dqkv, static_cast<const float*>(D), dout,
              qkv, lse, d);
  });
}

}  // namespace ct::gpu
