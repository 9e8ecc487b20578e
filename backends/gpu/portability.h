// One kernel source, three compilers: nvcc (CUDA), hipcc (HIP, including Debian's 5.2 headers,
// which have no *_sync shuffles) and g++ through the CPU SIMT runtime (backends/simt).
//
// Kernels written against this header use:
//   __global__ / __device__ / __forceinline__, CT_LAUNCH_BOUNDS(threads) on every kernel and
//   CT_CHECK_LAUNCH_BOUNDS(threads) with the same bound as its first statement,
//   a template parameter WARP for the warp size (32 on NVIDIA and RDNA, 64 on CDNA/GCN),
//   ct_shfl_down/up/xor/idx(v, lane_arg, width) and ct_any/ct_all/ct_ballot (whole warp),
//   ct_popc64 (the set bits of a ballot),
//   __syncthreads(), threadIdx/blockIdx/blockDim/gridDim,
//   CT_SHARED(type, name, count) for static and CT_DYNAMIC_SHARED(type, name) for dynamic shared
//   memory (`name` is a pointer on every target: do not take sizeof(name)),
//   atomicAdd (int, unsigned, float), atomicMax/atomicMin/atomicOr (int, unsigned), atomicCAS,
//   atomicExch, and ct::gpu::launch<WARP>(CT_KERNEL(kernel<...>), grid, block, shared_bytes,
//   stream, args...).
// The matrix instructions (mma.sync, ldmatrix, MFMA; ct_mma_*, ct_ldmatrix_*, ct_mfma_*) are in
// backends/gpu/matrix_ops.h, on the same three targets.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define CT_GPU_CUDA 1
#include <cuda_runtime.h>
#elif defined(__HIPCC__) || defined(__HIP__)
#define CT_GPU_HIP 1
#include <hip/hip_runtime.h>
#else
#define CT_GPU_SIMT 1
#include "backends/simt/simt.h"
#endif

#include <stdexcept>
#include <string>

// AMD targets with the CDNA matrix instructions the tiles use, v_mfma_f32_32x32x8{f16,bf16_1k}:
// gfx90a (MI200) and gfx940-942 (MI300), where LLVM emits the same builtins as
// v_mfma_f32_32x32x8_{f16,bf16} with the same A, B, C, D register layouts (AMD's matrix
// instruction calculator, CDNA2 against CDNA3: identical tables). Debian's hipcc 5.2 knows
// gfx940 but not gfx942, whose code objects gfx940's do not replace: build with
// -DCT_HIP_ARCHS=gfx942 and a ROCm that knows it.
#if defined(CT_GPU_HIP) && \
    (defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__))
#define CT_HIP_MFMA 1
#endif

namespace ct::gpu {
// Largest warp a target can have: kernels instantiated for a wider WARP must not be launched there.
#if defined(CT_GPU_CUDA)
inline constexpr int kMaxWarp = 32;
#else
inline constexpr int kMaxWarp = 64;
#endif
}  // namespace ct::gpu

// First in a kernel templated on its warp W. An AMD target's code object holds only the kernels
// of its wavefront size (gfx90a 64, gfx1030 32): the device's warp picks the instantiation, so
// the other's can never be launched there; its body is not compiled (hipcc's time, and code
// that unrolls for one size is no longer unrolled for both) and, launched anyway, it traps.
// Elsewhere (nvcc, the SIMT runtime, HIP's host pass) nothing.
#if defined(__HIP_DEVICE_COMPILE__) && defined(__AMDGCN_WAVEFRONT_SIZE)
#define CT_ONLY_ON_ITS_WARP(W)                    \
  if constexpr ((W) != __AMDGCN_WAVEFRONT_SIZE) { \
    __builtin_trap();                             \
    return;                                       \
  }
#else
#define CT_ONLY_ON_ITS_WARP(W) static_assert((W) == 32 || (W) == 64, "a warp of 32 or 64")
#endif

#if defined(CT_GPU_CUDA) || defined(CT_GPU_HIP)

#define CT_LAUNCH_BOUNDS(threads) __launch_bounds__(threads)
// The GPU itself refuses a block over the bound; here the bound only has to be one a GPU takes.
#define CT_CHECK_LAUNCH_BOUNDS(threads) \
  static_assert((threads) >= 1 && (threads) <= 1024, "a launch bound is 1 to 1024 threads")
