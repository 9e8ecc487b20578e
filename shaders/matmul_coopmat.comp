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
// memory (As [TBM][TBK]: op(a) row-major; Bs [TBN][TBK]: op(b) column-major, so that both
// fragments' k runs are contiguous -- AMD's WMMA takes a lane's k run of B in one 16-byte read
// that way, 16 two-byte reads the other; zero outside the matrices), FK per multiply-add. All of
// these are specialization constants (below).
// Split-k (pc.ksplit = S > 1, for long K and few tiles): workgroup z = batch * S + s sums only
// k in [s * kchunk, (s + 1) * kchunk) and stores its raw sums (alpha 1, beta 0, no bias, c the
// f32 partials [batch * S][M][N]); matmul_splitk.comp adds the S partials in order and applies
// the epilogue. S = 1: kchunk = K, the plain GEMM.
// bf16 a and b (H_BF16; bf16 has f32's 8 exponent bits, f16 5): each staged tile, TBM x TBK of
// op(a) and TBK x TBN of op(b), is multiplied by a power of two 2^s and rounded to f16 by
// ct_f32_to_f16 (round to nearest even, the same bits on every device and in both builds).
// The tile's own scale is s = clamp(14 - e, -126, 126) where 2^e <= the tile's largest |x| <
// 2^(e+1) (the workgroup's integer max of the f32 bits of |x| in shared memory: no float
// atomics): its largest |x| lands in [2^14, 2^15). The scale in use stays while it puts each new
// tile's largest |x| in [2^14, 2^16) -- the tile's own s or s + 1, i.e. the tile a binade larger
// than the one that set it (2^15 times bf16's largest significand, 65280, is an f16) -- or the
// tile is all zeros; else the new tile's own scale starts. Either way every element with |x| >=
// 2^-28 of its tile's largest is >= 2^-14 after scaling, a normal f16, and exact there (bf16's 8
// significant bits fit f16's 11). Smaller elements are rounded (or flushed, by a device that
// flushes f16 subnormals) with an absolute error below 2^-28 of the tile's largest |x|. The
// products go into an f32 accumulator at the scales in use, added to the running one
// multiplied by 2^-(sa+sb) when the scales change and at the end (two scalar x fragment
// multiplies by powers of two, 2^clamp(d, -126, 127) then the rest: exact unless the
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
// How a and b are read from memory (ops/matmul.cpp's rule): 0 one element a load; VA 1: 8
// elements along k (a row-major) as one 16-byte load, 2: along m (a transposed); VB 1: along n
// (b row-major), 2: along k (b transposed). The host sets 1 or 2 only where every group of 8 is
// 16-byte aligned and the unit-stride extent is a multiple of 8, so a group lies wholly inside
// or wholly outside the matrix (k0 and kend are multiples of 8 then, or K).
layout(constant_id = 9) const uint VA = 0;
layout(constant_id = 10) const uint VB = 0;
// VC 1: the epilogue writes c 4 consecutive elements of a row at a time, one 8-byte (16-bit c)
// or 16-byte (f32 c) store through c4, binding 0's view in units of 4 elements. The host sets it
// only where every row of c starts at a multiple of 4 elements of an aligned binding (offset,
// first element, row and batch strides); a group of 4 that crosses N is written element by
// element.
layout(constant_id = 11) const uint VC = 0;
const uint CU = VC != 0u ? 4u : 1u;  // elements an epilogue step of a lane
const uint NWARPS = WARPS_M * WARPS_N;
const uint WM = FRM * FM;  // rows of a subgroup's block
const uint WN = FRN * FN;
const uint TBM = WARPS_M * WM;  // the workgroup's tile of c
const uint TBN = WARPS_N * WN;
// Strides of the shared tiles' rows of a and columns of b, padded by 16 bytes (16-byte aligned
// for coopMatLoad, and off the banks of the next row): 8 f16 elements, 4 of the emulation's f32.
#if defined(CM_EMU)
const uint PAD = 4;
#else
const uint PAD = 8;
#endif
const uint LDA = TBK + PAD;
const uint LDB = TBK + PAD;

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
#if defined(C_H)
layout(std430, binding = 0) buffer Cm4 { uvec2 c4[]; };
#else
layout(std430, binding = 0) buffer Cm4 { uvec4 c4[]; };
#endif
// Elements ci .. ci + 3 of c (ci a multiple of 4) through c4, widened / rounded as C_LD / C_ST.
vec4 c_load4(uint ci) {
#if defined(C_H)
  const uvec2 w = c4[ci / 4u];
  return vec4(C_LD(w.x & 0xffffu), C_LD(w.x >> 16), C_LD(w.y & 0xffffu), C_LD(w.y >> 16));
#else
  return uintBitsToFloat(c4[ci / 4u]);
#endif
}
void c_store4(uint ci, vec4 v) {
#if defined(C_H)
  c4[ci / 4u] = uvec2(uint(C_ST(v.x)) | (uint(C_ST(v.y)) << 16),
                      uint(C_ST(v.z)) | (uint(C_ST(v.w)) << 16));
#else
  c4[ci / 4u] = floatBitsToUint(v);
#endif
}
layout(std430, binding = 1) readonly buffer Am { H_T a[]; };
layout(std430, binding = 2) readonly buffer Bm { H_T b[]; };
// The same bindings, 8 elements (16 bytes) a load: VA / VB below.
layout(std430, binding = 1) readonly buffer Am8 { uvec4 a8[]; };
layout(std430, binding = 2) readonly buffer Bm8 { uvec4 b8[]; };
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
shared SH_T Bs[TBN * LDB];
shared float Cw[NWARPS * FM * FN];  // per-subgroup epilogue scratch
#if defined(H_BF16)
shared uint Mx[2];  // the staged tiles' largest |x| of a and b, as f32 bits
// 2^s putting a largest |x| with these f32 bits in [2^14, 2^15), as s (inf/NaN: s = -114).
int tile_shift(uint maxbits) { return clamp(14 - (int(maxbits >> 23) - 127), -126, 126); }
#endif

