#version 450
// c[z] = alpha * op(a)[z] @ op(b)[z] + beta * c[z] (+ bias), fp32 accumulation.
// op(a) [M, K] at a[oa + z*sab + m*sam + k*sak]; op(b) [K, N] at b[ob + z*sbb + k*sbk + n*sbn];
// c [M, N] at c[oc + z*scb + m*scm + n]; bias [N] at bias[obias + n]. Strides encode the
// transposes and batch broadcasting (sab/sbb = 0). Workgroup (x, y, z) = (N tile, M tile, batch).
//   MM_REG    CPU-like devices (lavapipe): 8x8 invocations, each a 4x4 register block whose
//             columns are 8 apart, so neighbouring lanes load neighbouring b elements; no
//             shared memory, bounds handled by clamping loads and masking stores.
//   MM_TILED  GPUs: 16x16 invocations, 64x64 tile, 16-deep k slices staged in shared memory,
//             4x4 register block per invocation.

#if defined(MM_REG)
#define RB 8  // register block RB x RB per invocation
#define TM (8 * RB)
#define TN (8 * RB)
layout(local_size_x = 8, local_size_y = 8) in;
#else
#define TM 64
#define TN 64
#define BK 16
layout(local_size_x = 16, local_size_y = 16) in;
#endif

layout(push_constant) uniform Push {
  uint M;
  uint N;
  uint K;
  uint oa;
  uint sam;
  uint sak;
  uint sab;
  uint ob;
  uint sbk;
  uint sbn;
  uint sbb;
  uint oc;
  uint scm;
  uint scb;
  uint obias;
  uint has_bias;
  float alpha;
  float beta;
} pc;
#if !defined(MM_REG)
// As[k][m], Bs[k][n]; +1 column of padding against bank conflicts.
shared float As[BK][TM + 1];
shared float Bs[BK][TN + 1];
#endif

layout(std430, binding = 0) buffer Cm { float c[]; };
layout(std430, binding = 1) readonly buffer Am { float a[]; };
layout(std430, binding = 2) readonly buffer Bm { float b[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };

void store(uint m, uint n, uint cbase, float acc) {
  if (m >= pc.M || n >= pc.N) return;
  uint ci = cbase + m * pc.scm + n;
  float v = pc.alpha * acc;
  if (pc.beta != 0.0) v += pc.beta * c[ci];  // beta == 0: c may hold NaN garbage
  if (pc.has_bias != 0u) v += bias[pc.obias + n];
  c[ci] = v;
}

void main() {
  uint z = gl_WorkGroupID.z;
  uint abase = pc.oa + z * pc.sab;
  uint bbase = pc.ob + z * pc.sbb;
  uint cbase = pc.oc + z * pc.scb;
  uint m0 = gl_WorkGroupID.y * TM, n0 = gl_WorkGroupID.x * TN;
  uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;

#if defined(MM_REG)
  float acc[RB][RB];
  for (int i = 0; i < RB; ++i)
    for (int j = 0; j < RB; ++j) acc[i][j] = 0.0;
  uint arow[RB], bcol[RB];
  for (int i = 0; i < RB; ++i) {
    arow[i] = abase + min(m0 + ty + 8u * uint(i), pc.M - 1u) * pc.sam;
    bcol[i] = bbase + min(n0 + tx + 8u * uint(i), pc.N - 1u) * pc.sbn;
  }
  for (uint k = 0; k < pc.K; ++k) {
    float av[RB], bv[RB];
    for (int i = 0; i < RB; ++i) {
      av[i] = a[arow[i] + k * pc.sak];
      bv[i] = b[bcol[i] + k * pc.sbk];
    }
    for (int i = 0; i < RB; ++i)
      for (int j = 0; j < RB; ++j) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
  }
  for (int i = 0; i < RB; ++i)
    for (int j = 0; j < RB; ++j)
      store(m0 + ty + 8u * uint(i), n0 + tx + 8u * uint(j), cbase, acc[i][j]);
#else
  float acc[4][4];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;
  uint tid = ty * 16u + tx;
  for (uint k0 = 0; k0 < pc.K; k0 += BK) {
    for (uint r = 0; r < 4u; ++r) {
      uint e = tid + 256u * r;  // 0..1023 over a 16 x 64 slice
      uint kk = e / TM, mm = e % TM;
      uint gm = m0 + mm, gk = k0 + kk;
      As[kk][mm] = (gm < pc.M && gk < pc.K) ? a[abase + gm * pc.sam + gk * pc.sak] : 0.0;
      uint nn = e % TN;
      uint gn = n0 + nn;
      Bs[kk][nn] = (gn < pc.N && gk < pc.K) ? b[bbase + gk * pc.sbk + gn * pc.sbn] : 0.0;
    }
    barrier();
    for (uint kk = 0; kk < BK; ++kk) {
      float av[4], bv[4];
      for (int i = 0; i < 4; ++i) {
        av[i] = As[kk][ty + 16u * uint(i)];
        bv[i] = Bs[kk][tx + 16u * uint(i)];
      }
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
    }
    barrier();
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j)
      store(m0 + ty + 16u * uint(i), n0 + tx + 16u * uint(j), cbase, acc[i][j]);
#endif
}
