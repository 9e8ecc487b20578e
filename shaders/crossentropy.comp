#version 450
// Fused log-softmax + NLL, one workgroup per row, fixed-tree (deterministic) reductions.
//   CE_FWD  losses[n] = log(sum exp(x - max)) + max - x[target]
//   CE_BWD  dx[n, v] = dloss * (softmax(x)[v] - (v == target)); dx may be x itself
// logits, dlogits [N, V]; targets [N] i32; losses [N].
#extension GL_GOOGLE_include_directive : require
#include "common/index.glsl"

#define CT_WG 256
layout(local_size_x = CT_WG) in;
#include "common/reduce.glsl"

layout(push_constant) uniform Push {
  uint N;
  uint V;
  float dloss;
  uint oo;  // losses (FWD) or dlogits (BWD)
  uint ox;
  uint ot;
} pc;
#if defined(CE_FWD)
layout(std430, binding = 0) writeonly buffer Out { float o[]; };
#else
layout(std430, binding = 0) buffer Out { float o[]; };
#endif
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer Tgt { int targets[]; };

void main() {
  uint row = ct_group_index();
  if (row >= pc.N) return;  // uniform per workgroup
  uint tid = gl_LocalInvocationID.x;
  uint xr = pc.ox + row * pc.V;
  float mx = -1.0 / 0.0;
  for (uint v = tid; v < pc.V; v += CT_WG) mx = max(mx, x[xr + v]);
  mx = ct_wg_max(mx);
  float z = 0.0;
  for (uint v = tid; v < pc.V; v += CT_WG) z += exp(x[xr + v] - mx);
  z = ct_wg_sum(z);
  int tgt = targets[pc.ot + row];
#if defined(CE_FWD)
  if (tid == 0) o[pc.oo + row] = log(z) + mx - x[xr + uint(tgt)];
#else
  float rz = 1.0 / z;
  for (uint v = tid; v < pc.V; v += CT_WG) {
    float p = exp(x[xr + v] - mx) * rz;
    o[pc.oo + row * pc.V + v] = pc.dloss * (p - (int(v) == tgt ? 1.0 : 0.0));
  }
#endif
}
