// The portability layer's matrix instructions: one name per instruction on every target.
//   nvcc: the PTX instruction (mma.sync needs sm_80, ldmatrix sm_75),
//   SIMT: the runtime's warp collective (ct::simt::matrix, backends/simt/matrix.cpp),
//   HIP gfx90a, gfx940-942 (CT_HIP_MFMA): the MFMA builtins,
//   anywhere else (older CUDA, RDNA, gfx90a for the PTX forms): a portable form from warp
//   shuffles and shared-memory reads, decoded by the same layouts -- correct, not fast.
// Layouts: backends/gpu/matrix_layouts.h. All of these are whole-warp operations: call them in
// uniform control flow, with 1-D blocks (the lane is threadIdx.x % warp).
//
//   ct_mma_m16n8k16_f16 / _bf16(d[4], a[4], b[2], c[4])  d = a b + c, 16-bit pairs in b32 regs
//   ct_mma_m16n8k8_tf32(d[4], a[4], b[2], c[4])          tf32 in b32 regs (see below)
//   ct_ldmatrix_x1 / _x2 / _x4 (r, row), and _trans        row: this lane's row address (shared)
//   ct_mfma_32x32x8_f16 / _bf16(d[16], a[2], b[2], c[16]) wave64 (4 halves in 2 regs)
//   ct_mfma_16x16x16_f16 / _bf16(d[4], a[2], b[2], c[4])  wave64
//   ct_cp_async_16(dst, src, bytes), ct_cp_async_commit(), ct_cp_async_wait<N>()
//                                                        16-byte global -> shared copies (below)
//
// Arithmetic where this layer computes (SIMT and the portable forms): every element of D is
// c, then + a_k b_k for k = 0 .. K-1 in order, in f32, one rounding per add (16-bit and tf32
// products are exact in f32). Tensor cores and MFMA units sum in their own order: on hardware
// only the products' rounding is the same. TF32 operands are f32 bits whose low 13 mantissa bits
// are ignored (truncated; a NaN stays NaN); ct_f32_to_tf32 rounds instead (cvt.rna.tf32.f32:
// to nearest, ties away from zero; past the largest tf32 to infinity; NaN to the canonical NaN
// 0x7fffffff in the software form), for kernels that want rounded inputs.
#pragma once

#include <cstdint>

#include "backends/gpu/matrix_layouts.h"
#include "backends/gpu/numeric.h"
#include "backends/gpu/portability.h"

namespace ct::gpu::matrix_detail {

enum Type { kF16, kBF16, kTf32 };

// Half (0 low, 1 high) of a 32-bit register as the instruction's input type.
template <int TYPE>
__device__ __forceinline__ float value(std::uint32_t reg, int half) {
  if constexpr (TYPE == kTf32) {
    if ((reg & 0x7fffffffu) > 0x7f800000u) return bits_f32(reg);  // NaN
    return bits_f32(reg & 0xffffe000u);
  } else {
    const auto h = static_cast<std::uint16_t>(reg >> (16 * half));
    return TYPE == kF16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
}

// The portable mma: every register of every lane gathered by shuffles, then the k loop.
template <typename L, int TYPE>
__device__ __forceinline__ void mma_portable(float* d, const std::uint32_t* a,
                                             const std::uint32_t* b, const float* c) {
  constexpr int kPer = L::kBits == 16 ? 2 : 1;  // elements per register
  const int lane = static_cast<int>(threadIdx.x) % L::kWarp;
  float at[L::M][L::K], bt[L::K][L::N], out[L::kC];
  for (int s = 0; s < L::kWarp; ++s) {
    for (int r = 0; r < L::kARegs; ++r) {
      const std::uint32_t v = ct_shfl_idx(a[r], s, L::kWarp);
      for (int h = 0; h < kPer; ++h) {
        const layout::RowCol rc = L::a(s, kPer * r + h);
        at[rc.row][rc.col] = value<TYPE>(v, h);
      }
    }
    for (int r = 0; r < L::kBRegs; ++r) {
      const std::uint32_t v = ct_shfl_idx(b[r], s, L::kWarp);
      for (int h = 0; h < kPer; ++h) {
        const layout::RowCol rc = L::b(s, kPer * r + h);
        bt[rc.row][rc.col] = value<TYPE>(v, h);
      }
    }
  }
  for (int e = 0; e < L::kC; ++e) {
    const layout::RowCol rc = L::c(lane, e);
    float acc = c[e];
    for (int k = 0; k < L::K; ++k) acc += at[rc.row][k] * bt[k][rc.col];
    out[e] = acc;
  }
  for (int e = 0; e < L::kC; ++e) d[e] = out[e];
}

// The portable ldmatrix: each half is read through the row address of the lane that holds it.
template <int COUNT, bool TRANS>
__device__ __forceinline__ void ldmatrix_portable(std::uint32_t* r, const void* row) {
  using L = layout::Ldmatrix;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const auto mine = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(row));
  for (int j = 0; j < COUNT; ++j) {
    std::uint32_t reg = 0;
    for (int h = 0; h < 2; ++h) {
      const layout::RowCol rc = L::element(lane, h, TRANS);
      const std::uint64_t p = ct_shfl_idx(mine, L::address_lane(j, rc.row), 32);
      const auto* src = reinterpret_cast<const std::uint16_t*>(static_cast<std::uintptr_t>(p));
      reg |= static_cast<std::uint32_t>(src[rc.col]) << (16 * h);
    }
    r[j] = reg;
  }
}

}  // namespace ct::gpu::matrix_detail

