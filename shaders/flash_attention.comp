#version 450
// Fused causal multi-head self-attention (core/device.h flash_attention_*), the algorithm of
// backends/gpu/kernels/flash_attention.cu: one invocation per query row (FA_FWD, FA_BWD_Q) or key
// row (FA_BWD_KV) -- in the _u modules L of them (FA_PAIR below) --, 64 rows of one head a
// workgroup (gl_WorkGroupID.x: row block, .y: query head h of the dispatch's batch element,
// FA_BWD_KV: key/value head j); the other side streams through shared memory in tiles of TILE
// rows, so the T x T probabilities exist nowhere. Each row walks its keys (queries) in order: one
// owner per output, no atomics.
// Grouped-query attention: NKV key/value heads, query head h reads kv head h / G (G = NH / NKV;
// NKV == NH is plain multi-head attention); FA_BWD_KV sums over the G query heads j G + g of its
// group, g in order, in the same invocation.
//   FA_FWD     online softmax over u <= t: m = running max of s = scale q_t.k_u,
//              l = sum exp(s - m), o = sum exp(s - m) v_u, rescaled once a key tile (its
//              scores first);  out_t = o / l, lse_t = m + log l
//   FA_BWD_Q   D_t = dout_t . out_t (saved); p = exp(s - lse_t); ds = p (dout_t . v_u - D_t) scale;
//              dq_t = sum_u ds k_u
//   FA_BWD_KV  for the key row u: dk_u = sum_g sum_{t>=u} ds q_t, dv_u = sum_g sum_{t>=u} p dout_t
// One batch element per dispatch: qkv, dqkv [T, C3], C3 = C + 2 NKV hs (q: NH heads | k: NKV
// heads | v: NKV heads, heads of hs = C/NH); out, dout
// [T, C] (all H_T: f32, or 16 bits with H_F16 / H_BF16); lse, D [NH, T] f32. hs <= 128; loops
// run to hs (the tiles are padded to MAX_HS with zeros).
// FA_FWD of the last rows (sampling's key/value cache): out [Tq, C] and lse [NH, Tq] hold the
// positions q0 .. T - 1 only (q0 = T - Tq, in the push block's odo slot, which the forward
// does not otherwise read): the workgroups start at the block holding q0, rows below it are
// neither loaded nor written, and row t is stored at t - q0. Each row's sums are those of the
// whole window's run (q0 = 0), bit for bit.
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#include "common/h16.glsl"
#include "common/math.glsl"

#define MAX_HS 128
#define ROWS 64
#define TILE 16
// FA_PAIR (the _u modules): LANES_A_ROW invocations a row (a specialization constant, 2 or 4:
// the host takes 4 past head size 64), lane h of them holding the head's elements h, h + L,
// h + 2 L, ... of its rows (forward: q, o; dq: q, dout, dq; dk/dv: k, v, dk, dv) -- at head size
// 64 with 2, or 128 with 4, 128 floats a lane in dk/dv instead of 256 or 512: RDNA2 and NVIDIA
// keep them in registers; each dot product is the lanes' partial sums added by an xor butterfly
// (subgroupShuffleXor 1, then 2: every lane holds the same bits). The workgroup is
// ROWS x LANES_A_ROW invocations (local_size_x_id 2, set with it).
#if defined(FA_PAIR)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
layout(constant_id = 1) const uint LANES_A_ROW = 2u;
layout(local_size_x_id = 2) in;
// The sum of v over the row's lanes.
float row_lanes_sum(float v) {
  [[unroll]] for (uint m = 1u; m < LANES_A_ROW; m *= 2u) v += subgroupShuffleXor(v, m);
  return v;
}
#else
const uint LANES_A_ROW = 1u;
layout(local_size_x = ROWS) in;
#endif
const uint ROW_HS = MAX_HS / LANES_A_ROW;

// The _u modules (FA_UNROLL; backends/vulkan/ops/flash_attention.cpp dispatches them on GPUs):
// the head size HS_SPEC is set when the pipeline is created and the loops over the head are
// unrolled, so each invocation's rows (q, acc, ...) can live in registers; with the bound read at
// run time (HS_SPEC 0, the plain modules, which CPU devices run: lavapipe's JIT takes seconds a
// head size for the unrolled loops) those arrays are indexed dynamically, which puts them in
// local memory (RADV for RDNA2/3: 64-128 KiB of scratch a workgroup). The same operations in the
// same order either way.
layout(constant_id = 0) const uint HS_SPEC = 0;
#if defined(FA_UNROLL)
#define HS_UNROLL [[unroll]]
#else
#define HS_UNROLL
#endif

