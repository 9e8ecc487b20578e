// AVX-512 register-blocked micro-kernel for attention's small products (inner dimension hs, or
// up to T for the probability products), where OpenBLAS's sgemm pays packing and call overhead
// on tiles of a few dozen rows.
//   c[r, 0:w] (=) sum_k A(r, k) b[k, 0:w],  A(r, k) = a[r * ars + k * aks],  r < R, w <= 16 NV
// A's strides are free, so the same kernel takes A or A^T. Each accumulator sums k in order, in
// fp32 (like sgemm), so results are deterministic.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace ct::cpu::fast::CT_CPU_ISA::attn {

// Accumulators are named variables, not an array: GCC keeps a __m512 acc[R][NV] array in
// registers but also stores it to the stack on every iteration.
#define CT_ATTN_ROW_DECL(r) \
  __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = c##r##0, c##r##2 = c##r##0, c##r##3 = c##r##0;
#define CT_ATTN_ROW_FMA(r)                                            \
  if constexpr (R > r) {                                              \
    __m512 av = _mm512_set1_ps(a[r * ars]);                           \
    c##r##0 = _mm512_fmadd_ps(av, b0, c##r##0);                       \
    if constexpr (NV > 1) c##r##1 = _mm512_fmadd_ps(av, b1, c##r##1); \
    if constexpr (NV > 2) c##r##2 = _mm512_fmadd_ps(av, b2, c##r##2); \
    if constexpr (NV > 3) c##r##3 = _mm512_fmadd_ps(av, b3, c##r##3); \
  }
