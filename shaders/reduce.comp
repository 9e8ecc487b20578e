#version 450
// Deterministic reductions: a fixed split into workgroups and a fixed tree in each.
//   RED_PARTIAL   partial[op + g] = sum of x (or x^2) over group g's segment of seg elements
//   RED_FINAL     out[oo] = scale * sum(partial[0..count)) (sqrt of it when do_sqrt)
//   CHECK_FINITE  flag[of] |= 1 if any x is inf or NaN (bit test: immune to fast-math)
#extension GL_GOOGLE_include_directive : require
#include "common/index.glsl"
#include "common/math.glsl"

#define CT_WG 256
layout(local_size_x = CT_WG) in;

#if defined(RED_PARTIAL)
#include "common/reduce.glsl"
layout(push_constant) uniform Push {
  uint n;
  uint ox;
  uint seg;
  uint square;
  uint op;
} pc;
layout(std430, binding = 0) writeonly buffer Partial { float partial[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };

void main() {
  uint g = ct_group_index();
  uint start = g * pc.seg, end = min(pc.n, start + pc.seg);
  float s = 0.0;
  for (uint i = start + gl_LocalInvocationID.x; i < end; i += CT_WG) {
    float v = x[pc.ox + i];
    s += pc.square != 0u ? v * v : v;
  }
  s = ct_wg_sum(s);
  if (gl_LocalInvocationID.x == 0) partial[pc.op + g] = s;
}

#elif defined(RED_FINAL)
#include "common/reduce.glsl"
layout(push_constant) uniform Push {
  uint count;
  uint op;
  uint oo;
  float scale;
  uint do_sqrt;
} pc;
layout(std430, binding = 0) writeonly buffer Out { float o[]; };
layout(std430, binding = 1) readonly buffer Partial { float partial[]; };

void main() {
  float s = 0.0;
  for (uint i = gl_LocalInvocationID.x; i < pc.count; i += CT_WG) s += partial[pc.op + i];
  s = ct_wg_sum(s);
  if (gl_LocalInvocationID.x == 0) o[pc.oo] = pc.do_sqrt != 0u ? ct_sqrt(s) : s * pc.scale;  // an overflowed sum: inf
}

#else  // CHECK_FINITE
layout(push_constant) uniform Push {
  uint n;
  uint ox;
  uint of;
} pc;
layout(std430, binding = 0) buffer Flag { int flag[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };

void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
  if ((floatBitsToUint(x[pc.ox + i]) & 0x7f800000u) == 0x7f800000u) atomicOr(flag[pc.of], 1);
}
#endif
