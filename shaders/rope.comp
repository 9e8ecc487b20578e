#version 450
// Rotary position embedding, Hugging Face's rotate-half form. x, out [rows, W] (rows = B*T
// positions, this dispatch's rows starting at position bt0), W = heads * D; cos, sin [T, D/2].
// One invocation per work item of a position: items [0, rot_heads * D/2) rotate the pair
// (i, i + D/2) of head i / (D/2) by the angle of (t, i); the others copy two elements of the
// unrotated tail. sign = -1 rotates by the opposite angle (the backward). out may be x.
// x/out f32 or 16-bit (H_F16 / H_BF16, common/h16.glsl); fp32 arithmetic.
#extension GL_GOOGLE_include_directive : require
#include "common/h16.glsl"
#include "common/index.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Push {
  uint n;  // work items: rows * W / 2
  uint T;
  uint W;
  uint D;
  uint rot_heads;
  uint bt0;
  float sign;
  uint oo;
  uint ox;
  uint oc;
  uint os;
} pc;
layout(std430, binding = 0) buffer Out { H_T o[]; };
layout(std430, binding = 1) readonly buffer X { H_T x[]; };
layout(std430, binding = 2) readonly buffer Cos { float cs[]; };
layout(std430, binding = 3) readonly buffer Sin { float sn[]; };

void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
  uint per = pc.W / 2u, half_d = pc.D / 2u;
  uint r = i / per, k = i - r * per;
  uint t = (pc.bt0 + r) % pc.T;
  uint row = r * pc.W;
  if (k < pc.rot_heads * half_d) {
    uint h = k / half_d, j = k - h * half_d;
    uint i1 = row + h * pc.D + j, i2 = i1 + half_d;
    float a = h_load(x[pc.ox + i1]), b = h_load(x[pc.ox + i2]);
    float c = cs[pc.oc + t * half_d + j], s = pc.sign * sn[pc.os + t * half_d + j];
    o[pc.oo + i1] = h_store(a * c - b * s);
    o[pc.oo + i2] = h_store(b * c + a * s);
  } else {
    uint e = row + pc.rot_heads * pc.D + 2u * (k - pc.rot_heads * half_d);
    o[pc.oo + e] = x[pc.ox + e];
    o[pc.oo + e + 1u] = x[pc.ox + e + 1u];
  }
}
