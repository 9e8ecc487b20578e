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

// The elements [begin, end) step `step` that this thread handles in an elementwise kernel over n
// elements with THREADS threads a block. On a GPU a grid-stride loop (neighbouring threads take
// neighbouring elements: coalesced); on the SIMT runtime, where a block's threads run one after
// another, each thread takes one contiguous chunk instead (the grid-stride order would make
// every access of a fiber a cache miss). Only for kernels whose elements are independent: the
// assignment differs between targets, the results do not.
struct ElementRange {
  std::int64_t begin, end, step;
};
template <int THREADS>
__device__ __forceinline__ ElementRange thread_elements(std::int64_t n) {
  const std::int64_t total = static_cast<std::int64_t>(gridDim.x) * THREADS;
  const std::int64_t g = static_cast<std::int64_t>(blockIdx.x) * THREADS + threadIdx.x;
#if defined(CT_GPU_SIMT)
  const std::int64_t chunk = (n + total - 1) / total;
  const std::int64_t begin = g * chunk < n ? g * chunk : n;
  return ElementRange{begin, begin + chunk < n ? begin + chunk : n, 1};
#else
  return ElementRange{g, n, total};
#endif
}
#define CT_FOR_EACH_ELEMENT(i, n, THREADS)                                             \
  for (ElementRange ct_r_ = thread_elements<THREADS>(n), *ct_once_ = &ct_r_; ct_once_; \
       ct_once_ = nullptr)                                                             \
    for (std::int64_t i = ct_r_.begin; i < ct_r_.end; i += ct_r_.step)

// Block reductions in three fixed steps, the same at every warp size and on every target: every
// thread stores its value; kGroups threads each combine THREADS / kGroups consecutive slots in
// order; then every thread combines the kGroups partials in order (each gets the result, no
// broadcast step). Four barriers and no shuffles: cheap on a GPU, and on the SIMT runtime, where
// every barrier or shuffle is a round of fiber switches. smem: THREADS floats; THREADS a
// multiple of 16.
template <int THREADS, typename Op>
__device__ __forceinline__ float block_reduce(float v, float* smem, Op op) {
  static_assert(THREADS % 16 == 0, "block_reduce: THREADS must be a multiple of 16");
  constexpr int kGroups = THREADS >= 256 ? 16 : THREADS / 8;
  constexpr int kPer = THREADS / kGroups;
  const int t = threadIdx.x;
  smem[t] = v;
  __syncthreads();
  float part = 0.0f;
  if (t < kGroups) {
    part = smem[t * kPer];
    for (int j = 1; j < kPer; ++j) part = op(part, smem[t * kPer + j]);
  }
  __syncthreads();
  if (t < kGroups) smem[t] = part;
  __syncthreads();
  float r = smem[0];
  for (int j = 1; j < kGroups; ++j) r = op(r, smem[j]);
  __syncthreads();  // smem may be reused at once
  return r;
}

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The sum / maximum of v over the block's THREADS threads; every thread gets it. (WARP is
// unused: the order is fixed by THREADS alone.)
template <int WARP, int THREADS>
__device__ __forceinline__ float block_sum(float v, float* smem) {
  return block_reduce<THREADS>(v, smem, SumOp{});
}
template <int WARP, int THREADS>
__device__ __forceinline__ float block_max(float v, float* smem) {
  return block_reduce<THREADS>(v, smem, MaxOp{});
}

