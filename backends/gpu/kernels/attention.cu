// Causal multi-head self-attention, forward and backward (not fused: the probabilities are
// stored, as core/device.h's op keeps them for the backward), with grouped-query attention. qkv
// rows [C3], C3 = C + 2 NKV hs, hold q (NH heads of hs = C / NH) | k (NKV heads) | v (NKV heads);
// query head h reads key/value head h / G, G = NH / NKV (NKV = NH: plain multi-head attention).
// All tensors of one element type E; fp32 arithmetic.
//
// Forward: one block per (b, h, t) query row: scores for t2 <= t, softmax by the fixed block
// trees of common.h, the row of att, then out = att v. Backward in two kernels so that every
// output element has one owner and no atomics are needed: the first, per query row, forms
// dpre[t, t2] = att (datt - sum(att datt)) scale (into the workspace) and dq; the second, per key
// row t2 of a key/value head, sums dk and dv over the G query heads of its group in order and,
// for each, over the queries t >= t2 in order.
#include "backends/gpu/kernels/common.h"
#include "backends/gpu/kernels/safe_math.h"

namespace ct::gpu {
namespace {

// Threads a block: 64 for short rows (T <= 128), else 256. Every loop strides by THREADS, so the
// results do not depend on it beyond the fixed reduction order of common.h's block_reduce.
constexpr int kSmallThreads = 64, kThreads = 256;

struct Dims {
  std::int64_t T, C, NH, NKV, hs;
  std::int64_t C3;  // C + 2 NKV hs, the row of qkv
  std::int64_t G;   // NH / NKV query heads a key/value head
  float scale;
};

// Where key / value head j starts in a row of qkv.
__device__ __forceinline__ std::int64_t k_col(const Dims& d, std::int64_t j) {
  return d.C + j * d.hs;
}
__device__ __forceinline__ std::int64_t v_col(const Dims& d, std::int64_t j) {
  return d.C + (d.NKV + j) * d.hs;
}

// Row index of (b, h, t) blocks over `heads` heads (NH query heads or NKV key/value heads):
// blockIdx.x = (b heads + h) T + t.
__device__ __forceinline__ void row_of(const Dims& d, std::int64_t heads, std::int64_t* b,
                                       std::int64_t* h, std::int64_t* t) {
  const std::int64_t r = blockIdx.x;
  *t = r % d.T;
  *h = (r / d.T) % heads;
  *b = r / (d.T * heads);
}

// out (B, T, C), att (B, NH, T, T), qkv (B, T, C3), all of element E. One block per query row
// (b, h, t). Dynamic shared memory: T floats (the row's probabilities).
template <int WARP, typename E, int THREADS>
__global__ void CT_LAUNCH_BOUNDS(THREADS)
    attention_forward_kernel(void* out, void* att, const void* qkv, Dims d) {
  CT_CHECK_LAUNCH_BOUNDS(THREADS);
  CT_SHARED(float, red, THREADS);
  CT_DYNAMIC_SHARED(float, p);
  std::int64_t b, h, t;
  row_of(d, d.NH, &b, &h, &t);
  const std::int64_t C3 = d.C3, j = h / d.G;
  const std::int64_t q0 = (b * d.T + t) * C3 + h * d.hs;
  float m = -kFltMax;
  for (std::int64_t t2 = threadIdx.x; t2 <= t; t2 += THREADS) {
    const std::int64_t k0 = (b * d.T + t2) * C3 + k_col(d, j);
    float dot = 0.0f;
    for (std::int64_t i = 0; i < d.hs; ++i) dot += E::load(qkv, q0 + i) * E::load(qkv, k0 + i);
    p[t2] = dot * d.scale;
    m = fmaxf(m, p[t2]);
  }
  m = block_max<WARP, THREADS>(m, red);
  float s = 0.0f;
  for (std::int64_t t2 = threadIdx.x; t2 <= t; t2 += THREADS) {
    p[t2] = ct_exp_le0(p[t2] - m);
    s += p[t2];
  }
  s = block_sum<WARP, THREADS>(s, red);
  const float inv = 1.0f / s;
  const std::int64_t a0 = ((b * d.NH + h) * d.T + t) * d.T;
  for (std::int64_t t2 = threadIdx.x; t2 < d.T; t2 += THREADS) {
    float v = 0.0f;
    if (t2 <= t) {
      v = p[t2] * inv;
      p[t2] = v;
    }
    E::store(att, a0 + t2, v);
  }
  __syncthreads();
  const std::int64_t o0 = (b * d.T + t) * d.C + h * d.hs;
  for (std::int64_t i = threadIdx.x; i < d.hs; i += THREADS) {
    float acc = 0.0f;
    for (std::int64_t t2 = 0; t2 <= t; ++t2)
      acc += p[t2] * E::load(qkv, (b * d.T + t2) * C3 + v_col(d, j) + i);
    E::store(out, o0 + i, acc);
  }
}

// Per query row (b, h, t): dpre (B, NH, T, T) f32 in the workspace, rows t2 <= t, and dq (the q
// columns of dqkv (B, T, C3)). dqkv, dout, qkv, att of element E. Dynamic shared memory: T
// floats (datt, then dpre).
template <int WARP, typename E, int THREADS>
__global__ void CT_LAUNCH_BOUNDS(THREADS)
    attention_backward_query_kernel(void* dqkv, float* dpre, const void* dout, const void* qkv,
                                    const void* att, Dims d) {
  CT_CHECK_LAUNCH_BOUNDS(THREADS);
  CT_SHARED(float, red, THREADS);
  CT_DYNAMIC_SHARED(float, g);
  std::int64_t b, h, t;
  row_of(d, d.NH, &b, &h, &t);
  const std::int64_t C3 = d.C3, j = h / d.G;
  const std::int64_t a0 = ((b * d.NH + h) * d.T + t) * d.T;
  const std::int64_t o0 = (b * d.T + t) * d.C + h * d.hs;
  float dot = 0.0f;
  for (std::int64_t t2 = threadIdx.x; t2 <= t; t2 += THREADS) {
    const std::int64_t v0 = (b * d.T + t2) * C3 + v_col(d, j);
    float datt = 0.0f;
    for (std::int64_t i = 0; i < d.hs; ++i) datt += E::load(qkv, v0 + i) * E::load(dout, o0 + i);
    g[t2] = datt;
    dot += E::load(att, a0 + t2) * datt;
  }
  dot = block_sum<WARP, THREADS>(dot, red);
  for (std::int64_t t2 = threadIdx.x; t2 <= t; t2 += THREADS) {
    const float v = E::load(att, a0 + t2) * (g[t2] - dot) * d.scale;
    g[t2] = v;
    dpre[a0 + t2] = v;
  }
  __syncthreads();
  const std::int64_t q0 = (b * d.T + t) * C3 + h * d.hs;
  for (std::int64_t i = threadIdx.x; i < d.hs; i += THREADS) {
    float acc = 0.0f;
    for (std::int64_t t2 = 0; t2 <= t; ++t2)
      acc += g[t2] * E::load(qkv, (b * d.T + t2) * C3 + k_col(d, j) + i);
    E::store(dqkv, q0 + i, acc);
  }
}

// Per key row (b, j, t2) of key/value head j (one block each, B NKV T blocks), the k and v
// columns of dqkv (B, T, C3): dk = sum over the query heads h = j G .. j G + G - 1 and, for each,
// over t >= t2 of dpre[h, t, t2] q_h[t]; dv = the same sum of att[h, t, t2] dout_h[t]. h and t
// in increasing order, one accumulator: every element has one owner and a fixed order.
template <int WARP, typename E, int THREADS>
__global__ void CT_LAUNCH_BOUNDS(THREADS)
    attention_backward_key_kernel(void* dqkv, const float* dpre, const void* dout, const void* qkv,
                                  const void* att, Dims d) {
  CT_CHECK_LAUNCH_BOUNDS(THREADS);
  std::int64_t b, j, t2;
  row_of(d, d.NKV, &b, &j, &t2);
  const std::int64_t C3 = d.C3;
  for (std::int64_t i = threadIdx.x; i < d.hs; i += THREADS) {
    float dk = 0.0f, dv = 0.0f;
    for (std::int64_t h = j * d.G; h < (j + 1) * d.G; ++h) {
      const std::int64_t base = (b * d.NH + h) * d.T * d.T;
      for (std::int64_t t = t2; t < d.T; ++t) {
        const std::int64_t at = base + t * d.T + t2;
        dk += dpre[at] * E::load(qkv, (b * d.T + t) * C3 + h * d.hs + i);
        dv += E::load(att, at) * E::load(dout, (b * d.T + t) * d.C + h * d.hs + i);
      }
    }
    const std::int64_t r0 = (b * d.T + t2) * C3 + i;
    E::store(dqkv, r0 + k_col(d, j), dk);
    E::store(dqkv, r0 + v_col(d, j), dv);
  }
}

Dims dims_of(std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t NKV) {
  const std::int64_t hs = C / NH;
  return Dims{T, C, NH, NKV, hs, C + 2 * NKV * hs, NH / NKV, 1.0f / sqrtf(static_cast<float>(hs))};
}

}  // namespace

void attention_forward(const Ctx& cx, void* out, void* att, const void* qkv, Elem e, std::int64_t B,
                       std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t NKV) {
  if (B * T * C <= 0) return;
  const Dims d = dims_of(T, C, NH, NKV);
  const std::size_t smem = static_cast<std::size_t>(T) * sizeof(float);
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_elem(e, [&](auto el) {
      using E = decltype(el);
      const dim3 grid(static_cast<unsigned>(B * NH * T));
      if (T <= 128)
        launch<W>(CT_KERNEL(attention_forward_kernel<W, E, kSmallThreads>), grid,
                  dim3(kSmallThreads), smem, stream_of(cx), out, att, qkv, d);
      else
        launch<W>(CT_KERNEL(attention_forward_kernel<W, E, kThreads>), grid, dim3(kThreads), smem,
                  stream_of(cx), out, att, qkv, d);
    });
  });
}

