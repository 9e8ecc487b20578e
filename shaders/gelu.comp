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

const float kScale = 0.7978845608028654;  // sqrt(2/pi)

// With z = kScale (x + 0.044715 x^3) and t = exp(-2|z|) in [0, 1]:
//   1 + tanh z = 2 / (1 + t) for z >= 0, 2 t / (1 + t) for z < 0;  sech^2 z = 4 t / (1 + t)^2.
// No 1 + tanh z cancellation (gelu(-7) is -4e-14 in f32, not 0), no inf/inf for large |z|.
// For z < 0 the result is q * t; mul_exp() forms it without t underflowing first, so that a
// result that is still a normal float (bf16 has f32's range) does not become 0.
float mul_exp(float q, float e) {
  if (e > -80.0 || q == 0.0 || !(abs(q) < 1.0 / 0.0)) return q * exp(e);  // also inf, NaN
  return (q < 0.0 ? -1.0 : 1.0) * exp(log(abs(q)) + e);
}

void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
  float v = h_load(x[pc.ox + i]);
  float z = kScale * (v + 0.044715 * v * v * v);
  float e = -2.0 * abs(z);  // log t
  float t = exp(e);
  float u = 1.0 / (1.0 + t);
#ifndef BACKWARD
  // 0.5 v (1 + tanh z)
  o[pc.oo + i] = h_store(z >= 0.0 ? v * u : mul_exp(v * u, e));
#else
  // dout * (0.5 (1 + tanh z) + 0.5 v sech^2 z kScale (1 + 3 * 0.044715 v^2))
  float d = h_load(dout[pc.odo + i]);
  float g;
  if (z >= 0.0) {
    // d u (1 + 2 kScale u v t (1 + 3 * 0.044715 v^2)); v t first, so that once t underflows
    // this is d u, not NaN from 0 * inf (as in fp64, where v^3 does not overflow)
    float w = v * t;
    g = d * u * (1.0 + 2.0 * kScale * u * (w + 3.0 * 0.044715 * (w * v) * v));
  } else if (e < -200.0) {
    // t < 1e-87: t v^3 dout is below the smallest bf16 subnormal for any finite dout; NaN for
    // v = -inf (as fp64's 0.5 v sech^2 z) or a NaN dout. (Not d * v * 0.0: compilers may fold
    // x * 0.0 to 0.0 without SignedZeroInfNanPreserve.)
    g = isinf(v) || isnan(d) ? uintBitsToFloat(0x7fc00000u)
                             : uintBitsToFloat(floatBitsToUint(d) & 0x80000000u);  // +0 * d
  } else {
    // t d u (1 + 2 kScale u v (1 + 3 * 0.044715 v^2))
    float p = 2.0 * v * kScale * (1.0 + 3.0 * 0.044715 * v * v);
    g = mul_exp(d * u * (1.0 + p * u), e);
  }
  dx[pc.odx + i] = h_store(g);
#endif
}