__device__ __forceinline__ float ct_f32_to_tf32(float x) {
#if defined(CT_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  std::uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return ::ct::gpu::bits_f32(r);
#else
  std::uint32_t u = ::ct::gpu::f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return ::ct::gpu::bits_f32(0x7fffffffu);  // NaN: canonical
  if ((u & 0x7f800000u) != 0x7f800000u) u += 0x1000u;  // finite: half an ulp of tf32, up in size
  return ::ct::gpu::bits_f32(u & 0xffffe000u);
#endif
}

#if defined(CT_GPU_SIMT)

// Each entry point hands the lane's registers to the runtime's collective.
#define CT_SIMT_MATRIX_MMA(name, op, NA, NB, NC)                                            \
  inline void name(float(&d)[NC], const std::uint32_t(&a)[NA], const std::uint32_t(&b)[NB], \
                   const float(&c)[NC], CT_SIMT_WHERE) {                                    \
    ::ct::simt::MatrixArgs m;                                                               \
    m.a = a, m.b = b, m.c = c, m.d = d;                                                     \
    ::ct::simt::matrix(::ct::simt::MatrixOp::op, m, where);                                 \
  }
CT_SIMT_MATRIX_MMA(ct_mma_m16n8k16_f16, kMmaF16, 4, 2, 4)
CT_SIMT_MATRIX_MMA(ct_mma_m16n8k16_bf16, kMmaBF16, 4, 2, 4)
CT_SIMT_MATRIX_MMA(ct_mma_m16n8k8_tf32, kMmaTf32, 4, 2, 4)
CT_SIMT_MATRIX_MMA(ct_mfma_32x32x8_f16, kMfma32x32x8F16, 2, 2, 16)
CT_SIMT_MATRIX_MMA(ct_mfma_32x32x8_bf16, kMfma32x32x8BF16, 2, 2, 16)
CT_SIMT_MATRIX_MMA(ct_mfma_16x16x16_f16, kMfma16x16x16F16, 2, 2, 4)
CT_SIMT_MATRIX_MMA(ct_mfma_16x16x16_bf16, kMfma16x16x16BF16, 2, 2, 4)
#undef CT_SIMT_MATRIX_MMA

#define CT_SIMT_MATRIX_LDMATRIX(name, op, N)                               \
  inline void name(std::uint32_t(&r)[N], const void* row, CT_SIMT_WHERE) { \
    ::ct::simt::MatrixArgs m;                                              \
    m.row = row, m.r = r;                                                  \
    ::ct::simt::matrix(::ct::simt::MatrixOp::op, m, where);                \
  }
CT_SIMT_MATRIX_LDMATRIX(ct_ldmatrix_x1, kLdmatrixX1, 1)
CT_SIMT_MATRIX_LDMATRIX(ct_ldmatrix_x2, kLdmatrixX2, 2)
CT_SIMT_MATRIX_LDMATRIX(ct_ldmatrix_x4, kLdmatrixX4, 4)
CT_SIMT_MATRIX_LDMATRIX(ct_ldmatrix_x1_trans, kLdmatrixX1Trans, 1)
CT_SIMT_MATRIX_LDMATRIX(ct_ldmatrix_x2_trans, kLdmatrixX2Trans, 2)
CT_SIMT_MATRIX_LDMATRIX(ct_ldmatrix_x4_trans, kLdmatrixX4Trans, 4)
#undef CT_SIMT_MATRIX_LDMATRIX

#else  // CUDA and HIP

