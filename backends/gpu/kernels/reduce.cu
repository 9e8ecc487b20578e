// Deterministic sums. Every block reduces its values through one fixed pairwise tree over
// kThreads slots (slot i += slot i + s for s = kThreads/2 .. 1): the levels wider than a warp go
// through shared memory, the others through shfl_down, so the result is bit-identical for every
// warp size. Pass 1 leaves one partial per block, pass 2 sums the partials with the same tree.
#include "backends/gpu/kernels/common.h"
#include "backends/gpu/kernels/safe_math.h"

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

// x is (n), partial is (gridDim.x): partial[b] = sum of x[i] (SQUARE: of x[i]^2) for
// i = b*kThreads + t + k*stride.
template <int WARP, bool SQUARE = false>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    reduce_sum_pass1(const float* __restrict__ x, float* __restrict__ partial, std::int64_t n) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_SHARED(float, smem, kThreads);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kThreads;
  float acc = 0.0f;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += stride)
    acc += SQUARE ? x[i] * x[i] : x[i];
  acc = block_sum<WARP>(acc, smem);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// partial is (count), out is (1): one block. out[0] = scale * total, or sqrt(total) with SQRT.
template <int WARP, bool SQRT = false>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    reduce_sum_pass2(const float* __restrict__ partial, float* __restrict__ out, int count,
                     float scale) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_SHARED(float, smem, kThreads);
  float acc = 0.0f;
  for (int i = threadIdx.x; i < count; i += kThreads) acc += partial[i];
  acc = block_sum<WARP>(acc, smem);
  if (threadIdx.x == 0) out[0] = SQRT ? ct_sqrt(acc) : acc * scale;  // overflowed: inf
}

// x is (n): flag[0] |= 1 when any x[i] is inf or NaN (before, or with SCALE after, x *= s).
template <int WARP, bool SCALE>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    finite_kernel(float* __restrict__ x, std::int32_t* __restrict__ flag, float s, std::int64_t n) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  bool bad = false;
  CT_FOR_EACH_ELEMENT(i, n, kThreads) {
    float v = x[i];
    bad = bad || !ct_isfinite(v);
    if (SCALE) {
      v *= s;
      x[i] = v;
      bad = bad || !ct_isfinite(v);
    }
  }
  if (bad) atomicOr(flag, 1);  // an integer flag: the order of the ORs does not matter
}

template <int WARP, bool SQUARE = false, bool SQRT = false>
void reduce_sum(const float* x, float* partial, float* out, std::int64_t n, ct_stream_t stream,
                float scale = 1.0f) {
  const int blocks = reduce_sum_partials(n);
  launch<WARP>(CT_KERNEL(reduce_sum_pass1<WARP, SQUARE>), dim3(blocks), dim3(kThreads), 0, stream,
               x, partial, n);
  launch<WARP>(CT_KERNEL(reduce_sum_pass2<WARP, SQRT>), dim3(1), dim3(kThreads), 0, stream, partial,
               out, blocks, scale);
}

template <int WARP, bool SCALE>
void finite(const Ctx& cx, float* x, std::int32_t* flag, float s, std::int64_t n) {
  if (n <= 0) return;
  std::int64_t blocks = (n + kThreads - 1) / kThreads;
  const std::int64_t cap = std::int64_t{cx.multiprocessors > 0 ? cx.multiprocessors : 1} * 8;
  if (blocks > cap) blocks = cap;
  launch<WARP>(CT_KERNEL(finite_kernel<WARP, SCALE>), dim3(static_cast<unsigned>(blocks)),
               dim3(kThreads), 0, static_cast<ct_stream_t>(cx.stream), x, flag, s, n);
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

std::size_t reduce_workspace(std::int64_t n) {
  return static_cast<std::size_t>(reduce_sum_partials(n)) * sizeof(float);
}

void sum(const Ctx& cx, float* out, const float* x, std::int64_t n, float scale, void* workspace) {
  const auto stream = static_cast<ct_stream_t>(cx.stream);
  auto* partial = static_cast<float*>(workspace);
  if constexpr (kMaxWarp >= 64) {
    if (cx.warp == 64) return reduce_sum<64>(x, partial, out, n, stream, scale);
  }
  if (cx.warp != 32) throw std::invalid_argument("sum: warp size must be 32 or 64");
  reduce_sum<32>(x, partial, out, n, stream, scale);
}

void norm(const Ctx& cx, float* out, const float* x, std::int64_t n, void* workspace) {
  const auto stream = static_cast<ct_stream_t>(cx.stream);
  auto* partial = static_cast<float*>(workspace);
  if constexpr (kMaxWarp >= 64) {
    if (cx.warp == 64) return reduce_sum<64, true, true>(x, partial, out, n, stream);
  }
  if (cx.warp != 32) throw std::invalid_argument("norm: warp size must be 32 or 64");
  reduce_sum<32, true, true>(x, partial, out, n, stream);
}

void check_finite(const Ctx& cx, std::int32_t* flag, const float* x, std::int64_t n) {
  if constexpr (kMaxWarp >= 64) {
    if (cx.warp == 64) return finite<64, false>(cx, const_cast<float*>(x), flag, 1.0f, n);
  }
  if (cx.warp != 32) throw std::invalid_argument("check_finite: warp size must be 32 or 64");
  finite<32, false>(cx, const_cast<float*>(x), flag, 1.0f, n);
}

void unscale_check(const Ctx& cx, float* x, std::int32_t* flag, float inv_scale, std::int64_t n) {
  if constexpr (kMaxWarp >= 64) {
    if (cx.warp == 64) return finite<64, true>(cx, x, flag, inv_scale, n);
  }
  if (cx.warp != 32) throw std::invalid_argument("unscale_check: warp size must be 32 or 64");
  finite<32, true>(cx, x, flag, inv_scale, n);
}

}  // namespace ct::gpu
