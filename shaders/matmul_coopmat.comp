#version 450
// Cooperative-matrix GEMM for 16-bit a and b with fp32 accumulation:
//   c[z] = alpha * op(a)[z] @ op(b)[z] + beta * c[z] (+ bias)
// with matmul.comp's push constants, bindings and stride encoding of transposes and batches
// (backends/vulkan/ops/matmul.cpp), c f32 (hhf) or the inputs' dtype (hhh, C_H).
//
// One source, two builds:
//   (default)  VK_KHR_cooperative_matrix: fragments are coopmat<> values of one subgroup
//              (needs a glslang that knows GL_KHR_cooperative_matrix; H_F16 only: bf16 fragments
//              need VK_KHR_shader_bfloat16).
//   CM_EMU     the coopmat operations replaced by shared-memory code, for devices without the
//              extension (lavapipe): a "subgroup" is 32 consecutive invocations, a fragment of A
//              or B is its offset in the shared tile, an accumulator fragment is spread over the
//              32 lanes (element e of lane l is element e*32 + l of the fragment, row-major), and
//              the multiply-add sums its FK products in k order. Tiling, the staging of tiles,
//              the fragment offsets and strides, the zero-filled edges and the epilogue are the
//              same code in both builds, so running the emulated build tests them.
//
// Tiling: a workgroup computes a TBM x TBN tile of c with WARPS_M x WARPS_N subgroups, each a
// (TBM / WARPS_M) x (TBN / WARPS_N) block of FM x FN fragments; k advances TBK at a time through
// shared memory (As [TBM][TBK] and Bs [TBK][TBN], row-major, zero outside the matrices), FK per
// multiply-add. Fragment shape FM x FN x FK: 16x16x16 by default, 8x8x8 with CM_FRAG=8 (the
// emulated builds test both).
// Epilogue: each accumulator fragment is stored to its subgroup's FM x FN scratch in shared
// memory, then every lane applies alpha, beta, bias and the bounds to its elements.

#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#include "common/h16.glsl"
#if !defined(CM_EMU)
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif

#if !defined(CM_FRAG)
#define CM_FRAG 16
#endif
#define FM CM_FRAG
#define FN CM_FRAG
#define FK CM_FRAG
#define TBM 64
#define TBN 64
#define TBK 32
#define WARPS_M 2
#define WARPS_N 2
#define NWARPS (WARPS_M * WARPS_N)
#define WM (TBM / WARPS_M)  // rows of a subgroup's block
#define WN (TBN / WARPS_N)
#define FRM (WM / FM)  // fragments per subgroup block, down and across
#define FRN (WN / FN)
// Row strides of the shared tiles, padded (multiples of 8 elements: 16-byte aligned rows for
// coopMatLoad).
#define LDA (TBK + 8)
#define LDB (TBN + 8)

#if defined(CM_EMU)
#define LANES 32u
#define NT (NWARPS * 32)
layout(local_size_x = NT) in;
#define SH_T float
#define TO_SH(x) (x)
#else
// local_size_x = NWARPS * subgroup size, set by the host (specialization constant 0); the
// pipeline requires full subgroups, so subgroup s is invocations [s*SG, (s+1)*SG).
layout(local_size_x_id = 0) in;
#define SH_T float16_t
#define TO_SH(x) float16_t(x)
#endif

layout(push_constant) uniform Push {
  uint M, N, K;
  uint oa, sam, sak, sab;
  uint ob, sbk, sbn, sbb;
  uint oc, scm, scb;
  uint obias, has_bias;
  float alpha, beta;
  uint a_lo, a_hi, b_lo, b_hi;  // unused here (matmul.comp's MM_VEC addresses)
  uint c_lo, c_hi, c_vec;
}
pc;

#if defined(C_H)
#define C_T H_T
#define C_LD(x) h_load(x)
#define C_ST(f) h_store(f)
#else
#define C_T float
#define C_LD(x) (x)
#define C_ST(f) (f)
#endif

