// Fused log-softmax + negative log-likelihood, forward and backward, one block per row; logits
// f32 or 16-bit, statistics in fp32 by the fixed block trees of common.h (the same at every warp
// size). The backward reads a row's statistics before it writes, so dlogits may be logits.
// Rows are Vp wide: classes [0, V), then padding [V, Vp) that the forward never reads and the
// backward writes as 0 (core/device.h). The training step's kernel does both in place, reading
// a row twice (online statistics, then the gradient) where the two kernels read it five times.
#include "backends/gpu/kernels/common.h"
#include "backends/gpu/kernels/safe_math.h"

namespace ct::gpu {
namespace {

constexpr int kThreads = 256;

// Row max and log(sum(exp(x - max))) of x (V) of element E, over the block; every thread gets them.
template <int WARP, typename E>
__device__ __forceinline__ void row_stats(const void* x, std::int64_t base, std::int64_t V,
                                          float* smem, float* maxval, float* logsum) {
  float m = -kFltMax;  // finite start; -inf logits give ct_exp_le0(-inf) = 0
  for (std::int64_t i = threadIdx.x; i < V; i += kThreads) m = fmaxf(m, E::load(x, base + i));
  m = block_max<WARP, kThreads>(m, smem);
  float s = 0.0f;
  for (std::int64_t i = threadIdx.x; i < V; i += kThreads)
    s += ct_exp_le0(E::load(x, base + i) - m);
  s = block_sum<WARP, kThreads>(s, smem);
  *maxval = m;
  *logsum = logf(s);
}

// losses (N) f32; logits (N, Vp) of element E; targets (N) i32. Block n handles row n.
template <int WARP, typename E>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    crossentropy_forward_kernel(float* losses, const void* logits, const std::int32_t* targets,
                                std::int64_t V, std::int64_t Vp) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_SHARED(float, smem, kThreads);
  const std::int64_t n = blockIdx.x;
  const std::int64_t base = n * Vp;
  float m, ls;
  row_stats<WARP, E>(logits, base, V, smem, &m, &ls);
  // log z + (max - x[target]): the small log z is not rounded against a large max first.
  if (threadIdx.x == 0) losses[n] = ls + (m - E::load(logits, base + targets[n]));
}

// dlogits, logits (N, Vp) of element E (may be the same memory); targets (N) i32.
// dlogits = dloss * (softmax(logits) - onehot(target)) over [0, V), 0 over [V, Vp).
template <int WARP, typename E>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    crossentropy_backward_kernel(void* dlogits, const void* logits, const std::int32_t* targets,
                                 std::int64_t V, std::int64_t Vp, float dloss) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_SHARED(float, smem, kThreads);
  const std::int64_t n = blockIdx.x;
  const std::int64_t base = n * Vp;
  float m, ls;
  row_stats<WARP, E>(logits, base, V, smem, &m, &ls);
  const std::int64_t target = targets[n];
  for (std::int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float p = ct_exp_le0(E::load(logits, base + i) - m - ls);
    E::store(dlogits, base + i, dloss * (p - (i == target ? 1.0f : 0.0f)));
  }
  for (std::int64_t i = V + threadIdx.x; i < Vp; i += kThreads) E::store(dlogits, base + i, 0.0f);
}

// Row max and log(sum(exp(x - max))) of x (V) of element E in one read: each thread keeps the
// running max of its elements and their sum of exp(x - running max), rescaled when the max
// grows; the block merges the threads' pairs at the block max. Every thread gets them.
template <int WARP, typename E>
__device__ __forceinline__ void row_stats_online(const void* x, std::int64_t base, std::int64_t V,
                                                 float* smem, float* maxval, float* logsum) {
  float m = -kFltMax, s = 0.0f;
  for (std::int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float v = E::load(x, base + i);
    if (v > m) {
      s = s * ct_exp_le0(m - v) + 1.0f;
      m = v;
    } else {
      s += ct_exp_le0(v - m);  // NaN v: s becomes NaN, as in row_stats
    }
  }
  const float mb = block_max<WARP, kThreads>(m, smem);
  s = block_sum<WARP, kThreads>(s * ct_exp_le0(m - mb), smem);
  *maxval = mb;
  *logsum = logf(s);
}

