#version 450
// Loss-scaler step in one pass (Device::unscale_check): x[i] *= inv_scale, and flag[of] |= 1 if
// x[i] was inf/NaN before or after scaling (bit tests: immune to fast-math).
#extension GL_GOOGLE_include_directive : require
#include "common/index.glsl"

layout(local_size_x = 256) in;

layout(push_constant) uniform Push {
  uint n;
  uint ox;
  uint of;
  float inv_scale;
} pc;
layout(std430, binding = 0) buffer Flag { int flag[]; };
layout(std430, binding = 1) buffer X { float x[]; };

bool nonfinite(float v) { return (floatBitsToUint(v) & 0x7f800000u) == 0x7f800000u; }

void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
  float v = x[pc.ox + i];
  float s = v * pc.inv_scale;
  x[pc.ox + i] = s;
  if (nonfinite(v) || nonfinite(s)) atomicOr(flag[pc.of], 1);
}
