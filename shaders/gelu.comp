#version 450
// GELU, tanh form. Forward: out = gelu(x). BACKWARD: dx = dout * gelu'(x). All [n].
#extension GL_GOOGLE_include_directive : require
#include "common/index.glsl"

layout(local_size_x = 256) in;
#ifndef BACKWARD
layout(push_constant) uniform Push {
  uint n;
  uint oo;
  uint ox;
} pc;
layout(std430, binding = 0) writeonly buffer Out { float o[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
#else
layout(push_constant) uniform Push {
  uint n;
  uint odx;
  uint ox;
  uint odo;
} pc;
layout(std430, binding = 0) writeonly buffer DX { float dx[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer DOut { float dout[]; };
#endif

const float kScale = 0.7978845608028654;  // sqrt(2/pi)

// tanh without the inf/inf of (e^2x - 1)/(e^2x + 1) for large |x|.
float safe_tanh(float z) {
  float t = exp(-2.0 * abs(z));
  float r = (1.0 - t) / (1.0 + t);
  return z < 0.0 ? -r : r;
}

void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
#ifndef BACKWARD
  float v = x[pc.ox + i];
  o[pc.oo + i] = 0.5 * v * (1.0 + safe_tanh(kScale * (v + 0.044715 * v * v * v)));
#else
  float v = x[pc.ox + i];
  float th = safe_tanh(kScale * (v + 0.044715 * v * v * v));
  float sech2 = 1.0 - th * th;
  float grad = 0.5 * (1.0 + th) + 0.5 * v * sech2 * kScale * (1.0 + 3.0 * 0.044715 * v * v);
  dx[pc.odx + i] = dout[pc.odo + i] * grad;
#endif
}
