#version 450
// Fused causal self-attention (core/device.h flash_attention_*) on cooperative matrices: the op
// contract, bindings and push constants of flash_attention.comp (one batch element a dispatch;
// qkv [T, C3] = q (NH heads) | k (NKV heads) | v (NKV heads), out/dout [T, C], lse and the D
// workspace [NH, T] f32; grouped-query heads; lse saved; every output one owner summing in a
// fixed order: no atomics on values, the same bits run after run), for 16-bit tensors
// (H_F16, H_BF16) and head sizes HS that are multiples of 16 up to 128. Every matrix product is a
// sequence of f16 x f16 -> f32 fragment multiply-adds of one subgroup.
//
// One source, two builds (as matmul_coopmat.comp):
//   (default)  VK_KHR_cooperative_matrix: coopmat<> fragments of one subgroup.
//   CM_EMU     the fragment operations done by the lanes through shared memory (lavapipe has no
//              coopmat): a "subgroup" is 32 consecutive invocations, an accumulator fragment is
//              spread over them (element e of lane l is element e*32 + l, row-major). Staging,
//              the f16 rounding of the operands, the fragment offsets and strides, the masks,
//              the softmax passes and the epilogues are the same code in both builds.
//
// Shared memory is one array of 32-bit words (sm): f16 tiles hold two elements a word (the
// fragments load f16 from it, strides in words), f32 tiles one; regions are reused by type.
//
// KHR coopmat gives no per-row access to accumulators: the rows' softmax statistics are computed
// by invocations from score tiles stored to shared memory as f32, and an accumulator's rows are
// scaled by multiplying it element by element with an accumulator holding each row's factor
// (loaded from shared memory with stride 0; element-wise products of two matrices of one type
// are in SPV_KHR_cooperative_matrix).
//   FA_FWD (a block: R = NW * FRM * FM query rows of head h; keys in tiles of KT), one pass:
//     per key tile, S = Q K^T (fragments, stored f32); invocations keep row r's running max m
//     and sum l (scaled scores, keys u <= t only); P = exp(scale S - m) (in [0, 1]) rounded to
//     f16; O = O exp(m_old - m) + P V. At the end out = O / l, lse = m + log l (saved).
//     (Until 2026-11-29, fourteenth session: two passes, the statistics first and then P
//     normalised by lse, Q K^T computed twice: 3 products a key tile instead of 2, K staged
//     twice.)
//   FA_BWD_Q (a block: R query rows of head h; key tiles in order): D = dout . out per row
//     (saved), S = Q K^T, dP = dO V^T, P = exp(scale S - lse), dS = P (dP - D) scale, dQ += dS K.
//   FA_BWD_KV (a block: R key rows of kv head j; for the G query heads of the group in order,
//     query tiles of KT from the block's first row on): S^T = K Q^T, dP^T = V dO^T, P^T, dS^T,
//     dV += P^T dO, dK += dS^T Q.
// f16 rounding of the operands (ct_f32_to_f16: round to nearest even, the same on every device):
//   - P in [0, 1] is rounded as it is (absolute error <= 2^-12, below 2^-14 subnormal, below
//     2^-25 zero; in the forward P's largest of a row is 1, e^0, and the sum it is divided by is
//     of the unrounded P: the weights err by at most 2^-11 of the largest).
//   - dS is scaled by a power of two per tile, 2^k with its largest |dS| in [2^14, 2^15), then
//     rounded (relative error 2^-11 for every element within 2^-28 of the tile's largest; no
//     overflow whatever the loss scale); the product's accumulator is multiplied by 2^-k.
//   - f16 tensors' q, k, v, dout are staged as they are (exact).
//   - bf16 tensors' q, k, v, dout (8 exponent bits, f16 has 5) are staged by the same rule as
//     dS: per staged tile a power of two puts its largest |x| in [2^14, 2^15), so every element
//     within 2^-28 of it is exact in f16 (bf16 has 8 significant bits, f16 11), smaller ones
//     rounded at 2^-24 of the scale -- below fp32 accumulation error for the dot products they
//     join; scores and products are multiplied back exactly. bf16's range and precision go
//     through f16 fragments unharmed (the precision table's fp32 accumulation, 16-bit storage).
// Products accumulate in f32 (the accumulators); statistics, D, masks and exps are f32.
// FA_FWD of the last rows (sampling's key/value cache; flash_attention.comp): out [Tq, C] and
// lse [NH, Tq] hold the positions q0 .. T - 1 only (q0 = T - Tq, in the push block's odo slot).
// The workgroups start at the block holding q0 and compute it whole (the bf16 staging scale of Q
// is the block's, so each row's bits are those of the whole window's run); rows below q0 are
// not stored, row t is stored at t - q0.
//
// Tiles (specialization constants, chosen by the host from the fragment shape and the device's
// shared memory: backends/vulkan/ops/flash_attention.cpp): NW subgroups, each FRM x FM rows of the
// block; KT rows of the streamed operand a step (a multiple of FN and FK); HS the head size.
// Invocation r < R owns row r's statistics (lanes >= FRM * FM, the host checks).

#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#include "common/h16.glsl"
#include "common/math.glsl"
#if !defined(CM_EMU)
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif

