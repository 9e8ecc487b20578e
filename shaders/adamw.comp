#version 450
// One fused AdamW step (PyTorch semantics, decoupled weight decay), optional global-norm clip.
// param, grad, m, v [n]; grad_norm [1] (read only when max_norm > 0).
#extension GL_GOOGLE_include_directive : require
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
  float lr;
  float beta1;
  float beta2;
  float eps;
  float wd;
  float bc1;  // 1 - beta1^step
  float bc2;  // 1 - beta2^step
  float max_norm;
} pc;
layout(std430, binding = 0) buffer P { float p[]; };
layout(std430, binding = 1) readonly buffer G { float g[]; };
layout(std430, binding = 2) buffer M { float m[]; };
layout(std430, binding = 3) buffer Vv { float v[]; };
layout(std430, binding = 4) readonly buffer Norm { float gnorm[]; };

void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
  float clip = 1.0;
  if (pc.max_norm > 0.0) clip = ct_clip_factor(pc.max_norm, gnorm[pc.onorm]);
  float gi = g[pc.og + i] * clip;
  float mi = pc.beta1 * m[pc.om + i] + (1.0 - pc.beta1) * gi;
  float v0 = v[pc.ov + i];
  float vi = pc.beta2 * v0 + (1.0 - pc.beta2) * gi * gi;
  m[pc.om + i] = mi;
  v[pc.ov + i] = vi;
  float pi = p[pc.op + i];
  pi -= pc.lr * pc.wd * pi;
  pi -= ct_adam_update(mi, vi, v0, gi, pc.lr, pc.beta2, pc.bc1, pc.bc2, pc.eps);
  p[pc.op + i] = pi;
}