// losses (N) f32; logits (N, Vp) of element E, overwritten by their dlogits; targets (N) i32.
// losses[n] as crossentropy_forward_kernel, logits[n] as crossentropy_backward_kernel in place.
template <int WARP, typename E>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    crossentropy_forward_backward_kernel(float* losses, void* logits, const std::int32_t* targets,
                                         std::int64_t V, std::int64_t Vp, float dloss) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_SHARED(float, smem, kThreads);
  const std::int64_t n = blockIdx.x;
  const std::int64_t base = n * Vp;
  float m, ls;
  row_stats_online<WARP, E>(logits, base, V, smem, &m, &ls);
  const std::int64_t target = targets[n];
  for (std::int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float x = E::load(logits, base + i);
    // The thread that owns the target's column reads it just before it overwrites it.
    if (i == target) losses[n] = ls + (m - x);
    const float p = ct_exp_le0(x - m - ls);
    E::store(logits, base + i, dloss * (p - (i == target ? 1.0f : 0.0f)));
  }
  for (std::int64_t i = V + threadIdx.x; i < Vp; i += kThreads) E::store(logits, base + i, 0.0f);
}

}  // namespace

void crossentropy_forward(const Ctx& cx, float* losses, const void* logits, Elem e,
                          const std::int32_t* targets, std::int64_t N, std::int64_t V,
                          std::int64_t Vp) {
  for (std::int64_t row = 0; row < N; row += 65535) {  // gridDim.x limit of some targets
    const std::int64_t rows = N - row < 65535 ? N - row : 65535;
    with_warp(cx.warp, [&](auto w) {
      constexpr int W = decltype(w)::value;
      with_elem(e, [&](auto el) {
        using E = decltype(el);
        launch<W>(
            CT_KERNEL(crossentropy_forward_kernel<W, E>), dim3(static_cast<unsigned>(rows)),
            dim3(kThreads), 0, stream_of(cx), losses + row,
            static_cast<const char*>(logits) + row * Vp * static_cast<std::int64_t>(elem_size(e)),
            targets + row, V, Vp);
      });
    });
  }
}

void crossentropy_backward(const Ctx& cx, void* dlogits, const void* logits, Elem e,
                           const std::int32_t* targets, std::int64_t N, std::int64_t V,
                           std::int64_t Vp, float dloss) {
  const std::int64_t row_bytes = Vp * static_cast<std::int64_t>(elem_size(e));
  for (std::int64_t row = 0; row < N; row += 65535) {
    const std::int64_t rows = N - row < 65535 ? N - row : 65535;
    with_warp(cx.warp, [&](auto w) {
      constexpr int W = decltype(w)::value;
      with_elem(e, [&](auto el) {
        using E = decltype(el);
        launch<W>(CT_KERNEL(crossentropy_backward_kernel<W, E>), dim3(static_cast<unsigned>(rows)),
                  dim3(kThreads), 0, stream_of(cx), static_cast<char*>(dlogits) + row * row_bytes,
                  static_cast<const char*>(logits) + row * row_bytes, targets + row, V, Vp, dloss);
      });
    });
  }
}

void crossentropy_forward_backward(const Ctx& cx, float* losses, void* logits, Elem e,
                                   const std::int32_t* targets, std::int64_t N, std::int64_t V,
                                   std::int64_t Vp, float dloss) {
  const std::int64_t row_bytes = Vp * static_cast<std::int64_t>(elem_size(e));
  for (std::int64_t row = 0; row < N; row += 65535) {
    const std::int64_t rows = N - row < 65535 ? N - row : 65535;
    with_warp(cx.warp, [&](auto w) {
      constexpr int W = decltype(w)::value;
      with_elem(e, [&](auto el) {
        using E = decltype(el);
        launch<W>(CT_KERNEL(crossentropy_forward_backward_kernel<W, E>),
                  dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream_of(cx), losses + row,
                  static_cast<char*>(logits) + row * row_bytes, targets + row, V, Vp, dloss);
      });
    });
  }
}

}  // namespace ct::gpu