// mma.sync: PTX on sm_80 and later, the portable form elsewhere.
#if defined(CT_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define CT_MMA_ASM(shape, type)                                                               \
  asm volatile("mma.sync.aligned." shape ".row.col.f32." type "." type                        \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"             \
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                               \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), \
                 "f"(c[1]), "f"(c[2]), "f"(c[3]))
#define CT_MMA_BODY(shape, type, L, TYPE) CT_MMA_ASM(shape, type)
#else
#define CT_MMA_BODY(shape, type, L, TYPE) \
  ::ct::gpu::matrix_detail::mma_portable<::ct::gpu::layout::L, TYPE>(d, a, b, c)
#endif
__device__ __forceinline__ void ct_mma_m16n8k16_f16(float (&d)[4], const std::uint32_t (&a)[4],
                                                    const std::uint32_t (&b)[2],
                                                    const float (&c)[4]) {
  CT_MMA_BODY("m16n8k16", "f16", M16N8K16, ::ct::gpu::matrix_detail::kF16);
}
__device__ __forceinline__ void ct_mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                                                     const std::uint32_t (&b)[2],
                                                     const float (&c)[4]) {
  CT_MMA_BODY("m16n8k16", "bf16", M16N8K16, ::ct::gpu::matrix_detail::kBF16);
}
__device__ __forceinline__ void ct_mma_m16n8k8_tf32(float (&d)[4], const std::uint32_t (&a)[4],
                                                    const std::uint32_t (&b)[2],
                                                    const float (&c)[4]) {
  CT_MMA_BODY("m16n8k8", "tf32", M16N8K8Tf32, ::ct::gpu::matrix_detail::kTf32);
}
#undef CT_MMA_BODY
#undef CT_MMA_ASM

// ldmatrix: PTX on sm_75 and later (a shared-window address), the portable form elsewhere.
#if defined(CT_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
#define CT_LDMATRIX(name, N, TRANS, suffix, outs, ...)                                     \
  __device__ __forceinline__ void name(std::uint32_t(&r)[N], const void* row) {            \
    const auto s = static_cast<std::uint32_t>(__cvta_generic_to_shared(row));              \
    asm volatile("ldmatrix.sync.aligned.m8n8." suffix ".shared.b16 " outs ", [%" #N "];\n" \
                 : __VA_ARGS__                                                             \
                 : "r"(s));                                                                \
  }
#else
#define CT_LDMATRIX(name, N, TRANS, suffix, outs, ...)                          \
  __device__ __forceinline__ void name(std::uint32_t(&r)[N], const void* row) { \
    ::ct::gpu::matrix_detail::ldmatrix_portable<N, TRANS>(r, row);              \
  }
#endif
CT_LDMATRIX(ct_ldmatrix_x1, 1, false, "x1", "{%0}", "=r"(r[0]))
CT_LDMATRIX(ct_ldmatrix_x2, 2, false, "x2", "{%0,%1}", "=r"(r[0]), "=r"(r[1]))
CT_LDMATRIX(ct_ldmatrix_x4, 4, false, "x4", "{%0,%1,%2,%3}", "=r"(r[0]), "=r"(r[1]), "=r"(r[2]),
            "=r"(r[3]))
CT_LDMATRIX(ct_ldmatrix_x1_trans, 1, true, "x1.trans", "{%0}", "=r"(r[0]))
CT_LDMATRIX(ct_ldmatrix_x2_trans, 2, true, "x2.trans", "{%0,%1}", "=r"(r[0]), "=r"(r[1]))
CT_LDMATRIX(ct_ldmatrix_x4_trans, 4, true, "x4.trans", "{%0,%1,%2,%3}", "=r"(r[0]), "=r"(r[1]),
            "=r"(r[2]), "=r"(r[3]))
#undef CT_LDMATRIX

// MFMA: the CDNA builtins (CT_HIP_MFMA), the portable form elsewhere (only ever launched at warp
// 64).
#if defined(CT_HIP_MFMA)
#define CT_MFMA(name, NC, builtin, elem, TYPE, L)                                               \
  __device__ __forceinline__ void name(float(&d)[NC], const std::uint32_t(&a)[2],               \
                                       const std::uint32_t(&b)[2], const float(&c)[NC]) {       \
    typedef float acc_t __attribute__((ext_vector_type(NC)));                                   \
    typedef elem in_t __attribute__((ext_vector_type(4)));                                      \
    acc_t acc;                                                                                  \
    for (int i = 0; i < NC; ++i) acc[i] = c[i];                                                 \
    in_t va, vb;                                                                                \
    for (int i = 0; i < 4; ++i) {                                                               \
      va[i] = __builtin_bit_cast(elem, static_cast<std::uint16_t>(a[i / 2] >> (16 * (i % 2)))); \
      vb[i] = __builtin_bit_cast(elem, static_cast<std::uint16_t>(b[i / 2] >> (16 * (i % 2)))); \
    }                                                                                           \
    acc = builtin(va, vb, acc, 0, 0, 0);                                                        \
    for (int i = 0; i < NC; ++i) d[i] = acc[i];                                                 \
  }
