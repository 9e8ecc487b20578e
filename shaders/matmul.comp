#version 450
// c[z] = alpha * op(a)[z] @ op(b)[z] + beta * c[z] (+ bias), fp32 accumulation.
// op(a) [M, K] at a[oa + z*sab + m*sam + k*sak]; op(b) [K, N] at b[ob + z*sbb + k*sbk + n*sbn];
// c [M, N] at c[oc + z*scb + m*scm + n]; bias [N] at bias[obias + n]. Strides encode the
// transposes and batch broadcasting (sab/sbb = 0). Workgroup (x, y, z) = (N tile, M tile, batch).
//   MM_REG    CPU-like devices (lavapipe): 8x8 invocations, each a 4x4 register block whose
//             columns are 8 apart, so neighbouring lanes load neighbouring b elements; no
//             shared memory, bounds handled by clamping loads and masking stores.
//   MM_TILED  GPUs without (or before) cooperative matrices: a TBM x TBN tile of c per workgroup,
//             TBK-deep k slices of a and b staged in shared memory, a TRM x TRN register block
//             per invocation (runs of 4 contiguous rows and columns, read from shared memory as
//             vec4s), operands read as vec4s where aligned -- all specialization constants, so
//             the host sizes the tile per device class (backends/vulkan/matmul_kind.h
//             tiled_config(): 128x128 with 8x8 blocks on discrete GPUs, 64x64 with 4x4 on
//             integrated ones; TRM, TRN multiples of 4).
// pc.epi (every variant): the GELU epilogues of matmul_bias_gelu and matmul_gelu_backward
// (common/gelu.glsl; EPI_BLOCK below), with ep[] the element of the tensor at binding 4 (at
// pc.oe, c's strides) for each element of c:
//   0 none (ep unused);  1 forward: c = pre as stored, ep = gelu(pre) (out);
//   2 backward: c = gelu'(ep) * the product as stored (ep = pre).
// The GELU needs the finished sum: split-k partials (pc.ksplit > 1) take 0, and
// matmul_splitk.comp applies it after adding them. A push constant, not a specialization
// constant or a define: the fused ops reuse the plain GEMM's pipelines (a specialized pipeline
// per layout, dtype and direction cost lavapipe 1-2.5 s of compilation each, tripling the
// pipelines a process compiles), and the epilogue is one loop after the product, a small part of
// each pipeline's code.
// 16-bit operands (core/device.h: a, b f32 | h, the same; c f32 | a's dtype; the attention's
// GEMMs also need a f32 with b, c h): A_H, B_H, C_H store that operand as 16 bits of the H_F16 or
// H_BF16 format (common/h16.glsl: exact widening on load, the CPU's round-to-nearest-even on
// store); all arithmetic stays fp32. MM_VEC reads 16-bit operands through addresses as uvec2
// (4 values) or uint words (scalar) and unpacks them, so only 32-bit types are loaded there.

#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#if defined(A_H) || defined(B_H) || defined(C_H)
#include "common/h16.glsl"
#endif
#if defined(A_H)
#define A_T H_T
#define A_LD(x) h_load(x)
#else
#define A_T float
#define A_LD(x) (x)
#endif
#if defined(B_H)
#define B_T H_T
#define B_LD(x) h_load(x)
#else
#define B_T float
#define B_LD(x) (x)
#endif
// C_RND(f): f as c's dtype holds it -- the bias of a 16-bit c is added rounded to it
// (core/device.h's matmul contract); an f32 c takes the f32 bias as it is.
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

