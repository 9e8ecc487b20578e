#version 450
// Adafactor (core/device.h's contract, HF semantics) on one tensor, in passes (one variant each):
//   AF_ROW    factored: one workgroup per row r of this row chunk: row[r] = b2t row[r] +
//             (1-b2t) mean_c(g^2 + eps1), the row sum a fixed shared-memory tree
//   AF_COLP   factored: one invocation per column c: the sum over this row chunk's rows (in row
//             order, in blocks of 256 rows) of g^2 + eps1 -> part[c]
//   AF_COL    factored: one invocation per column: col[c] = b2t col[c] + (1-b2t) sum(parts)/R,
//             the row-chunk partials summed in chunk order
//   AF_U      elementwise: the unscaled update U -> u (factored: from row, col and mean(row);
//             else v = b2t v + (1-b2t)(g^2 + eps1), U = g / sqrt(v))
//   AF_APPLY  elementwise: k = lr_t / max(1, RMS(U) / clip_threshold); U k, through exp_avg
//             when beta1 > 0; param -= wd lr_t param; param -= U
// RMS(U) and RMS(param) and mean(row) come in as norms / sums computed by reduce.comp.
// g = grad * clip (clip from grad_norm when max_norm > 0). Offsets o* are element indices.
#extension GL_GOOGLE_include_directive : require
#include "common/index.glsl"
#include "common/math.glsl"

#define CT_WG 256
layout(local_size_x = CT_WG) in;

layout(push_constant) uniform Push {
  uint n;     // elements (AF_U, AF_APPLY) or rows (AF_ROW, AF_COLP) of this chunk
  uint R;
  uint C;
  uint s0;    // first element (AF_U) of this chunk in the tensor
  uint nparts;
  uint o0;
  uint o1;
  uint o2;
  uint o3;
  uint o4;
  uint onorm;
  uint flags;  // 1: factored, 2: exp_avg (beta1 > 0), 4: scale_parameter
  float b2t;
  float eps1;
  float max_norm;
  float rho;
  float eps2;
  float clip_threshold;
  float beta1;
  float wd;
  float inv_sqrt_n;  // 1 / sqrt(numel)
} pc;

layout(std430, binding = 0) readonly buffer Norm { float gnorm[]; };

float clip_factor() {
  return pc.max_norm > 0.0 ? ct_clip_factor(pc.max_norm, gnorm[pc.onorm]) : 1.0;
}

#if defined(AF_ROW)
#include "common/reduce.glsl"
layout(std430, binding = 1) readonly buffer G { float g[]; };
layout(std430, binding = 2) buffer Row { float row[]; };
void main() {
  uint r = ct_group_index();
  if (r >= pc.n) return;  // whole workgroups
  float clip = clip_factor();
  float acc = 0.0;
  for (uint c = gl_LocalInvocationID.x; c < pc.C; c += CT_WG) {
    float gi = g[pc.o0 + r * pc.C + c] * clip;
    acc += gi * gi + pc.eps1;
  }
  float s = ct_wg_sum(acc);
  if (gl_LocalInvocationID.x == 0u)
    row[pc.o1 + r] = pc.b2t * row[pc.o1 + r] + (1.0 - pc.b2t) * (s / float(pc.C));
}
#elif defined(AF_COLP)
layout(std430, binding = 1) readonly buffer G { float g[]; };
layout(std430, binding = 2) writeonly buffer Part { float part[]; };
void main() {
  uint c = ct_linear_index();
  if (c >= pc.C) return;
  float clip = clip_factor();
  // Two levels (blocks of 256 rows, then the block sums) keep the fp32 rounding error of long
  // columns near that of a tree: O(256 + rows/256) ulps rather than O(rows).
  float acc = 0.0;
  for (uint r0 = 0u; r0 < pc.n; r0 += 256u) {
    float blk = 0.0;
    uint r1 = min(pc.n, r0 + 256u);
    for (uint r = r0; r < r1; ++r) {
      float gi = g[pc.o0 + r * pc.C + c] * clip;
      blk += gi * gi + pc.eps1;
    }
    acc += blk;
  }
  part[pc.o1 + c] = acc;
}
#elif defined(AF_COL)
layout(std430, binding = 1) readonly buffer Part { float part[]; };
layout(std430, binding = 2) buffer Col { float col[]; };
void main() {
  uint c = ct_linear_index();
  if (c >= pc.C) return;
  float acc = 0.0;
  for (uint k = 0u; k < pc.nparts; ++k) acc += part[pc.o0 + k * pc.C + c];
  col[pc.o1 + c] = pc.b2t * col[pc.o1 + c] + (1.0 - pc.b2t) * (acc / float(pc.R));
}
#elif defined(AF_U)
// factored: 1 row [R], 2 col [C], 3 row_sum [1]; else 1 v [n] (2, 3 unused)
layout(std430, binding = 1) readonly buffer G { float g[]; };
layout(std430, binding = 2) buffer RowV { float rowv[]; };
layout(std430, binding = 3) readonly buffer Col { float col[]; };
layout(std430, binding = 4) readonly buffer RowSum { float rowsum[]; };
layout(std430, binding = 5) writeonly buffer U { float u[]; };
void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
  float gi = g[pc.o0 + i] * clip_factor();
  float ui;
  if ((pc.flags & 1u) != 0u) {
    uint e = pc.s0 + i, r = e / pc.C, c = e - r * pc.C;
    float mean = rowsum[pc.o3] / float(pc.R);
    ui = gi / sqrt(rowv[pc.o1 + r] / mean) / sqrt(col[pc.o2 + c]);
  } else {
    float vi = pc.b2t * rowv[pc.o1 + i] + (1.0 - pc.b2t) * (gi * gi + pc.eps1);
    rowv[pc.o1 + i] = vi;
    ui = gi / sqrt(vi);
  }
  u[pc.o4 + i] = ui;
}
#elif defined(AF_APPLY)
// 1 param, 2 u, 3 exp_avg (unused without beta1), 4 |U| [1], 5 |param| [1] before the step
// (read with scale_parameter only)
layout(std430, binding = 1) buffer P { float p[]; };
layout(std430, binding = 2) readonly buffer U { float u[]; };
layout(std430, binding = 3) buffer EA { float ea[]; };
layout(std430, binding = 4) readonly buffer UNorm { float unorm[]; };
layout(std430, binding = 5) readonly buffer PNorm { float pnorm[]; };
void main() {
  uint i = ct_linear_index();
  if (i >= pc.n) return;
  float lr_t = pc.rho;
  if ((pc.flags & 4u) != 0u) lr_t *= max(pc.eps2, pnorm[pc.o4] * pc.inv_sqrt_n);
  float rms = unorm[pc.o3] * pc.inv_sqrt_n;
  float k = lr_t / max(1.0, rms / pc.clip_threshold);
  float upd = u[pc.o1 + i] * k;
  if ((pc.flags & 2u) != 0u) {
    upd = pc.beta1 * ea[pc.o2 + i] + (1.0 - pc.beta1) * upd;
    ea[pc.o2 + i] = upd;
  }
  float pi = p[pc.o0 + i];
  pi -= pc.wd * lr_t * pi;
  p[pc.o0 + i] = pi - upd;
}
#endif
