#version 450
// LayerNorm over the last dim with fp32 statistics and fixed-order (deterministic) reductions.
//   LN_FWD       32 invocations a row: out = (x - mean) * rstd * w + b; saves mean, rstd
//   LN_FWD_RES   LN_FWD of residual = x + r, stored first (the residual add fused in); each
//                invocation reads back only the elements it wrote
//   LN_BWD_DX    32 invocations a row: dx += rstd * (dnorm - mean(dnorm) - xhat*mean(dnorm*xhat))
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

#if defined(LN_BWD_DWDB)
layout(local_size_x = 256) in;
#else
#include "common/rows.glsl"
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
  const uint lane = gl_LocalInvocationID.x % ROW_LANES;
  const uint row = ct_group_index() * ROWS_WG + gl_LocalInvocationID.x / ROW_LANES;
  const bool live = row < pc.N;
  const uint end = live ? pc.C : 0u;
#if defined(LN_FWD_RES)
  // each lane reads back only the elements it wrote
  for (uint c = lane; c < end; c += ROW_LANES)
    LN_IN(c) = x[pc.ox + row * pc.C + c] + h_load(rin[pc.orin + row * pc.C + c]);
#endif
  // The row is used as x * sc: sc = 1 (the same arithmetic as without it) unless the sum or the
  // sum of squares overflowed (|x| past ~1e19); then sc is a power of two that brings max |x|
  // into [1, 4) and both sums are taken again. The second pass runs while any row of the
  // workgroup needs it; a row that does not keeps its first pass's m and var.
  float sc = 1.0, m = 0.0, var = 0.0;
  bool done = false;
  for (int pass = 0; pass < 2; ++pass) {
    float s = 0.0;
    for (uint c = lane; c < end; c += ROW_LANES) s += LN_IN(c) * sc;
    const float mp = row_sum(s) / float(pc.C);
    float v = 0.0;
    for (uint c = lane; c < end; c += ROW_LANES) {
      float d = LN_IN(c) * sc - mp;
      v += d * d;
    }
    const float vp = row_sum(v) / float(pc.C);
    if (!done) m = mp, var = vp;
    if (pass == 1) break;
    done = ct_isfinite(m) && ct_isfinite(var);
    if (!wg_any(!done)) break;
    float a = 0.0;
    for (uint c = lane; c < end; c += ROW_LANES) a = max(a, abs(LN_IN(c)));
    a = row_max(a);
    if (!done && !ct_isfinite(a)) done = true;  // an inf or NaN x: the sums stay inf / NaN
    if (!done) sc = ct_downscale(a);
  }
  float r = ct_isinf(var) ? 0.0 : 1.0 / sqrt(var + pc.eps * sc * sc);  // rstd of x sc
  for (uint c = lane; c < end; c += ROW_LANES)
    o[pc.oo + row * pc.C + c] = h_store((LN_IN(c) * sc - m) * r * w[pc.ow + c] + b[pc.ob + c]);
  if (live && lane == 0u) {
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
  const uint lane = gl_LocalInvocationID.x % ROW_LANES;
  const uint row = ct_group_index() * ROWS_WG + gl_LocalInvocationID.x / ROW_LANES;
  const bool live = row < pc.N;
  const uint end = live ? pc.C : 0u;
  const float m = live ? mean[pc.om + row] : 0.0, r = live ? rstd[pc.ors + row] : 0.0;
  uint base = row * pc.C;
  float s1 = 0.0, s2 = 0.0;
  for (uint c = lane; c < end; c += ROW_LANES) {
    float dn = h_load(dout[pc.odo + base + c]) * w[pc.ow + c];
    float xh = (x[pc.ox + base + c] - m) * r;
    s1 += dn;
    s2 += dn * xh;
  }
  float mdn = row_sum(s1) / float(pc.C);
  float mdnx = row_sum(s2) / float(pc.C);
  for (uint c = lane; c < end; c += ROW_LANES) {
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