#if defined(MM_VEC)
// 8x8 invocations, each a VRM x VRN register block of contiguous rows and columns (8x8; MM_SG
// 16x8; without MM_SG 16x8 and 8x16 measured no faster on lavapipe, 16x16 slower); k advances 4
// at a time, and each accumulator takes its 4 k steps in a row (lavapipe reloads, blends and
// stores a loop-carried accumulator around every run of multiply-adds on it). Operands are read
// as vec4 along their unit-stride dimension where aligned:
//   A_K: a rows along k (a not transposed)   A_M: along m (a transposed)   A_S: scalar loads
//   B_N: b rows along n (b not transposed)   B_K: along k (b transposed)   B_S: scalar loads
// On lavapipe each buffer load costs about the same whether it fetches 1 or 4 floats, so vec4
// loads cut the load count per FMA fourfold. A_K and B_K need K % 4 == 0.
#ifndef VRM
#if defined(MM_SG)
#define VRM 8  // rows per invocation: MM_SG 8 (see below: 16 compiles 4x slower on lavapipe)
#else
#define VRM 8  // rows per invocation (multiple of 4)
#endif
#endif
#ifndef VRN
#define VRN 8  // columns per invocation (multiple of 4)
#endif
#define TM (8 * VRM)
#define TN (8 * VRN)
#ifndef MM_KU
#define MM_KU 1  // 4-deep k steps per loop iteration
#endif
#if defined(MM_SG)
// MM_SG (with MM_VEC, VRM a multiple of 8, 8 by default; the host picks it where the subgroup
// size is 8 and subgroups support ballot in compute): the 8 invocations of a subgroup share their
// VRM rows of a, so each loads 1/8 of them -- rows l, l + 8, .. (A_K, A_S) or vec4s of 4 rows at
// one k (A_M) -- and subgroupBroadcast() hands the values round (on lavapipe an extract and a
// splat, against 8x the gathers). The row block is the subgroup's, the column block the lane's,
// so nothing depends on how the device lays subgroups over the workgroup. With 16 rows each b
// value loaded (a per-lane gather on lavapipe) serves 16 multiply-adds, in 8-row halves that
// reuse it: 5-37% faster GEMMs on lavapipe, but lavapipe's LLVM 15 compiles a 16x8 variant in
// 41-50 s against 10 s for 8x8 (and 4 s for 8x4), at its first dispatch in every process whose
// Mesa shader cache lacks it -- in a cold CI run 60+ variants, most of the Vulkan suite's time.
// 8 rows it is. VRM=16 would also need the host's tile height (tm in backends/vulkan/ops/
// matmul.cpp) back at 128 for the MM_SG variants.
// Tried: 32-bit byte offsets from a 64-bit base (base + sext(offset)) so that LLVM might use
// 32-bit-index gathers: LLVM 15 keeps vpgatherqd with 64-bit zmm addresses (already 8 lanes per
// instruction with AVX-512), no faster. 8x4 blocks (32 accumulators, no spills): no faster.
// 64-bit byte addresses carried through the k loop (one add per load instead of a 32-bit multiply
// and a widening): no faster. 32 rows: 20-45% slower. All rows in one pass of the multiply-adds
// (no halves): slower.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_ballot : require
#if VRM % 8 != 0
#error MM_SG needs VRM % 8 == 0
#endif
#define SG_R (VRM / 8)  // rows of a each lane loads per k step
#endif
layout(local_size_x = 8, local_size_y = 8) in;
#elif defined(MM_REG)
#define RB 8  // register block RB x RB per invocation
#define TM (8 * RB)
#define TN (8 * RB)
layout(local_size_x = 8, local_size_y = 8) in;
#else
// MM_TILED's shape (specialization constants; tiled_config() in matmul_kind.h picks them):
layout(constant_id = 1) const uint TBM = 64;  // the workgroup's tile of c
layout(constant_id = 2) const uint TBN = 64;
layout(constant_id = 3) const uint TBK = 16;  // k staged per step
layout(constant_id = 4) const uint TRM = 4;   // register block per invocation: rows TTM apart,
layout(constant_id = 5) const uint TRN = 4;   // columns TTN apart (neighbours read neighbours)
// How a and b are staged: 0 one element per load; VA 1: vec4s along k (a row-major), 2: along
// m (a transposed); VB 1: along n (b row-major), 2: along k (b transposed). The host sets 1 or 2
// only where every vec4 is aligned and the unit-stride extent is a multiple of 4.
layout(constant_id = 6) const uint VA = 0;
layout(constant_id = 7) const uint VB = 0;
const uint TTM = TBM / TRM, TTN = TBN / TRN;  // invocations down and across
layout(local_size_x_id = 0) in;               // TTM * TTN
#define TM TBM
#define TN TBN
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
  uint a_lo;  // MM_VEC: device addresses of a's and b's bound ranges (low, high 32 bits)
  uint a_hi;
  uint b_lo;
  uint b_hi;
  uint c_lo;   // MM_VEC: device address of c's bound range, used where c_vec != 0: c f32 with
  uint c_hi;   // oc, scm, scb multiples of 4 (rows of whole blocks are then vec4-aligned)
  uint c_vec;
  uint ksplit;  // MM_TILED split-k (matmul_splitk.comp): workgroup z = batch * ksplit + s sums
  uint kchunk;  // k in [s, s+1) * kchunk into f32 partials; 1 and K elsewhere
  uint oe;      // epi != 0: ep's element matching c's pc.oc
  uint epi;     // the GELU epilogue: 0 none, 1 forward, 2 backward
} pc;
#if defined(MM_TILED)
// As [TBK][TBM], Bs [TBK][TBN], row strides padded by 4 (rows stay 16-byte aligned).
const uint LDA = TBM + 4, LDB = TBN + 4;
shared vec4 As[TBK * LDA / 4];
shared vec4 Bs[TBK * LDB / 4];
#define AS(k, m) As[((k) * LDA + (m)) / 4u][(m) % 4u]  // op(a)[m0 + m, k0 + k]
#define BS(k, n) Bs[((k) * LDB + (n)) / 4u][(n) % 4u]  // op(b)[k0 + k, n0 + n]
#endif

