// Branch-free float exp, tanh and sqrt that GCC vectorises inside `omp simd` loops (libm's expf and
// tanhf stay scalar without -ffast-math). Relative error of fast_exp ~2 ulp (Cephes expf
// polynomial); fast_tanh's absolute error is ~1e-7.
// Also the bf16 <-> f32 conversions of whole spans.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

// Put after the includes of a file whose loops are compute-bound (exp, division): lets GCC use
// 512-bit vectors where the target has them (its default preference is 256 bits). A tuning hint
// only; on targets without AVX-512 nothing changes.
#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)
#define CT_FAST_WIDE_VECTORS _Pragma("GCC target(\"prefer-vector-width=512\")")
#else
#define CT_FAST_WIDE_VECTORS
#endif

namespace ct::cpu::fast::CT_CPU_ISA {

// fast_exp's arithmetic for x in [-87.34, 88.38] (or NaN, which comes out NaN): no clamps and
// no selects for the edges, so a loop of it is a few FMAs and integer ops a vector. Callers
// whose argument is bounded by construction (GELU's clamped tanh argument) get fast_exp's bits
// for a third of its instructions.
inline float fast_exp_in_range(float x) {
  // n = round(x / ln 2) by the 1.5 * 2^23 trick (floorf does not vectorise without
  // -ffast-math); exact for |n| < 2^22, and |n| <= 128 here.
  const float kMagic = 12582912.0f;
  float n = (x * 1.44269504088896341f + kMagic) - kMagic;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t e = static_cast<int32_t>(n) + 127;
  uint32_t bits = static_cast<uint32_t>(e) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

inline float fast_exp(float x) {
  const float kHi = 88.3762626647949f, kLo = -87.3365447504019f;
  float xc = x > kHi ? kHi : x;
  xc = xc < kLo ? kLo : xc;
  float y = fast_exp_in_range(xc);
  y = x < kLo ? 0.0f : y;
  y = x > kHi ? __builtin_inff() : y;
  return x != x ? x : y;
}

// sqrt(v) for v >= 0 as v * rsqrt(v), rsqrt by the bit-trick estimate and three Newton steps
// (~1 ulp). std::sqrt keeps loops scalar under -fmath-errno (GCC's default), and the
// optimize("no-math-errno") attribute does not take effect in GCC 12.
inline float fast_sqrt(float v) {
  uint32_t i;
  std::memcpy(&i, &v, 4);
  i = 0x5f3759dfu - (i >> 1);
  float y;
  std::memcpy(&y, &i, 4);
  float h = 0.5f * v;
  y = y * (1.5f - h * y * y);
  y = y * (1.5f - h * y * y);
  y = y * (1.5f - h * y * y);
  return v * y;
}

// out[i] = std::sqrt(x[i]) for i < n, the same bits (the correctly rounded square root), by the
// vector instruction: a loop calling std::sqrt stays scalar under -fmath-errno.
inline void sqrt_n(float* out, const float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#endif
#if defined(__SSE2__)
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(out + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) out[i] = std::sqrt(x[i]);
}

#if defined(__AVX__)
// r[0..7] (rows of 8 floats) transposed in place: r[u] becomes column u.
inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}
#endif

// n bf16 widened into f32, and n f32 rounded to bf16 (nearest even, NaN kept quiet: the bits of
// bf16_to_f32 / f32_to_bf16), eight at a time where AVX2 has the integer vectors for it.
#if defined(__AVX2__)
inline __m256 bf16x8_to_f32(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m128i f32x8_to_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v), hi = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  // 32-bit lanes holding 16-bit values -> 8 x u16 (packus works per 128-bit half)
  const __m256i packed = _mm256_packus_epi32(r, r);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}
#endif
inline void widen_bf16(float* out, const uint16_t* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, bf16x8_to_f32(x + i));
#endif
  for (; i < n; ++i) out[i] = bf16_to_f32(x[i]);
}
inline void round_bf16(uint16_t* out, const float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), f32x8_to_bf16(_mm256_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) out[i] = f32_to_bf16(x[i]);
}

inline float fast_tanh(float u) {
  float e = fast_exp(2.0f * u);
  return 1.0f - 2.0f / (e + 1.0f);
}

// fast_tanh for |u| <= 43.6 (2u inside fast_exp_in_range's domain) or NaN: the same bits.
inline float fast_tanh_in_range(float u) {
  float e = fast_exp_in_range(2.0f * u);
  return 1.0f - 2.0f / (e + 1.0f);
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