layout(constant_id = 1) const uint FM = 16;
layout(constant_id = 2) const uint FN = 16;
layout(constant_id = 3) const uint FK = 16;
layout(constant_id = 4) const uint NW = 2;   // subgroups a workgroup
layout(constant_id = 5) const uint FRM = 1;  // fragment rows a subgroup
layout(constant_id = 6) const uint KT = 32;  // streamed rows a step
layout(constant_id = 7) const uint HS = 64;  // head size
// 1: q, k, v (and dout) staged 8 elements a load (every head slice's rows 16-byte aligned: the
// host's rule); 0: one element a load.
layout(constant_id = 8) const uint VEC = 0;
const uint WR = FRM * FM;  // rows of a subgroup
const uint R = NW * WR;    // rows of the block
const uint LDH = HS + 8;   // f16 elements a row of a staged head slice (16-byte rows)
const uint LDS = KT + 4;   // f32 a row of a score tile
const uint LDP = KT + 8;   // f16 a row of a P / dS tile
const uint NS = KT / FN;   // score fragments across
const uint NO = HS / FN;   // output fragments across

layout(local_size_x_id = 0) in;
// Invocations a row for the forward's row statistics: the workgroup's over its R rows (R is 16
// rows a subgroup, a subgroup 16 to 64 invocations: 1, 2 or 4).
const uint SPLIT = gl_WorkGroupSize.x / R;

// Regions of sm, in words (unused ones empty). Tiles: A, A2 the block's own rows (R), B, B2 the
// streamed ones (KT), S, S2 f32 scores, P, P2 f16 (R x LDP), L, D per streamed (or own) row.
// The host's flash_cm_words() mirrors this layout.
const uint H_A = R * LDH / 2, H_B = KT * LDH / 2, H_S = R * LDS, H_P = R * LDP / 2;
#if defined(FA_FWD)
// W_X, W_Y: the row statistics' partial maxima and sums, R x SPLIT each; W_AL: the rows' rescale
// factors; W_L: the rows' final l.
const uint W_A = 0, W_B = W_A + H_A, W_S = W_B + H_B, W_P = W_S + H_S, W_L = W_P + H_P;
const uint W_AL = W_L + R, W_X = W_AL + R, W_Y = W_X + R * SPLIT, W_M = W_Y + R * SPLIT;
#elif defined(FA_BWD_Q)
const uint W_A = 0, W_A2 = W_A + H_A, W_B = W_A2 + H_A, W_B2 = W_B + H_B, W_S = W_B2 + H_B;
// W_P (the scaled dS as f16) takes dP's region once the first elementwise pass has read dP
// (a barrier between): 48 KiB then hold 4 subgroups at head size 64 (NVIDIA's limit).
const uint W_S2 = W_S + H_S, W_P = W_S2, W_L = W_S2 + H_S, W_D = W_L + R, W_M = W_D + R;
#else
const uint W_A = 0, W_A2 = W_A + H_A, W_B = W_A2 + H_A, W_B2 = W_B + H_B, W_S = W_B2 + H_B;
const uint W_S2 = W_S + H_S, W_P = W_S2 + H_S, W_P2 = W_P + H_P, W_L = W_P2 + H_P;
const uint W_D = W_L + KT, W_M = W_D + KT;
#endif
const uint WORDS = W_M + 4;  // W_M: four words for tile maxima
shared uint sm[WORDS];

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
}
pc;

#if defined(FA_FWD)
layout(std430, binding = 0) writeonly buffer Out { H_T o[]; };
layout(std430, binding = 1) writeonly buffer Lse { float lse[]; };
layout(std430, binding = 2) readonly buffer Qkv { H_T qkv[]; };
layout(std430, binding = 2) readonly buffer Qkv8 { uvec4 qkv8[]; };
#else
layout(std430, binding = 0) buffer DQkv { H_T dqkv[]; };
layout(std430, binding = 1) readonly buffer Lse { float lse[]; };
layout(std430, binding = 2) readonly buffer Qkv { H_T qkv[]; };
layout(std430, binding = 3) readonly buffer DOut { H_T dout[]; };
layout(std430, binding = 2) readonly buffer Qkv8 { uvec4 qkv8[]; };
layout(std430, binding = 3) readonly buffer DOut8 { uvec4 dout8[]; };
layout(std430, binding = 4) readonly buffer Out { H_T o[]; };
layout(std430, binding = 5) buffer Dsave { float dsave[]; };
#endif

uint tid, nt, warp, lane, lanes, wrow;

// Loops the emulated build keeps rolled: lavapipe's LLVM compiles each pipeline cold in CI, and
// unrolled copies of the staging and elementwise loops cost seconds there.
#if defined(CM_EMU)
#define EMU_ROLLED [[dont_unroll]]
#else
#define EMU_ROLLED
#endif