// ---- staging: global memory -> registers -> shared tiles ------------------------------------
// A k-step's tiles are read into registers as raw 16-bit elements, in groups of 8 (a uvec4;
// element e of a group in bits 16 (e % 2) of word e / 2): a group of op(a) is 8 consecutive k of
// one row (VA 0 or 1) or 8 consecutive rows at one k (VA 2); of op(b), 8 consecutive columns at
// one k (VB 0 or 1) or 8 consecutive k of one column (VB 2). Invocation t holds groups t,
// t + NT, ... The next k-step's groups are read while the subgroups multiply this one's.
// The staging loops are unrolled on GPUs (registers), not in the emulated build (lavapipe's LLVM
// compiles the unrolled form several times slower, for nothing the tests need).
#if defined(CM_EMU)
#define STAGE_LOOP [[dont_unroll]]
#else
#define STAGE_LOOP [[unroll]]
#endif
const uint NT = gl_WorkGroupSize.x;
const uint GA = TBM * TBK / 8u, GB = TBK * TBN / 8u;  // groups a tile
const uint RA = (GA + NT - 1u) / NT, RB = (GB + NT - 1u) / NT;
uvec4 ra[RA], rb[RB];

uint elem(uvec4 w, uint e) { return (w[e >> 1] >> ((e & 1u) * 16u)) & 0xffffu; }
uvec4 pack8(uint v[8]) {
  return uvec4(v[0] | (v[1] << 16), v[2] | (v[3] << 16), v[4] | (v[5] << 16), v[6] | (v[7] << 16));
}

// Group g of op(a)'s tile at (m0, k0): its first row r and k offset q in the tile.
void a_group(uint g, out uint r, out uint q) {
  if (VA == 2u) q = g / (TBM / 8u), r = (g % (TBM / 8u)) * 8u;
  else r = g / (TBK / 8u), q = (g % (TBK / 8u)) * 8u;
}
// Group g of op(b)'s tile at (k0, n0): its k offset q and first column cl in the tile.
void b_group(uint g, out uint q, out uint cl) {
  if (VB == 2u) cl = g / (TBK / 8u), q = (g % (TBK / 8u)) * 8u;
  else q = g / (TBN / 8u), cl = (g % (TBN / 8u)) * 8u;
}

