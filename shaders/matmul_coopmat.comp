#version 450
// Cooperative-matrix GEMM for 16-bit a and b with fp32 accumulation:
//   c[z] = alpha * op(a)[z] @ op(b)[z] + beta * c[z] (+ bias)
// with matmul.comp's push constants, bindings and stride encoding of transposes and batches
// (backends/vulkan/ops/matmul.cpp), c f32 (hhf) or the inputs' dtype (hhh, C_H).
//
// One source, two builds:
//   (default)  VK_KHR_cooperative_matrix: fragments are coopmat<> values of one subgroup
//              (needs a glslang that knows GL_KHR_cooperative_matrix), f16 x f16 -> f32 for f16
//              and bf16 tensors alike (bf16 fragments would need VK_KHR_shader_bfloat16; bf16
//              tiles are staged as scaled f16 instead: below).
//   CM_EMU     the coopmat operations replaced by shared-memory code, for devices without the
//              extension (lavapipe): a "subgroup" is 32 consecutive invocations, a fragment of A
//              or B is its offset in the shared tile, an accumulator fragment is spread over the
//              32 lanes (element e of lane l is element e*32 + l of the fragment, row-major), and
//              the multiply-add sums its FK products in k order. Tiling, the staging of tiles,
//              the fragment offsets and strides, the zero-filled edges and the epilogue are the
//              same code in both builds, so running the emulated build tests them.
//
// Tiling: a workgroup computes a TBM x TBN tile of c with WARPS_M x WARPS_N subgroups, each a
// WM x WN block of FRM x FRN fragments of FM x FN; k advances TBK at a time through shared
// memory (As [TBM][TBK] and Bs [TBK][TBN], row-major, zero outside the matrices), FK per
// multiply-add. All of these are specialization constants (below).
// Split-k (pc.ksplit = S > 1, for long K and few tiles): workgroup z = batch * S + s sums only
// k in [s * kchunk, (s + 1) * kchunk) and stores its raw sums (alpha 1, beta 0, no bias, c the
// f32 partials [batch * S][M][N]); matmul_splitk.comp adds the S partials in order and applies
// the epilogue. S = 1: kchunk = K, the plain GEMM.
// bf16 a and b (H_BF16; bf16 has f32's 8 exponent bits, f16 5): each staged tile, TBM x TBK of
// op(a) and TBK x TBN of op(b), is multiplied by its own power of two 2^s, s = clamp(14 - e,
// -126, 126) where 2^e <= the tile's largest |x| < 2^(e+1) (the workgroup's integer max of the
// f32 bits of |x| in shared memory: no float atomics), and rounded to f16 by ct_f32_to_f16 (round
// to nearest even, the same bits on every device and in both builds). The tile's largest |x|
// lands in [2^14, 2^15); every element with |x| >= 2^-28 of it is >= 2^-14 after scaling, a
// normal f16, and exact there (bf16's 8 significant bits fit f16's 11). Smaller elements are
// rounded (or flushed, by a device that flushes f16 subnormals) with an absolute error below
// 2^-28 of the tile's largest |x|. Each k-step's products go into a zeroed f32 temporary
// accumulator, which is added to the running one multiplied by 2^-(sa+sb) (two scalar x
// fragment multiplies by powers of two, 2^clamp(d, -126, 127) then the rest: exact unless the
// product itself leaves f32's normal range). So for c[i][j] = sum_k a[i][k] b[k][j]:
//   |error| <= (fp32 summation, as the f16 path) + 2^-28 (max_a sum_k |b[k][j]| +
//              max_b sum_k |a[i][k]|) (+ the product of both, smaller)
// with max_a, max_b the largest |x| of the tiles that element's k-steps staged: zero for
// operands whose tiles span less than 2^28 in magnitude, which is every tile of a trained
// network's activations, weights and gradients short of an inf/NaN (an inf or NaN in a tile
// stays one; the tile's other elements are then scaled to nothing: that step is skipped by the
// loss scaler anyway). So bf16 GEMMs keep the precision table's promise (16-bit storage, fp32
// accumulation; the products of bf16 values exact) and bf16's range. f16 tensors are staged as
// they are (exact, unscaled): the f16 build is unchanged by this.
// Epilogue: each accumulator fragment is stored to its subgroup's FM x FN scratch in shared
// memory, then every lane applies alpha, beta, bias (rounded to a 16-bit c's dtype first, as in
// matmul.comp) and the bounds to its elements; then pc.epi's GELU (matmul.comp's push constant
// and binding 4, the same epi_value()) over the elements it stored, read back.

#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#include "common/h16.glsl"
#if !defined(CM_EMU)
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif

