#version 450
// One fused Lion step (bitsandbytes lion_32bit semantics), optional global-norm clip.
// param, grad, m [n]; grad_norm [1] (read only when max_norm > 0).
//   c = b1 m + (1-b1) g;  p = p (1 - lr wd) - lr sign(c);  m = b2 m + (1-b2) g
#extension GL_GOOGLE_include_directive : require
#include "common/index.glsl"
#include "common/math.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Push {
  uint n;
  uint op;
  uint og;
  uint om;
  uint onorm;
  float lr;
  float beta1;
  float beta2;
  float wd;
  float max_norm;
} pc;
layout(std430, binding = 0) buffer P { float p[]; };
layout(std430, binding = 1) readonly buffer G { float g[]; };
layout(std430, binding = 2) buffer M { float m[]; };
layout(std430, binding = 3) readonly buffer Norm { float gnorm[]; };

void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
  float clip = 1.0;
  if (pc.max_norm > 0.0) clip = ct_clip_factor(pc.max_norm, gnorm[pc.onorm]);
  float gi = g[pc.og + i] * clip;
  float mi = m[pc.om + i];
  float c = pc.beta1 * mi + (1.0 - pc.beta1) * gi;
  float s = c > 0.0 ? 1.0 : (c < 0.0 ? -1.0 : 0.0);  // sign(0) = 0; NaN -> 0 as the CPU
  p[pc.op + i] = p[pc.op + i] * (1.0 - pc.lr * pc.wd) - pc.lr * s;
  m[pc.om + i] = pc.beta2 * mi + (1.0 - pc.beta2) * gi;
}