// 2^k putting a largest |x| with these bits in [2^14, 2^15) (NaN, inf: tiny k, they stay so).
float pow2_scale(uint maxbits) {
  return ldexp(1.0, clamp(14 - (int(maxbits >> 23) - 127), -126, 126));
}
// f16 bits of x * s, rounded to nearest even (common/convert.glsl).
uint f16_bits(float x) { return ct_f32_to_f16(x); }
uint pack2(float a, float b) { return f16_bits(a) | (f16_bits(b) << 16); }
// Four f32 words of sm from word w (16-byte reads where w is a multiple of 4), and back; four
// values as two f16 pairs into the words w, w + 1.
vec4 sm4(uint w) { return uintBitsToFloat(uvec4(sm[w], sm[w + 1u], sm[w + 2u], sm[w + 3u])); }
void sm4_store(uint w, vec4 v) {
  sm[w] = floatBitsToUint(v.x);
  sm[w + 1u] = floatBitsToUint(v.y);
  sm[w + 2u] = floatBitsToUint(v.z);
  sm[w + 3u] = floatBitsToUint(v.w);
}
void sm4_put_f16(uint w, vec4 v) {
  sm[w] = pack2(v.x, v.y);
  sm[w + 1u] = pack2(v.z, v.w);
}
// The f16 element e (in f16 units) of sm, widened.
float h16at(uint e) {
  uint w = sm[e >> 1];
  return ct_f16_to_f32((e & 1u) != 0u ? w >> 16 : w & 0xffffu);
}

// Stages n rows from row r0 of a head slice of `buf` (row 0 at `base`, rows `stride` apart) into
// the f16 region at word dw, LDH elements a row; rows past T are zeros. f16: the bits as stored.
// bf16: scaled by a power of two from the tile's largest |x| (slot: which W_M word), returned in
// `sc` (1 for f16). bf16 staging has barriers: call it from uniform control flow. With VEC (the
// host's rule: base and stride multiples of 8, the binding 16-byte aligned) 8 elements a load
// through buf8, `buf`'s uvec4 view; else 2 a step, one element a load.
#define STAGE_ROWS_OF_8(buf8, base, stride, r0, n, body)                               \
  EMU_ROLLED for (uint i_ = tid; i_ < (n) * HS / 8u; i_ += nt) {                      \
    const uint rr_ = i_ / (HS / 8u), c_ = 8u * (i_ % (HS / 8u)), r_ = (r0) + rr_;     \
    const uvec4 v_ = r_ < pc.T ? buf8[((base) + r_ * (stride) + c_) / 8u] : uvec4(0u); \
    const uint o_ = rr_ * (LDH / 2u) + c_ / 2u;                                       \
    body                                                                              \
  }
#if defined(H_BF16)
// bf16 elements of v_ (8, two a word) times s_, as f16 pairs: by packHalf2x16 where every value
// is exact in f16 whatever the conversion's rounding (|x| >= 2^-14, or 0), else pack2's rounding.
#define PUT8_BF16(dw)                                                                      \
  {                                                                                       \
    float x_[8];                                                                          \
    bool ex_ = true;                                                                      \
    EMU_ROLLED for (uint e_ = 0u; e_ < 8u; ++e_) {                                        \
      const uint h_ = (v_[e_ >> 1u] >> (16u * (e_ & 1u))) & 0xffffu;                      \
      x_[e_] = uintBitsToFloat(h_ << 16) * s_;                                            \
      ex_ = ex_ && (abs(x_[e_]) >= 6.103515625e-05 || x_[e_] == 0.0);                     \
    }                                                                                     \
    EMU_ROLLED for (uint q_ = 0u; q_ < 4u; ++q_)                                          \
      sm[(dw) + o_ + q_] = ex_ ? packHalf2x16(vec2(x_[2u * q_], x_[2u * q_ + 1u]))         \
                              : pack2(x_[2u * q_], x_[2u * q_ + 1u]);                     \
  }
#define STAGE(buf, buf8, base, stride, r0, n, dw, slot, sc)                                \
  {                                                                                       \
    uint mb_ = 0u;                                                                        \
    if (VEC != 0u) {                                                                      \
      STAGE_ROWS_OF_8(buf8, base, stride, r0, n, {                                        \
        EMU_ROLLED for (uint q_ = 0u; q_ < 4u; ++q_)                                      \
          mb_ = max(mb_, max(v_[q_] & 0x7fffu, (v_[q_] >> 16) & 0x7fffu) << 16);          \
      })                                                                                  \
    } else {                                                                              \
      EMU_ROLLED for (uint i_ = tid; i_ < (n) * HS; i_ += nt) {                           \
        uint r_ = (r0) + i_ / HS;                                                         \
        if (r_ < pc.T)                                                                    \
          mb_ = max(mb_, floatBitsToUint(abs(h_load(buf[(base) + r_ * (stride) + i_ % HS])))); \
      }                                                                                   \
    }                                                                                     \
    barrier();                                                                            \
    if (tid == 0u) sm[W_M + (slot)] = 0u;                                                 \
    barrier();                                                                            \
    atomicMax(sm[W_M + (slot)], mb_);                                                     \
    barrier();                                                                            \
    const float s_ = pow2_scale(sm[W_M + (slot)]);                                        \
    if (VEC != 0u) {                                                                      \
      STAGE_ROWS_OF_8(buf8, base, stride, r0, n, PUT8_BF16(dw))                            \
    } else {                                                                              \
      EMU_ROLLED for (uint i_ = tid; i_ < (n) * HS / 2u; i_ += nt) {                      \
        uint rr_ = i_ / (HS / 2u), c_ = 2u * (i_ % (HS / 2u)), r_ = (r0) + rr_;           \
        uint g_ = (base) + r_ * (stride) + c_;                                            \
        sm[(dw) + rr_ * (LDH / 2u) + c_ / 2u] =                                            \
            r_ < pc.T ? pack2(h_load(buf[g_]) * s_, h_load(buf[g_ + 1u]) * s_) : 0u;      \
      }                                                                                   \
    }                                                                                     \
    sc = s_;                                                                              \
  }