#define CT_SHARED(type, name, count) __shared__ type name[count]
#define CT_DYNAMIC_SHARED(type, name)                               \
  extern __shared__ __align__(16) unsigned char ct_dynamic_smem_[]; \
  type* name = reinterpret_cast<type*>(ct_dynamic_smem_)

#if defined(CT_GPU_CUDA)
using ct_stream_t = cudaStream_t;
using ct_error_t = cudaError_t;
#define CT_GPU_OK cudaSuccess
#define ct_get_last_error cudaGetLastError
#define ct_error_string cudaGetErrorString
inline constexpr unsigned ct_full_mask = 0xffffffffu;
template <typename T>
__device__ __forceinline__ T ct_shfl_down(T v, unsigned delta, int width) {
  return __shfl_down_sync(ct_full_mask, v, delta, width);
}
template <typename T>
__device__ __forceinline__ T ct_shfl_up(T v, unsigned delta, int width) {
  return __shfl_up_sync(ct_full_mask, v, delta, width);
}
template <typename T>
__device__ __forceinline__ T ct_shfl_xor(T v, int lane_mask, int width) {
  return __shfl_xor_sync(ct_full_mask, v, lane_mask, width);
}
template <typename T>
__device__ __forceinline__ T ct_shfl_idx(T v, int src_lane, int width) {
  return __shfl_sync(ct_full_mask, v, src_lane, width);
}
__device__ __forceinline__ bool ct_any(bool p) {
  return __any_sync(ct_full_mask, p) != 0;
}
__device__ __forceinline__ bool ct_all(bool p) {
  return __all_sync(ct_full_mask, p) != 0;
}
__device__ __forceinline__ std::uint64_t ct_ballot(bool p) {
  return __ballot_sync(ct_full_mask, p);
}
__device__ __forceinline__ int ct_popc64(std::uint64_t m) {
  return __popcll(m);
}
__device__ __forceinline__ void ct_syncwarp() {
  __syncwarp();
}
#else  // HIP: Debian's 5.2 headers have only the maskless, width-taking forms.
using ct_stream_t = hipStream_t;
using ct_error_t = hipError_t;
#define CT_GPU_OK hipSuccess
#define ct_get_last_error hipGetLastError
#define ct_error_string hipGetErrorString
template <typename T>
__device__ __forceinline__ T ct_shfl_down(T v, unsigned delta, int width) {
  return __shfl_down(v, delta, width);
}
template <typename T>
__device__ __forceinline__ T ct_shfl_up(T v, unsigned delta, int width) {
  return __shfl_up(v, delta, width);
}
template <typename T>
__device__ __forceinline__ T ct_shfl_xor(T v, int lane_mask, int width) {
  return __shfl_xor(v, lane_mask, width);
}
template <typename T>
__device__ __forceinline__ T ct_shfl_idx(T v, int src_lane, int width) {
  return __shfl(v, src_lane, width);
}
__device__ __forceinline__ bool ct_any(bool p) {
  return __any(p) != 0;
}
__device__ __forceinline__ bool ct_all(bool p) {
  return __all(p) != 0;
}
__device__ __forceinline__ std::uint64_t ct_ballot(bool p) {
  return __ballot(p);
}
__device__ __forceinline__ int ct_popc64(std::uint64_t m) {
  return __popcll(m);
}
// AMD wavefronts execute in lockstep: only the compiler must not move memory accesses across.
__device__ __forceinline__ void ct_syncwarp() {
  __builtin_amdgcn_wave_barrier();
}
#endif

namespace ct::gpu {
// A kernel and the name its launch errors carry; CT_KERNEL builds one.
template <typename... P>
struct KernelRef {
  void (*fn)(P...);
  const char* name;
};
template <typename... P>
KernelRef(void (*)(P...), const char*) -> KernelRef<P...>;

// Enqueues kernel<<<grid, block, shared_bytes, stream>>>(args...); a launch error throws
// std::runtime_error naming the kernel.
template <int WARP, typename... P, typename... A>
void launch(KernelRef<P...> k, dim3 grid, dim3 block, std::size_t shared_bytes, ct_stream_t stream,
            A&&... args) {
  static_assert(WARP <= kMaxWarp, "this target has no warps that wide");
  k.fn<<<grid, block, shared_bytes, stream>>>(static_cast<P>(args)...);
  ct_error_t e = ct_get_last_error();
  if (e != CT_GPU_OK)
    throw std::runtime_error(std::string("launch of ") + k.name + " failed: " + ct_error_string(e));
}
}  // namespace ct::gpu

