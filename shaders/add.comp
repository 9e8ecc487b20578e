#version 450
// out[oo + i] = a[oa + i] + b[ob + i], i < n. a may be out itself (accumulate). out, a f32;
// b f32 or 16-bit (H_F16 / H_BF16, common/h16.glsl).
#extension GL_GOOGLE_include_directive : require
#include "common/h16.glsl"
#include "common/index.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Push {
  uint n;
  uint oo;
  uint oa;
  uint ob;
} pc;
layout(std430, binding = 0) buffer Out { float o[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer B { H_T b[]; };

void main() {
  uint i = ct_linear_index();
  if (i < pc.n) o[pc.oo + i] = a[pc.oa + i] + h_load(b[pc.ob + i]);
}