#else
#define STAGE(buf, buf8, base, stride, r0, n, dw, slot, sc)                                \
  {                                                                                       \
    if (VEC != 0u) {                                                                      \
      STAGE_ROWS_OF_8(buf8, base, stride, r0, n, {                                        \
        sm[(dw) + o_] = v_.x;                                                              \
        sm[(dw) + o_ + 1u] = v_.y;                                                         \
        sm[(dw) + o_ + 2u] = v_.z;                                                         \
        sm[(dw) + o_ + 3u] = v_.w;                                                         \
      })                                                                                  \
    } else {                                                                              \
      EMU_ROLLED for (uint i_ = tid; i_ < (n) * HS / 2u; i_ += nt) {                      \
        uint rr_ = i_ / (HS / 2u), c_ = 2u * (i_ % (HS / 2u)), r_ = (r0) + rr_;           \
        uint g_ = (base) + r_ * (stride) + c_;                                            \
        sm[(dw) + rr_ * (LDH / 2u) + c_ / 2u] =                                            \
            r_ < pc.T ? uint(buf[g_]) | (uint(buf[g_ + 1u]) << 16) : 0u;                  \
      }                                                                                   \
    }                                                                                     \
    sc = 1.0;                                                                             \
  }
#endif

// ---- fragment operations: coopmat, or their shared-memory emulation -------------------------
// SCORES(dst, wa, wb): this subgroup's rows of the R x KT f32 tile at word dst (LDS a row) =
//   A (rows of the f16 region at wa, R x HS) times B^T (the f16 region at wb, KT x HS: B(k, n)
//   = wb's row n, element k; a column-major B).
// ACCUM(acc, wa, wb, f): acc (this subgroup's FRM x NO fragments of an R x HS product) +=
//   (A (the R x KT f16 tile at wa, LDP a row) times B (the KT x HS f16 tile at wb)) * f.
// STORE_ACC(acc, i, j): fragment (i, j) of acc to the subgroup's rows of the f32 tile W_S.
#if defined(CM_EMU)
#define LANES 32u
const uint EPL = FM * FN / 32u;  // accumulator elements per lane
#define ACC_DECL(name, nfrag) float name[(nfrag) * EPL]
#define ACC_ZERO(name, nfrag) \
  [[dont_unroll]] for (uint e_ = 0u; e_ < (nfrag) * EPL; ++e_) name[e_] = 0.0
#define SCORES(dst, wa, wb)                                                                  \
  [[dont_unroll]] for (uint i_ = 0u; i_ < FRM; ++i_)                                               \
    [[dont_unroll]] for (uint j_ = 0u; j_ < NS; ++j_)                                              \
      [[dont_unroll]] for (uint e_ = 0u; e_ < EPL; ++e_) {                                         \
        uint x_ = e_ * LANES + lane, r_ = wrow + i_ * FM + x_ / FN, c_ = j_ * FN + x_ % FN;  \
        float s_ = 0.0;                                                                      \
        [[dont_unroll]] for (uint k_ = 0u; k_ < HS; ++k_)                                    \
          s_ += h16at(2u * (wa) + r_ * LDH + k_) * h16at(2u * (wb) + c_ * LDH + k_);         \
        sm[(dst) + r_ * LDS + c_] = floatBitsToUint(s_);                                     \
      }
#define ACCUM(acc, wa, wb, f)                                                                \
  [[dont_unroll]] for (uint i_ = 0u; i_ < FRM; ++i_)                                               \
    [[dont_unroll]] for (uint j_ = 0u; j_ < NO; ++j_)                                              \
      [[dont_unroll]] for (uint e_ = 0u; e_ < EPL; ++e_) {                                         \
        uint x_ = e_ * LANES + lane, r_ = wrow + i_ * FM + x_ / FN, c_ = j_ * FN + x_ % FN;  \
        float s_ = 0.0;                                                                      \
        [[dont_unroll]] for (uint k_ = 0u; k_ < KT; ++k_)                                    \
          s_ += h16at(2u * (wa) + r_ * LDP + k_) * h16at(2u * (wb) + k_ * LDH + c_);         \
        acc[(i_ * NO + j_) * EPL + e_] += s_ * (f);                                          \
      }
#define STORE_ACC(acc, i, j)                                                      \
  [[dont_unroll]] for (uint e_ = 0u; e_ < EPL; ++e_) {                                            \
    uint x_ = e_ * LANES + lane;                                                  \
    sm[W_S + (wrow + (i) * FM + x_ / FN) * LDS + x_ % FN] =                       \
        floatBitsToUint(acc[((i) * NO + (j)) * EPL + e_]);                        \
  }
// RESCALE_ROWS(acc, w): row r of the block's accumulators (FRM x NO fragments) times the f32
//   sm[w + r].
#define RESCALE_ROWS(acc, w)                                                                 \
  [[dont_unroll]] for (uint i_ = 0u; i_ < FRM; ++i_)                                         \
    [[dont_unroll]] for (uint j_ = 0u; j_ < NO; ++j_)                                        \
      [[dont_unroll]] for (uint e_ = 0u; e_ < EPL; ++e_)                                     \
        acc[(i_ * NO + j_) * EPL + e_] *=                                                    \
            uintBitsToFloat(sm[(w) + wrow + i_ * FM + (e_ * LANES + lane) / FN]);