#define CT_ATTN_ROW_STORE(r)                                              \
  if constexpr (R > r) {                                                  \
    float* cr = c + r * ldc;                                              \
    if constexpr (NV == 1) _mm512_mask_storeu_ps(cr, last, c##r##0);      \
    if constexpr (NV > 1) _mm512_storeu_ps(cr, c##r##0);                  \
    if constexpr (NV == 2) _mm512_mask_storeu_ps(cr + 16, last, c##r##1); \
    if constexpr (NV > 2) _mm512_storeu_ps(cr + 16, c##r##1);             \
    if constexpr (NV == 3) _mm512_mask_storeu_ps(cr + 32, last, c##r##2); \
    if constexpr (NV > 3) _mm512_storeu_ps(cr + 32, c##r##2);             \
    if constexpr (NV == 4) _mm512_mask_storeu_ps(cr + 48, last, c##r##3); \
  }

#define CT_ATTN_ROW_LOAD(r)                                                \
  if constexpr (R > r) {                                                   \
    const float* cr = c + r * ldc;                                         \
    if constexpr (NV == 1) c##r##0 = _mm512_maskz_loadu_ps(last, cr);      \
    if constexpr (NV > 1) c##r##0 = _mm512_loadu_ps(cr);                   \
    if constexpr (NV == 2) c##r##1 = _mm512_maskz_loadu_ps(last, cr + 16); \
    if constexpr (NV > 2) c##r##1 = _mm512_loadu_ps(cr + 16);              \
    if constexpr (NV == 3) c##r##2 = _mm512_maskz_loadu_ps(last, cr + 32); \
    if constexpr (NV > 3) c##r##2 = _mm512_loadu_ps(cr + 32);              \
    if constexpr (NV == 4) c##r##3 = _mm512_maskz_loadu_ps(last, cr + 48); \
  }

// One row of macro statements per line (the formatter would run them together).
// clang-format off
// ACC: c (+)= instead of (=).
template <int R, int NV, bool ACC>
inline void micro(int64_t K, const float* a, int64_t ars, int64_t aks, const float* b,
                  int64_t ldb, float* c, int64_t ldc, __mmask16 last) {
  static_assert(R >= 1 && R <= 6 && NV >= 1 && NV <= 4);
  CT_ATTN_ROW_DECL(0) CT_ATTN_ROW_DECL(1) CT_ATTN_ROW_DECL(2)
  CT_ATTN_ROW_DECL(3) CT_ATTN_ROW_DECL(4) CT_ATTN_ROW_DECL(5)
  if constexpr (ACC) {
    CT_ATTN_ROW_LOAD(0) CT_ATTN_ROW_LOAD(1) CT_ATTN_ROW_LOAD(2)
    CT_ATTN_ROW_LOAD(3) CT_ATTN_ROW_LOAD(4) CT_ATTN_ROW_LOAD(5)
  }
  for (int64_t k = 0; k < K; ++k) {
    __m512 b0, b1 = _mm512_setzero_ps(), b2 = b1, b3 = b1;
    if constexpr (NV == 1) b0 = _mm512_maskz_loadu_ps(last, b);
    if constexpr (NV > 1) b0 = _mm512_loadu_ps(b);
    if constexpr (NV == 2) b1 = _mm512_maskz_loadu_ps(last, b + 16);
    if constexpr (NV > 2) b1 = _mm512_loadu_ps(b + 16);
    if constexpr (NV == 3) b2 = _mm512_maskz_loadu_ps(last, b + 32);
    if constexpr (NV > 3) b2 = _mm512_loadu_ps(b + 32);
    if constexpr (NV == 4) b3 = _mm512_maskz_loadu_ps(last, b + 48);
    CT_ATTN_ROW_FMA(0) CT_ATTN_ROW_FMA(1) CT_ATTN_ROW_FMA(2)
    CT_ATTN_ROW_FMA(3) CT_ATTN_ROW_FMA(4) CT_ATTN_ROW_FMA(5)
    a += aks;
    b += ldb;
  }
  CT_ATTN_ROW_STORE(0) CT_ATTN_ROW_STORE(1) CT_ATTN_ROW_STORE(2)
  CT_ATTN_ROW_STORE(3) CT_ATTN_ROW_STORE(4) CT_ATTN_ROW_STORE(5)
}

// clang-format on

#undef CT_ATTN_ROW_DECL
#undef CT_ATTN_ROW_LOAD
#undef CT_ATTN_ROW_FMA
#undef CT_ATTN_ROW_STORE

using MicroFn = void (*)(int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*,
                         int64_t, __mmask16);

constexpr int kRows = 6;  // 6 rows x 4 vectors: 24 accumulators of the 32 zmm registers

template <int R, bool ACC>
constexpr MicroFn pick(int nv) {
  return nv == 1   ? micro<R, 1, ACC>
         : nv == 2 ? micro<R, 2, ACC>
         : nv == 3 ? micro<R, 3, ACC>
                   : micro<R, 4, ACC>;
}

template <bool ACC>
constexpr MicroFn pick(int R, int nv) {
  return R == 6   ? pick<6, ACC>(nv)
         : R == 5 ? pick<5, ACC>(nv)
         : R == 4 ? pick<4, ACC>(nv)
         : R == 3 ? pick<3, ACC>(nv)
         : R == 2 ? pick<2, ACC>(nv)
                  : pick<1, ACC>(nv);
}

// c[0:R, 0:W] (=) A[0:R, 0:K] b[0:K, 0:W] ((+)= with acc), R <= kRows, any W (column tiles of
// 64).
inline void tile(int R, int64_t W, int64_t K, const float* a, int64_t ars, int64_t aks,
                 const float* b, int64_t ldb, float* c, int64_t ldc, bool acc = false) {
  for (int64_t w0 = 0; w0 < W; w0 += 64) {
    int64_t w = W - w0 < 64 ? W - w0 : 64;
    int nv = static_cast<int>((w + 15) / 16);
    int rem = static_cast<int>(w - 16 * (nv - 1));
    __mmask16 last = static_cast<__mmask16>((1u << rem) - 1u);
    MicroFn f = acc ? pick<true>(R, nv) : pick<false>(R, nv);
    f(K, a, ars, aks, b + w0, ldb, c + w0, ldc, last);
  }
}

// Horizontal sum / max. GCC 12's unmasked min/max/shuffle intrinsics (and _mm512_reduce_*) pass
// an undefined source and trip -Wmaybe-uninitialized, hence the all-ones masked forms here.
template <bool kMax>
inline float reduce16(__m512 v) {
  auto op = [](__m512 x, __m512 y) {
    return kMax ? _mm512_mask_max_ps(x, 0xFFFF, x, y) : _mm512_add_ps(x, y);
  };
  v = op(v, _mm512_mask_shuffle_f32x4(v, 0xFFFF, v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = op(v, _mm512_mask_shuffle_f32x4(v, 0xFFFF, v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  v = op(v, _mm512_mask_permute_ps(v, 0xFFFF, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = op(v, _mm512_mask_permute_ps(v, 0xFFFF, v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_cvtss_f32(v);
}

// Lanes j0 + l with j0 + l <= t.
inline __mmask16 upto(int64_t t, int64_t j0) {
  int64_t n = t - j0 + 1;
  return n >= 16  ? static_cast<__mmask16>(0xFFFF)
         : n <= 0 ? static_cast<__mmask16>(0)
                  : static_cast<__mmask16>((1u << n) - 1u);
}

// fast_exp (vec_math.h) on 16 lanes: the same Cephes polynomial, 2^n by scalef. Inputs here are
// <= 0 (scores minus their maximum); below -87.3 the result is 0.
inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.3365447504019f);
  __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  __m512 xc = _mm512_mask_max_ps(
      lo, 0xFFFF, _mm512_mask_min_ps(x, 0xFFFF, x, _mm512_set1_ps(88.3762626647949f)), lo);
  __m512 xl = _mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f));
  __m512 n =
      _mm512_mask_roundscale_ps(xl, 0xFFFF, xl, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~under), p, n);
}

// dst[d * ld + j] = src[j * stride + d] for j < T, d < hs; zero for j in [T, round16(T)).
inline void pack_transposed(float* dst, int64_t ld, const float* src, int64_t stride, int64_t T,
                            int64_t hs) {
  __m512i idx =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int32_t>(stride)));
  for (int64_t j0 = 0; j0 < T; j0 += 16) {
    __mmask16 m = upto(T - 1, j0);
    const float* s = src + j0 * stride;
    // The next 16 rows into L1 while this block's gathers run (qkv is mostly out of cache).
    for (int64_t j = j0 + 16; j < j0 + 32 && j < T; ++j)
      for (int64_t d = 0; d < hs; d += 16)
        _mm_prefetch(reinterpret_cast<const char*>(src + j * stride + d), _MM_HINT_T0);
    for (int64_t d = 0; d < hs; ++d)
      _mm512_storeu_ps(dst + d * ld + j0,
                       _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, s + d, 4));
  }
}

}  // namespace ct::cpu::fast::CT_CPU_ISA::attn
