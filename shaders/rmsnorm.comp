#version 450
// RMSNorm (Llama) over the last dim with fp32 statistics and fixed-order reductions.
//   RMS_FWD     32 invocations a row (common/rows.glsl): rstd = 1/sqrt(mean(x^2) + eps); out = (x * rstd) * w
//   RMS_FWD_RES RMS_FWD of residual = x + r, stored first (the residual add fused in); each
//               invocation reads back only the elements it wrote
//   RMS_BWD_DX  32 invocations a row: dx += rstd * (dnorm - xhat * mean(dnorm * xhat)),
//               xhat = x * rstd, dnorm = dout * w
//   RMS_BWD_DW  one invocation per channel, rows in order: dw += dout * xhat; with pc.R > 0 the
//               first of two passes (bias_backward.comp's: partials of R rows, workgroup z,
//               assigned at dw[odw + z C + c])
// x, out, dx, dout [N, C]; w, dw [C]; rstd [N]. All f32 except out and r (RMS_FWD*) and dout
// (RMS_BWD_*), which are 16-bit in the H_F16 / H_BF16 variants (common/h16.glsl).
#extension GL_GOOGLE_include_directive : require
#include "common/h16.glsl"
#include "common/index.glsl"
#include "common/math.glsl"

#if defined(RMS_BWD_DW)
layout(local_size_x = 256) in;
#else
#include "common/rows.glsl"
#endif

#if defined(RMS_FWD) || defined(RMS_FWD_RES)
layout(push_constant) uniform Push {
  uint N;
  uint C;
  float eps;
  uint oo;
  uint ors;
  uint ox;
  uint ow;
#if defined(RMS_FWD_RES)
  uint ores;
  uint orin;
#endif
} pc;
layout(std430, binding = 0) writeonly buffer Out { H_T o[]; };
layout(std430, binding = 1) writeonly buffer Rstd { float rstd[]; };
layout(std430, binding = 2) readonly buffer X { float x[]; };
layout(std430, binding = 3) readonly buffer W { float w[]; };
#if defined(RMS_FWD_RES)
layout(std430, binding = 4) buffer Res { float res[]; };
layout(std430, binding = 5) readonly buffer R { H_T rin[]; };
#define RMS_IN(c) res[pc.ores + row * pc.C + (c)]
#else
#define RMS_IN(c) x[pc.ox + row * pc.C + (c)]
#endif

void main() {
  const uint lane = gl_LocalInvocationID.x % ROW_LANES;
  const uint row = ct_group_index() * ROWS_WG + gl_LocalInvocationID.x / ROW_LANES;
  const bool live = row < pc.N;
  const uint end = live ? pc.C : 0u;
#if defined(RMS_FWD_RES)
  // each lane reads back only the elements it wrote
  for (uint c = lane; c < end; c += ROW_LANES)
    RMS_IN(c) = x[pc.ox + row * pc.C + c] + h_load(rin[pc.orin + row * pc.C + c]);
#endif
  float ss = 0.0;
  for (uint c = lane; c < end; c += ROW_LANES) ss += RMS_IN(c) * RMS_IN(c);
  float ms = row_sum(ss) / float(pc.C);
  // The row is used as x * sc: sc = 1 (the same arithmetic as without it) unless the squares
  // overflowed (|x| past ~1e19); then sc is a power of two that brings max |x| into [1, 4) and
  // the sums are taken again. That pass runs while any row of the workgroup needs it; the other
  // rows keep their first sums.
  float sc = 1.0;
  if (wg_any(!ct_isfinite(ms))) {
    float a = 0.0;
    for (uint c = lane; c < end; c += ROW_LANES) a = max(a, abs(RMS_IN(c)));
    a = row_max(a);
    // an inf x keeps ms = inf: rstd 0, as PyTorch's rsqrt(inf)
    const bool again = !ct_isfinite(ms) && ct_isfinite(a);
    if (again) sc = ct_downscale(a);
    ss = 0.0;
    for (uint c = lane; again && c < end; c += ROW_LANES)
      ss += (RMS_IN(c) * sc) * (RMS_IN(c) * sc);
    const float ms2 = row_sum(ss) / float(pc.C);
    if (again) ms = ms2;
  }
  float r = ct_isinf(ms) ? 0.0 : 1.0 / sqrt(ms + pc.eps * sc * sc);  // rstd of x sc
  for (uint c = lane; c < end; c += ROW_LANES)
    o[pc.oo + row * pc.C + c] = h_store((RMS_IN(c) * sc) * r * w[pc.ow + c]);
  if (live && lane == 0u) rstd[pc.ors + row] = r * sc;
}

#elif defined(RMS_BWD_DX)
layout(push_constant) uniform Push {
  uint N;
  uint C;
  uint odx;
  uint odo;
  uint ox;
  uint ow;
  uint ors;
} pc;
layout(std430, binding = 0) buffer DX { float dx[]; };
layout(std430, binding = 1) readonly buffer DOut { H_T dout[]; };
layout(std430, binding = 2) readonly buffer X { float x[]; };
layout(std430, binding = 3) readonly buffer W { float w[]; };
layout(std430, binding = 4) readonly buffer Rstd { float rstd[]; };

void main() {
  const uint lane = gl_LocalInvocationID.x % ROW_LANES;
  const uint row = ct_group_index() * ROWS_WG + gl_LocalInvocationID.x / ROW_LANES;
  const bool live = row < pc.N;
  const uint end = live ? pc.C : 0u;
  float r = live ? rstd[pc.ors + row] : 0.0;
  uint base = row * pc.C;
  float s = 0.0;
  for (uint c = lane; c < end; c += ROW_LANES)
    s += h_load(dout[pc.odo + base + c]) * w[pc.ow + c] * (x[pc.ox + base + c] * r);
  float mdnx = row_sum(s) / float(pc.C);
  for (uint c = lane; c < end; c += ROW_LANES) {
    float xh = x[pc.ox + base + c] * r;
    dx[pc.odx + base + c] += r * (h_load(dout[pc.odo + base + c]) * w[pc.ow + c] - xh * mdnx);
  }
}

#else  // RMS_BWD_DW
layout(push_constant) uniform Push {
  uint N;
  uint C;
  uint odw;
  uint odo;
  uint ox;
  uint ors;
  uint R;
} pc;
layout(std430, binding = 0) buffer DW { float dw[]; };
layout(std430, binding = 1) readonly buffer DOut { H_T dout[]; };
layout(std430, binding = 2) readonly buffer X { float x[]; };
layout(std430, binding = 3) readonly buffer Rstd { float rstd[]; };

void main() {
  uint c = ct_linear_index();
  if (c >= pc.C) return;
  const uint z = gl_WorkGroupID.z;
  const uint n0 = pc.R > 0u ? z * pc.R : 0u, n1 = pc.R > 0u ? min(pc.N, n0 + pc.R) : pc.N;
  float aw = 0.0;
  for (uint n = n0; n < n1; ++n)
    aw += h_load(dout[pc.odo + n * pc.C + c]) * (x[pc.ox + n * pc.C + c] * rstd[pc.ors + n]);
  if (pc.R > 0u)
    dw[pc.odw + z * pc.C + c] = aw;
  else
    dw[pc.odw + c] += aw;
}
#endif
