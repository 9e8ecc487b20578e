#version 450
// Fused log-softmax + NLL, one workgroup per row, fixed-tree (deterministic) reductions.
//   CE_FWD    losses[n] = log(sum exp(x - max)) + max - x[target]
//   CE_BWD    dx[n, v] = dloss * (softmax(x)[v] - (v == target)); dx may be x itself
//   CE_FUSED  both, in place: losses as CE_FWD, x overwritten by CE_BWD's dx (the same bits:
//             the same statistics and arithmetic), the row read twice instead of three times
// over the V classes of a row; logits, dlogits [N, Vp] f32 or 16-bit (H_F16 / H_BF16,
// common/h16.glsl, both the same), columns [V, Vp) padding: their values never used, and dx = 0
// there; targets [N] i32 (< V); losses [N] f32. The statistics in one read of the row (a
// running max and rescaled sum per invocation, row_stats below).
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

// A row is walked in chunks of 8 consecutive elements, chunk c by invocation c % CT_WG, in the
// order c, c + CT_WG, ... (the same chunks as backends/gpu/kernels/crossentropy.cu), so the
// statistics have the same bits whichever way they are read. VEC (per dispatch): every row of
// x (and of o, CE_BWD) starts 16-byte aligned in its binding and Vp is a multiple of 8, so a
// chunk is one 16-byte load (two for f32) through the same bindings' uvec4 views -- on a GPU an
// invocation with one 2-byte load in flight at a time leaves most of the memory's bandwidth
// unused. Else element by element; columns past `end` are not read then.
layout(constant_id = 0) const uint VEC = 0;
#if defined(CE_FUSED)
layout(std430, binding = 1) buffer X8 { uvec4 x8[]; };
#else
layout(std430, binding = 1) readonly buffer X8 { uvec4 x8[]; };
#endif
#if defined(CE_BWD)
layout(std430, binding = 0) buffer Out8 { uvec4 o8[]; };
#endif

#if defined(H_F16) || defined(H_BF16)
#define CE_UNPACK(w, v, k)                         \
  v[2 * (k)] = h_load((w) & 0xffffu);              \
  v[2 * (k) + 1] = h_load((w) >> 16);
#define CE_PACK(v, k) (uint(h_store(v[2 * (k)])) | (uint(h_store(v[2 * (k) + 1])) << 16))
#endif

// Elements e .. e + 7 of x (binding element index), e + i < end read one by one (0 past it), or
// the whole chunk by VEC.
void load_chunk(uint e, uint n, out float v[8]) {
  if (VEC != 0u) {
#if defined(H_F16) || defined(H_BF16)
    const uvec4 w = x8[e / 8u];
    CE_UNPACK(w.x, v, 0)
    CE_UNPACK(w.y, v, 1)
    CE_UNPACK(w.z, v, 2)
    CE_UNPACK(w.w, v, 3)
#else
    const uvec4 a = x8[e / 4u], b = x8[e / 4u + 1u];
    v = float[8](uintBitsToFloat(a.x), uintBitsToFloat(a.y), uintBitsToFloat(a.z),
                 uintBitsToFloat(a.w), uintBitsToFloat(b.x), uintBitsToFloat(b.y),
                 uintBitsToFloat(b.z), uintBitsToFloat(b.w));
#endif
  } else {
    for (uint k = 0u; k < 8u; ++k) v[k] = k < n ? h_load(x[e + k]) : 0.0;
  }
}