#else  // CT_GPU_SIMT: the names map onto backends/simt/simt.h.

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
// A GPU refuses to launch a block with more threads than the kernel's __launch_bounds__. g++
// has no such attribute, and no attribute in that place can be read back through the function
// pointer a launch gets (kernels are templates on WARP and element types: the bound may depend on
// them). So the kernel repeats its bound as its first statement, where the template's parameters
// are in scope, and every thread checks its block against it before anything else runs: a
// launcher over the bound fails here as it would on a GPU (kernel_rules_test keeps the two
// spellings equal).
#define CT_LAUNCH_BOUNDS(threads)
#define CT_CHECK_LAUNCH_BOUNDS(threads) ::ct::simt::check_launch_bounds((threads), #threads)
// Every thread of a block gets the same storage for `name` (keyed by this declaration), fresh per
// block.
#define CT_SHARED(type, name, count)          \
  static const char ct_shared_key_##name = 0; \
  type* name = ::ct::simt::static_shared<type>(&ct_shared_key_##name, (count))
#define CT_DYNAMIC_SHARED(type, name) type* name = ::ct::simt::dynamic_shared<type>()

using ct_stream_t = ::ct::simt::Runtime*;  // nullptr: the process-wide runtime

// Collectives remember the kernel line that called them, for the runtime's error messages.
#define CT_SIMT_WHERE const std::source_location& where = std::source_location::current()

template <typename T>
inline T ct_shfl_down(T v, unsigned delta, int width, CT_SIMT_WHERE) {
  return ::ct::simt::shuffle(::ct::simt::Shuffle::kDown, v, static_cast<int>(delta), width, where);
}
template <typename T>
inline T ct_shfl_up(T v, unsigned delta, int width, CT_SIMT_WHERE) {
  return ::ct::simt::shuffle(::ct::simt::Shuffle::kUp, v, static_cast<int>(delta), width, where);
}
template <typename T>
inline T ct_shfl_xor(T v, int lane_mask, int width, CT_SIMT_WHERE) {
  return ::ct::simt::shuffle(::ct::simt::Shuffle::kXor, v, lane_mask, width, where);
}
template <typename T>
inline T ct_shfl_idx(T v, int src_lane, int width, CT_SIMT_WHERE) {
  return ::ct::simt::shuffle(::ct::simt::Shuffle::kIdx, v, src_lane, width, where);
}
inline bool ct_any(bool p, CT_SIMT_WHERE) {
  return ::ct::simt::ballot(p, where) != 0;
}
inline bool ct_all(bool p, CT_SIMT_WHERE) {
  return ::ct::simt::ballot(p, where) == ::ct::simt::warp_member_mask();
}
inline std::uint64_t ct_ballot(bool p, CT_SIMT_WHERE) {
  return ::ct::simt::ballot(p, where);
}
inline int ct_popc64(std::uint64_t m) {
  return __builtin_popcountll(m);
}
inline void ct_syncwarp(CT_SIMT_WHERE) {
  ::ct::simt::ballot(true, where);
}

namespace ct::gpu {
template <typename... P>
struct KernelRef {
  void (*fn)(P...);
  const char* name;
};
template <typename... P>
KernelRef(void (*)(P...), const char*) -> KernelRef<P...>;

template <int WARP, typename... P, typename... A>
void launch(KernelRef<P...> k, dim3 grid, dim3 block, std::size_t shared_bytes, ct_stream_t stream,
            A&&... args) {
  ::ct::simt::LaunchConfig cfg{grid, block, shared_bytes, WARP, k.name};
  ::ct::simt::launch(stream, cfg, k.fn, static_cast<P>(args)...);
}
}  // namespace ct::gpu

#endif

// CT_KERNEL(name<WARP, 256>): the kernel with its spelling, for error messages.
#define CT_KERNEL(...)        \
  ::ct::gpu::KernelRef {      \
    __VA_ARGS__, #__VA_ARGS__ \
  }
