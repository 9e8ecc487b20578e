#version 450
// One fused AdamW step (PyTorch semantics, decoupled weight decay), optional global-norm clip.
// param, grad, m, v [n]; grad_norm [1] (read only when max_norm > 0).
// SCHEDULE (adamw_groups, one range per dispatch): lr and the bias corrections read from
// schedule [4] (lr, step, bc1, bc2: core/device.h AdamWSchedule) instead of push constants.
// H_F16 / H_BF16: the updated parameter also stored into p16 [n] (from pc.oh), rounded as the
// convert shaders round (common/convert.glsl): the model's 16-bit compute copy in the same pass.
#extension GL_GOOGLE_include_directive : require
#include "common/h16.glsl"
#include "common/index.glsl"
#include "common/math.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Push {
  uint n;
  uint op;
  uint og;
  uint om;
  uint ov;
  uint onorm;
#ifdef SCHEDULE
  uint osched;
#else
  float lr;
#endif
  float beta1;
  float beta2;
  float eps;
  float wd;
#ifndef SCHEDULE
  float bc1;  // 1 - beta1^step
  float bc2;  // 1 - beta2^step
#endif
  float max_norm;
  uint oh;  // p16's first element (read by the H_F16 / H_BF16 variants only)
} pc;
layout(std430, binding = 0) buffer P { float p[]; };
layout(std430, binding = 1) readonly buffer G { float g[]; };
layout(std430, binding = 2) buffer M { float m[]; };
layout(std430, binding = 3) buffer Vv { float v[]; };
layout(std430, binding = 4) readonly buffer Norm { float gnorm[]; };
#ifdef SCHEDULE
layout(std430, binding = 5) readonly buffer Sched { float sched[]; };
#endif
#if defined(H_F16) || defined(H_BF16)
layout(std430, binding = 6) writeonly buffer P16 { H_T p16[]; };
#endif

void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
#ifdef SCHEDULE
  float lr = sched[pc.osched], bc1 = sched[pc.osched + 2], bc2 = sched[pc.osched + 3];
#else
  float lr = pc.lr, bc1 = pc.bc1, bc2 = pc.bc2;
#endif
  float clip = 1.0;
  if (pc.max_norm > 0.0) clip = ct_clip_factor(pc.max_norm, gnorm[pc.onorm]);
  float gi = g[pc.og + i] * clip;
  float mi = pc.beta1 * m[pc.om + i] + (1.0 - pc.beta1) * gi;
  float v0 = v[pc.ov + i];
  float vi = pc.beta2 * v0 + (1.0 - pc.beta2) * gi * gi;
  m[pc.om + i] = mi;
  v[pc.ov + i] = vi;
  float pi = p[pc.op + i];
  pi -= lr * pc.wd * pi;
  pi -= ct_adam_update(mi, vi, v0, gi, lr, pc.beta2, bc1, bc2, pc.eps);
  p[pc.op + i] = pi;
#if defined(H_F16) || defined(H_BF16)
  p16[pc.oh + i] = h_store(pi);
#endif
}
