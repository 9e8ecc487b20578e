#version 450
// Fused log-softmax + NLL, one workgroup per row, fixed-tree (deterministic) reductions.
//   CE_FWD    losses[n] = log(sum exp(x - max)) + max - x[target]
//   CE_BWD    dx[n, v] = dloss * (softmax(x)[v] - (v == target)); dx may be x itself
//   CE_FUSED  both, in place: losses as CE_FWD, x overwritten by CE_BWD's dx; the statistics
//             in one read of the row (a running max and rescaled sum per invocation)
// over the V classes of a row; logits, dlogits [N, Vp] f32 or 16-bit (H_F16 / H_BF16,
// common/h16.glsl, both the same), columns [V, Vp) padding: not read, and dx = 0 there;
// targets [N] i32 (< V); losses [N] f32.
#extension GL_GOOGLE_include_directive : require
#include "common/h16.glsl"
#include "common/index.glsl"
#include "common/math.glsl"

#define CT_WG 256
layout(local_size_x = CT_WG) in;
#include "common/reduce.glsl"

layout(push_constant) uniform Push {
  uint N;
  uint V;   // classes
  uint Vp;  // row length
  float dloss;
  uint oo;  // losses (FWD, FUSED) or dlogits (BWD)
  uint ox;
  uint ot;
} pc;
#if defined(CE_FWD) || defined(CE_FUSED)
layout(std430, binding = 0) writeonly buffer Out { float o[]; };
#else
layout(std430, binding = 0) buffer Out { H_T o[]; };
#endif
#if defined(CE_FUSED)
layout(std430, binding = 1) buffer X { H_T x[]; };
#else
layout(std430, binding = 1) readonly buffer X { H_T x[]; };
#endif
layout(std430, binding = 2) readonly buffer Tgt { int targets[]; };

void main() {
  uint row = ct_group_index();
  if (row >= pc.N) return;  // uniform per workgroup
  uint tid = gl_LocalInvocationID.x;
  uint xr = pc.ox + row * pc.Vp;
#if defined(CE_FUSED)
  float m = -CT_FLT_MAX, s = 0.0;
  for (uint v = tid; v < pc.V; v += CT_WG) {
    float xv = h_load(x[xr + v]);
    if (xv > m) {
      s = s * ct_exp_le0(m - xv) + 1.0;
      m = xv;
    } else {
      s += ct_exp_le0(xv - m);  // a NaN logit makes s NaN, as the two-pass sum
    }
  }
  float mx = ct_wg_max(m);
  float z = ct_wg_sum(s * ct_exp_le0(m - mx));
  float rz = 1.0 / z;
  int tgt = targets[pc.ot + row];
  for (uint v = tid; v < pc.V; v += CT_WG) {
    float xv = h_load(x[xr + v]);
    // the invocation that owns the target's column reads it just before overwriting it
    if (int(v) == tgt) o[pc.oo + row] = log(z) + (mx - xv);
    float p = ct_exp_le0(xv - mx) * rz;
    x[xr + v] = h_store(pc.dloss * (p - (int(v) == tgt ? 1.0 : 0.0)));
  }
  for (uint v = pc.V + tid; v < pc.Vp; v += CT_WG) x[xr + v] = h_store(0.0);
#else
  float mx = -CT_FLT_MAX;  // finite start: -inf logits give exp(-inf) = 0 from ct_exp_le0
  for (uint v = tid; v < pc.V; v += CT_WG) mx = max(mx, h_load(x[xr + v]));
  mx = ct_wg_max(mx);
  float z = 0.0;
  for (uint v = tid; v < pc.V; v += CT_WG) z += ct_exp_le0(h_load(x[xr + v]) - mx);
  z = ct_wg_sum(z);
  int tgt = targets[pc.ot + row];
#if defined(CE_FWD)
  // log z + (max - x[target]): log z is not absorbed by a huge max first (as crossentropy.cu)
  if (tid == 0) o[pc.oo + row] = log(z) + (mx - h_load(x[xr + uint(tgt)]));
#else
  float rz = 1.0 / z;
  for (uint v = tid; v < pc.V; v += CT_WG) {
    float p = ct_exp_le0(h_load(x[xr + v]) - mx) * rz;
    o[pc.oo + row * pc.Vp + v] = h_store(pc.dloss * (p - (int(v) == tgt ? 1.0 : 0.0)));
  }
  for (uint v = pc.V + tid; v < pc.Vp; v += CT_WG) o[pc.oo + row * pc.Vp + v] = h_store(0.0);
#endif
#endif  // CE_FUSED
}
