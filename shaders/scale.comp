#version 450
// t[off + i] *= s, i < n.
#extension GL_GOOGLE_include_directive : require
#include "common/index.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Push {
  uint n;
  uint off;
  float s;
} pc;
layout(std430, binding = 0) buffer T { float t[]; };

void main() {
  uint i = ct_linear_index();
  if (i < pc.n) t[pc.off + i] *= pc.s;
}
