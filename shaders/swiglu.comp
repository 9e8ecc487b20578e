#version 450
// SwiGLU (Llama's MLP activation) over (gate, up) pairs: gu [N, 2F], gate = gu[:, :F],
// up = gu[:, F:]. Forward: out [N, F] = silu(gate) * up. BACKWARD: dgu = (dout * up * s *
// (1 + g (1 - s)), dout * g * s), s = sigmoid(g); one invocation per pair, so dgu may be gu.
// All f32 or all the same 16-bit type (H_F16 / H_BF16, common/h16.glsl); fp32 arithmetic.
#extension GL_GOOGLE_include_directive : require
#include "common/h16.glsl"
#include "common/index.glsl"
#include "common/math.glsl"

layout(local_size_x = 256) in;
#ifndef BACKWARD
layout(push_constant) uniform Push {
  uint n;  // pairs (N * F)
  uint F;
  uint oo;
  uint og;
} pc;
layout(std430, binding = 0) writeonly buffer Out { H_T o[]; };
layout(std430, binding = 1) readonly buffer GU { H_T gu[]; };
#else
layout(push_constant) uniform Push {
  uint n;
  uint F;
  uint odg;
  uint og;
  uint odo;
} pc;
layout(std430, binding = 0) buffer DGU { H_T dgu[]; };
layout(std430, binding = 1) readonly buffer GU { H_T gu[]; };
layout(std430, binding = 2) readonly buffer DOut { H_T dout[]; };
#endif

void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
  uint row = i / pc.F, col = i - row * pc.F;
  uint ig = row * 2u * pc.F + col, iu = ig + pc.F;
  float g = h_load(gu[pc.og + ig]), u = h_load(gu[pc.og + iu]);
  // silu and sigmoid from common/math.glsl: exp(-g) never overflows (g / inf, 1 / inf are
  // outside the range a Vulkan division is defined on); the formulas of before for g >= -80.
#ifndef BACKWARD
  o[pc.oo + i] = h_store(ct_silu(g) * u);
#else
  float d = h_load(dout[pc.odo + i]);
  float s = ct_sigmoid(g);
  dgu[pc.odg + ig] = h_store(d * u * s * (1.0 + g * (1.0 - s)));
  dgu[pc.odg + iu] = h_store(d * g * s);
#endif
}
