// Pieces shared by the kernel files: warp and element-type dispatch for launchers, grid sizing,
// and deterministic block reductions (a fixed tree, the same at every warp size).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "backends/gpu/kernels.h"
#include "backends/gpu/numeric.h"
#include "backends/gpu/portability.h"

namespace ct::gpu {

// Calls fn(std::integral_constant<int, WARP>) for the device's warp size (32 or 64; CUDA builds
// only the 32-wide instance).
template <typename Fn>
void with_warp(int warp, Fn&& fn) {
  if constexpr (kMaxWarp >= 64) {
    if (warp == 64) {
      fn(std::integral_constant<int, 64>{});
      return;
    }
  }
  if (warp != 32) throw std::invalid_argument("warp size must be 32 or 64");
  fn(std::integral_constant<int, 32>{});
}

// Calls fn(F32{}), fn(F16{}) or fn(BF16{}).
template <typename Fn>
void with_elem(Elem e, Fn&& fn) {
  switch (e) {
    case Elem::kF16:
      fn(F16{});
      return;
    case Elem::kBF16:
      fn(BF16{});
      return;
    default:
      fn(F32{});
  }
}

inline ct_stream_t stream_of(const Ctx& cx) {
  return static_cast<ct_stream_t>(cx.stream);
}

// Blocks for a grid-stride loop over n items with `threads` threads a block: enough to fill the
// device a few times over, never more than the items need. Elementwise results do not depend on
// it.
inline unsigned grid_for(const Ctx& cx, std::int64_t n, int threads) {
  const std::int64_t need = (n + threads - 1) / threads;
  std::int64_t cap = static_cast<std::int64_t>(cx.multiprocessors > 0 ? cx.multiprocessors : 1) * 8;
  if (cap < 1) cap = 1;
  const std::int64_t b = need < cap ? need : cap;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

// Sum of v over the THREADS threads of a block (blockDim.x == THREADS, a power of two), by the
// fixed pairwise tree slot i += slot i + s for s = THREADS/2 .. 1: levels at least a warp wide
// through shared memory, the rest through shfl_down, so every warp size gives the same bits.
// smem: THREADS floats. Every thread gets the result.
template <int WARP, int THREADS>
__device__ __forceinline__ float block_sum(float v, float* smem) {
  const int t = threadIdx.x;
  for (int s = THREADS / 2; s >= WARP; s /= 2) {
    smem[t] = v;
    __syncthreads();
    if (t < s) v += smem[t + s];
    __syncthreads();
  }
  for (int s = (WARP < THREADS ? WARP : THREADS) / 2; s >= 1; s /= 2) v += ct_shfl_down(v, s, WARP);
  if (t == 0) smem[0] = v;
  __syncthreads();
  v = smem[0];
  __syncthreads();
  return v;
}

// The maximum of v over the block, the same tree (max is exact: any tree gives the same value).
template <int WARP, int THREADS>
__device__ __forceinline__ float block_max(float v, float* smem) {
  const int t = threadIdx.x;
  for (int s = THREADS / 2; s >= WARP; s /= 2) {
    smem[t] = v;
    __syncthreads();
    if (t < s) v = fmaxf(v, smem[t + s]);
    __syncthreads();
  }
  for (int s = (WARP < THREADS ? WARP : THREADS) / 2; s >= 1; s /= 2)
    v = fmaxf(v, ct_shfl_down(v, s, WARP));
  if (t == 0) smem[0] = v;
  __syncthreads();
  v = smem[0];
  __syncthreads();
  return v;
}

}  // namespace ct::gpu
