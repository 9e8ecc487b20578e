#version 450
// Token + position embedding, forward and deterministic backward.
//   EMB_FWD      out[bt,c] = wte[tokens[bt],c] + wpe[bt % T,c] for tokens in this vocab chunk
//   EMB_CHAIN    link[bt] = (is the first position of its token, next position of that token)
//   EMB_BWD_WTE  dwte[tok,c] += dout[bt,c] over the token's positions, in (b,t) order
//   EMB_BWD_WPE  dwpe[t,c] += dout[b,t,c] over b, in order
// out, dout [B*T, C]; tokens [B*T] i32; wte, dwte rows [v0, v0+vc) of [V, C]; wpe [maxT, C]
// (haswpe 0: no position table, out = wte[token]; the host binds some table it does not read).
// EMB_FWD's wte and wpe may be 16-bit (H_F16 / H_BF16: widened, added in fp32); the rest f32.
#extension GL_GOOGLE_include_directive : require
#include "common/h16.glsl"
#include "common/index.glsl"

layout(local_size_x = 256) in;

#if defined(EMB_FWD)
layout(push_constant) uniform Push {
  uint n;  // B*T*C
  uint T;
  uint C;
  uint v0;
  uint vc;
  uint oo;
  uint otok;
  uint owte;
  uint owpe;
  uint haswpe;
} pc;
layout(std430, binding = 0) writeonly buffer Out { float o[]; };
layout(std430, binding = 1) readonly buffer Tok { int tokens[]; };
layout(std430, binding = 2) readonly buffer Wte { H_T wte[]; };
layout(std430, binding = 3) readonly buffer Wpe { H_T wpe[]; };

void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
  uint bt = i / pc.C, c = i % pc.C;
  uint tok = uint(tokens[pc.otok + bt]) - pc.v0;
  if (tok >= pc.vc) return;  // another chunk's token
  float e = h_load(wte[pc.owte + tok * pc.C + c]);
  o[pc.oo + i] = pc.haswpe != 0u ? e + h_load(wpe[pc.owpe + (bt % pc.T) * pc.C + c]) : e;
}

#elif defined(EMB_CHAIN)
layout(push_constant) uniform Push {
  uint BT;
  uint otok;
  uint olink;
} pc;
layout(std430, binding = 0) writeonly buffer Link { int link[]; };
layout(std430, binding = 1) readonly buffer Tok { int tokens[]; };

void main() {
  uint i = ct_linear_index();
  if (i >= pc.BT) return;
  int tok = tokens[pc.otok + i];
  int first = 1;
  for (uint j = 0; j < i; ++j)
    if (tokens[pc.otok + j] == tok) {
      first = 0;
      break;
    }
  int next = -1;
  for (uint j = i + 1; j < pc.BT; ++j)
    if (tokens[pc.otok + j] == tok) {
      next = int(j);
      break;
    }
  link[pc.olink + 2 * i] = first;
  link[pc.olink + 2 * i + 1] = next;
}

#elif defined(EMB_BWD_WTE)
layout(push_constant) uniform Push {
  uint n;  // B*T*C
  uint C;
  uint v0;
  uint vc;
  uint odw;
  uint odo;
  uint otok;
  uint olink;
} pc;
layout(std430, binding = 0) buffer DWte { float dwte[]; };
layout(std430, binding = 1) readonly buffer DOut { float dout[]; };
layout(std430, binding = 2) readonly buffer Tok { int tokens[]; };
layout(std430, binding = 3) readonly buffer Link { int link[]; };

void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
  uint bt = i / pc.C, c = i % pc.C;
  if (link[pc.olink + 2 * bt] == 0) return;  // not the token's first position
  uint tok = uint(tokens[pc.otok + bt]) - pc.v0;
  if (tok >= pc.vc) return;
  uint w = pc.odw + tok * pc.C + c;
  float acc = dwte[w];
  int j = int(bt);
  while (j >= 0) {
    acc += dout[pc.odo + uint(j) * pc.C + c];
    j = link[pc.olink + 2 * uint(j) + 1];
  }
  dwte[w] = acc;
}

#else  // EMB_BWD_WPE
layout(push_constant) uniform Push {
  uint n;  // T*C
  uint B;
  uint T;
  uint C;
  uint odw;
  uint odo;
} pc;
layout(std430, binding = 0) buffer DWpe { float dwpe[]; };
layout(std430, binding = 1) readonly buffer DOut { float dout[]; };

void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
  float acc = dwpe[pc.odw + i];
  for (uint b = 0; b < pc.B; ++b) acc += dout[pc.odo + b * pc.T * pc.C + i];
  dwpe[pc.odw + i] = acc;
}
#endif