#else
#define ACC_T coopmat<float, gl_ScopeSubgroup, FM, FN, gl_MatrixUseAccumulator>
#define FRAG_A coopmat<float16_t, gl_ScopeSubgroup, FM, FK, gl_MatrixUseA>
#define FRAG_B coopmat<float16_t, gl_ScopeSubgroup, FK, FN, gl_MatrixUseB>
#define ACC_DECL(name, nfrag) ACC_T name[nfrag]
#define ACC_ZERO(name, nfrag) \
  [[unroll]] for (uint f_ = 0u; f_ < (nfrag); ++f_) name[f_] = ACC_T(0.0)
#define SCORES(dst, wa, wb)                                                                   \
  {                                                                                           \
    ACC_T s_[FRM * NS];                                                                       \
    [[unroll]] for (uint f_ = 0u; f_ < FRM * NS; ++f_) s_[f_] = ACC_T(0.0);                   \
    [[unroll]] for (uint k_ = 0u; k_ < HS; k_ += FK) {                                        \
      FRAG_A a_[FRM];                                                                         \
      [[unroll]] for (uint i_ = 0u; i_ < FRM; ++i_)                                           \
        coopMatLoad(a_[i_], sm, (wa) + ((wrow + i_ * FM) * LDH + k_) / 2u, LDH / 2u,          \
                    gl_CooperativeMatrixLayoutRowMajor);                                      \
      [[unroll]] for (uint j_ = 0u; j_ < NS; ++j_) {                                          \
        FRAG_B b_;                                                                            \
        coopMatLoad(b_, sm, (wb) + (j_ * FN * LDH + k_) / 2u, LDH / 2u,                       \
                    gl_CooperativeMatrixLayoutColumnMajor);                                   \
        [[unroll]] for (uint i_ = 0u; i_ < FRM; ++i_)                                         \
          s_[i_ * NS + j_] = coopMatMulAdd(a_[i_], b_, s_[i_ * NS + j_]);                     \
      }                                                                                       \
    }                                                                                         \
    [[unroll]] for (uint i_ = 0u; i_ < FRM; ++i_)                                             \
      [[unroll]] for (uint j_ = 0u; j_ < NS; ++j_)                                            \
        coopMatStore(s_[i_ * NS + j_], sm, (dst) + (wrow + i_ * FM) * LDS + j_ * FN, LDS,     \
                     gl_CooperativeMatrixLayoutRowMajor);                                     \
  }
#define ACCUM(acc, wa, wb, f)                                                                 \
  [[unroll]] for (uint j_ = 0u; j_ < NO; ++j_) {                                              \
    ACC_T t_[FRM];                                                                            \
    [[unroll]] for (uint i_ = 0u; i_ < FRM; ++i_) t_[i_] = ACC_T(0.0);                        \
    [[unroll]] for (uint k_ = 0u; k_ < KT; k_ += FK) {                                        \
      FRAG_B b_;                                                                              \
      coopMatLoad(b_, sm, (wb) + (k_ * LDH + j_ * FN) / 2u, LDH / 2u,                         \
                  gl_CooperativeMatrixLayoutRowMajor);                                        \
      [[unroll]] for (uint i_ = 0u; i_ < FRM; ++i_) {                                         \
        FRAG_A a_;                                                                            \
        coopMatLoad(a_, sm, (wa) + ((wrow + i_ * FM) * LDP + k_) / 2u, LDP / 2u,              \
                    gl_CooperativeMatrixLayoutRowMajor);                                      \
        t_[i_] = coopMatMulAdd(a_, b_, t_[i_]);                                               \
      }                                                                                       \
    }                                                                                         \
    [[unroll]] for (uint i_ = 0u; i_ < FRM; ++i_) acc[i_ * NO + j_] += t_[i_] * (f);          \
  }
// The factors as an accumulator fragment: a column-major load with stride 0 gives element
// (r, c) the word at w + first row + r (SPV_KHR_cooperative_matrix allows a load stride of 0), and
// the product of two accumulators of one type is element by element.
#define RESCALE_ROWS(acc, w)                                                                \
  [[unroll]] for (uint i_ = 0u; i_ < FRM; ++i_) {                                           \
    ACC_T al_;                                                                              \
    coopMatLoad(al_, sm, (w) + wrow + i_ * FM, 0u, gl_CooperativeMatrixLayoutColumnMajor);  \
    [[unroll]] for (uint j_ = 0u; j_ < NO; ++j_) acc[i_ * NO + j_] = acc[i_ * NO + j_] * al_; \
  }
#define STORE_ACC(acc, i, j)                                                                \
  coopMatStore(acc[(i) * NO + (j)], sm, W_S + (wrow + (i) * FM) * LDS, LDS,                 \
               gl_CooperativeMatrixLayoutRowMajor)
#endif