layout(std430, binding = 0) buffer Cm { C_T c[]; };
layout(std430, binding = 1) readonly buffer Am { A_T a[]; };
layout(std430, binding = 2) readonly buffer Bm { B_T b[]; };
#if defined(MM_TILED)
// The same bindings read 4 elements at a time (vec4 for f32, uvec2 of 4 halves for 16 bits).
#if defined(A_H) || defined(B_H)
vec4 t_h4(uvec2 w) {
  return vec4(h_load(w.x & 0xffffu), h_load(w.x >> 16), h_load(w.y & 0xffffu), h_load(w.y >> 16));
}
#endif
#if defined(A_H)
layout(std430, binding = 1) readonly buffer Am4 { uvec2 a4[]; };
#define A_LD4(i) t_h4(a4[i])
#else
layout(std430, binding = 1) readonly buffer Am4 { vec4 a4[]; };
#define A_LD4(i) a4[i]
#endif
#if defined(B_H)
layout(std430, binding = 2) readonly buffer Bm4 { uvec2 b4[]; };
#define B_LD4(i) t_h4(b4[i])
#else
layout(std430, binding = 2) readonly buffer Bm4 { vec4 b4[]; };
#define B_LD4(i) b4[i]
#endif
#endif
#if defined(MM_VEC)
// a and b are read through buffer device addresses: lavapipe compiles a divergent load from a
// descriptor-bound buffer into a bounds-checked per-lane branch, a load through an address into
// one masked gather. (The bindings stay, so the descriptor set and validation see the reads.)
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference_uvec2 : require
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer V4Ptr { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer F1Ptr { float v[]; };
#if defined(B_U64)
// B_U64 (f32 b along n or k): a vec4 of b read as two 64-bit words. lavapipe gathers every
// component of a per-lane load separately; a 64-bit component brings two floats per gather.
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer U64Ptr { u64vec2 v[]; };
vec4 u64x2_to_vec4(u64vec2 w) {
  return uintBitsToFloat(uvec4(unpackUint2x32(w.x), unpackUint2x32(w.y)));
}
#endif
#if defined(B_U64)
layout(buffer_reference, std430, buffer_reference_align = 16) buffer CPtr { u64vec2 v[]; };
#define C_GET(p, i) u64x2_to_vec4(p.v[i])
#define C_PUT(p, i, x) p.v[i] = u64vec2(packUint2x32(floatBitsToUint(x.xy)), packUint2x32(floatBitsToUint(x.zw)))
#else
layout(buffer_reference, std430, buffer_reference_align = 16) buffer CPtr { vec4 v[]; };
#define C_GET(p, i) p.v[i]
#define C_PUT(p, i, x) p.v[i] = x
#endif
#if defined(C_H)
layout(buffer_reference, std430, buffer_reference_align = 2) buffer C1Ptr { C_T v[]; };  // c
#else
layout(buffer_reference, std430, buffer_reference_align = 4) buffer C1Ptr { C_T v[]; };
#endif
#if defined(A_H) || defined(B_H)
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer U2Ptr { uvec2 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer U1Ptr { uint v[]; };
// 4 16-bit values (little-endian: element 4i in the low half of word 2i)
vec4 h4(uvec2 w) {
  return vec4(h_load(w.x & 0xffffu), h_load(w.x >> 16), h_load(w.y & 0xffffu), h_load(w.y >> 16));
}
// 16-bit element i, read as the aligned word holding it
float h1(U1Ptr p, uint i) { return h_load((p.v[i >> 1] >> ((i & 1u) << 4)) & 0xffffu); }
#endif
#endif
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
layout(std430, binding = 4) buffer Ep { C_T ep[]; };
#include "common/math.glsl"
#include "common/gelu.glsl"

// The GELU epilogue on element ci of c, once c holds its value s (widened from c's dtype: the
// value the unfused GELU shader would read, so the bits are the unfused ops'): forward writes
// ep's element = gelu(s) and returns s; backward returns gelu'(ep's element) * s for c to store.
float epi_value(uint ci, float s) {
  const uint ie = ci - pc.oc + pc.oe;
  const bool backward = pc.epi == 2u;
  // forward gelu(s); backward gelu'(pre) * s, pre = ep's element (one call: one copy of its code)
  const float x = backward ? C_LD(ep[ie]) : s;
  const float g = ct_gelu_dir(x, backward ? s : 0.0, backward);
  if (!backward) ep[ie] = C_ST(g);
  return backward ? g : s;
}
// The epilogue over an invocation's register block, as a loop that reads back what the
// invocation stored (its own writes, through the same binding): one copy of the GELU's code
// rather than one per element of the unrolled block, which lavapipe compiled 3-4x slower.
#define EPI_BLOCK(rows, cols, M_AT, N_AT, C)                  \
  if (pc.epi != 0u) {                                         \
    [[dont_unroll]] for (uint i = 0; i < uint(rows); ++i)     \
      [[dont_unroll]] for (uint j = 0; j < uint(cols); ++j) { \
        const uint m = M_AT(i), n = N_AT(j);                  \
        if (m < pc.M && n < pc.N) {                           \
          const uint ci = cbase + m * pc.scm + n;             \
          const float r = epi_value(ci, C_LD(C[ci]));         \
          if (pc.epi == 2u) C[ci] = C_ST(r);                  \
        }                                                     \
      }                                                       \
  }

// c[m][n] = alpha * acc (+ beta * c[m][n]) (+ bn, bias_at(n), where pc.has_bias)
void store_b(uint m, uint n, uint cbase, float acc, float bn) {
  if (m >= pc.M || n >= pc.N) return;
  uint ci = cbase + m * pc.scm + n;
  float v = pc.alpha * acc;
  if (pc.beta != 0.0) v += pc.beta * C_LD(c[ci]);  // beta == 0: c may hold NaN garbage
  if (pc.has_bias != 0u) v += bn;
  c[ci] = C_ST(v);
}

// The bias at column n as added (C_RND: rounded to a 16-bit c's dtype; 0 past N or without
// bias): loaded once per column of a register block rather than once per element (on lavapipe
// every load from a bound buffer is a bounds-checked branch per lane, and the epilogue's loads
// were most of a GEMM's compile time).
float bias_at(uint n) {
  float b = 0.0;
  if (pc.has_bias != 0u && n < pc.N) b = C_RND(bias[pc.obias + n]);
  return b;
}

void store(uint m, uint n, uint cbase, float acc) {
  if (m >= pc.M || n >= pc.N) return;
  store_b(m, n, cbase, acc, pc.has_bias != 0u ? C_RND(bias[pc.obias + n]) : 0.0);
}

void main() {
  uint z = gl_WorkGroupID.z;
#if defined(MM_TILED)
  // split-k: z = batch * ksplit + s, c the f32 partials [batch * ksplit][M][N]
  const uint zb = z / pc.ksplit, kbeg = (z % pc.ksplit) * pc.kchunk;
  const uint kend = min(pc.K, kbeg + pc.kchunk);
  uint abase = pc.oa + zb * pc.sab;
  uint bbase = pc.ob + zb * pc.sbb;
#else
  uint abase = pc.oa + z * pc.sab;
  uint bbase = pc.ob + z * pc.sbb;
#endif
  uint cbase = pc.oc + z * pc.scb;
  uint m0 = gl_WorkGroupID.y * TM, n0 = gl_WorkGroupID.x * TN;
  uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;

#if defined(MM_VEC)
#if defined(MM_SG)
  tx = gl_SubgroupInvocationID, ty = gl_SubgroupID;
#endif
#if (defined(A_K) || defined(A_M)) && defined(A_H)
  U2Ptr pa = U2Ptr(uvec2(pc.a_lo, pc.a_hi));
#define a4(i) h4(pa.v[i])
#elif (defined(A_K) || defined(A_M)) && defined(B_U64)
  U64Ptr pa = U64Ptr(uvec2(pc.a_lo, pc.a_hi));
#define a4(i) u64x2_to_vec4(pa.v[i])
#elif defined(A_K) || defined(A_M)
  V4Ptr pa = V4Ptr(uvec2(pc.a_lo, pc.a_hi));
#define a4(i) pa.v[i]
#elif defined(A_H)
  U1Ptr pa = U1Ptr(uvec2(pc.a_lo, pc.a_hi));
#define a(i) h1(pa, i)
#else
  F1Ptr pa = F1Ptr(uvec2(pc.a_lo, pc.a_hi));
#define a(i) pa.v[i]
#endif
#if (defined(B_N) || defined(B_K)) && defined(B_U64)
  U64Ptr pb = U64Ptr(uvec2(pc.b_lo, pc.b_hi));
#define b4(i) u64x2_to_vec4(pb.v[i])
#elif (defined(B_N) || defined(B_K)) && defined(B_H)
  U2Ptr pb = U2Ptr(uvec2(pc.b_lo, pc.b_hi));
#define b4(i) h4(pb.v[i])
#elif defined(B_N) || defined(B_K)
  V4Ptr pb = V4Ptr(uvec2(pc.b_lo, pc.b_hi));
#define b4(i) pb.v[i]
#elif defined(B_H)
  U1Ptr pb = U1Ptr(uvec2(pc.b_lo, pc.b_hi));
#define b(i) h1(pb, i)
#else
  F1Ptr pb = F1Ptr(uvec2(pc.b_lo, pc.b_hi));
#define b(i) pb.v[i]
#endif
  uint mb = m0 + ty * uint(VRM), nb = n0 + tx * uint(VRN);
  float acc[VRM][VRN];
  [[unroll]] for (int i = 0; i < VRM; ++i)
    [[unroll]] for (int j = 0; j < VRN; ++j) acc[i][j] = 0.0;
#if defined(A_K)
  uint ar[VRM];  // vec4 index of row i at k = 0
  [[unroll]] for (int i = 0; i < VRM; ++i) ar[i] = (abase + min(mb + uint(i), pc.M - 1u) * pc.sam) >> 2;
#elif defined(A_M)
  uint ar[VRM / 4];  // vec4 index of rows 4*i4 .. 4*i4+3 at k = 0
  [[unroll]] for (int i = 0; i < VRM / 4; ++i) ar[i] = (abase + min(mb + 4u * uint(i), pc.M - 4u)) >> 2;
  uint ak4 = pc.sak >> 2;
#else
  uint ar[VRM];
  [[unroll]] for (int i = 0; i < VRM; ++i) ar[i] = abase + min(mb + uint(i), pc.M - 1u) * pc.sam;
#endif
#if defined(B_N)
  uint bc[VRN / 4];
  [[unroll]] for (int j = 0; j < VRN / 4; ++j) bc[j] = (bbase + min(nb + 4u * uint(j), pc.N - 4u)) >> 2;
  uint bk4 = pc.sbk >> 2;
#elif defined(B_K)
  uint bc[VRN];
  [[unroll]] for (int j = 0; j < VRN; ++j) bc[j] = (bbase + min(nb + uint(j), pc.N - 1u) * pc.sbn) >> 2;
#else
  uint bc[VRN];
  [[unroll]] for (int j = 0; j < VRN; ++j) bc[j] = bbase + min(nb + uint(j), pc.N - 1u) * pc.sbn;
#endif
#if defined(MM_SG)
  // this lane's share of the subgroup's rows of a
#if defined(A_K)
  uint sg_a[SG_R];  // rows tx + 8 r, vec4 index at k = 0
  [[unroll]] for (int r = 0; r < SG_R; ++r) sg_a[r] = (abase + min(mb + tx + 8u * uint(r), pc.M - 1u) * pc.sam) >> 2;
#elif defined(A_M)
  uint sg_a[SG_R];  // rows 4*((tx&1) + 2r) .., at k+tx/2
  [[unroll]] for (int r = 0; r < SG_R; ++r) sg_a[r] = (abase + min(mb + 4u * ((tx & 1u) + 2u * uint(r)), pc.M - 4u)) >> 2;
  uint sg_k = tx >> 1u;
#else
  uint sg_a[SG_R];  // rows tx + 8 r, scalar index at k = 0
  [[unroll]] for (int r = 0; r < SG_R; ++r) sg_a[r] = abase + min(mb + tx + 8u * uint(r), pc.M - 1u) * pc.sam;
#endif
#if defined(A_M)  // lane l holds rows 4*(l&1) .. +3 at k + l/2
#define SGB(l) { vec4 w = subgroupBroadcast(v, l); const int i4 = (int(l) & 1) + 2 * r, q = int(l) >> 1; \
    av[4 * i4][q] = w.x; av[4 * i4 + 1][q] = w.y; av[4 * i4 + 2][q] = w.z; av[4 * i4 + 3][q] = w.w; }
#else  // lane l holds row l at k .. k+3
#define SGB(l) { vec4 w = subgroupBroadcast(v, l); const int i = int(l) + 8 * r; \
    av[i][0] = w.x; av[i][1] = w.y; av[i][2] = w.z; av[i][3] = w.w; }
#endif
#endif
  uint K4 = pc.K & ~3u, k = 0;
  // MM_KU 4-deep k steps per iteration (the host picks MM_KU = 2 only when K % 8 == 0): on
  // lavapipe every loop-carried accumulator costs a masked blend and a spill per iteration, so
  // fewer, longer iterations leave more of the time to the arithmetic.
  for (; k < K4; k += 4u * uint(MM_KU)) {
    [[unroll]] for (uint ku = 0; ku < uint(MM_KU); ++ku) {
    const uint kb = k + 4u * ku;
      float av[VRM][4], bv[4][VRN];
#if defined(MM_SG)
      [[unroll]] for (int r = 0; r < SG_R; ++r) {
#if defined(A_K)
        vec4 v = a4(sg_a[r] + (kb >> 2));
#elif defined(A_M)
        vec4 v = a4(sg_a[r] + (kb + sg_k) * ak4);
#else
        vec4 v = vec4(a(sg_a[r] + kb * pc.sak), a(sg_a[r] + (kb + 1u) * pc.sak), a(sg_a[r] + (kb + 2u) * pc.sak),
                      a(sg_a[r] + (kb + 3u) * pc.sak));
#endif
        SGB(0u) SGB(1u) SGB(2u) SGB(3u) SGB(4u) SGB(5u) SGB(6u) SGB(7u)
      }
#elif defined(A_K)
      [[unroll]] for (int i = 0; i < VRM; ++i) {
        vec4 v = a4(ar[i] + (kb >> 2));
        av[i][0] = v.x; av[i][1] = v.y; av[i][2] = v.z; av[i][3] = v.w;
      }
#elif defined(A_M)
      [[unroll]] for (uint kk = 0; kk < 4u; ++kk)
        [[unroll]] for (int i = 0; i < VRM / 4; ++i) {
          vec4 v = a4(ar[i] + (kb + kk) * ak4);
          av[4 * i][kk] = v.x; av[4 * i + 1][kk] = v.y; av[4 * i + 2][kk] = v.z; av[4 * i + 3][kk] = v.w;
        }
#else
      [[unroll]] for (uint kk = 0; kk < 4u; ++kk)
        [[unroll]] for (int i = 0; i < VRM; ++i) av[i][kk] = a(ar[i] + (kb + kk) * pc.sak);
#endif
#if defined(B_N)
      [[unroll]] for (uint kk = 0; kk < 4u; ++kk)
        [[unroll]] for (int j = 0; j < VRN / 4; ++j) {
          vec4 v = b4(bc[j] + (kb + kk) * bk4);
          bv[kk][4 * j] = v.x; bv[kk][4 * j + 1] = v.y; bv[kk][4 * j + 2] = v.z; bv[kk][4 * j + 3] = v.w;
        }
#elif defined(B_K)
      [[unroll]] for (int j = 0; j < VRN; ++j) {
        vec4 v = b4(bc[j] + (kb >> 2));
        bv[0][j] = v.x; bv[1][j] = v.y; bv[2][j] = v.z; bv[3][j] = v.w;
      }
#else
      [[unroll]] for (uint kk = 0; kk < 4u; ++kk)
        [[unroll]] for (int j = 0; j < VRN; ++j) bv[kk][j] = b(bc[j] + (kb + kk) * pc.sbk);
#endif
      [[unroll]] for (int i0 = 0; i0 < VRM; i0 += 8)
      [[unroll]] for (int j = 0; j < VRN; ++j)
        [[unroll]] for (int i = 0; i < 8; ++i)
          [[unroll]] for (int kk = 0; kk < 4; ++kk) acc[i0 + i][j] = fma(av[i0 + i][kk], bv[kk][j], acc[i0 + i][j]);
    }
  }
#if !defined(A_K) && !defined(B_K)
  for (; k < pc.K; ++k) {  // K % 4 tail, one k at a time
    float av[VRM], bv[VRN];
#if defined(A_M)
    [[unroll]] for (int i = 0; i < VRM / 4; ++i) {
      vec4 v = a4(ar[i] + k * ak4);
      av[4 * i] = v.x; av[4 * i + 1] = v.y; av[4 * i + 2] = v.z; av[4 * i + 3] = v.w;
    }
#else
    [[unroll]] for (int i = 0; i < VRM; ++i) av[i] = a(ar[i] + k * pc.sak);
#endif
#if defined(B_N)
    [[unroll]] for (int j = 0; j < VRN / 4; ++j) {
      vec4 v = b4(bc[j] + k * bk4);
      bv[4 * j] = v.x; bv[4 * j + 1] = v.y; bv[4 * j + 2] = v.z; bv[4 * j + 3] = v.w;
    }
#else
    [[unroll]] for (int j = 0; j < VRN; ++j) bv[j] = b(bc[j] + k * pc.sbk);
#endif
    [[unroll]] for (int i = 0; i < VRM; ++i)
      [[unroll]] for (int j = 0; j < VRN; ++j) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
  }
#endif
  float bs[VRN];
  [[unroll]] for (int j = 0; j < VRN; ++j) bs[j] = bias_at(nb + uint(j));
  C1Ptr pc1 = C1Ptr(uvec2(pc.c_lo, pc.c_hi));
#if !defined(C_H)
  // A block wholly inside c writes its rows as vec4s through c's address: lavapipe stores to a
  // descriptor-bound buffer one bounds-checked lane and component at a time (about 15% of the
  // time of a K = 384 product went to the scalar stores). Same arithmetic as store_b().
  if (pc.c_vec != 0u && mb + uint(VRM) <= pc.M && nb + uint(VRN) <= pc.N) {
    CPtr pc4 = CPtr(uvec2(pc.c_lo, pc.c_hi));
    [[unroll]] for (int i = 0; i < VRM; ++i) {
      uint ci = (cbase + (mb + uint(i)) * pc.scm + nb) >> 2;  // vec4 index
      [[unroll]] for (int j4 = 0; j4 < VRN / 4; ++j4) {
        vec4 v = pc.alpha * vec4(acc[i][4 * j4], acc[i][4 * j4 + 1], acc[i][4 * j4 + 2], acc[i][4 * j4 + 3]);
        if (pc.beta != 0.0) v += pc.beta * C_GET(pc4, ci + uint(j4));
        if (pc.has_bias != 0u) v += vec4(bs[4 * j4], bs[4 * j4 + 1], bs[4 * j4 + 2], bs[4 * j4 + 3]);
        C_PUT(pc4, ci + uint(j4), v);
      }
    }
  } else
#endif
  {
    // The other blocks (16-bit c: all) element by element, also through c's address: lavapipe
    // turns each access to a bound buffer into a branch per lane, and these 3 x 64 of them took
    // most of the shader's compile time (a cold cache compiles it at the first dispatch of every
    // test process).
    [[unroll]] for (int i = 0; i < VRM; ++i)
      [[unroll]] for (int j = 0; j < VRN; ++j) {
        const uint m = mb + uint(i), n = nb + uint(j);
        if (m < pc.M && n < pc.N) {
          const uint ci = cbase + m * pc.scm + n;
          float v = pc.alpha * acc[i][j];
          if (pc.beta != 0.0) v += pc.beta * C_LD(pc1.v[ci]);
          if (pc.has_bias != 0u) v += bs[j];
          pc1.v[ci] = C_ST(v);
        }
      }
  }
  // The GELU reads c back through pc1 whichever way it was written: the pointers are
  // AliasedPointer (glslang's default), so the invocation's own stores come first.
#define VEC_M(i) (mb + (i))
#define VEC_N(j) (nb + (j))
  EPI_BLOCK(VRM, VRN, VEC_M, VEC_N, pc1.v)
#undef a
#undef b
#undef a4
#undef b4
#elif defined(MM_REG)
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
      av[i] = A_LD(a[arow[i] + k * pc.sak]);
      bv[i] = B_LD(b[bcol[i] + k * pc.sbk]);
    }
    for (int i = 0; i < RB; ++i)
      for (int j = 0; j < RB; ++j) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
  }
  for (int i = 0; i < RB; ++i)
    for (int j = 0; j < RB; ++j)
      store(m0 + ty + 8u * uint(i), n0 + tx + 8u * uint(j), cbase, acc[i][j]);
