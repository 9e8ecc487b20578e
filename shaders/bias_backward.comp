#version 450
// dbias[n] += sum over m of dout[m, n], rows in order. dout [M, N] f32 or 16-bit (H_F16 /
// H_BF16, common/h16.glsl), dbias [N] f32.
#extension GL_GOOGLE_include_directive : require
#include "common/h16.glsl"
#include "common/index.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Push {
  uint M;
  uint N;
  uint odb;
  uint odo;
} pc;
layout(std430, binding = 0) buffer DBias { float db[]; };
layout(std430, binding = 1) readonly buffer DOut { H_T dout[]; };

void main() {
  uint n = ct_linear_index();
  if (n >= pc.N) return;
  float acc = 0.0;
  for (uint m = 0; m < pc.M; ++m) acc += h_load(dout[pc.odo + m * pc.N + n]);
  db[pc.odb + n] += acc;
}