layout(push_constant) uniform Push {
  uint T;
  uint C;
  uint NH;
  uint NKV;
  float scale;
  uint oo;    // out (FWD) or dqkv (BWD)
  uint olse;
  uint oqkv;
  uint odo;   // dout (BWD); FWD: q0, the first query row (out's and lse's row 0)
  uint oout;  // out (BWD_Q)
  uint od;    // D (BWD)
} pc;

#if defined(FA_FWD)
layout(std430, binding = 0) writeonly buffer Out { H_T o[]; };
layout(std430, binding = 1) writeonly buffer Lse { float lse[]; };
layout(std430, binding = 2) readonly buffer Qkv { H_T qkv[]; };
#else
layout(std430, binding = 0) buffer DQkv { H_T dqkv[]; };
layout(std430, binding = 1) readonly buffer Lse { float lse[]; };
layout(std430, binding = 2) readonly buffer Qkv { H_T qkv[]; };
layout(std430, binding = 3) readonly buffer DOut { H_T dout[]; };
layout(std430, binding = 4) readonly buffer Out { H_T o[]; };
layout(std430, binding = 5) buffer Dsave { float dsave[]; };
#endif

shared float ta[TILE * MAX_HS];  // FWD, BWD_Q: keys; BWD_KV: queries
shared float tb[TILE * MAX_HS];  // FWD, BWD_Q: values; BWD_KV: dout rows
shared float tl[TILE];           // BWD_KV: lse of the staged queries
shared float td[TILE];           // BWD_KV: D of the staged queries

// Stages rows r0 .. r0 + TILE of a head slice into dst as f32 (zeros past T and past hs).
#define STAGE(dst, buf, base, stride, r0)                                          \
  for (uint idx_ = gl_LocalInvocationID.x; idx_ < TILE * MAX_HS; idx_ += ROWS * LANES_A_ROW) { \
    uint rr_ = idx_ / MAX_HS, i_ = idx_ % MAX_HS, r_ = (r0) + rr_;                \
    dst[idx_] = r_ < T && i_ < hs ? h_load(buf[(base) + r_ * (stride) + i_]) : 0.0; \
  }