// The shape, as specialization constants (the host picks them per device and problem;
// backends/vulkan/ops/matmul.cpp): fragments FM x FN x FK (the driver's coopmat shape:
// 16x16x16 on NVIDIA and AMD RDNA3, 8x16x16 or 8x8x16 on Intel; the emulated build takes any
// with FM * FN a multiple of 32); WARPS_M x WARPS_N subgroups per workgroup, each FRM x FRN
// fragments; TBK of k staged per step (a multiple of FK).
layout(constant_id = 1) const uint FM = 16;
layout(constant_id = 2) const uint FN = 16;
layout(constant_id = 3) const uint FK = 16;
layout(constant_id = 4) const uint WARPS_M = 2;
layout(constant_id = 5) const uint WARPS_N = 2;
layout(constant_id = 6) const uint FRM = 2;  // fragments per subgroup block, down and across
layout(constant_id = 7) const uint FRN = 2;
layout(constant_id = 8) const uint TBK = 32;
const uint NWARPS = WARPS_M * WARPS_N;
const uint WM = FRM * FM;  // rows of a subgroup's block
const uint WN = FRN * FN;
const uint TBM = WARPS_M * WM;  // the workgroup's tile of c
const uint TBN = WARPS_N * WN;
// Row strides of the shared tiles, padded (multiples of 8 elements: 16-byte aligned rows for
// coopMatLoad).
const uint LDA = TBK + 8;
const uint LDB = TBN + 8;

// local_size_x = NWARPS * subgroup size (32 in the emulated build), set by the host
// (specialization constant 0); the real build's pipeline requires full subgroups, so subgroup s
// is invocations [s*SG, (s+1)*SG).
layout(local_size_x_id = 0) in;
#if defined(CM_EMU)
#define LANES 32u
#define SH_T float
#define TO_SH(x) (x)
#else
#define SH_T float16_t
#define TO_SH(x) float16_t(x)
#endif
// The value staged for x: bf16 scaled by the tile's power of two s and rounded to f16 (held in an
// f32 exactly, so both builds' TO_SH keep it); f16 as it is.
#if defined(H_BF16)
#define SCALED_F16(x, s) ct_f16_to_f32(ct_f32_to_f16((x) * (s)))
#else
#define SCALED_F16(x, s) (x)
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
  uint ksplit, kchunk;  // split-k: workgroup z = batch * ksplit + s sums k in [s, s+1) * kchunk
  uint oe;              // epi != 0: the epilogue tensor's element matching c's pc.oc
  uint epi;             // the GELU epilogue: 0 none, 1 forward, 2 backward (matmul.comp)
}
pc;

// C_RND(f): f as c's dtype holds it (the bias of a 16-bit c is added rounded to it).
#if defined(C_H)
#define C_T H_T
#define C_LD(x) h_load(x)
#define C_ST(f) h_store(f)
#define C_RND(f) h_round(f)
#else
#define C_T float
#define C_LD(x) (x)
#define C_ST(f) (f)
#define C_RND(f) (f)
#endif

