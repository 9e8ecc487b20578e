#version 450
// GELU, tanh form. Forward: out = gelu(x). BACKWARD: dx = dout * gelu'(x). All [n], all f32
// or all the same 16-bit type (H_F16 / H_BF16, common/h16.glsl).
#extension GL_GOOGLE_include_directive : require
#include "common/h16.glsl"
#include "common/index.glsl"

layout(local_size_x = 256) in;
#ifndef BACKWARD
layout(push_constant) uniform Push {
  uint n;
  uint oo;
  uint ox;
} pc;
layout(std430, binding = 0) writeonly buffer Out { H_T o[]; };
layout(std430, binding = 1) readonly buffer X { H_T x[]; };
#else
layout(push_constant) uniform Push {
  uint n;
  uint odx;
  uint ox;
  uint odo;
} pc;
layout(std430, binding = 0) writeonly buffer DX { H_T dx[]; };
layout(std430, binding = 1) readonly buffer X { H_T x[]; };
layout(std430, binding = 2) readonly buffer DOut { H_T dout[]; };
#endif

#include "common/math.glsl"

const float kScale = 0.7978845608028654;  // sqrt(2/pi)

// With z = kScale (c + 0.044715 c^3) and t = exp(-2|z|) in [0, 1]:
//   1 + tanh z = 2 / (1 + t) for z >= 0, 2 t / (1 + t) for z < 0;  sech^2 z = 4 t / (1 + t)^2.
// No 1 + tanh z cancellation (gelu(-7) is -4e-14 in f32, not 0), no inf/inf for large |z|.
// c is v clamped to [-20, 20]: past |v| = 7e12, v^3 overflows (and inf * 0 became NaN in the
// backward on NVIDIA's driver); from |v| = 20 on, |z| > 300 and t = 0, so gelu(v) = v or -0 and
// gelu'(v) = 1 or 0 as with the exact v (gelu(-11) is already -0 in fp32). For |v| <= 20 c = v:
// the results are those of the unclamped formula. NaN or inf v: the clamp may give anything in
// [-20, 20]; v itself carries NaN / inf into every branch. For z < 0 the result is q * t, formed
// by ct_mul_exp() (common/math.glsl) without t underflowing first.
void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
  float v = h_load(x[pc.ox + i]);
  float c = clamp(v, -20.0, 20.0);
  float z = kScale * (c + 0.044715 * c * c * c);
  float e = -2.0 * abs(z);  // log t, >= -610
  float t = ct_exp_le0(e);
  float u = 1.0 / (1.0 + t);
#ifndef BACKWARD
  // 0.5 v (1 + tanh z)
  o[pc.oo + i] = h_store(z >= 0.0 ? v * u : ct_mul_exp(v * u, e));
#else
  // dout * (0.5 (1 + tanh z) + 0.5 v sech^2 z kScale (1 + 3 * 0.044715 v^2))
  float d = h_load(dout[pc.odo + i]);
  float g;
  if (z >= 0.0) {
    // d u (1 + 2 kScale u v t (1 + 3 * 0.044715 v^2)); v t first, so that once t is 0 this is
    // d u (an inf v gives NaN, as fp64's 0.5 v sech^2 z)
    float w = v * t;
    g = d * u * (1.0 + 2.0 * kScale * u * (w + 3.0 * 0.044715 * (w * c) * c));
  } else if (e < -200.0) {
    // t < 1e-87: t v^3 dout is below the smallest bf16 subnormal for any finite dout; NaN for
    // v = -inf (as fp64's 0.5 v sech^2 z) or a NaN dout. (Not d * v * 0.0: compilers may fold
    // x * 0.0 to 0.0 without SignedZeroInfNanPreserve.)
    g = !ct_isfinite(v) || ct_isnan(d) ? ct_nan() : ct_signed_zero(d);  // +0 * d
  } else {
    // t d u (1 + 2 kScale u v (1 + 3 * 0.044715 v^2)); |z| <= 100 here: |v| < 13, c = v
    float p = 2.0 * c * kScale * (1.0 + 3.0 * 0.044715 * c * c);
    g = ct_mul_exp(d * u * (1.0 + p * u), e);
  }
  dx[pc.odx + i] = h_store(g);
#endif
}