layout(std430, binding = 0) buffer Cm { C_T c[]; };
layout(std430, binding = 1) readonly buffer Am { H_T a[]; };
layout(std430, binding = 2) readonly buffer Bm { H_T b[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };

shared SH_T As[TBM * LDA];
shared SH_T Bs[TBK * LDB];
shared float Cw[NWARPS * FM * FN];  // per-subgroup epilogue scratch

// ---- fragment operations: coopmat, or their shared-memory emulation -------------------------
#if defined(CM_EMU)
#define KF_LOOP [[dont_unroll]]  // (see acc_muladd)
#define EPL (FM * FN / 32)  // accumulator elements per lane
#define ACC_T float[EPL]
#define FRAG_A uint  // a fragment of A or B: its offset in As / Bs
#define FRAG_B uint
#define LOAD_A(f, off) f = (off)
#define LOAD_B(f, off) f = (off)
void acc_zero(inout float acc[EPL]) {
  [[unroll]] for (int e = 0; e < EPL; ++e) acc[e] = 0.0;
}
// acc += A[FM x FK at fa, stride LDA] @ B[FK x FN at fb, stride LDB]
void acc_muladd(inout float acc[EPL], uint fa, uint fb, uint lane) {
  [[unroll]] for (int e = 0; e < EPL; ++e) {
    uint idx = uint(e) * LANES + lane, r = idx / FN, col = idx % FN;
    float s = acc[e];
    // Not unrolled: the emulation only has to be right, and lavapipe's LLVM compiles the fully
    // unrolled 16x16x16 bf16 build for minutes.
    [[dont_unroll]] for (int k = 0; k < FK; ++k) s += As[fa + r * LDA + k] * Bs[fb + uint(k) * LDB + col];
    acc[e] = s;
  }
}
void acc_store(float acc[EPL], uint off, uint lane) {  // row-major, stride FN
  [[unroll]] for (int e = 0; e < EPL; ++e) Cw[off + uint(e) * LANES + lane] = acc[e];
}
#else
#define KF_LOOP [[unroll]]
#define ACC_T coopmat<float, gl_ScopeSubgroup, FM, FN, gl_MatrixUseAccumulator>
#define FRAG_A coopmat<float16_t, gl_ScopeSubgroup, FM, FK, gl_MatrixUseA>
#define FRAG_B coopmat<float16_t, gl_ScopeSubgroup, FK, FN, gl_MatrixUseB>
#define LOAD_A(f, off) coopMatLoad(f, As, off, LDA, gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_B(f, off) coopMatLoad(f, Bs, off, LDB, gl_CooperativeMatrixLayoutRowMajor)
#endif

void main() {
  const uint z = gl_WorkGroupID.z;
  const uint abase = pc.oa + z * pc.sab, bbase = pc.ob + z * pc.sbb, cbase = pc.oc + z * pc.scb;
  const uint m0 = gl_WorkGroupID.y * TBM, n0 = gl_WorkGroupID.x * TBN;
  const uint tid = gl_LocalInvocationIndex, nt = gl_WorkGroupSize.x;
#if defined(CM_EMU)
  const uint warp = tid / LANES, lane = tid % LANES, lanes = LANES;
#else
  const uint warp = gl_SubgroupID, lane = gl_SubgroupInvocationID, lanes = gl_SubgroupSize;
#endif
  const uint wm = (warp / WARPS_N) * WM, wn = (warp % WARPS_N) * WN;

#if defined(CM_EMU)
  float acc[FRM][FRN][EPL];
  [[unroll]] for (int i = 0; i < FRM; ++i)
    [[unroll]] for (int j = 0; j < FRN; ++j) acc_zero(acc[i][j]);
#else
  ACC_T acc[FRM][FRN];
  [[unroll]] for (int i = 0; i < FRM; ++i)
    [[unroll]] for (int j = 0; j < FRN; ++j) acc[i][j] = ACC_T(0.0);
#endif

  for (uint k0 = 0; k0 < pc.K; k0 += TBK) {
    // Stage op(a)[m0 .. m0+TBM, k0 .. k0+TBK] and op(b)[k0 .., n0 ..]; zeros past the edges.
    for (uint i = tid; i < TBM * TBK; i += nt) {
      uint r = i / TBK, k = i % TBK, m = m0 + r, kk = k0 + k;
      float v = 0.0;
      if (m < pc.M && kk < pc.K) v = h_load(a[abase + m * pc.sam + kk * pc.sak]);
      As[r * LDA + k] = TO_SH(v);
    }
    for (uint i = tid; i < TBK * TBN; i += nt) {
      uint k = i / TBN, col = i % TBN, n = n0 + col, kk = k0 + k;
      float v = 0.0;
      if (n < pc.N && kk < pc.K) v = h_load(b[bbase + kk * pc.sbk + n * pc.sbn]);
      Bs[k * LDB + col] = TO_SH(v);
    }
    barrier();
    KF_LOOP for (uint kf = 0; kf < TBK; kf += FK) {
      FRAG_A fa[FRM];
      FRAG_B fb[FRN];
      [[unroll]] for (int i = 0; i < FRM; ++i) LOAD_A(fa[i], (wm + uint(i) * FM) * LDA + kf);
      [[unroll]] for (int j = 0; j < FRN; ++j) LOAD_B(fb[j], kf * LDB + wn + uint(j) * FN);
      [[unroll]] for (int i = 0; i < FRM; ++i)
        [[unroll]] for (int j = 0; j < FRN; ++j) {
#if defined(CM_EMU)
          acc_muladd(acc[i][j], fa[i], fb[j], lane);
#else
          acc[i][j] = coopMatMulAdd(fa[i], fb[j], acc[i][j]);
#endif
        }
    }
    barrier();
  }

  // Epilogue, one fragment at a time through the subgroup's scratch.
  const uint woff = warp * (FM * FN);
  [[unroll]] for (int i = 0; i < FRM; ++i)
    [[unroll]] for (int j = 0; j < FRN; ++j) {
#if defined(CM_EMU)
      acc_store(acc[i][j], woff, lane);
#else
      coopMatStore(acc[i][j], Cw, woff, FN, gl_CooperativeMatrixLayoutRowMajor);
#endif
      barrier();
      for (uint e = lane; e < FM * FN; e += lanes) {
        uint m = m0 + wm + uint(i) * FM + e / FN, n = n0 + wn + uint(j) * FN + e % FN;
        if (m < pc.M && n < pc.N) {
          uint ci = cbase + m * pc.scm + n;
          float v = pc.alpha * Cw[woff + e];
          if (pc.beta != 0.0) v += pc.beta * C_LD(c[ci]);  // beta == 0: c may hold NaN garbage
          if (pc.has_bias != 0u) v += bias[pc.obias + n];
          c[ci] = C_ST(v);
        }
      }
      barrier();
    }
}
