#version 450
// Inverted dropout (core/device.h): out[i] = keep(i) ? x[i] * scale : 0, keep(i) =
// (Philox4x32-10(seed, stream) word e >> 8) >= threshold for the tensor element e = base + i
// (base: the element this dispatch starts at). x, out [n], both f32 or both the same 16-bit type
// (H_F16 / H_BF16, common/h16.glsl); out may be x.
#extension GL_GOOGLE_include_directive : require
#include "common/h16.glsl"
#include "common/index.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Push {
  uint n;
  uint oo;
  uint ox;
  uint base_lo;
  uint base_hi;
  uint k0;
  uint k1;
  uint s0;
  uint s1;
  uint threshold;
  float scale;
} pc;
layout(std430, binding = 0) buffer Out { H_T o[]; };
layout(std430, binding = 1) readonly buffer X { H_T x[]; };

// Word `word` of the Philox4x32-10 block (c0, c1, s0, s1) under key (k0, k1).
uint philox_word(uint c0, uint c1, uint word) {
  uint c2 = pc.s0, c3 = pc.s1, k0 = pc.k0, k1 = pc.k1;
  for (int round = 0; round < 10; ++round) {
    uint h0, l0, h1, l1;
    umulExtended(0xD2511F53u, c0, h0, l0);
    umulExtended(0xCD9E8D57u, c2, h1, l1);
    uint n0 = h1 ^ c1 ^ k0;
    uint n2 = h0 ^ c3 ^ k1;
    c0 = n0;
    c1 = l1;
    c2 = n2;
    c3 = l0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return word == 0u ? c0 : word == 1u ? c1 : word == 2u ? c2 : c3;
}

void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
  // element e = base + i as 64 bits; block e / 4, word e % 4
  uint lo = pc.base_lo + i;
  uint hi = pc.base_hi + (lo < i ? 1u : 0u);
  uint w = philox_word((lo >> 2) | (hi << 30), hi >> 2, lo & 3u);
  float v = h_load(x[pc.ox + i]);
  o[pc.oo + i] = h_store((w >> 8) >= pc.threshold ? v * pc.scale : 0.0);
}
