#version 450
// LayerNorm over the last dim with fp32 statistics and fixed-order (deterministic) reductions.
//   LN_FWD       one workgroup per row: out = (x - mean) * rstd * w + b; saves mean, rstd
//   LN_FWD_RES   LN_FWD of residual = x + r, stored first (the residual add fused in); each
//                invocation reads back only the elements it wrote
//   LN_BWD_DX    one workgroup per row: dx += rstd * (dnorm - mean(dnorm) - xhat*mean(dnorm*xhat))
//   LN_BWD_DWDB  one invocation per channel, rows in order: dw += dout*xhat, db += dout; with
//                pc.R > 0 the first of two passes (bias_backward.comp's: partials of R rows,
//                workgroup z, assigned at dw[odw + z C + c], db[odb + z C + c])
// x, out, dx, dout [N, C]; w, b, dw, db [C]; mean, rstd [N]. All f32 except out (LN_FWD) and
// dout (LN_BWD_*), and r (LN_FWD_RES), which are 16-bit in the H_F16 / H_BF16 variants
// (common/h16.glsl).
#extension GL_GOOGLE_include_directive : require
#include "common/h16.glsl"
#include "common/index.glsl"
#include "common/math.glsl"

#define CT_WG 64
#if defined(LN_BWD_DWDB)
layout(local_size_x = 256) in;
#else
layout(local_size_x = CT_WG) in;
#include "common/reduce.glsl"
#endif

#if defined(LN_FWD) || defined(LN_FWD_RES)
layout(push_constant) uniform Push {
  uint N;
  uint C;
  float eps;
  uint oo;
  uint om;
  uint ors;
  uint ox;
  uint ow;
  uint ob;
#if defined(LN_FWD_RES)
  uint ores;
  uint orin;
#endif
} pc;
layout(std430, binding = 0) writeonly buffer Out { H_T o[]; };
layout(std430, binding = 1) writeonly buffer Mean { float mean[]; };
layout(std430, binding = 2) writeonly buffer Rstd { float rstd[]; };
layout(std430, binding = 3) readonly buffer X { float x[]; };
layout(std430, binding = 4) readonly buffer W { float w[]; };
layout(std430, binding = 5) readonly buffer B { float b[]; };
#if defined(LN_FWD_RES)
layout(std430, binding = 6) buffer Res { float res[]; };
layout(std430, binding = 7) readonly buffer R { H_T rin[]; };
#define LN_IN(c) res[pc.ores + row * pc.C + (c)]
#else
#define LN_IN(c) x[pc.ox + row * pc.C + (c)]
#endif

void main() {
  uint row = ct_group_index();
  if (row >= pc.N) return;  // uniform per workgroup
  uint tid = gl_LocalInvocationID.x;
#if defined(LN_FWD_RES)
  for (uint c = tid; c < pc.C; c += CT_WG)
    LN_IN(c) = x[pc.ox + row * pc.C + c] + h_load(rin[pc.orin + row * pc.C + c]);
#endif
  // The row is used as x * sc: sc = 1 (the same arithmetic as without it) unless the sum or the
  // sum of squares overflowed (|x| past ~1e19); then sc is a power of two that brings max |x|
  // into [1, 4) and both sums are taken again (uniform per workgroup: reduced values decide).
  float sc = 1.0, m, var;
  for (int pass = 0; pass < 2; ++pass) {
    float s = 0.0;
    for (uint c = tid; c < pc.C; c += CT_WG) s += LN_IN(c) * sc;
    m = ct_wg_sum(s) / float(pc.C);
    float v = 0.0;
    for (uint c = tid; c < pc.C; c += CT_WG) {
      float d = LN_IN(c) * sc - m;
      v += d * d;
    }
    var = ct_wg_sum(v) / float(pc.C);
    if (pass == 1 || (ct_isfinite(m) && ct_isfinite(var))) break;
    float a = 0.0;
    for (uint c = tid; c < pc.C; c += CT_WG) a = max(a, abs(LN_IN(c)));
    a = ct_wg_max(a);
    if (!ct_isfinite(a)) break;  // an inf or NaN x: the sums stay inf / NaN
    sc = ct_downscale(a);
  }
  float r = ct_isinf(var) ? 0.0 : 1.0 / sqrt(var + pc.eps * sc * sc);  // rstd of x sc
  for (uint c = tid; c < pc.C; c += CT_WG)
    o[pc.oo + row * pc.C + c] = h_store((LN_IN(c) * sc - m) * r * w[pc.ow + c] + b[pc.ob + c]);
  if (tid == 0) {
    mean[pc.om + row] = m / sc;
    rstd[pc.ors + row] = r * sc;
  }
}

