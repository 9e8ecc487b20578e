#version 450
// One fused SGD step (torch.optim.SGD: coupled weight decay, momentum buffer set to the first
// gradient, optional Nesterov), optional global-norm clip. param, grad, buf [n]; grad_norm [1]
// (read only when max_norm > 0); buf is read and written only when has_buf != 0.
#extension GL_GOOGLE_include_directive : require
#include "common/index.glsl"
#include "common/math.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Push {
  uint n;
  uint op;
  uint og;
  uint ob;
  uint onorm;
  uint has_buf;     // momentum != 0
  uint first_step;  // step == 1: buf = g
  uint nesterov;
  float lr;
  float momentum;
  float dampening;
  float wd;
  float max_norm;
} pc;
layout(std430, binding = 0) buffer P { float p[]; };
layout(std430, binding = 1) readonly buffer G { float g[]; };
layout(std430, binding = 2) buffer B { float buf[]; };
layout(std430, binding = 3) readonly buffer Norm { float gnorm[]; };

void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
  float clip = 1.0;
  if (pc.max_norm > 0.0) clip = ct_clip_factor(pc.max_norm, gnorm[pc.onorm]);
  float pi = p[pc.op + i];
  float gi = g[pc.og + i] * clip + pc.wd * pi;
  if (pc.has_buf != 0u) {
    float b = pc.first_step != 0u ? gi
                                  : pc.momentum * buf[pc.ob + i] + (1.0 - pc.dampening) * gi;
    buf[pc.ob + i] = b;
    gi = pc.nesterov != 0u ? gi + pc.momentum * b : b;
  }
  p[pc.op + i] = pi - pc.lr * gi;
}