// The second pass of a column sum in two fixed passes (the bias, LayerNorm and RMSNorm weight
// gradients): column n of a block of kColumnSumThreads threads sums its chunks' partials
// (partial[k * stride + n], chunks of them) split among kColumnSumLanes threads -- thread q takes
// chunks q, q + 8, ... in order -- and returns their sum in the order q = 0, 1, ... (through
// smem, kColumnSumThreads floats) to the threads with q == 0 (others get 0). Columns are
// blockIdx.x * 32 + threadIdx.x % 32: neighbouring threads read neighbouring columns. The order
// depends on the shapes alone; a block of 32 columns instead of 256 keeps 8 times the threads
// busy on a short row of columns (gpt2's 768: 24 blocks, not 3).
constexpr int kColumnSumThreads = 256, kColumnSumLanes = 8, kColumnSumCols = 32;
__device__ __forceinline__ std::int64_t column_sum_col() {
  return static_cast<std::int64_t>(blockIdx.x) * kColumnSumCols + threadIdx.x % kColumnSumCols;
}
__device__ __forceinline__ float column_sum(const float* partial, std::int64_t stride,
                                            std::int64_t chunks, std::int64_t N, float* smem) {
  const int q = static_cast<int>(threadIdx.x) / kColumnSumCols;
  const int cl = static_cast<int>(threadIdx.x) % kColumnSumCols;
  const std::int64_t n = column_sum_col();
  float s = 0.0f;
  if (n < N)
    for (std::int64_t k = q; k < chunks; k += kColumnSumLanes) s += partial[k * stride + n];
  smem[threadIdx.x] = s;
  __syncthreads();
  float t = 0.0f;
  if (q == 0)
    for (int j = 0; j < kColumnSumLanes; ++j) t += smem[j * kColumnSumCols + cl];
  __syncthreads();  // smem may be reused at once
  return t;
}
inline unsigned column_sum_blocks(std::int64_t N) {
  return static_cast<unsigned>((N + kColumnSumCols - 1) / kColumnSumCols);
}

// Sums / maxima over 32 consecutive lanes (a warp-32 warp, half a wave-64 one): butterflies of
// width 32, xor 16, 8, 4, 2, 1 -- each pair combines the same two values, so every lane of the
// 32 ends with the same bits, at every warp size and on every target. Every lane of the 32 must
// call it. The row kernels of layernorm.cu and rmsnorm.cu (32 lanes a row).
constexpr int kRowLanes = 32;
__device__ __forceinline__ float row32_sum(float v) {
  for (int m = kRowLanes / 2; m >= 1; m /= 2) v += ct_shfl_xor(v, m, kRowLanes);
  return v;
}
__device__ __forceinline__ float row32_max(float v) {
  for (int m = kRowLanes / 2; m >= 1; m /= 2) v = fmaxf(v, ct_shfl_xor(v, m, kRowLanes));
  return v;
}
// The residual rows' sum: rn[i] = xn[i] + r[off + i] (r of element O) for this lane's
// elements i = lane, lane + 32, ... of a row of C. Four of them a step, all read before any is
// written: rn may be xn (in place), so the compiler may not move a load above an earlier store,
// and one element a step waited for its two loads every time.
template <typename O>
__device__ __forceinline__ void row32_add(float* rn, const float* xn, const void* r,
                                          std::int64_t off, int C, int lane) {
  constexpr int kStep = 4;
  for (int i0 = lane; i0 < C; i0 += kStep * kRowLanes) {
    float a[kStep];
    for (int j = 0; j < kStep; ++j) {
      const int i = i0 + j * kRowLanes;
      a[j] = i < C ? xn[i] + O::load(r, off + i) : 0.0f;
    }
    for (int j = 0; j < kStep; ++j) {
      const int i = i0 + j * kRowLanes;
      if (i < C) rn[i] = a[j];
    }
  }
}

// Their launches: blocks of 256 threads, kRowsPerBlock rows each; f(row, rows, blocks) for the
// slices of N rows that grid x's 65535 blocks hold.
constexpr int kRowsPerBlock = 256 / kRowLanes;
template <typename F>
void for_row_slices(std::int64_t N, F f) {
  constexpr std::int64_t kSlice = std::int64_t(65535) * kRowsPerBlock;
  for (std::int64_t row = 0; row < N; row += kSlice) {
    const std::int64_t rows = N - row < kSlice ? N - row : kSlice;
    f(row, rows, static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock));
  }
}

}  // namespace ct::gpu