// The epilogue: acc's fragments through the subgroup's rows of W_S (f32) into `buf`: rows
// row = first + r with lo <= row < T, element `base + (row - lo) * stride + column`, divided by
// `div` (an expression of the block's row rr_; 1.0 for none), rounded to the 16-bit type.
#define EPILOGUE(acc, buf, base, stride, first, lo, div)                               \
  EMU_ROLLED for (uint fi_ = 0u; fi_ < FRM; ++fi_)                                              \
    EMU_ROLLED for (uint fj_ = 0u; fj_ < NO; ++fj_) {                                          \
      STORE_ACC(acc, fi_, fj_);                                                        \
      barrier();                                                                       \
      EMU_ROLLED for (uint fe_ = lane; fe_ < FM * FN; fe_ += lanes) {                          \
        uint rr_ = wrow + fi_ * FM + fe_ / FN, row_ = (first) + rr_;                   \
        if (row_ >= (lo) && row_ < pc.T)                                               \
          buf[(base) + (row_ - (lo)) * (stride) + fj_ * FN + fe_ % FN] =               \
              h_store(uintBitsToFloat(sm[W_S + rr_ * LDS + fe_ % FN]) / (div));        \
      }                                                                                \
      barrier();                                                                       \
    }

void main() {
  const uint T = pc.T, C = pc.C, G = pc.NH / pc.NKV;
  const uint C3 = C + 2u * pc.NKV * HS, VO = C + pc.NKV * HS;  // VO: where v starts in a row
#if defined(FA_FWD)
  const uint q0 = pc.odo, Tq = T - q0;             // the rows stored: q0 .. T - 1
  const uint first = (q0 / R + gl_WorkGroupID.x) * R;  // the block's first row
#else
  const uint first = gl_WorkGroupID.x * R;  // the block's first row
#endif
  const uint last = min(first + R, T) - 1u;
  tid = gl_LocalInvocationIndex;
  nt = gl_WorkGroupSize.x;
#if defined(CM_EMU)
  warp = tid / LANES;
  lane = tid % LANES;
  lanes = LANES;
#else
  warp = gl_SubgroupID;
  lane = gl_SubgroupInvocationID;
  lanes = gl_SubgroupSize;
#endif
  wrow = warp * WR;

#if defined(FA_FWD)
  const uint h = gl_WorkGroupID.y;
  const uint qbase = pc.oqkv + h * HS, kbase = pc.oqkv + C + (h / G) * HS;
  const uint vbase = pc.oqkv + VO + (h / G) * HS;
  float sq, sk, sv;
  STAGE(qkv, qkv8, qbase, C3, first, R, W_A, 0u, sq)
  // One pass over the key tiles (FlashAttention-2's order): SPLIT invocations a row (row
  // first + r1, r1 = tid / SPLIT; part p of them takes the tile's column pairs p, p + SPLIT, ...).
  // Per tile: the row's running maximum m' = max(m, the tile's scaled scores over keys u <= t),
  // P = exp(scale S - m') rounded to f16 (in [0, 1]), l = l exp(m - m') + sum P (f32, before the
  // rounding), and O = O exp(m - m') + P V: the rescale multiplies each accumulator fragment
  // element by element by one loaded from W_AL with stride 0 (row r's factor in every column).
  // The partial maxima and sums are combined in the order p = 0, 1, ... (W_X, W_Y); every part
  // holds the same m and l. At the end O / l and lse = m + log l.
  const uint r1 = tid / SPLIT, part = tid % SPLIT, t = first + r1;
  const bool own = r1 < R && t < T;
  float m = -CT_FLT_MAX, l = 0.0;  // finite start: exp(m - m') is 0, not NaN, at the first key
  ACC_DECL(acc, FRM * NO);
  ACC_ZERO(acc, FRM * NO);
  for (uint u0 = 0u; u0 <= last; u0 += KT) {
    STAGE(qkv, qkv8, kbase, C3, u0, KT, W_B, 1u, sk)
    barrier();
    SCORES(W_S, W_A, W_B)
    barrier();  // K is no longer read: V takes its place while the rows' statistics go on
    STAGE(qkv, qkv8, vbase, C3, u0, KT, W_B, 2u, sv)
    const float f = pc.scale / (sq * sk);
    // Four columns a step, c = 4 part, 4 (part + SPLIT), ... (16-byte reads of S); a tile whose
    // keys all precede the block's first row needs no mask (`whole`: most of them).
    const bool whole = u0 + KT <= first;  // keys u0 .. u0 + KT - 1 < first <= every row
    float mt = -CT_FLT_MAX;
    if (own) {
      EMU_ROLLED for (uint c = 4u * part; c < KT && u0 + c <= t; c += 4u * SPLIT) {
        const uint w = W_S + r1 * LDS + c;
        const vec4 sc = sm4(w) * f;
        if (whole || u0 + c + 3u <= t) {
          mt = max(mt, max(max(sc.x, sc.y), max(sc.z, sc.w)));
        } else {
          mt = max(mt, sc.x);  // u0 + c <= t: the loop's condition
          if (u0 + c + 1u <= t) mt = max(mt, sc.y);
          if (u0 + c + 2u <= t) mt = max(mt, sc.z);
        }
      }
    }
    if (r1 < R) sm[W_X + tid] = floatBitsToUint(mt);
    barrier();
    float mn = m;
    if (r1 < R) {
      EMU_ROLLED for (uint q = 0u; q < SPLIT; ++q)
        mn = max(mn, uintBitsToFloat(sm[W_X + r1 * SPLIT + q]));
    }
    float ls = 0.0;
    if (r1 < R) {
      EMU_ROLLED for (uint c = 4u * part; c < KT; c += 4u * SPLIT) {
        const uint u = u0 + c, w = W_S + r1 * LDS + c;
        const vec4 sc = sm4(w) * f;
        vec4 pv;
        if (own && (whole || u + 3u <= t)) {
          pv = vec4(ct_exp_le0(sc.x - mn), ct_exp_le0(sc.y - mn), ct_exp_le0(sc.z - mn),
                    ct_exp_le0(sc.w - mn));
        } else {
          pv = vec4(own && u <= t ? ct_exp_le0(sc.x - mn) : 0.0,
                    own && u + 1u <= t ? ct_exp_le0(sc.y - mn) : 0.0,
                    own && u + 2u <= t ? ct_exp_le0(sc.z - mn) : 0.0, 0.0);
        }
        ls += (pv.x + pv.y) + (pv.z + pv.w);
        sm4_put_f16(W_P + r1 * (LDP / 2u) + c / 2u, pv);
      }
      sm[W_Y + tid] = floatBitsToUint(ls);
      if (part == 0u) sm[W_AL + r1] = floatBitsToUint(ct_exp_le0(m - mn));
    }
    barrier();  // P, its row sums, the rescale factors and V are in place
    if (r1 < R) {
      float sum = 0.0;
      EMU_ROLLED for (uint q = 0u; q < SPLIT; ++q) sum += uintBitsToFloat(sm[W_Y + r1 * SPLIT + q]);
      l = l * ct_exp_le0(m - mn) + sum;
      m = mn;
    }
    RESCALE_ROWS(acc, W_AL)
    ACCUM(acc, W_P, W_B, 1.0 / sv)
    barrier();
  }
  if (r1 < R && part == 0u) {
    if (t >= q0 && t < T) lse[pc.olse + h * Tq + t - q0] = m + log(l);
    sm[W_L + r1] = floatBitsToUint(t < T ? l : 1.0);  // rows past T: never stored
  }
  barrier();
  EPILOGUE(acc, o, pc.oo + h * HS, C, first, q0, uintBitsToFloat(sm[W_L + rr_]))

#elif defined(FA_BWD_Q)
  const uint h = gl_WorkGroupID.y;
  const uint qbase = pc.oqkv + h * HS, kbase = pc.oqkv + C + (h / G) * HS;
  const uint vbase = pc.oqkv + VO + (h / G) * HS;
  float sq, sd, sk, sv;
  STAGE(qkv, qkv8, qbase, C3, first, R, W_A, 0u, sq)
  STAGE(dout, dout8, pc.odo + h * HS, C, first, R, W_A2, 1u, sd)
  if (tid < R) {
    const uint t = first + tid;
    float D = 0.0, L = 0.0;
    if (t < T) {
      EMU_ROLLED for (uint i = 0u; i < HS; ++i)
        D += h_load(dout[pc.odo + t * C + h * HS + i]) * h_load(o[pc.oout + t * C + h * HS + i]);
      dsave[pc.od + h * T + t] = D;
      L = lse[pc.olse + h * T + t];
    }
    sm[W_L + tid] = floatBitsToUint(L);
    sm[W_D + tid] = floatBitsToUint(D);
  }
  ACC_DECL(acc, FRM * NO);
  ACC_ZERO(acc, FRM * NO);
  for (uint u0 = 0u; u0 <= last; u0 += KT) {
    STAGE(qkv, qkv8, kbase, C3, u0, KT, W_B, 2u, sk)
    STAGE(qkv, qkv8, vbase, C3, u0, KT, W_B2, 3u, sv)
    if (tid == 0u) sm[W_M] = 0u;  // the dS tile's max (slot 0: Q's was read long ago)
    barrier();
    SCORES(W_S, W_A, W_B)     // S = Q K^T
    SCORES(W_S2, W_A2, W_B2)  // dP = dO V^T
    barrier();
    const float fs = pc.scale / (sq * sk), fp = 1.0 / (sd * sv);
    // Four columns of a row a step (16-byte reads of S and dP); no mask on a key tile whose keys
    // all precede the block's first row.
    const bool whole = u0 + KT <= first;
    uint mb = 0u;
    EMU_ROLLED for (uint i = tid; i < R * KT / 4u; i += nt) {
      const uint r = i / (KT / 4u), c = 4u * (i % (KT / 4u)), tr = first + r, u = u0 + c;
      const float Lr = uintBitsToFloat(sm[W_L + r]), Dr = uintBitsToFloat(sm[W_D + r]);
      const uint ws = W_S + r * LDS + c, wd = W_S2 + r * LDS + c;
      const vec4 sc = sm4(ws) * fs;
      const vec4 dp = sm4(wd) * fp;
      vec4 p;
      if (tr < T && (whole || u + 3u <= tr)) {
        p = vec4(ct_exp_le0(sc.x - Lr), ct_exp_le0(sc.y - Lr), ct_exp_le0(sc.z - Lr),
                 ct_exp_le0(sc.w - Lr));
      } else {
        p = vec4(tr < T && u <= tr ? ct_exp_le0(sc.x - Lr) : 0.0,
                 tr < T && u + 1u <= tr ? ct_exp_le0(sc.y - Lr) : 0.0,
                 tr < T && u + 2u <= tr ? ct_exp_le0(sc.z - Lr) : 0.0,
                 tr < T && u + 3u <= tr ? ct_exp_le0(sc.w - Lr) : 0.0);
      }
      const vec4 ds = p * (dp - Dr) * pc.scale;
      sm4_store(ws, ds);
      const uvec4 mbs = floatBitsToUint(abs(ds));
      mb = max(mb, max(max(mbs.x, mbs.y), max(mbs.z, mbs.w)));
    }
    atomicMax(sm[W_M], mb);
    barrier();
    const float sds = pow2_scale(sm[W_M]);
    EMU_ROLLED for (uint i = tid; i < R * KT / 4u; i += nt) {
      const uint r = i / (KT / 4u), c = 4u * (i % (KT / 4u)), ws = W_S + r * LDS + c;
      const vec4 ds = sm4(ws) * sds;
      sm4_put_f16(W_P + r * (LDP / 2u) + c / 2u, ds);
    }
    barrier();
    ACCUM(acc, W_P, W_B, 1.0 / (sds * sk))  // dQ += dS K
    barrier();
  }
  EPILOGUE(acc, dqkv, pc.oo + h * HS, C3, first, 0u, 1.0)

#else  // FA_BWD_KV: the block's rows are keys u = first + r of kv head j
  const uint j = gl_WorkGroupID.y;
  float sk, sv, sq, sd;
  STAGE(qkv, qkv8, pc.oqkv + C + j * HS, C3, first, R, W_A, 0u, sk)
  STAGE(qkv, qkv8, pc.oqkv + VO + j * HS, C3, first, R, W_A2, 1u, sv)
  ACC_DECL(dk, FRM * NO);
  ACC_DECL(dv, FRM * NO);
  ACC_ZERO(dk, FRM * NO);
  ACC_ZERO(dv, FRM * NO);
  for (uint g = 0u; g < G; ++g) {
    const uint h = j * G + g;  // query head
    for (uint t0 = first; t0 < T; t0 += KT) {
      STAGE(qkv, qkv8, pc.oqkv + h * HS, C3, t0, KT, W_B, 2u, sq)
      STAGE(dout, dout8, pc.odo + h * HS, C, t0, KT, W_B2, 3u, sd)
      for (uint c = tid; c < KT; c += nt) {
        uint tq = t0 + c;
        sm[W_L + c] = floatBitsToUint(tq < T ? lse[pc.olse + h * T + tq] : 0.0);
        sm[W_D + c] = floatBitsToUint(tq < T ? dsave[pc.od + h * T + tq] : 0.0);
      }
      if (tid == 0u) sm[W_M] = 0u;
      barrier();
      SCORES(W_S, W_A, W_B)     // S^T = K Q^T
      SCORES(W_S2, W_A2, W_B2)  // dP^T = V dO^T
      barrier();
      const float fs = pc.scale / (sk * sq), fp = 1.0 / (sv * sd);
      // Four columns (queries) of a row (key) a step; no mask where every query of the tile
      // comes at or after every key of the block and all of them are inside T.
      const bool whole = t0 + 1u >= first + R && t0 + KT <= T && first + R <= T;
      uint mb = 0u;
      EMU_ROLLED for (uint i = tid; i < R * KT / 4u; i += nt) {
        const uint r = i / (KT / 4u), c = 4u * (i % (KT / 4u)), u = first + r, tq = t0 + c;
        const uint ws = W_S + r * LDS + c, wd = W_S2 + r * LDS + c;
        const vec4 sc = sm4(ws) * fs;
        const vec4 dp = sm4(wd) * fp;
        const vec4 L4 = sm4(W_L + c), D4 = sm4(W_D + c);
        vec4 p;
        if (whole) {
          p = vec4(ct_exp_le0(sc.x - L4.x), ct_exp_le0(sc.y - L4.y), ct_exp_le0(sc.z - L4.z),
                   ct_exp_le0(sc.w - L4.w));
        } else {
          p = vec4(u < T && tq < T && tq >= u ? ct_exp_le0(sc.x - L4.x) : 0.0,
                   u < T && tq + 1u < T && tq + 1u >= u ? ct_exp_le0(sc.y - L4.y) : 0.0,
                   u < T && tq + 2u < T && tq + 2u >= u ? ct_exp_le0(sc.z - L4.z) : 0.0,
                   u < T && tq + 3u < T && tq + 3u >= u ? ct_exp_le0(sc.w - L4.w) : 0.0);
        }
        const vec4 ds = p * (dp - D4) * pc.scale;
        sm4_store(ws, ds);
        const uvec4 mbs = floatBitsToUint(abs(ds));
        mb = max(mb, max(max(mbs.x, mbs.y), max(mbs.z, mbs.w)));
        sm4_put_f16(W_P + r * (LDP / 2u) + c / 2u, p);
      }
      atomicMax(sm[W_M], mb);
      barrier();
      const float sds = pow2_scale(sm[W_M]);
      EMU_ROLLED for (uint i = tid; i < R * KT / 4u; i += nt) {
        const uint r = i / (KT / 4u), c = 4u * (i % (KT / 4u)), ws = W_S + r * LDS + c;
        const vec4 ds = sm4(ws) * sds;
        sm4_put_f16(W_P2 + r * (LDP / 2u) + c / 2u, ds);
      }
      barrier();
      ACCUM(dv, W_P, W_B2, 1.0 / sd)          // dV += P^T dO
      ACCUM(dk, W_P2, W_B, 1.0 / (sds * sq))  // dK += dS^T Q
      barrier();
    }
  }
  EPILOGUE(dk, dqkv, pc.oo + C + j * HS, C3, first, 0u, 1.0)
  EPILOGUE(dv, dqkv, pc.oo + VO + j * HS, C3, first, 0u, 1.0)
#endif
}
