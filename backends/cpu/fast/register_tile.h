// The register tile under the CPU's own products (flash attention's, fast/flash_attention.cpp,
// and the packing GEMM's, fast/gemm_packed.cpp): kMR rows of two vectors, 12 accumulators in
// 15 of the 16 vector registers: 6 x 16 floats with AVX, 6 x 8 with SSE only (the x86-64-v2
// level). Each element is a sum in order of k, one FMA a term (a multiply and an add without
// FMA).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace ct::cpu::fast::CT_CPU_ISA::register_tile {

#if defined(__AVX__)
constexpr int64_t kLanes = 8;
#else
constexpr int64_t kLanes = 4;
#endif
constexpr int64_t kMR = 6, kNR = 2 * kLanes;

typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));
typedef float VecU
    __attribute__((vector_size(kLanes * sizeof(float)), aligned(alignof(float)), may_alias));

inline Vec load(const float* p) {
  return *reinterpret_cast<const VecU*>(p);
}
inline void store(float* p, Vec v) {
  *reinterpret_cast<VecU*>(p) = v;
}
// (Vec{} + x would add 0.0f first: not a no-op for -0.0f.)
inline Vec splat(float x) {
#if defined(__AVX__)
  return _mm256_set1_ps(x);
#else
  return _mm_set1_ps(x);
#endif
}
inline Vec splat_load(const float* p) {
#if defined(__AVX__)
  return _mm256_broadcast_ss(p);
#else
  return _mm_load1_ps(p);
#endif
}
inline Vec fmadd(Vec a, Vec b, Vec c) {
#if defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}

// The kernel under every product: the (rows x kNR) tile sum_{k < kc} a(u, k) b(k, .), with
// a(u, k) = a[u ar + k ak] and row k of b at b + k ldb, handed to out(u, lo, hi) a row at a
// time (lo, hi its two vectors). rows <= kMR; the rows past `rows` read the last one and are
// dropped. (The six rows are written out: a loop over an array of accumulators spilled some.)
template <class Out>
inline void tile(int64_t kc, const float* a, int64_t ar, int64_t ak, const float* b, int64_t ldb,
                 int64_t rows, Out out) {
  const float* a0 = a;
  const float* a1 = a + std::min<int64_t>(1, rows - 1) * ar;
  const float* a2 = a + std::min<int64_t>(2, rows - 1) * ar;
  const float* a3 = a + std::min<int64_t>(3, rows - 1) * ar;
  const float* a4 = a + std::min<int64_t>(4, rows - 1) * ar;
  const float* a5 = a + std::min<int64_t>(5, rows - 1) * ar;
  Vec c00 = {}, c01 = {}, c10 = {}, c11 = {}, c20 = {}, c21 = {}, c30 = {}, c31 = {}, c40 = {},
      c41 = {}, c50 = {}, c51 = {};
  int64_t off = 0;
  for (int64_t k = 0; k < kc; ++k, off += ak, b += ldb) {
    const Vec b0 = load(b), b1 = load(b + kLanes);
    Vec x = splat_load(a0 + off);
    c00 = fmadd(x, b0, c00);
    c01 = fmadd(x, b1, c01);
    x = splat_load(a1 + off);
    c10 = fmadd(x, b0, c10);
    c11 = fmadd(x, b1, c11);
    x = splat_load(a2 + off);
    c20 = fmadd(x, b0, c20);
    c21 = fmadd(x, b1, c21);
    x = splat_load(a3 + off);
    c30 = fmadd(x, b0, c30);
    c31 = fmadd(x, b1, c31);
    x = splat_load(a4 + off);
    c40 = fmadd(x, b0, c40);
    c41 = fmadd(x, b1, c41);
    x = splat_load(a5 + off);
    c50 = fmadd(x, b0, c50);
    c51 = fmadd(x, b1, c51);
  }
  out(0, c00, c01);
  if (rows > 1) out(1, c10, c11);
  if (rows > 2) out(2, c20, c21);
  if (rows > 3) out(3, c30, c31);
  if (rows > 4) out(4, c40, c41);
  if (rows > 5) out(5, c50, c51);
}

}  // namespace ct::cpu::fast::CT_CPU_ISA::register_tile
