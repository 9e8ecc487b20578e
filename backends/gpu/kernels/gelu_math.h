// The tanh GELU and its derivative of one element, fp32: what gelu.cu's kernels and the GELU
// epilogues of the GEMM kernels (matmul.cu, gemm_tc.cu) compute, written once so that a fused
// epilogue gives the bits of the separate pass.
//
// gelu(v) = 0.5 v (1 + tanh z) = v / (1 + exp(-2z)), z = sqrt(2/pi) (c + 0.044715 c^3), written
// with t = exp(-2|z|) <= 1 so that nothing overflows and the tails keep their precision (the
// formulation of shaders/gelu.comp): z >= 0 gives v u with u = 1 / (1 + t), z < 0 gives v u t
// (ct_mul_exp, safe_math.h). c is v clamped to [-20, 20]: v^3 would overflow past |v| = 7e12
// (inf * 0 = NaN in the backward), and from |v| = 20 on t = 0 (|z| > 300), so clamping changes
// nothing else; for |v| <= 20 c = v. NaN / inf v reach every branch through v itself.
#pragma once

#include "backends/gpu/kernels/safe_math.h"

namespace ct::gpu {

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

__device__ __forceinline__ float gelu_clamp20(float v) {
  return v > 20.0f ? 20.0f : (v < -20.0f ? -20.0f : v);  // NaN stays NaN
}

// 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))).
__device__ __forceinline__ float gelu_value(float v) {
  const float c = gelu_clamp20(v);
  const float z = kGeluS * (c + kGeluA * c * c * c);
  const float e = -2.0f * fabsf(z);  // log t, >= -610
  const float u = 1.0f / (1.0f + ct_exp_le0(e));
  return z >= 0.0f ? v * u : ct_mul_exp(v * u, e);
}

// d * gelu'(v).
__device__ __forceinline__ float gelu_grad(float v, float d) {
  const float c = gelu_clamp20(v);
  const float z = kGeluS * (c + kGeluA * c * c * c);
  const float e = -2.0f * fabsf(z);
  const float t = ct_exp_le0(e);
  const float u = 1.0f / (1.0f + t);
  if (z >= 0.0f) {
    const float w = v * t;
    return d * u * (1.0f + 2.0f * kGeluS * u * (w + 3.0f * kGeluA * (w * c) * c));
  }
  if (e < -200.0f) {  // gelu' is +0 this far out: +0 * d (NaN for inf v or NaN d)
    const bool nan = !ct_isfinite(v) || ct_isnan(d);
    return nan ? ct_nan() : ct_signed_zero(d);
  }
  // |z| <= 100: |v| < 13, c = v
  const float p = 2.0f * c * kGeluS * (1.0f + 3.0f * kGeluA * c * c);
  return ct_mul_exp(d * u * (1.0f + p * u), e);
}

// A GEMM's GELU epilogue (kernels.h GemmArgs::gelu_out / gelu_pre), a second pass of the thread
// over the outputs it has just stored in c (of element C; the thread reads back its own stores):
// gelu_out (=) gelu(c), or c (=) gelu_backward(gelu_pre, c), as gelu.cu's kernels would compute
// them from c, so the same bits. A pass of its own rather than code inside the kernels' unrolled
// accumulator loops: grown by the GELU, those loops are no longer unrolled by AMDGPU (gfx90a),
// which would then keep every GEMM's accumulators in scratch memory.
template <typename C>
__device__ __forceinline__ void gemm_gelu_pass(void* c, std::int64_t at, void* gelu_out,
                                               const void* gelu_pre) {
  const float v = C::load(c, at);
  if (gelu_pre)
    C::store(c, at, gelu_grad(C::load(gelu_pre, at), v));
  else
    C::store(gelu_out, at, gelu_value(v));
}

}  // namespace ct::gpu