#else
#define CT_MFMA(name, NC, builtin, elem, TYPE, L)                                         \
  __device__ __forceinline__ void name(float(&d)[NC], const std::uint32_t(&a)[2],         \
                                       const std::uint32_t(&b)[2], const float(&c)[NC]) { \
    ::ct::gpu::matrix_detail::mma_portable<::ct::gpu::layout::L, TYPE>(d, a, b, c);       \
  }
#endif
CT_MFMA(ct_mfma_32x32x8_f16, 16, __builtin_amdgcn_mfma_f32_32x32x8f16, _Float16,
        ::ct::gpu::matrix_detail::kF16, Mfma32x32x8)
CT_MFMA(ct_mfma_32x32x8_bf16, 16, __builtin_amdgcn_mfma_f32_32x32x8bf16_1k, short,
        ::ct::gpu::matrix_detail::kBF16, Mfma32x32x8)
CT_MFMA(ct_mfma_16x16x16_f16, 4, __builtin_amdgcn_mfma_f32_16x16x16f16, _Float16,
        ::ct::gpu::matrix_detail::kF16, Mfma16x16x16)
CT_MFMA(ct_mfma_16x16x16_bf16, 4, __builtin_amdgcn_mfma_f32_16x16x16bf16_1k, short,
        ::ct::gpu::matrix_detail::kBF16, Mfma16x16x16)
#undef CT_MFMA

#endif

// Asynchronous copies global -> shared, 16 bytes (PTX cp.async.cg.shared.global, sm_80+):
//   ct_cp_async_16(dst, src, bytes)  dst in shared memory, both 16-byte aligned; bytes 16 copies,
//                                     0 writes zeros (src is not read, but must be an address of
//                                     the operand, as the hardware may form it)
//   ct_cp_async_commit()             closes this thread's group of copies issued so far
//   ct_cp_async_wait<N>()            waits until at most N of this thread's groups are pending
// The copies are visible to other threads after the wait and a __syncthreads, as on hardware.
// The SIMT runtime lands each copy as late as the hardware may: at the wait that retires its
// group (ct::simt::async_copy_16, simt.h), so a kernel that reads a staged tile before waiting
// for it, or waits for the wrong group, reads stale shared memory in the tests. Elsewhere (HIP,
// CUDA before sm_80) the copy is a plain 16-byte load and store at the call, and commit and wait
// do nothing: a kernel written for the asynchronous form computes the same there, since every
// copy is complete before any wait could return.
namespace ct::gpu::matrix_detail {
struct alignas(16) Bytes16 {
  std::uint32_t w[4];
};
}  // namespace ct::gpu::matrix_detail

#if defined(CT_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ void ct_cp_async_16(void* dst, const void* src, int bytes) {
  const auto s = static_cast<std::uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void ct_cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void ct_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#elif defined(CT_GPU_SIMT)
inline void ct_cp_async_16(void* dst, const void* src, int bytes) {
  ::ct::simt::async_copy_16(dst, src, bytes);
}
inline void ct_cp_async_commit() {
  ::ct::simt::async_commit();
}
template <int N>
void ct_cp_async_wait() {
  ::ct::simt::async_wait(N);
}
#else
__device__ __forceinline__ void ct_cp_async_16(void* dst, const void* src, int bytes) {
#if defined(CT_GPU_HIP)
  // One 16-byte vector in registers: with the struct AMDGPU built the selected value in scratch
  // memory, 4 stores and 4 loads a copy (the 32 bytes a lane every tile kernel showed).
  typedef std::uint32_t V __attribute__((ext_vector_type(4)));
  const V v = bytes ? *static_cast<const V*>(src) : V{0u, 0u, 0u, 0u};
  *static_cast<V*>(dst) = v;
#else
  using ::ct::gpu::matrix_detail::Bytes16;
  *static_cast<Bytes16*>(dst) = bytes ? *static_cast<const Bytes16*>(src) : Bytes16{};
#endif
}
__device__ __forceinline__ void ct_cp_async_commit() {}
template <int N>
__device__ __forceinline__ void ct_cp_async_wait() {}
#endif