#define REG_M(i) (m0 + ty + 8u * (i))
#define REG_N(j) (n0 + tx + 8u * (j))
  EPI_BLOCK(RB, RB, REG_M, REG_N, c)
#else
  // MM_TILED
  float acc[TRM * TRN];
  [[unroll]] for (uint i = 0; i < TRM * TRN; ++i) acc[i] = 0.0;
  const uint tid = gl_LocalInvocationIndex, nt = TTM * TTN;
  const uint tm = tid / TTN, tn = tid % TTN;
  // Row i of the register block: runs of 4 contiguous rows, 4 * TTM apart (likewise columns),
  // so each run is one vec4 load from shared memory, and neighbouring invocations read
  // neighbouring vec4s. On lavapipe every shared-memory load is a branch per lane: vec4s instead
  // of scalars took a third off the compile time of the 128 x 128 shape (LLVM's coroutine
  // lowering of the barriers grows with the branches).
#define TROW(i) ((i) / 4u * 4u * TTM + 4u * tm + (i) % 4u)
#define TCOL(j) ((j) / 4u * 4u * TTN + 4u * tn + (j) % 4u)
  for (uint k0 = kbeg; k0 < kend; k0 += TBK) {
    // Stage op(a)[m0 .., k0 ..] into As[k][m] and op(b)[k0 .., n0 ..] into Bs[k][n], zeros past
    // the edges. With vec4s every one lies wholly inside or outside (aligned, extent % 4 == 0,
    // and k0, kend multiples of 4 or K).
    if (VA == 1) {
      for (uint i = tid; i < TBM * TBK / 4; i += nt) {
        uint r = i / (TBK / 4), q = (i % (TBK / 4)) * 4, gm = m0 + r, gk = k0 + q;
        vec4 v = (gm < pc.M && gk < kend) ? A_LD4((abase + gm * pc.sam + gk) / 4) : vec4(0.0);
        AS(q, r) = v.x, AS(q + 1, r) = v.y, AS(q + 2, r) = v.z, AS(q + 3, r) = v.w;
      }
    } else if (VA == 2) {
      for (uint i = tid; i < TBM * TBK / 4; i += nt) {
        uint k = i / (TBM / 4), r = (i % (TBM / 4)) * 4, gm = m0 + r, gk = k0 + k;
        vec4 v = (gm < pc.M && gk < kend) ? A_LD4((abase + gk * pc.sak + gm) / 4) : vec4(0.0);
        As[(k * LDA + r) / 4u] = v;
      }
    } else {
      for (uint i = tid; i < TBM * TBK; i += nt) {
        uint k = i / TBM, r = i % TBM, gm = m0 + r, gk = k0 + k;
        AS(k, r) = (gm < pc.M && gk < kend) ? A_LD(a[abase + gm * pc.sam + gk * pc.sak]) : 0.0;
      }
    }
    if (VB == 1) {
      for (uint i = tid; i < TBN * TBK / 4; i += nt) {
        uint k = i / (TBN / 4), col = (i % (TBN / 4)) * 4, gn = n0 + col, gk = k0 + k;
        vec4 v = (gn < pc.N && gk < kend) ? B_LD4((bbase + gk * pc.sbk + gn) / 4) : vec4(0.0);
        Bs[(k * LDB + col) / 4u] = v;
      }
    } else if (VB == 2) {
      for (uint i = tid; i < TBN * TBK / 4; i += nt) {
        uint col = i / (TBK / 4), q = (i % (TBK / 4)) * 4, gn = n0 + col, gk = k0 + q;
        vec4 v = (gn < pc.N && gk < kend) ? B_LD4((bbase + gn * pc.sbn + gk) / 4) : vec4(0.0);
        BS(q, col) = v.x, BS(q + 1, col) = v.y, BS(q + 2, col) = v.z, BS(q + 3, col) = v.w;
      }
    } else {
      for (uint i = tid; i < TBN * TBK; i += nt) {
        uint k = i / TBN, col = i % TBN, gn = n0 + col, gk = k0 + k;
        BS(k, col) = (gn < pc.N && gk < kend) ? B_LD(b[bbase + gk * pc.sbk + gn * pc.sbn]) : 0.0;
      }
    }
    barrier();
    [[unroll]] for (uint kk = 0; kk < TBK; ++kk) {
      float av[TRM], bv[TRN];
      [[unroll]] for (uint i4 = 0; i4 < TRM / 4; ++i4) {
        vec4 v = As[(kk * LDA) / 4u + i4 * TTM + tm];
        av[4 * i4] = v.x, av[4 * i4 + 1] = v.y, av[4 * i4 + 2] = v.z, av[4 * i4 + 3] = v.w;
      }
      [[unroll]] for (uint j4 = 0; j4 < TRN / 4; ++j4) {
        vec4 v = Bs[(kk * LDB) / 4u + j4 * TTN + tn];
        bv[4 * j4] = v.x, bv[4 * j4 + 1] = v.y, bv[4 * j4 + 2] = v.z, bv[4 * j4 + 3] = v.w;
      }
      [[unroll]] for (uint i = 0; i < TRM; ++i)
        [[unroll]] for (uint j = 0; j < TRN; ++j) acc[i * TRN + j] = fma(av[i], bv[j], acc[i * TRN + j]);
    }
    barrier();
  }
  float bs[TRN];
  [[unroll]] for (uint j = 0; j < TRN; ++j) bs[j] = bias_at(n0 + TCOL(j));
  [[unroll]] for (uint i = 0; i < TRM; ++i)
    [[unroll]] for (uint j = 0; j < TRN; ++j)
      store_b(m0 + TROW(i), n0 + TCOL(j), cbase, acc[i * TRN + j], bs[j]);
#define TILE_M(i) (m0 + TROW(i))
#define TILE_N(j) (n0 + TCOL(j))
  EPI_BLOCK(TRM, TRN, TILE_M, TILE_N, c)
#endif
}
