// GELU, tanh form, forward and backward, f32 or 16-bit tensors (all of one element type); fp32
// arithmetic. Elementwise: results do not depend on the grid or the warp size.
#include "backends/gpu/kernels/common.h"

namespace ct::gpu {
namespace {

constexpr int kThreads = 256;
constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kA = 0.044715f;

// gelu(v) = 0.5 v (1 + tanh z) = v / (1 + exp(-2z)), z = sqrt(2/pi) (v + 0.044715 v^3), written
// with t = exp(-2|z|) <= 1 so that nothing overflows and the tails keep their precision (the
// formulation of shaders/gelu.comp): z >= 0 gives v u with u = 1 / (1 + t), z < 0 gives v u t.
// q * exp(e), with the product taken in the log domain where exp(e) alone would be subnormal.
__device__ __forceinline__ float mul_exp(float q, float e) {
  if (e > -80.0f || q == 0.0f || !(fabsf(q) < INFINITY)) return q * expf(e);  // also inf, NaN
  return (q < 0.0f ? -1.0f : 1.0f) * expf(logf(fabsf(q)) + e);
}

// out, x (n) of element E: out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <int WARP, typename E>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    gelu_forward_kernel(void* out, const void* x, std::int64_t n) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_FOR_EACH_ELEMENT(i, n, kThreads) {
    const float v = E::load(x, i);
    const float z = kS * (v + kA * v * v * v);
    const float e = -2.0f * fabsf(z);  // log t
    const float u = 1.0f / (1.0f + expf(e));
    E::store(out, i, z >= 0.0f ? v * u : mul_exp(v * u, e));
  }
}

// dx, x, dout (n) of element E: dx = dout * gelu'(x).
template <int WARP, typename E>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    gelu_backward_kernel(void* dx, const void* x, const void* dout, std::int64_t n) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_FOR_EACH_ELEMENT(i, n, kThreads) {
    const float v = E::load(x, i);
    const float d = E::load(dout, i);
    const float z = kS * (v + kA * v * v * v);
    const float e = -2.0f * fabsf(z);
    const float t = expf(e);
    const float u = 1.0f / (1.0f + t);
    float g;
    if (z >= 0.0f) {
      const float w = v * t;
      g = d * u * (1.0f + 2.0f * kS * u * (w + 3.0f * kA * (w * v) * v));
    } else if (e < -200.0f) {  // gelu' is +0 this far out: +0 * d (NaN for inf x or NaN d)
      const bool nan = !ct_isfinite(v) || d != d;
      g = nan ? bits_f32(0x7fc00000u) : bits_f32(f32_bits(d) & 0x80000000u);
    } else {
      const float p = 2.0f * v * kS * (1.0f + 3.0f * kA * v * v);
      g = mul_exp(d * u * (1.0f + p * u), e);
    }
    E::store(dx, i, g);
  }
}

}  // namespace

void gelu_forward(const Ctx& cx, void* out, const void* x, Elem e, std::int64_t n) {
  if (n <= 0) return;
  const dim3 grid(grid_for(cx, n, kThreads));
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_elem(e, [&](auto el) {
      using E = decltype(el);
      launch<W>(CT_KERNEL(gelu_forward_kernel<W, E>), grid, dim3(kThreads), 0, stream_of(cx), out,
                x, n);
    });
  });
}

void gelu_backward(const Ctx& cx, void* dx, const void* x, const void* dout, Elem e,
                   std::int64_t n) {
  if (n <= 0) return;
  const dim3 grid(grid_for(cx, n, kThreads));
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_elem(e, [&](auto el) {
      using E = decltype(el);
      launch<W>(CT_KERNEL(gelu_backward_kernel<W, E>), grid, dim3(kThreads), 0, stream_of(cx), dx,
                x, dout, n);
    });
  });
}

}  // namespace ct::gpu
