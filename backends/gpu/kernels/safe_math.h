// Transcendentals whose extremes are decided here rather than by the target's math library, the
// counterpart of shaders/common/math.glsl (same thresholds, same formulas): expf/logf/sqrtf only
// ever see arguments with finite, normal-range results (or NaN, which passes through), special
// values are tested by their bits (a fast-math build may assume there are none), and nothing
// computes inf/inf, inf * 0 or a division by a value past 2^126. For ordinary arguments the
// helpers evaluate the formulas the kernels used before, in the same order.
#pragma once

#include <cstdint>

#include "backends/gpu/numeric.h"
#include "backends/gpu/portability.h"

namespace ct::gpu {

constexpr float kFltMax = 3.402823466e38f;

__device__ __forceinline__ bool ct_isnan(float x) {
  return (f32_bits(x) & 0x7fffffffu) > 0x7f800000u;
}
__device__ __forceinline__ bool ct_isinf(float x) {
  return (f32_bits(x) & 0x7fffffffu) == 0x7f800000u;
}
__device__ __forceinline__ float ct_nan() {
  return bits_f32(0x7fc00000u);
}
// +0 or -0 with the sign of x (x * 0.0f may be folded to +0).
__device__ __forceinline__ float ct_signed_zero(float x) {
  return bits_f32(f32_bits(x) & 0x80000000u);
}

// exp(x) for x <= 0 up to rounding: 0 below -104 (fp32's exp is 0 there), -inf included; NaN
// stays NaN.
__device__ __forceinline__ float ct_exp_le0(float x) {
  return x < -104.0f ? 0.0f : expf(x);
}

// exp(x) for x <= 0 where the result only becomes a 16-bit or TF32 operand of a matrix tile or
// joins an f32 row sum (the attention tiles' softmax, flash_attention_tc.cu): on CUDA the
// hardware's ex2 (x log2(e), then ex2.approx.ftz: MUFU.EX2, subnormal results flushed to 0;
// relative error ~2^-21 plus |x| 2^-24, below the operands' rounding), two instructions where
// ct_exp_le0 takes eight and a branch; 0 for -inf and -FLT_MAX (x log2(e) is -inf), NaN stays NaN.
// On AMD GPUs likewise v_exp_f32 (__expf). On the SIMT runtime ct_exp_le0: its bits unchanged.
__device__ __forceinline__ float ct_exp_le0_tile(float x) {
#if defined(__CUDA_ARCH__)
  float y;  // (ex2.approx.f32 without .ftz adds a test and two multiplies for subnormal results)
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.44269504f));
  return y;
#elif defined(__HIP_DEVICE_COMPILE__)
  return __expf(x);  // v_mul_f32 by log2(e), v_exp_f32: 2 instructions where expf takes ~20
#else
  return ct_exp_le0(x);
#endif
}

// q * exp(e) for e <= 0, in the log domain where exp(e) alone would be subnormal (e <= -80), so
// that a product still in the normal range does not become 0. NaN q or e -> NaN; +-inf q ->
// +-inf while exp(e) > 0, NaN (inf * 0) once it is 0; |q| below the normal range -> +-0.
__device__ __forceinline__ float ct_mul_exp(float q, float e) {
  if (e > -80.0f) return q * expf(e);
  if (ct_isnan(q) || ct_isnan(e)) return ct_nan();
  if (ct_isinf(q)) return e < -104.0f ? ct_nan() : q;
  if (fabsf(q) < 1.17549435e-38f) return ct_signed_zero(q);
  return (q < 0.0f ? -1.0f : 1.0f) * ct_exp_le0(logf(fabsf(q)) + e);
}

// exp(-g) for g >= -80 (<= e^80), through ct_exp_le0 for g >= 0: expf never sees -1e30.
__device__ __forceinline__ float ct_exp_neg_ge80(float g) {
  return g >= 0.0f ? ct_exp_le0(-g) : expf(-g);
}
// sigmoid(g): 1 / (1 + exp(-g)) for g >= -80 (exp(-g) <= e^80), exp(g) below (1 + e^-80 is 1
// in fp32).
__device__ __forceinline__ float ct_sigmoid(float g) {
  return g >= -80.0f ? 1.0f / (1.0f + ct_exp_neg_ge80(g)) : ct_exp_le0(g);
}
// silu(g) = g sigmoid(g): g / (1 + exp(-g)) for g >= -80, g exp(g) below (-0 below -104, as
// PyTorch's -1e30 / inf); -inf -> NaN (-inf * 0, as PyTorch), NaN -> NaN.
__device__ __forceinline__ float ct_silu(float g) {
  if (g >= -80.0f) return g / (1.0f + ct_exp_neg_ge80(g));
  return ct_isinf(g) ? ct_nan() : g * ct_exp_le0(g);
}

// sqrt(x) for x >= 0 that may be +inf (an overflowed sum of squares): inf by bits.
__device__ __forceinline__ float ct_sqrt(float x) {
  return ct_isinf(x) ? x : sqrtf(x);
}

// A power of two s with a * s in [1, 4), for a finite a >= 1: brings a row whose sums of squares
// overflowed back into range without rounding (the norms' second pass).
__device__ __forceinline__ float ct_downscale(float a) {
  const int e = static_cast<int>((f32_bits(a) >> 23) & 0xffu);  // biased exponent, <= 254
  return bits_f32(static_cast<std::uint32_t>(254 - e > 1 ? 254 - e : 1) << 23);
}

// AdamW's lr * mhat / (sqrt(vhat) + eps) for the new moments m, v, the old v0 and the gradient g
// (shaders/common/math.glsl ct_adam_update): v / bc2 finite: the formula as written; past fp32's
// range, the same quotient from m, v0, g scaled by a power of two, as the fp64 reference has it.
// v0 = +inf: 0 (m / inf); non-finite m or NaN v0: NaN.
__device__ __forceinline__ float ct_adam_update(float m, float v, float v0, float g, float lr,
                                                float b2, float bc1, float bc2, float eps) {
  const float q = v / bc2;
  if (ct_isfinite(q)) return lr * (m / bc1) / (sqrtf(q) + eps);
  if (!ct_isfinite(m) || ct_isnan(v0)) return ct_nan();
  if (ct_isinf(v0)) return 0.0f;
  const float r0 = sqrtf(v0), ag = fabsf(g);
  const float k = ct_downscale(r0 > ag ? r0 : ag);
  const float gs = g * k;
  const float t = b2 * ((v0 * k) * k) + (1.0f - b2) * gs * gs;
  return lr * ((m * k) / bc1) / (sqrtf(t / bc2) + eps * k);
}

}  // namespace ct::gpu