// Reads the k-step at k0 (zeros outside op(a) and op(b) and past kend) into ra and rb.
void load_tiles(uint abase, uint bbase, uint m0, uint n0, uint k0, uint kend) {
  STAGE_LOOP for (uint i = 0; i < RA; ++i) {
    const uint g = gl_LocalInvocationIndex + i * NT;
    uint r, q;
    a_group(g, r, q);
    const uint m = m0 + r, kk = k0 + q;
    uvec4 w = uvec4(0u);
    if (g < GA) {
      if (VA == 1u) {
        if (m < pc.M && kk < kend) w = a8[(abase + m * pc.sam + kk) / 8u];
      } else if (VA == 2u) {
        if (m < pc.M && kk < kend) w = a8[(abase + kk * pc.sak + m) / 8u];
      } else {
        uint v[8];
        STAGE_LOOP for (uint e = 0; e < 8u; ++e)
          v[e] = m < pc.M && kk + e < kend ? uint(a[abase + m * pc.sam + (kk + e) * pc.sak]) : 0u;
        w = pack8(v);
      }
    }
    ra[i] = w;
  }
  STAGE_LOOP for (uint i = 0; i < RB; ++i) {
    const uint g = gl_LocalInvocationIndex + i * NT;
    uint q, cl;
    b_group(g, q, cl);
    const uint n = n0 + cl, kk = k0 + q;
    uvec4 w = uvec4(0u);
    if (g < GB) {
      if (VB == 1u) {
        if (n < pc.N && kk < kend) w = b8[(bbase + kk * pc.sbk + n) / 8u];
      } else if (VB == 2u) {
        if (n < pc.N && kk < kend) w = b8[(bbase + n * pc.sbn + kk) / 8u];
      } else {
        uint v[8];
        STAGE_LOOP for (uint e = 0; e < 8u; ++e)
          v[e] = n + e < pc.N && kk < kend ? uint(b[bbase + kk * pc.sbk + (n + e) * pc.sbn]) : 0u;
        w = pack8(v);
      }
    }
    rb[i] = w;
  }
}

// The 8 values staged for group w. f16: as they are (exact). bf16: times the tile's power of two
// s, rounded to f16 (the header's rule). The real build converts in hardware where that is exact
// whatever the device's rounding mode -- every |x| >= 2^-14 (f16's normals hold bf16's 8
// significant bits) or zero; inf -- and a group with another value (NaN, or below 2^-14: below
// 2^-28 of the tile's largest) by ct_f32_to_f16; the emulated build always by ct_f32_to_f16.
// The same values either way.
void staged8(uvec4 w, float s, out SH_T v[8]) {
#if defined(H_BF16)
  float x[8];  // element 2i in the low half of word i, 2i + 1 in the high half
  STAGE_LOOP for (uint i = 0; i < 4u; ++i) {
    x[2u * i] = uintBitsToFloat(w[i] << 16) * s;
    x[2u * i + 1u] = uintBitsToFloat(w[i] & 0xffff0000u) * s;
  }
#if defined(CM_EMU)
  STAGE_LOOP for (uint e = 0; e < 8u; ++e) v[e] = ct_f16_to_f32(ct_f32_to_f16(x[e]));
#else
  bool exact = true;
  STAGE_LOOP for (uint e = 0; e < 8u; ++e)
    exact = exact && (abs(x[e]) >= 6.103515625e-05 || x[e] == 0.0);  // 2^-14
  if (exact) {
    STAGE_LOOP for (uint e = 0; e < 8u; ++e) v[e] = float16_t(x[e]);
  } else {
    STAGE_LOOP for (uint e = 0; e < 8u; ++e) v[e] = unpackFloat2x16(ct_f32_to_f16(x[e])).x;
  }
#endif
#else
#if defined(CM_EMU)
  STAGE_LOOP for (uint e = 0; e < 8u; ++e) v[e] = ct_f16_to_f32(elem(w, e));
#else
  STAGE_LOOP for (uint e = 0; e < 4u; ++e) {
    const f16vec2 h = unpackFloat2x16(w[e]);
    v[2u * e] = h.x, v[2u * e + 1u] = h.y;
  }
#endif
#endif
}

