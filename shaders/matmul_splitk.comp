#version 450
// The second pass of a split-k GEMM (matmul_coopmat.comp, matmul.comp MM_TILED with
// pc.ksplit = S > 1): c[z][m][n] = alpha * sum_s part[z * S + s][m][n] + beta * c[z][m][n]
// (+ bias[n], rounded to c's dtype first where c is 16-bit), the S partial sums added in order
// s = 0, 1, .. so that the result does not depend on the device (deterministic; no atomics). part [batch * S][M][N] f32 at part[opart];
// c [batch][M][N] at c[oc + z*scb + m*scm + n] (f32, or 16 bits with H_F16 / H_BF16).
// One invocation per element of c, over the (x, y) grid of VulkanDevice::grid().
// pc.epi: matmul.comp's GELU epilogues on the finished sum, with ep (binding 3, at pc.oe, c's
// strides): 1 c = pre, ep = gelu(pre); 2 c = gelu'(ep) * the sum.
#extension GL_GOOGLE_include_directive : require
#include "common/h16.glsl"
#include "common/index.glsl"

layout(local_size_x = 256) in;
layout(push_constant) uniform Push {
  uint M, N, batch, S;
  uint opart, oc, scm, scb;
  uint obias, has_bias;
  float alpha, beta;
  uint oe;   // epi != 0: ep's element matching c's oc
  uint epi;  // 0 none, 1 GELU forward, 2 backward
} pc;
layout(std430, binding = 0) buffer Cm { H_T c[]; };
layout(std430, binding = 1) readonly buffer Part { float part[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) buffer Ep { H_T ep[]; };
#include "common/math.glsl"
#include "common/gelu.glsl"

void main() {
  const uint i = ct_linear_index(), mn = pc.M * pc.N;
  if (i >= pc.batch * mn) return;
  const uint z = i / mn, r = i % mn, m = r / pc.N, n = r % pc.N;
  float s = 0.0;
  for (uint k = 0; k < pc.S; ++k) s += part[pc.opart + (z * pc.S + k) * mn + r];
  const uint ci = pc.oc + z * pc.scb + m * pc.scm + n;
  float v = pc.alpha * s;
  if (pc.beta != 0.0) v += pc.beta * h_load(c[ci]);  // beta == 0: c may hold NaN garbage
  if (pc.has_bias != 0u) v += h_round(bias[pc.obias + n]);  // as c's dtype holds it
  if (pc.epi != 0u) {  // matmul.comp's epi_value() on v as c holds it
    const uint ie = ci - pc.oc + pc.oe;
    const bool backward = pc.epi == 2u;
    const float x = backward ? h_load(ep[ie]) : h_round(v);  // the GELU's argument
    const float g = ct_gelu_dir(x, backward ? h_round(v) : 0.0, backward);
    if (!backward) ep[ie] = h_store(g);
    if (backward) v = g;
  }
  c[ci] = h_store(v);
}
