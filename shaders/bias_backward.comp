#version 450
// dbias[n] += sum over m of dout[m, n], rows in order. dout [M, N] f32 or 16-bit (H_F16 /
// H_BF16, common/h16.glsl), dbias [N] f32.
// With pc.R > 0, the first of two passes (ops/matmul.cpp, ops/layernorm.cpp, ops/rmsnorm.cpp):
// workgroup z sums rows [z R, min(M, (z + 1) R)) of column n into db[odb + z N + n], assigned;
// the second, this shader's f32 variant with R = 0 over those partials as its rows, adds them in
// order. One invocation walking every row was latency-bound on a GPU (N invocations in all).
#extension GL_GOOGLE_include_directive : require
#include "common/h16.glsl"
#include "common/index.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Push {
  uint M;
  uint N;
  uint odb;
  uint odo;
  uint R;
} pc;
layout(std430, binding = 0) buffer DBias { float db[]; };
layout(std430, binding = 1) readonly buffer DOut { H_T dout[]; };

void main() {
  uint n = ct_linear_index();
  if (n >= pc.N) return;
  const uint z = gl_WorkGroupID.z;
  const uint m0 = pc.R > 0u ? z * pc.R : 0u, m1 = pc.R > 0u ? min(pc.M, m0 + pc.R) : pc.M;
  float acc = 0.0;
  for (uint m = m0; m < m1; ++m) acc += h_load(dout[pc.odo + m * pc.N + n]);
  if (pc.R > 0u)
    db[pc.odb + z * pc.N + n] = acc;
  else
    db[pc.odb + n] += acc;
}