// Writes ra and rb to As and Bs (a's scaled by sa, b's by sb where bf16).
void store_tiles(float sa, float sb) {
  STAGE_LOOP for (uint i = 0; i < RA; ++i) {
    const uint g = gl_LocalInvocationIndex + i * NT;
    if (g < GA) {
      uint r, q;
      a_group(g, r, q);
      SH_T v[8];
      staged8(ra[i], sa, v);
      STAGE_LOOP for (uint e = 0; e < 8u; ++e) {
        if (VA == 2u) As[(r + e) * LDA + q] = v[e];
        else As[r * LDA + q + e] = v[e];
      }
    }
  }
  STAGE_LOOP for (uint i = 0; i < RB; ++i) {
    const uint g = gl_LocalInvocationIndex + i * NT;
    if (g < GB) {
      uint q, cl;
      b_group(g, q, cl);
      SH_T v[8];
      staged8(rb[i], sb, v);
      STAGE_LOOP for (uint e = 0; e < 8u; ++e) {
        if (VB == 2u) Bs[cl * LDB + q + e] = v[e];
        else Bs[(cl + e) * LDB + q] = v[e];
      }
    }
  }
}

#if defined(H_BF16)
// The largest |x| of the groups this invocation holds, as f32 bits (a bf16's bits, shifted).
uint held_max(bool of_a) {
  uint mx = 0u;
  if (of_a) {
    STAGE_LOOP for (uint i = 0; i < RA; ++i)
      STAGE_LOOP for (uint e = 0; e < 8u; ++e) mx = max(mx, elem(ra[i], e) & 0x7fffu);
  } else {
    STAGE_LOOP for (uint i = 0; i < RB; ++i)
      STAGE_LOOP for (uint e = 0; e < 8u; ++e) mx = max(mx, elem(rb[i], e) & 0x7fffu);
  }
  return mx << 16;
}
#endif

// ---- fragment operations: coopmat, or their shared-memory emulation -------------------------
// The accumulators are one array, fragment f = i * FRN + j (arrays sized by specialization
// constants cannot be function parameters, so the emulation works on the array in place).
// Cw is per subgroup: its writes and reads need only the subgroup's lanes in step (the
// emulation's "subgroups" are groups of invocations, so it takes the workgroup's barrier).
#if defined(CM_EMU)
#define SUBGROUP_SYNC() barrier()
#else
#define SUBGROUP_SYNC() \
  subgroupMemoryBarrierShared(); \
  subgroupBarrier()
#endif
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
#define LOAD_B(f, off) coopMatLoad(f, Bs, off, LDB, gl_CooperativeMatrixLayoutColumnMajor)
#endif

#if defined(H_BF16)
// acc += kacc * 2^-(ca + cb), then kacc = 0: the products summed at the tiles' scales, in acc's
// units. d = -(ca + cb) in [-252, 252]: 2^d1 (a normal f32) then 2^(d - d1) (two scalar x
// fragment multiplies by powers of two: exact unless the product itself leaves f32's normal
// range); one multiply where d == d1 (workgroup-uniform), the same bits (x 1 is exact).
#if defined(CM_EMU)
#define KACC_ZERO() [[unroll]] for (uint e_ = 0; e_ < FRM * FRN * EPL; ++e_) kacc[e_] = 0.0
#define KACC_ADD(x) [[unroll]] for (uint e_ = 0; e_ < FRM * FRN * EPL; ++e_) acc[e_] += kacc[e_] * x
#define KACC_ADD2(x, y) \
  [[unroll]] for (uint e_ = 0; e_ < FRM * FRN * EPL; ++e_) acc[e_] += kacc[e_] * (x) * (y)
#else
#define KACC_ZERO() [[unroll]] for (uint f_ = 0; f_ < FRM * FRN; ++f_) kacc[f_] = ACC_T(0.0)
#define KACC_ADD(x) [[unroll]] for (uint f_ = 0; f_ < FRM * FRN; ++f_) acc[f_] += kacc[f_] * x
#define KACC_ADD2(x, y) \
  [[unroll]] for (uint f_ = 0; f_ < FRM * FRN; ++f_) acc[f_] += kacc[f_] * (x) * (y)
#endif
#define KACC_FLUSH(ca, cb)                                                \
  {                                                                       \
    const int d_ = -((ca) + (cb)), d1_ = clamp(d_, -126, 127);            \
    const float b1_ = ldexp(1.0, d1_), b2_ = ldexp(1.0, d_ - d1_);        \
    if (d_ == d1_) {                                                      \
      KACC_ADD(b1_);                                                      \
    } else {                                                              \
      KACC_ADD2(b1_, b2_);                                                \
    }                                                                     \
    KACC_ZERO();                                                          \
  }