#elif defined(LN_BWD_DX)
layout(push_constant) uniform Push {
  uint N;
  uint C;
  uint odx;
  uint odo;
  uint ox;
  uint ow;
  uint om;
  uint ors;
} pc;
layout(std430, binding = 0) buffer DX { float dx[]; };
layout(std430, binding = 1) readonly buffer DOut { H_T dout[]; };
layout(std430, binding = 2) readonly buffer X { float x[]; };
layout(std430, binding = 3) readonly buffer W { float w[]; };
layout(std430, binding = 4) readonly buffer Mean { float mean[]; };
layout(std430, binding = 5) readonly buffer Rstd { float rstd[]; };

void main() {
  uint row = ct_group_index();
  if (row >= pc.N) return;
  uint tid = gl_LocalInvocationID.x;
  float m = mean[pc.om + row], r = rstd[pc.ors + row];
  uint base = row * pc.C;
  float s1 = 0.0, s2 = 0.0;
  for (uint c = tid; c < pc.C; c += CT_WG) {
    float dn = h_load(dout[pc.odo + base + c]) * w[pc.ow + c];
    float xh = (x[pc.ox + base + c] - m) * r;
    s1 += dn;
    s2 += dn * xh;
  }
  float mdn = ct_wg_sum(s1) / float(pc.C);
  float mdnx = ct_wg_sum(s2) / float(pc.C);
  for (uint c = tid; c < pc.C; c += CT_WG) {
    float dn = h_load(dout[pc.odo + base + c]) * w[pc.ow + c];
    float xh = (x[pc.ox + base + c] - m) * r;
    dx[pc.odx + base + c] += r * (dn - mdn - xh * mdnx);
  }
}

#else  // LN_BWD_DWDB
layout(push_constant) uniform Push {
  uint N;
  uint C;
  uint odw;
  uint odb;
  uint odo;
  uint ox;
  uint om;
  uint ors;
  uint R;
} pc;
layout(std430, binding = 0) buffer DW { float dw[]; };
layout(std430, binding = 1) buffer DB { float db[]; };
layout(std430, binding = 2) readonly buffer DOut { H_T dout[]; };
layout(std430, binding = 3) readonly buffer X { float x[]; };
layout(std430, binding = 4) readonly buffer Mean { float mean[]; };
layout(std430, binding = 5) readonly buffer Rstd { float rstd[]; };

void main() {
  uint c = ct_linear_index();
  if (c >= pc.C) return;
  const uint z = gl_WorkGroupID.z;
  const uint n0 = pc.R > 0u ? z * pc.R : 0u, n1 = pc.R > 0u ? min(pc.N, n0 + pc.R) : pc.N;
  float aw = 0.0, ab = 0.0;
  for (uint n = n0; n < n1; ++n) {
    float d = h_load(dout[pc.odo + n * pc.C + c]);
    float xh = (x[pc.ox + n * pc.C + c] - mean[pc.om + n]) * rstd[pc.ors + n];
    aw += d * xh;
    ab += d;
  }
  if (pc.R > 0u) {
    dw[pc.odw + z * pc.C + c] = aw;
    db[pc.odb + z * pc.C + c] = ab;
  } else {
    dw[pc.odw + c] += aw;
    db[pc.odb + c] += ab;
  }
}
#endif
