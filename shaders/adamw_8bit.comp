#version 450
// One fused block-wise 8-bit AdamW step (core/device.h's adamw_8bit contract): one workgroup
// per block of 256 elements. Dequantise m and v with the block's absmax and the code tables,
// update in fp32, step the parameter with the unquantised moments, then take the block's new
// absmax (a fixed shared-memory tree: max is exact, so the result is the CPU's) and requantise
// to the nearest code, the lower index on a tie (the CPU reference's binary search).
// param, grad, m_q, v_q [n]; m_absmax, v_absmax [ceil(n/256)]; qmap_signed/unsigned [256];
// grad_norm [1] (read only when max_norm > 0). Offsets o* are element indices in each binding;
// n counts elements of this chunk, which starts on a block boundary.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_8bit_storage : require
#include "common/index.glsl"
#include "common/math.glsl"

#define CT_WG 256
layout(local_size_x = CT_WG) in;
#include "common/reduce.glsl"

layout(push_constant) uniform Push {
  uint n;
  uint op;
  uint og;
  uint omq;
  uint ovq;
  uint oma;
  uint ova;
  uint oqs;
  uint oqu;
  uint onorm;
  float lr;
  float beta1;
  float beta2;
  float eps;
  float wd;
  float bc1;  // 1 - beta1^step
  float bc2;  // 1 - beta2^step
  float max_norm;
} pc;
layout(std430, binding = 0) buffer P { float p[]; };
layout(std430, binding = 1) readonly buffer G { float g[]; };
layout(std430, binding = 2) buffer MQ { uint8_t mq[]; };
layout(std430, binding = 3) buffer VQ { uint8_t vq[]; };
layout(std430, binding = 4) buffer MA { float mabs[]; };
layout(std430, binding = 5) buffer VA { float vabs[]; };
layout(std430, binding = 6) readonly buffer QS { float qs_g[]; };
layout(std430, binding = 7) readonly buffer QU { float qu_g[]; };
layout(std430, binding = 8) readonly buffer Norm { float gnorm[]; };

shared float qs[256];
shared float qu[256];

// nearest(code, x): the index minimising |code[i] - x|, the lower index on a tie.
#define CT_NEAREST(code, x, out)                                                     \
  {                                                                                  \
    uint lo = 0u;                                                                    \
    for (uint st = 128u; st > 0u; st >>= 1u) lo += (code[lo + st - 1u] < x) ? st : 0u; \
    if (lo == 256u) out = 255u;                                                      \
    else if (lo == 0u) out = 0u;                                                     \
    else out = (x - code[lo - 1u] <= code[lo] - x) ? lo - 1u : lo;                   \
  }

void main() {
  uint blk = ct_group_index();
  if (blk * 256u >= pc.n) return;  // whole workgroups beyond the last block (grid rounding)
  uint tid = gl_LocalInvocationID.x;
  qs[tid] = qs_g[pc.oqs + tid];
  qu[tid] = qu_g[pc.oqu + tid];
  barrier();
  uint i = blk * 256u + tid;
  bool live = i < pc.n;
  float mi = 0.0, vi = 0.0;
  if (live) {
    float clip = 1.0;
    if (pc.max_norm > 0.0) clip = ct_clip_factor(pc.max_norm, gnorm[pc.onorm]);
    float gi = g[pc.og + i] * clip;
    mi = pc.beta1 * (qs[uint(mq[pc.omq + i])] * mabs[pc.oma + blk]) + (1.0 - pc.beta1) * gi;
    float v0 = qu[uint(vq[pc.ovq + i])] * vabs[pc.ova + blk];
    vi = pc.beta2 * v0 + (1.0 - pc.beta2) * gi * gi;
    float pi = p[pc.op + i];
    pi -= pc.lr * pc.wd * pi;
    pi -= ct_adam_update(mi, vi, v0, gi, pc.lr, pc.beta2, pc.bc1, pc.bc2, pc.eps);
    p[pc.op + i] = pi;
  }
  // Every invocation has read the old absmax before any writes the new one.
  float mmax = ct_wg_max(abs(mi));
  float vmax = ct_wg_max(vi);
  if (tid == 0u) {
    mabs[pc.oma + blk] = mmax;
    vabs[pc.ova + blk] = vmax;
  }
  if (live) {
    float xm = mmax > 0.0 ? mi / mmax : 0.0;
    float xv = vmax > 0.0 ? vi / vmax : 0.0;
    uint a, b;
    CT_NEAREST(qs, xm, a);
    CT_NEAREST(qu, xv, b);
    mq[pc.omq + i] = uint8_t(a);
    vq[pc.ovq + i] = uint8_t(b);
  }
}
