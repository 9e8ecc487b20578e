#version 450
// Causal multi-head self-attention, one invocation per (b, h, t) row; fixed summation order.
//   ATT_FWD     att[b,h,t,:] = softmax(q_t . k_u * scale, u <= t), 0 above the diagonal;
//               out[b,t,h] = sum_u att * v_u
//   ATT_BWD_Q   s[b,h,t] = sum_u att * datt (datt = dout_t . v_u); dq_t = scale * sum_u dpre * k_u
//               with dpre = att * (datt - s)
//   ATT_BWD_KV  one invocation per (b, h, u): dk_u = scale * sum_{t>=u} dpre * q_t,
//               dv_u = sum_{t>=u} att * dout_t
// qkv, dqkv [B, T, 3C] (q | k | v, heads of hs = C/NH); out, dout [B, T, C];
// att [B, NH, T, T]; s [B, NH, T] (workspace). Head size at most 128.
#extension GL_GOOGLE_include_directive : require
#include "common/index.glsl"

#define MAX_HS 128
layout(local_size_x = 64) in;

layout(push_constant) uniform Push {
  uint rows;  // B*NH*T
  uint T;
  uint C;
  uint NH;
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
  uint T = pc.T, C = pc.C, hs = C / pc.NH;
  uint t = idx % T, h = (idx / T) % pc.NH, b = idx / (T * pc.NH);
  uint C3 = 3u * C;
  uint row = pc.oqkv + b * T * C3 + h * hs;  // q of (b, t=0, h)
  uint arow = pc.oatt + idx * T;              // att[b, h, t, :]
  float acc[MAX_HS];

#if defined(ATT_FWD)
  uint q = row + t * C3;
  float mx = -1.0 / 0.0;
  for (uint u = 0; u <= t; ++u) {
    float d = 0.0;
    for (uint i = 0; i < hs; ++i) d += qkv[q + i] * qkv[row + u * C3 + C + i];
    d *= pc.scale;
    att[arow + u] = d;
    mx = max(mx, d);
  }
  float z = 0.0;
  for (uint u = 0; u <= t; ++u) {
    float e = exp(att[arow + u] - mx);
    att[arow + u] = e;
    z += e;
  }
  float rz = 1.0 / z;
  for (uint i = 0; i < hs; ++i) acc[i] = 0.0;
  for (uint u = 0; u <= t; ++u) {
    float p = att[arow + u] * rz;
    att[arow + u] = p;
    for (uint i = 0; i < hs; ++i) acc[i] += p * qkv[row + u * C3 + 2u * C + i];
  }
  for (uint u = t + 1u; u < T; ++u) att[arow + u] = 0.0;
  uint ob = pc.oo + (b * T + t) * C + h * hs;
  for (uint i = 0; i < hs; ++i) o[ob + i] = acc[i];

#elif defined(ATT_BWD_Q)
  uint dob = pc.odo + (b * T + t) * C + h * hs;
  float sum = 0.0;
  for (uint u = 0; u <= t; ++u) {
    float d = 0.0;
    for (uint i = 0; i < hs; ++i) d += dout[dob + i] * qkv[row + u * C3 + 2u * C + i];
    sum += att[arow + u] * d;
  }
  s[pc.os + idx] = sum;
  for (uint i = 0; i < hs; ++i) acc[i] = 0.0;
  for (uint u = 0; u <= t; ++u) {
    float d = 0.0;
    for (uint i = 0; i < hs; ++i) d += dout[dob + i] * qkv[row + u * C3 + 2u * C + i];
    float dp = att[arow + u] * (d - sum) * pc.scale;
    for (uint i = 0; i < hs; ++i) acc[i] += dp * qkv[row + u * C3 + C + i];
  }
  uint qb = pc.oo + (b * T + t) * C3 + h * hs;
  for (uint i = 0; i < hs; ++i) dqkv[qb + i] = acc[i];

#else  // ATT_BWD_KV: here t plays the key position u; the loop runs over query rows tq >= t
  float dv[MAX_HS];
  for (uint i = 0; i < hs; ++i) {
    acc[i] = 0.0;
    dv[i] = 0.0;
  }
  uint vb = row + t * C3 + 2u * C;
  uint hrow = idx - t;  // (b, h, 0) row index
  for (uint tq = t; tq < T; ++tq) {
    float p = att[pc.oatt + (hrow + tq) * T + t];
    uint dob = pc.odo + (b * T + tq) * C + h * hs;
    float d = 0.0;
    for (uint i = 0; i < hs; ++i) d += dout[dob + i] * qkv[vb + i];
    float dp = p * (d - s[pc.os + hrow + tq]) * pc.scale;
    uint q = row + tq * C3;
    for (uint i = 0; i < hs; ++i) {
      acc[i] += dp * qkv[q + i];
      dv[i] += p * dout[dob + i];
    }
  }
  uint kb = pc.oo + (b * T + t) * C3 + C + h * hs;
  for (uint i = 0; i < hs; ++i) {
    dqkv[kb + i] = acc[i];
    dqkv[kb + C + i] = dv[i];
  }
#endif
}
