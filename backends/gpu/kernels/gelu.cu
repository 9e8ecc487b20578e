// GELU, tanh form, forward and backward, f32 or 16-bit tensors (all of one element type); fp32
// arithmetic. Elementwise: results do not depend on the grid or the warp size.
#include "backends/gpu/kernels/common.h"
#include "backends/gpu/kernels/safe_math.h"

namespace ct::gpu {
namespace {

constexpr int kThreads = 256;
constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kA = 0.044715f;

// gelu(v) = 0.5 v (1 + tanh z) = v / (1 + exp(-2z)), z = sqrt(2/pi) (c + 0.044715 c^3), written
// with t = exp(-2|z|) <= 1 so that nothing overflows and the tails keep their precision (the
// formulation of shaders/gelu.comp): z >= 0 gives v u with u = 1 / (1 + t), z < 0 gives v u t
// (ct_mul_exp, safe_math.h). c is v clamped to [-20, 20]: v^3 would overflow past |v| = 7e12
// (inf * 0 = NaN in the backward), and from |v| = 20 on t = 0 (|z| > 300), so clamping changes
// nothing else; for |v| <= 20 c = v. NaN / inf v reach every branch through v itself.
__device__ __forceinline__ float clamp20(float v) {
  return v > 20.0f ? 20.0f : (v < -20.0f ? -20.0f : v);  // NaN stays NaN
}

// out, x (n) of element E: out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <int WARP, typename E>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    gelu_forward_kernel(void* out, const void* x, std::int64_t n) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_FOR_EACH_ELEMENT(i, n, kThreads) {
    const float v = E::load(x, i), c = clamp20(v);
    const float z = kS * (c + kA * c * c * c);
    const float e = -2.0f * fabsf(z);  // log t, >= -610
    const float u = 1.0f / (1.0f + ct_exp_le0(e));
    E::store(out, i, z >= 0.0f ? v * u : ct_mul_exp(v * u, e));
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
    const float c = clamp20(v);
    const float z = kS * (c + kA * c * c * c);
    const float e = -2.0f * fabsf(z);
    const float t = ct_exp_le0(e);
    const float u = 1.0f / (1.0f + t);
    float g;
    if (z >= 0.0f) {
      const float w = v * t;
      g = d * u * (1.0f + 2.0f * kS * u * (w + 3.0f * kA * (w * c) * c));
    } else if (e < -200.0f) {  // gelu' is +0 this far out: +0 * d (NaN for inf x or NaN d)
      const bool nan = !ct_isfinite(v) || ct_isnan(d);
      g = nan ? ct_nan() : ct_signed_zero(d);
    } else {  // |z| <= 100: |v| < 13, c = v
      const float p = 2.0f * c * kS * (1.0f + 3.0f * kA * c * c);
      g = ct_mul_exp(d * u * (1.0f + p * u), e);
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
