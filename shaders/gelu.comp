#version 450
// GELU, tanh form (the formulas: common/gelu.glsl). Forward: out = gelu(x). BACKWARD: dx = dout *
// gelu'(x). All [n], all f32 or all the same 16-bit type (H_F16 / H_BF16, common/h16.glsl).
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

#include "common/gelu.glsl"

void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
  float v = h_load(x[pc.ox + i]);
#ifndef BACKWARD
  o[pc.oo + i] = h_store(ct_gelu(v));
#else
  dx[pc.odx + i] = h_store(ct_gelu_backward(v, h_load(dout[pc.odo + i])));
#endif
}