void main() {
  const uint T = pc.T, C = pc.C, hs = HS_SPEC != 0u ? HS_SPEC : C / pc.NH, G = pc.NH / pc.NKV;
  const uint C3 = C + 2u * pc.NKV * hs, VO = C + pc.NKV * hs;  // VO: where v starts in a row
  // FA_PAIR: a row's L invocations are subgroup invocations L i .. L i + L - 1 of one subgroup
  // (the partners of the xor shuffles), numbered by subgroup, so the grouping holds however a
  // driver maps local invocations to subgroups (the workgroup's 64 L invocations in full
  // subgroups -- requested where the driver can be asked, ops/flash_attention.cpp, and what
  // drivers do for a workgroup a multiple of the subgroup size: these numbers are 0 .. 64 L - 1
  // once each). Else the local invocation index.
#if defined(FA_PAIR)
  const uint slot = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
#else
  const uint slot = gl_LocalInvocationID.x;
#endif
#if defined(FA_FWD)
  const uint q0 = pc.odo, Tq = T - q0;
  const uint first = (q0 / ROWS + gl_WorkGroupID.x) * ROWS;
  const uint r = first + slot / LANES_A_ROW;  // this invocation's row
  const bool live = r >= q0 && r < T;
#else
  const uint first = gl_WorkGroupID.x * ROWS;
  const uint r = first + slot / LANES_A_ROW;  // this invocation's row
  const bool live = r < T;
#endif
  const uint last = min(first + ROWS, T) - 1u;
  // Element e of this invocation's per-row arrays is the head's element hof(e): in chunks of 4,
  // lane lh of the row's L holding chunks lh, lh + L, ... (FA_PAIR; with L = 1 all of them, in
  // order), so a lane's reads of a staged row come 16 bytes at a time; hn of them at most (a
  // chunk's elements past hs are zeros in the arrays and the tiles).
  const uint lh = slot % LANES_A_ROW;
#define hof(e) (4u * (lh + LANES_A_ROW * ((e) / 4u)) + (e) % 4u)
  const uint hn =
      LANES_A_ROW == 1u ? hs : 4u * (((hs + 3u) / 4u + LANES_A_ROW - 1u) / LANES_A_ROW);
  // dst = the sum over this invocation's elements e < hn of (A) * (B) (expressions of e): in the
  // _u modules four running sums, one for each position e % 4 of a chunk, (s0 + s1) + (s2 + s3)
  // at the end (dependent multiply-add chains a quarter as long); in the plain ones one, in
  // order.
#if defined(FA_UNROLL)
#define ROW_DOT(dst, A, B)                                   \
  {                                                          \
    float d_[4] = float[4](0.0, 0.0, 0.0, 0.0);              \
    HS_UNROLL for (uint e = 0; e < hn; ++e) d_[e % 4u] += (A) * (B); \
    dst = (d_[0] + d_[1]) + (d_[2] + d_[3]);                 \
  }
#else
#define ROW_DOT(dst, A, B) \
  dst = 0.0;               \
  for (uint e = 0; e < hn; ++e) dst += (A) * (B);
#endif
#if !defined(FA_BWD_KV)
  const uint h = gl_WorkGroupID.y;                 // query head
  const uint qbase = pc.oqkv + h * hs;             // q of row 0 of head h
  const uint kbase = pc.oqkv + C + (h / G) * hs;   // k of row 0 of h's kv head
  const uint vbase = pc.oqkv + VO + (h / G) * hs;  // v of row 0 of h's kv head
#endif

#if defined(FA_FWD)
  float q[ROW_HS], acc[ROW_HS];
  HS_UNROLL for (uint e = 0; e < ROW_HS; ++e) {
    q[e] = live && hof(e) < hs ? h_load(qkv[qbase + r * C3 + hof(e)]) : 0.0;
    acc[e] = 0.0;
  }
  // FlashAttention-2's order within a key tile: the row's scores of the tile first (sc), its
  // running max m over them once, acc and l rescaled once, then p = exp(s - m) and acc += p v key
  // by key -- no branch on "a new maximum" per key, which the rows of a subgroup took at
  // different keys (both sides ran).
  float m = -CT_FLT_MAX, l = 0.0;  // finite start: exp(m - m') is 0, not NaN, at the first key
  for (uint u0 = 0; u0 <= last; u0 += TILE) {
    STAGE(ta, qkv, kbase, C3, u0)
    STAGE(tb, qkv, vbase, C3, u0)
    barrier();
    if (live && u0 <= r) {  // a row's lanes together
      float sc[TILE];
      float mt = m;
      HS_UNROLL for (uint uu = 0; uu < TILE; ++uu) {
        if (u0 + uu <= r) {
          float dot;
          ROW_DOT(dot, q[e], ta[uu * MAX_HS + hof(e)])
#if defined(FA_PAIR)
          dot = row_lanes_sum(dot);
#endif
          sc[uu] = dot * pc.scale;
          mt = max(mt, sc[uu]);
        }
      }
      const float corr = ct_exp_le0(m - mt);  // 0 at the first tile, 1 if the max stayed
      l *= corr;
      HS_UNROLL for (uint e = 0; e < hn; ++e) acc[e] *= corr;
      m = mt;
      HS_UNROLL for (uint uu = 0; uu < TILE; ++uu) {
        if (u0 + uu <= r) {
          const float p = ct_exp_le0(sc[uu] - m);
          l += p;
          HS_UNROLL for (uint e = 0; e < hn; ++e) acc[e] += p * tb[uu * MAX_HS + hof(e)];
        }
      }
    }
    barrier();
  }
  if (!live) return;
  float inv = 1.0 / l;
  HS_UNROLL for (uint e = 0; e < hn; ++e) {
    if (hof(e) >= hs) break;
    o[pc.oo + (r - q0) * C + h * hs + hof(e)] = h_store(acc[e] * inv);
  }
  if (lh == 0u) lse[pc.olse + h * Tq + r - q0] = m + log(l);

#elif defined(FA_BWD_Q)
  float q[ROW_HS], g[ROW_HS], acc[ROW_HS];
  float D = 0.0, lr = 0.0;
  HS_UNROLL for (uint e = 0; e < ROW_HS; ++e) {
    bool ok = live && hof(e) < hs;
    q[e] = ok ? h_load(qkv[qbase + r * C3 + hof(e)]) : 0.0;
    g[e] = ok ? h_load(dout[pc.odo + r * C + h * hs + hof(e)]) : 0.0;
    D += g[e] * (ok ? h_load(o[pc.oout + r * C + h * hs + hof(e)]) : 0.0);
    acc[e] = 0.0;
  }
#if defined(FA_PAIR)
  D = row_lanes_sum(D);  // every invocation is here: no row has diverged yet
#endif
  if (live) {
    if (lh == 0u) dsave[pc.od + h * T + r] = D;
    lr = lse[pc.olse + h * T + r];
  }
  for (uint u0 = 0; u0 <= last; u0 += TILE) {
    STAGE(ta, qkv, kbase, C3, u0)
    STAGE(tb, qkv, vbase, C3, u0)
    barrier();
    for (uint uu = 0; live && uu < TILE && u0 + uu <= r; ++uu) {  // a row's lanes together
      float dot, dp;
      ROW_DOT(dot, q[e], ta[uu * MAX_HS + hof(e)])
      ROW_DOT(dp, g[e], tb[uu * MAX_HS + hof(e)])
#if defined(FA_PAIR)
      dot = row_lanes_sum(dot);
      dp = row_lanes_sum(dp);
#endif
      float p = ct_exp_le0(dot * pc.scale - lr);
      float ds = p * (dp - D) * pc.scale;
      HS_UNROLL for (uint e = 0; e < hn; ++e) acc[e] += ds * ta[uu * MAX_HS + hof(e)];
    }
    barrier();
  }
  if (!live) return;
  HS_UNROLL for (uint e = 0; e < hn; ++e) {
    if (hof(e) >= hs) break;
    dqkv[pc.oo + r * C3 + h * hs + hof(e)] = h_store(acc[e]);
  }

#else  // FA_BWD_KV: r is the key row u of kv head j; for each query head of the group in
       // order, queries t >= u, from the block's first row on
  const uint j = gl_WorkGroupID.y;
  float k[ROW_HS], v[ROW_HS], dk[ROW_HS], dv[ROW_HS];
  HS_UNROLL for (uint e = 0; e < ROW_HS; ++e) {
    bool ok = live && hof(e) < hs;
    k[e] = ok ? h_load(qkv[pc.oqkv + r * C3 + C + j * hs + hof(e)]) : 0.0;
    v[e] = ok ? h_load(qkv[pc.oqkv + r * C3 + VO + j * hs + hof(e)]) : 0.0;
    dk[e] = 0.0;
    dv[e] = 0.0;
  }
  for (uint g = 0; g < G; ++g) {
    const uint h = j * G + g;  // query head
    for (uint t0 = first; t0 < T; t0 += TILE) {
      STAGE(ta, qkv, pc.oqkv + h * hs, C3, t0)
      STAGE(tb, dout, pc.odo + h * hs, C, t0)
      if (gl_LocalInvocationID.x < TILE) {
        uint t = t0 + gl_LocalInvocationID.x;
        tl[gl_LocalInvocationID.x] = t < T ? lse[pc.olse + h * T + t] : 0.0;
        td[gl_LocalInvocationID.x] = t < T ? dsave[pc.od + h * T + t] : 0.0;
      }
      barrier();
      for (uint tt = 0; live && tt < TILE && t0 + tt < T; ++tt) {
        if (t0 + tt < r) continue;  // a row's lanes have the same row: they go on together
        float dot, dp;
        // (elements past hs are 0 in the tiles and the arrays: the sums see exact zeros)
        ROW_DOT(dot, ta[tt * MAX_HS + hof(e)], k[e])
        ROW_DOT(dp, tb[tt * MAX_HS + hof(e)], v[e])
#if defined(FA_PAIR)
        dot = row_lanes_sum(dot);
        dp = row_lanes_sum(dp);
#endif
        float p = ct_exp_le0(dot * pc.scale - tl[tt]);
        float ds = p * (dp - td[tt]) * pc.scale;
        HS_UNROLL for (uint e = 0; e < hn; ++e) {
          dv[e] += p * tb[tt * MAX_HS + hof(e)];
          dk[e] += ds * ta[tt * MAX_HS + hof(e)];
        }
      }
      barrier();
    }
  }
  if (!live) return;
  HS_UNROLL for (uint e = 0; e < hn; ++e) {
    if (hof(e) >= hs) break;
    dqkv[pc.oo + r * C3 + C + j * hs + hof(e)] = h_store(dk[e]);
    dqkv[pc.oo + r * C3 + VO + j * hs + hof(e)] = h_store(dv[e]);
  }
#endif
}
