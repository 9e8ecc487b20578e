#version 450
// out[oo + i] = a[oa + i] + b[ob + i], i < n. a may be out itself (accumulate).
#extension GL_GOOGLE_include_directive : require
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
layout(std430, binding = 2) readonly buffer B { float b[]; };

void main() {
  uint i = ct_linear_index();
  if (i < pc.n) o[pc.oo + i] = a[pc.oa + i] + b[pc.ob + i];
}
