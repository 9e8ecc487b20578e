#version 450
// Causal self-attention with grouped-query attention (NKV key/value heads, query head h reading
// kv head h / G, G = NH / NKV; NKV == NH is plain multi-head attention). Fixed summation order.
//   ATT_FWD     one invocation per (b, h, t) row: att[b,h,t,:] = softmax(q_t . k_u * scale,
//               u <= t), 0 above the diagonal; out[b,t,h] = sum_u att * v_u
//   ATT_BWD_Q   one invocation per (b, h, t) row: s[b,h,t] = sum_u att * datt (datt = dout_t .
//               v_u); dq_t = scale * sum_u dpre * k_u with dpre = att * (datt - s)
//   ATT_BWD_KV  one invocation per (b, j, u), j a kv head: dk_u = scale * sum_g sum_{t>=u} dpre *
//               q_t, dv_u = sum_g sum_{t>=u} att * dout_t over the G query heads h = j G + g of
//               its group, g in order (one owner per output, no atomics)
// qkv, dqkv [B, T, C3], C3 = C + 2 NKV hs (q: NH heads | k: NKV heads | v: NKV heads, heads of
// hs = C/NH); out, dout [B, T, C]; att [B, NH, T, T]; s [B, NH, T] (workspace). Head size at
// most 128.
#extension GL_GOOGLE_include_directive : require
#include "common/index.glsl"
#include "common/math.glsl"

#define MAX_HS 128
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
  uint rows;  // B*NH*T (ATT_BWD_KV: B*NKV*T)
  uint T;
  uint C;
  uint NH;
  uint NKV;
  float scale;
  uint oo;    // out (FWD) or dqkv (BWD)
  uint oatt;
  uint oqkv;
  uint odo;   // dout (BWD)
  uint os;    // s (BWD)
} pc;

#if defined(ATT_FWD)
layout(std430, binding = 0) writeonly buffer Out { float o[]; };
layout(std430, binding = 1) buffer Att { float att[]; };
layout(std430, binding = 2) readonly buffer Qkv { float qkv[]; };
#else
layout(std430, binding = 0) writeonly buffer DQkv { float dqkv[]; };
layout(std430, binding = 1) readonly buffer Att { float att[]; };
layout(std430, binding = 2) readonly buffer Qkv { float qkv[]; };
layout(std430, binding = 3) readonly buffer DOut { float dout[]; };
layout(std430, binding = 4) buffer S { float s[]; };
#endif

void main() {
  uint idx = ct_linear_index();
  if (idx >= pc.rows) return;
  uint T = pc.T, C = pc.C, hs = C / pc.NH, G = pc.NH / pc.NKV;
  uint C3 = C + 2u * pc.NKV * hs;
  uint VO = C + pc.NKV * hs;  // where v starts in a row
  float acc[MAX_HS];

#if defined(ATT_FWD) || defined(ATT_BWD_Q)
  uint t = idx % T, h = (idx / T) % pc.NH, b = idx / (T * pc.NH);
  uint row = pc.oqkv + b * T * C3 + h * hs;              // q of (b, t=0, h)
  uint krow = pc.oqkv + b * T * C3 + C + (h / G) * hs;   // k of (b, u=0, kv head of h)
  uint vrow = pc.oqkv + b * T * C3 + VO + (h / G) * hs;  // v of (b, u=0, kv head of h)
  uint arow = pc.oatt + idx * T;                         // att[b, h, t, :]
#endif

#if defined(ATT_FWD)
  uint q = row + t * C3;
  float mx = -CT_FLT_MAX;
  for (uint u = 0; u <= t; ++u) {
    float d = 0.0;
    for (uint i = 0; i < hs; ++i) d += qkv[q + i] * qkv[krow + u * C3 + i];
    d *= pc.scale;
    att[arow + u] = d;
    mx = max(mx, d);
  }
  float z = 0.0;
  for (uint u = 0; u <= t; ++u) {
    float e = ct_exp_le0(att[arow + u] - mx);
    att[arow + u] = e;
    z += e;
  }
  float rz = 1.0 / z;
  for (uint i = 0; i < hs; ++i) acc[i] = 0.0;
  for (uint u = 0; u <= t; ++u) {
    float p = att[arow + u] * rz;
    att[arow + u] = p;
    for (uint i = 0; i < hs; ++i) acc[i] += p * qkv[vrow + u * C3 + i];
  }
  for (uint u = t + 1u; u < T; ++u) att[arow + u] = 0.0;
  uint ob = pc.oo + (b * T + t) * C + h * hs;
  for (uint i = 0; i < hs; ++i) o[ob + i] = acc[i];

#elif defined(ATT_BWD_Q)
  uint dob = pc.odo + (b * T + t) * C + h * hs;
  float sum = 0.0;
  for (uint u = 0; u <= t; ++u) {
    float d = 0.0;
    for (uint i = 0; i < hs; ++i) d += dout[dob + i] * qkv[vrow + u * C3 + i];
    sum += att[arow + u] * d;
  }
  s[pc.os + idx] = sum;
  for (uint i = 0; i < hs; ++i) acc[i] = 0.0;
  for (uint u = 0; u <= t; ++u) {
    float d = 0.0;
    for (uint i = 0; i < hs; ++i) d += dout[dob + i] * qkv[vrow + u * C3 + i];
    float dp = att[arow + u] * (d - sum) * pc.scale;
    for (uint i = 0; i < hs; ++i) acc[i] += dp * qkv[krow + u * C3 + i];
  }
  uint qb = pc.oo + (b * T + t) * C3 + h * hs;
  for (uint i = 0; i < hs; ++i) dqkv[qb + i] = acc[i];

#else  // ATT_BWD_KV: t is the key position u of kv head j; the loops run over the group's
       // query heads g in order and, for each, the query rows tq >= t
  uint t = idx % T, j = (idx / T) % pc.NKV, b = idx / (T * pc.NKV);
  float dv[MAX_HS];
  for (uint i = 0; i < hs; ++i) {
    acc[i] = 0.0;
    dv[i] = 0.0;
  }
  uint vb = pc.oqkv + (b * T + t) * C3 + VO + j * hs;
  for (uint g = 0; g < G; ++g) {
    uint h = j * G + g;
    uint hrow = (b * pc.NH + h) * T;  // (b, h, 0) row index
    for (uint tq = t; tq < T; ++tq) {
      float p = att[pc.oatt + (hrow + tq) * T + t];
      uint dob = pc.odo + (b * T + tq) * C + h * hs;
      float d = 0.0;
      for (uint i = 0; i < hs; ++i) d += dout[dob + i] * qkv[vb + i];
      float dp = p * (d - s[pc.os + hrow + tq]) * pc.scale;
      uint q = pc.oqkv + (b * T + tq) * C3 + h * hs;
      for (uint i = 0; i < hs; ++i) {
        acc[i] += dp * qkv[q + i];
        dv[i] += p * dout[dob + i];
      }
    }
  }
  uint kb = pc.oo + (b * T + t) * C3 + C + j * hs;
  uint vob = pc.oo + (b * T + t) * C3 + VO + j * hs;
  for (uint i = 0; i < hs; ++i) {
    dqkv[kb + i] = acc[i];
    dqkv[vob + i] = dv[i];
  }
#endif
}