#endif

void main() {
  const uint S = pc.ksplit, z = gl_WorkGroupID.z, zb = z / S, ks = z % S;
  const uint abase = pc.oa + zb * pc.sab, bbase = pc.ob + zb * pc.sbb;
  const uint cbase = pc.oc + z * pc.scb;  // split-k: c is the f32 partials [batch * S][M][N]
  const uint kbeg = ks * pc.kchunk, kend = min(pc.K, kbeg + pc.kchunk);
  const uint m0 = gl_WorkGroupID.y * TBM, n0 = gl_WorkGroupID.x * TBN;
  const uint tid = gl_LocalInvocationIndex;
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
  // The products at the tiles' scales 2^cura x 2^curb, added into acc multiplied back when the
  // scales change and at the end (KACC_FLUSH).
#if defined(CM_EMU)
  float kacc[FRM * FRN * EPL];
  [[unroll]] for (uint e = 0; e < FRM * FRN * EPL; ++e) kacc[e] = 0.0;
#else
  ACC_T kacc[FRM * FRN];
  [[unroll]] for (uint f = 0; f < FRM * FRN; ++f) kacc[f] = ACC_T(0.0);
#endif
#define KACC kacc
  int cura = 0, curb = 0;  // workgroup-uniform, as everything deciding them
  bool have = false;       // kacc's scales are set (a k-step ran)
  if (tid == 0u) Mx[0] = Mx[1] = 0u;
  barrier();
#else
#define KACC acc
#endif

  load_tiles(abase, bbase, m0, n0, kbeg, kend);
  for (uint k0 = kbeg; k0 < kend; k0 += TBK) {
#if defined(H_BF16)
    // The tiles' largest |x| (f32 bits of non-negative values order as integers).
    atomicMax(Mx[0], held_max(true));
    atomicMax(Mx[1], held_max(false));
    barrier();
    // kacc's scales stay while each tile's largest |x| lands in [2^14, 2^16) under them -- the
    // tile's own scale (tile_shift), or one above it: a binade larger than the tile that set
    // the scale (2^15 times bf16's largest significand is 65280, an f16) -- or the tile is all
    // zeros: the header's rule holds for the tile either way, and its products add into kacc
    // as they come. Else kacc goes into acc and the tiles' own scales start.
    const int na = tile_shift(Mx[0]), nb = tile_shift(Mx[1]);
    const bool keep = have && (Mx[0] == 0u || cura == na || cura == na + 1) &&
                      (Mx[1] == 0u || curb == nb || curb == nb + 1);
    if (!keep) {
      if (have) KACC_FLUSH(cura, curb);
      cura = na, curb = nb, have = true;
    }
    const float sa = ldexp(1.0, cura), sb = ldexp(1.0, curb);
#else
    const float sa = 1.0, sb = 1.0;
#endif
    // op(a)[m0 .. m0+TBM, k0 .. k0+TBK] and op(b)[k0 .., n0 ..] into As and Bs, then the next
    // k-step's groups into the registers while the subgroups multiply.
    store_tiles(sa, sb);
    barrier();
#if defined(H_BF16)
    // every invocation read Mx before the barrier; the next k-step's maxima come after the
    // barrier that ends this one
    if (tid == 0u) Mx[0] = Mx[1] = 0u;
#endif
    if (k0 + TBK < kend) load_tiles(abase, bbase, m0, n0, k0 + TBK, kend);
    [[unroll]] for (uint kf = 0; kf < TBK; kf += FK) {
      FRAG_A fa[FRM];
      FRAG_B fb[FRN];
      [[unroll]] for (uint i = 0; i < FRM; ++i) LOAD_A(fa[i], (wm + i * FM) * LDA + kf);
      [[unroll]] for (uint j = 0; j < FRN; ++j) LOAD_B(fb[j], (wn + j * FN) * LDB + kf);
      [[unroll]] for (uint i = 0; i < FRM; ++i)
        [[unroll]] for (uint j = 0; j < FRN; ++j) {
#if defined(CM_EMU)
          // acc += A[FM x FK at fa, row stride LDA] @ B[FK x FN at fb, column stride LDB], the FK
          // products summed in k order. The k loop is not unrolled: the emulation only has to
          // be right, and lavapipe's LLVM compiles fully unrolled 16x16x16 builds for minutes.
          const uint f = i * FRN + j;
          [[unroll]] for (uint e = 0; e < EPL; ++e) {
            uint idx = e * LANES + lane, r = idx / FN, col = idx % FN;
            float s = KACC[f * EPL + e];
            [[dont_unroll]] for (uint k = 0; k < FK; ++k)
              s += float(As[fa[i] + r * LDA + k]) * float(Bs[fb[j] + col * LDB + k]);
            KACC[f * EPL + e] = s;
          }
#else
          KACC[i * FRN + j] = coopMatMulAdd(fa[i], fb[j], KACC[i * FRN + j]);
#endif
        }
    }
    barrier();
  }
#if defined(H_BF16)
  if (have) KACC_FLUSH(cura, curb);
#endif

  // Epilogue, one fragment at a time through the subgroup's scratch: a lane takes CU
  // consecutive elements of a row a step (VC: 4, one store), the same ones in the GELU pass.
  const uint woff = warp * (FM * FN);
  [[unroll]] for (uint i = 0; i < FRM; ++i)
    [[unroll]] for (uint j = 0; j < FRN; ++j) {
#if defined(CM_EMU)
      [[unroll]] for (uint e = 0; e < EPL; ++e)
        Cw[woff + e * LANES + lane] = acc[(i * FRN + j) * EPL + e];
#else
      coopMatStore(acc[i * FRN + j], Cw, woff, FN, gl_CooperativeMatrixLayoutRowMajor);
#endif
      SUBGROUP_SYNC();
      for (uint e = lane * CU; e < FM * FN; e += lanes * CU) {
        const uint m = m0 + wm + i * FM + e / FN, n = n0 + wn + j * FN + e % FN;
        if (m >= pc.M) continue;
        const uint ci = cbase + m * pc.scm + n;
        if (VC != 0u && n + 3u < pc.N) {
          vec4 v = pc.alpha * vec4(Cw[woff + e], Cw[woff + e + 1u], Cw[woff + e + 2u],
                                   Cw[woff + e + 3u]);
          if (pc.beta != 0.0) v += pc.beta * c_load4(ci);  // beta == 0: c may hold NaN
          if (pc.has_bias != 0u)
            v += vec4(C_RND(bias[pc.obias + n]), C_RND(bias[pc.obias + n + 1u]),
                      C_RND(bias[pc.obias + n + 2u]), C_RND(bias[pc.obias + n + 3u]));
          c_store4(ci, v);
        } else {
          for (uint u = 0; u < CU && n + u < pc.N; ++u) {
            float v = pc.alpha * Cw[woff + e + u];
            if (pc.beta != 0.0) v += pc.beta * C_LD(c[ci + u]);  // beta == 0: c may hold NaN
            if (pc.has_bias != 0u) v += C_RND(bias[pc.obias + n + u]);
            c[ci + u] = C_ST(v);
          }
        }
      }
      SUBGROUP_SYNC();
    }
  // The GELU over the elements this invocation stored, read back (its own writes, through the
  // view it wrote them by): one copy of its code, not one per fragment.
  if (pc.epi != 0u) {
    [[dont_unroll]] for (uint f = 0; f < FRM * FRN; ++f) {
      const uint i = f / FRN, j = f % FRN;
      for (uint e = lane * CU; e < FM * FN; e += lanes * CU) {
        const uint m = m0 + wm + i * FM + e / FN, n = n0 + wn + j * FN + e % FN;
        if (m >= pc.M || n >= pc.N) continue;
        const uint ci = cbase + m * pc.scm + n, cnt = min(CU, pc.N - n);
        const bool whole = VC != 0u && cnt == 4u;
        vec4 x = vec4(0.0), r = vec4(0.0);
        if (whole)
          x = c_load4(ci);
        else
          for (uint u = 0; u < cnt; ++u) x[u] = C_LD(c[ci + u]);
        [[dont_unroll]] for (uint u = 0; u < cnt; ++u) r[u] = epi_value(ci + u, x[u]);
        if (pc.epi == 2u) {
          if (whole)
            c_store4(ci, r);
          else
            for (uint u = 0; u < cnt; ++u) c[ci + u] = C_ST(r[u]);
        }
      }
    }
  }
}
