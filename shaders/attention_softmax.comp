#version 450
// Row-wise parts of the GEMM-based attention (ops/attention.cpp), one invocation per (b, h, t)
// row of att [rows, T] (rows = heads * T of one batch element; t = row % T):
//   SM_FWD  att[t, u] = softmax_u(scale * att[t, u]) for u <= t, 0 above the diagonal (in place;
//           att holds q . k on entry)
//   SM_BWD  d[t, u] = scale * att[t, u] * (d[t, u] - sum_u' att[t, u'] d[t, u']) (in place; d
//           holds dout . v on entry)
// Rows are read and written through buffer device addresses (one gather per load on lavapipe);
// the bindings stay so the descriptor set and validation see the accesses.
// H_F16 / H_BF16 (attention in 16 bits, common/h16.glsl): SM_FWD works in place on the f32
// scores (a workspace) as before and also writes the rounded probabilities to the 16-bit att
// (binding 1, offset od); SM_BWD reads att as 16 bits (binding 0), d stays f32.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference_uvec2 : require
#include "common/index.glsl"
#if defined(H_F16) || defined(H_BF16)
#include "common/h16.glsl"
#define ATT_H
#endif
#include "common/math.glsl"

layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
  uint rows;
  uint T;
  float scale;
  uint oatt;  // element offsets of row 0 within the bound ranges
  uint od;
  uint att_lo;  // device addresses of the bound ranges
  uint att_hi;
  uint d_lo;
  uint d_hi;
} pc;

#if defined(SM_BWD) && defined(ATT_H)
layout(std430, binding = 0) readonly buffer Att { H_T att[]; };
#else
layout(std430, binding = 0) buffer Att { float att[]; };
#endif
#if defined(SM_BWD)
layout(std430, binding = 1) buffer D { float dd[]; };
#elif defined(ATT_H)
layout(std430, binding = 1) writeonly buffer AttH { H_T atth[]; };
#endif
layout(buffer_reference, std430, buffer_reference_align = 4) buffer FPtr { float v[]; };

void main() {
  uint row = ct_linear_index();
  if (row >= pc.rows) return;
  uint T = pc.T, t = row % T;
  FPtr pa = FPtr(uvec2(pc.att_lo, pc.att_hi));
  uint base = pc.oatt + row * T;
#if defined(SM_FWD)
  float mx = -CT_FLT_MAX;
  for (uint u = 0; u <= t; ++u) mx = max(mx, pc.scale * pa.v[base + u]);
  float z = 0.0;
  for (uint u = 0; u <= t; ++u) {
    float e = ct_exp_le0(pc.scale * pa.v[base + u] - mx);
    pa.v[base + u] = e;
    z += e;
  }
  float rz = 1.0 / z;
#if defined(ATT_H)
  uint hbase = pc.od + row * T;
  for (uint u = 0; u <= t; ++u) {
    float p = pa.v[base + u] * rz;
    pa.v[base + u] = p;
    atth[hbase + u] = h_store(p);
  }
  for (uint u = t + 1u; u < T; ++u) {
    pa.v[base + u] = 0.0;
    atth[hbase + u] = h_store(0.0);
  }
#else
  for (uint u = 0; u <= t; ++u) pa.v[base + u] *= rz;
  for (uint u = t + 1u; u < T; ++u) pa.v[base + u] = 0.0;
#endif
#else
  FPtr pd = FPtr(uvec2(pc.d_lo, pc.d_hi));
  uint dbase = pc.od + row * T;
#if defined(ATT_H)
#define ATT(u) h_load(att[base + (u)])
#else
#define ATT(u) pa.v[base + (u)]
#endif
  float s = 0.0;
  for (uint u = 0; u <= t; ++u) s += ATT(u) * pd.v[dbase + u];
  for (uint u = 0; u <= t; ++u) pd.v[dbase + u] = pc.scale * ATT(u) * (pd.v[dbase + u] - s);
  for (uint u = t + 1u; u < T; ++u) pd.v[dbase + u] = 0.0;
#endif
}