std::size_t attention_backward_workspace(std::int64_t B, std::int64_t T, std::int64_t C,
                                         std::int64_t NH) {
  (void)C;
  return static_cast<std::size_t>(B * NH * T * T) * sizeof(float);
}

void attention_backward(const Ctx& cx, void* dqkv, const void* dout, const void* qkv,
                        const void* att, Elem e, std::int64_t B, std::int64_t T, std::int64_t C,
                        std::int64_t NH, std::int64_t NKV, void* workspace) {
  if (B * T * C <= 0) return;
  const Dims d = dims_of(T, C, NH, NKV);
  auto* dpre = static_cast<float*>(workspace);
  const std::size_t smem = static_cast<std::size_t>(T) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(B * NH * T));      // query rows
  const dim3 kv_grid(static_cast<unsigned>(B * NKV * T));  // key rows of the key/value heads
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_elem(e, [&](auto el) {
      using E = decltype(el);
      if (T <= 128) {
        launch<W>(CT_KERNEL(attention_backward_query_kernel<W, E, kSmallThreads>), grid,
                  dim3(kSmallThreads), smem, stream_of(cx), dqkv, dpre, dout, qkv, att, d);
        launch<W>(CT_KERNEL(attention_backward_key_kernel<W, E, kSmallThreads>), kv_grid,
                  dim3(kSmallThreads), 0, stream_of(cx), dqkv, static_cast<const float*>(dpre),
                  dout, qkv, att, d);
      } else {
        launch<W>(CT_KERNEL(attention_backward_query_kernel<W, E, kThreads>), grid, dim3(kThreads),
                  smem, stream_of(cx), dqkv, dpre, dout, qkv, att, d);
        launch<W>(CT_KERNEL(attention_backward_key_kernel<W, E, kThreads>), kv_grid, dim3(kThreads),
                  0, stream_of(cx), dqkv, static_cast<const float*>(dpre), dout, qkv, att, d);
      }
    });
  });
}

}  // namespace ct::gpu