#if defined(CE_FUSED) || defined(CE_BWD)
// The gradient's binding: x itself (CE_FUSED, in place) or o, and its uvec4 view.
#if defined(CE_FUSED)
#define G x
#define G8 x8
#else
#define G o
#define G8 o8
#endif
// v into elements e .. e + 7 of the gradient's binding, the first n of them (VEC: all 8).
void store_chunk(uint e, uint n, float v[8]) {
  if (VEC != 0u) {
#if defined(H_F16) || defined(H_BF16)
    G8[e / 8u] = uvec4(CE_PACK(v, 0), CE_PACK(v, 1), CE_PACK(v, 2), CE_PACK(v, 3));
#else
    G8[e / 4u] = floatBitsToUint(vec4(v[0], v[1], v[2], v[3]));
    G8[e / 4u + 1u] = floatBitsToUint(vec4(v[4], v[5], v[6], v[7]));
#endif
  } else {
    for (uint k = 0u; k < n; ++k) G[e + k] = h_store(v[k]);
  }
}
#endif

// The row's max and sum of exp(x - max) over its V classes (row xr of the binding), in one
// read: each invocation keeps the running max of its chunks and its sum of exp(x - running
// max), rescaled once a chunk (by exp(m - m'), 1 when the max did not grow); then the
// workgroup's max and the sum of the invocations' sums at it. A NaN logit makes the sum NaN
// (compares skip it in the max; its exp is NaN); -inf logits add exp(-inf) = 0.
void row_stats(uint xr, out float mx, out float z) {
  const uint tid = gl_LocalInvocationID.x;
  float m = -CT_FLT_MAX, s = 0.0;  // finite start: m - m' is never inf - inf
  for (uint i0 = tid * 8u; i0 < pc.V; i0 += CT_WG * 8u) {
    const uint n = min(pc.V - i0, 8u);
    float v[8];
    load_chunk(xr + i0, n, v);
    float mc = m;
    for (uint k = 0u; k < 8u; ++k)
      if (k < n) mc = v[k] > mc ? v[k] : mc;
    float add = 0.0;
    for (uint k = 0u; k < 8u; ++k)
      if (k < n) add += ct_exp_le0(v[k] - mc);
    s = s * ct_exp_le0(m - mc) + add;
    m = mc;
  }
  mx = ct_wg_max(m);
  z = ct_wg_sum(s * ct_exp_le0(m - mx));
}

void main() {
  uint row = ct_group_index();
  if (row >= pc.N) return;  // uniform per workgroup
  uint tid = gl_LocalInvocationID.x;
  uint xr = pc.ox + row * pc.Vp;
  float mx, z;
  row_stats(xr, mx, z);
  int tgt = targets[pc.ot + row];
#if defined(CE_FWD)
  // log z + (max - x[target]): log z is not absorbed by a huge max first (as crossentropy.cu)
  if (tid == 0) o[pc.oo + row] = log(z) + (mx - h_load(x[xr + uint(tgt)]));
#else
  // dx = dloss * (softmax - onehot) over the classes, 0 over the padding [V, Vp). Each chunk is
  // read before its own invocation writes it (dx may be x), after the statistics' last read.
  float rz = 1.0 / z;
#if defined(CE_BWD)
  const uint gr = pc.oo + row * pc.Vp;
#else
  const uint gr = xr;
#endif
  for (uint i0 = tid * 8u; i0 < pc.Vp; i0 += CT_WG * 8u) {
    const uint n = min(pc.Vp - i0, 8u), nv = pc.V > i0 ? min(pc.V - i0, 8u) : 0u;
    float v[8] = float[8](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0), g[8];
    if (nv > 0u) load_chunk(xr + i0, nv, v);
    const int tk = tgt - int(i0);  // the target's place in the chunk, if it is there
#if defined(CE_FUSED)
    // the invocation that owns the target's column reads it just before overwriting it
    if (tk >= 0 && tk < 8) {
      float xt = 0.0;
      for (int k = 0; k < 8; ++k)
        if (k == tk) xt = v[k];
      o[pc.oo + row] = log(z) + (mx - xt);
    }
#endif
    for (uint k = 0u; k < 8u; ++k) {
      const float p = ct_exp_le0(v[k] - mx) * rz;
      g[k] = k < nv ? pc.dloss * (p - (int(k) == tk ? 1.0 : 0.0)) : 0.0;
    }
    store_chunk(gr + i0, n, g);
  }
#endif
}
