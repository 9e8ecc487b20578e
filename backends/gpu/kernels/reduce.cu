// Deterministic sums. Every block reduces its values through one fixed pairwise tree over
// kThreads slots (slot i += slot i + s for s = kThreads/2 .. 1): the levels wider than a warp go
// through shared memory, the others through shfl_down, so the result is bit-identical for every
// warp size. Pass 1 leaves one partial per block, pass 2 sums the partials with the same tree.
#include "backends/gpu/kernels.h"
#include "backends/gpu/portability.h"

namespace ct::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;

// v: this thread's value; smem: kThreads floats. Returns the block's sum in thread 0.
template <int WARP>
__device__ __forceinline__ float block_sum(float v, float* smem) {
  const int t = threadIdx.x;
  for (int s = kThreads / 2; s >= WARP; s /= 2) {
    smem[t] = v;
    __syncthreads();
    if (t < s) v += smem[t + s];
    __syncthreads();
  }
  for (int s = (WARP < kThreads ? WARP : kThreads) / 2; s >= 1; s /= 2)
    v += ct_shfl_down(v, s, WARP);
  return v;
}

// x is (n), partial is (gridDim.x): partial[b] = sum of x[i] for i = b*kThreads + t + k*stride.
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    reduce_sum_pass1(const float* __restrict__ x, float* __restrict__ partial, std::int64_t n) {
  CT_SHARED(float, smem, kThreads);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kThreads;
  float acc = 0.0f;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += stride)
    acc += x[i];
  acc = block_sum<WARP>(acc, smem);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// partial is (count), out is (1): one block.
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    reduce_sum_pass2(const float* __restrict__ partial, float* __restrict__ out, int count) {
  CT_SHARED(float, smem, kThreads);
  float acc = 0.0f;
  for (int i = threadIdx.x; i < count; i += kThreads) acc += partial[i];
  acc = block_sum<WARP>(acc, smem);
  if (threadIdx.x == 0) out[0] = acc;
}

template <int WARP>
void reduce_sum(const float* x, float* partial, float* out, std::int64_t n, ct_stream_t stream) {
  const int blocks = reduce_sum_partials(n);
  launch<WARP>(CT_KERNEL(reduce_sum_pass1<WARP>), dim3(blocks), dim3(kThreads), 0, stream, x,
               partial, n);
  launch<WARP>(CT_KERNEL(reduce_sum_pass2<WARP>), dim3(1), dim3(kThreads), 0, stream, partial, out,
               blocks);
}

}  // namespace

int reduce_sum_partials(std::int64_t n) {
  const std::int64_t per_block = std::int64_t{kThreads} * 8;  // a few values per thread
  const std::int64_t blocks = (n + per_block - 1) / per_block;
  return static_cast<int>(blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

void reduce_sum_f32(int warp, const float* x, float* partial, float* out, std::int64_t n,
                    void* stream_handle) {
  const auto stream = static_cast<ct_stream_t>(stream_handle);
  if constexpr (kMaxWarp >= 64) {
    if (warp == 64) return reduce_sum<64>(x, partial, out, n, stream);
  }
  if (warp != 32) throw std::invalid_argument("reduce_sum_f32: warp size must be 32 or 64");
  reduce_sum<32>(x, partial, out, n, stream);
}

}  // namespace ct::gpu