layout(std430, binding = 0) buffer Cm { C_T c[]; };
layout(std430, binding = 1) readonly buffer Am { H_T a[]; };
layout(std430, binding = 2) readonly buffer Bm { H_T b[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
layout(std430, binding = 4) buffer Ep { C_T ep[]; };
#include "common/math.glsl"
#include "common/gelu.glsl"

// matmul.comp's epi_value(): the GELU epilogue on element ci of c, which holds s (widened).
float epi_value(uint ci, float s) {
  const uint ie = ci - pc.oc + pc.oe;
  const bool backward = pc.epi == 2u;
  // forward gelu(s); backward gelu'(pre) * s, pre = ep's element (one call: one copy of its code)
  const float x = backward ? C_LD(ep[ie]) : s;
  const float g = ct_gelu_dir(x, backward ? s : 0.0, backward);
  if (!backward) ep[ie] = C_ST(g);
  return backward ? g : s;
}

shared SH_T As[TBM * LDA];
shared SH_T Bs[TBK * LDB];
shared float Cw[NWARPS * FM * FN];  // per-subgroup epilogue scratch
#if defined(H_BF16)
shared uint Mx[2];  // the staged tiles' largest |x| of a and b, as f32 bits
// 2^s putting a largest |x| with these f32 bits in [2^14, 2^15), as s (inf/NaN: s = -114).
int tile_shift(uint maxbits) { return clamp(14 - (int(maxbits >> 23) - 127), -126, 126); }
#endif

// ---- fragment operations: coopmat, or their shared-memory emulation -------------------------
// The accumulators are one array, fragment f = i * FRN + j (arrays sized by specialization
// constants cannot be function parameters, so the emulation works on the array in place).
#if defined(CM_EMU)
const uint EPL = FM * FN / 32;  // accumulator elements per lane
// A fragment of A or B is its offset in As / Bs.
#define FRAG_A uint
#define FRAG_B uint
#define LOAD_A(f, off) f = (off)
#define LOAD_B(f, off) f = (off)
#else
#define ACC_T coopmat<float, gl_ScopeSubgroup, FM, FN, gl_MatrixUseAccumulator>
#define FRAG_A coopmat<float16_t, gl_ScopeSubgroup, FM, FK, gl_MatrixUseA>
#define FRAG_B coopmat<float16_t, gl_ScopeSubgroup, FK, FN, gl_MatrixUseB>
#define LOAD_A(f, off) coopMatLoad(f, As, off, LDA, gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_B(f, off) coopMatLoad(f, Bs, off, LDB, gl_CooperativeMatrixLayoutRowMajor)
#endif

void main() {
  const uint S = pc.ksplit, z = gl_WorkGroupID.z, zb = z / S, ks = z % S;
  const uint abase = pc.oa + zb * pc.sab, bbase = pc.ob + zb * pc.sbb;
  const uint cbase = pc.oc + z * pc.scb;  // split-k: c is the f32 partials [batch * S][M][N]
  const uint kbeg = ks * pc.kchunk, kend = min(pc.K, kbeg + pc.kchunk);
  const uint m0 = gl_WorkGroupID.y * TBM, n0 = gl_WorkGroupID.x * TBN;
  const uint tid = gl_LocalInvocationIndex, nt = gl_WorkGroupSize.x;
#if defined(CM_EMU)
  const uint warp = tid / LANES, lane = tid % LANES, lanes = LANES;
#else
  const uint warp = gl_SubgroupID, lane = gl_SubgroupInvocationID, lanes = gl_SubgroupSize;
#endif
  const uint wm = (warp / WARPS_N) * WM, wn = (warp % WARPS_N) * WN;

#if defined(CM_EMU)
  // element e of fragment f, lane l: acc[f * EPL + e] holds element e * 32 + l (row-major)
  float acc[FRM * FRN * EPL];
  [[unroll]] for (uint e = 0; e < FRM * FRN * EPL; ++e) acc[e] = 0.0;
#else
  ACC_T acc[FRM * FRN];
  [[unroll]] for (uint f = 0; f < FRM * FRN; ++f) acc[f] = ACC_T(0.0);
#endif
#if defined(H_BF16)
  // a k-step's products (the tiles' scaled units), added into acc multiplied back
#if defined(CM_EMU)
  float kacc[FRM * FRN * EPL];
#else
  ACC_T kacc[FRM * FRN];
#endif
#define KACC kacc
  if (tid == 0u) Mx[0] = Mx[1] = 0u;
  barrier();
#else
#define KACC acc
#endif

  for (uint k0 = kbeg; k0 < kend; k0 += TBK) {
#if defined(H_BF16)
    // The tiles' largest |x| (f32 bits of non-negative values order as integers).
    uint ma = 0u, mb = 0u;
    for (uint i = tid; i < TBM * TBK; i += nt) {
      uint m = m0 + i / TBK, kk = k0 + i % TBK;
      if (m < pc.M && kk < kend)
        ma = max(ma, floatBitsToUint(abs(h_load(a[abase + m * pc.sam + kk * pc.sak]))));
    }
    for (uint i = tid; i < TBK * TBN; i += nt) {
      uint n = n0 + i % TBN, kk = k0 + i / TBN;
      if (n < pc.N && kk < kend)
        mb = max(mb, floatBitsToUint(abs(h_load(b[bbase + kk * pc.sbk + n * pc.sbn]))));
    }
    atomicMax(Mx[0], ma);
    atomicMax(Mx[1], mb);
    barrier();
    const int sha = tile_shift(Mx[0]), shb = tile_shift(Mx[1]);
    const float sa = ldexp(1.0, sha), sb = ldexp(1.0, shb);
    // kacc * 2^d, d = -(sha + shb) in [-252, 252]: 2^d1 (a normal f32) then 2^(d - d1)
    const int d = -(sha + shb), d1 = clamp(d, -126, 127);
    const float back1 = ldexp(1.0, d1), back2 = ldexp(1.0, d - d1);
#if defined(CM_EMU)
    [[unroll]] for (uint e = 0; e < FRM * FRN * EPL; ++e) kacc[e] = 0.0;
#else
    [[unroll]] for (uint f = 0; f < FRM * FRN; ++f) kacc[f] = ACC_T(0.0);
#endif
#else
    const float sa = 1.0, sb = 1.0;
#endif
    // Stage op(a)[m0 .. m0+TBM, k0 .. k0+TBK] and op(b)[k0 .., n0 ..]; zeros past the edges.
    for (uint i = tid; i < TBM * TBK; i += nt) {
      uint r = i / TBK, k = i % TBK, m = m0 + r, kk = k0 + k;
      float v = 0.0;
      if (m < pc.M && kk < kend) v = h_load(a[abase + m * pc.sam + kk * pc.sak]);
      As[r * LDA + k] = TO_SH(SCALED_F16(v, sa));
    }
    for (uint i = tid; i < TBK * TBN; i += nt) {
      uint k = i / TBN, col = i % TBN, n = n0 + col, kk = k0 + k;
      float v = 0.0;
      if (n < pc.N && kk < kend) v = h_load(b[bbase + kk * pc.sbk + n * pc.sbn]);
      Bs[k * LDB + col] = TO_SH(SCALED_F16(v, sb));
    }
    barrier();
#if defined(H_BF16)
    // every invocation read Mx before the barrier; the next k-step's maxima come after the
    // barrier that ends this one
    if (tid == 0u) Mx[0] = Mx[1] = 0u;
#endif
    [[unroll]] for (uint kf = 0; kf < TBK; kf += FK) {
      FRAG_A fa[FRM];
      FRAG_B fb[FRN];
      [[unroll]] for (uint i = 0; i < FRM; ++i) LOAD_A(fa[i], (wm + i * FM) * LDA + kf);
      [[unroll]] for (uint j = 0; j < FRN; ++j) LOAD_B(fb[j], kf * LDB + wn + j * FN);
      [[unroll]] for (uint i = 0; i < FRM; ++i)
        [[unroll]] for (uint j = 0; j < FRN; ++j) {
#if defined(CM_EMU)
          // acc += A[FM x FK at fa, stride LDA] @ B[FK x FN at fb, stride LDB], the FK
          // products summed in k order. The k loop is not unrolled: the emulation only has to
          // be right, and lavapipe's LLVM compiles fully unrolled 16x16x16 builds for minutes.
          const uint f = i * FRN + j;
          [[unroll]] for (uint e = 0; e < EPL; ++e) {
            uint idx = e * LANES + lane, r = idx / FN, col = idx % FN;
            float s = KACC[f * EPL + e];
            [[dont_unroll]] for (uint k = 0; k < FK; ++k)
              s += float(As[fa[i] + r * LDA + k]) * float(Bs[fb[j] + k * LDB + col]);
            KACC[f * EPL + e] = s;
          }
#else
          KACC[i * FRN + j] = coopMatMulAdd(fa[i], fb[j], KACC[i * FRN + j]);
#endif
        }
    }
#if defined(H_BF16)
#if defined(CM_EMU)
    [[unroll]] for (uint e = 0; e < FRM * FRN * EPL; ++e) acc[e] += kacc[e] * back1 * back2;
#else
    [[unroll]] for (uint f = 0; f < FRM * FRN; ++f) acc[f] += kacc[f] * back1 * back2;
#endif
#endif
    barrier();
  }

  // Epilogue, one fragment at a time through the subgroup's scratch.
  const uint woff = warp * (FM * FN);
  [[unroll]] for (uint i = 0; i < FRM; ++i)
    [[unroll]] for (uint j = 0; j < FRN; ++j) {
#if defined(CM_EMU)
      [[unroll]] for (uint e = 0; e < EPL; ++e)
        Cw[woff + e * LANES + lane] = acc[(i * FRN + j) * EPL + e];
#else
      coopMatStore(acc[i * FRN + j], Cw, woff, FN, gl_CooperativeMatrixLayoutRowMajor);
#endif
      barrier();
      for (uint e = lane; e < FM * FN; e += lanes) {
        uint m = m0 + wm + i * FM + e / FN, n = n0 + wn + j * FN + e % FN;
        if (m < pc.M && n < pc.N) {
          uint ci = cbase + m * pc.scm + n;
          float v = pc.alpha * Cw[woff + e];
          if (pc.beta != 0.0) v += pc.beta * C_LD(c[ci]);  // beta == 0: c may hold NaN garbage
          if (pc.has_bias != 0u) v += C_RND(bias[pc.obias + n]);
          c[ci] = C_ST(v);
        }
      }
      barrier();
    }
  // The GELU over the elements this invocation stored, read back (its own writes): one copy of
  // its code, not one per fragment.
  if (pc.epi != 0u) {
    [[dont_unroll]] for (uint f = 0; f < FRM * FRN; ++f) {
      const uint i = f / FRN, j = f % FRN;
      for (uint e = lane; e < FM * FN; e += lanes) {
        uint m = m0 + wm + i * FM + e / FN, n = n0 + wn + j * FN + e % FN;
        if (m < pc.M && n < pc.N) {
          uint ci = cbase + m * pc.scm + n;
          const float r = epi_value(ci, C_LD(c[ci]));
          if (pc.epi == 2u) c[ci] = C_ST(r);
        }
      }
    }
  }
}
