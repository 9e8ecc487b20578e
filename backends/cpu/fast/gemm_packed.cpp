// A GEMM of its own for products with 16-bit operands on CPUs without 16-bit arithmetic:
// c = alpha op(a) op(b) + beta c (+ bias), f32 arithmetic, where a, b and c may each be f32,
// bf16 or f16. OpenBLAS's sgemm needs f32 operands, so the device used to widen every 16-bit
// operand into an f32 copy first (6 bytes of memory traffic an element, and the copy read
// again by sgemm's own packing) and round c back from an f32 copy afterwards. Here the
// operands are widened while they are packed, which every fast GEMM does anyway, and c is
// rounded in the kernel's epilogue: the 16-bit run reads half the bytes instead of twice them.
//
// The layout is the textbook one for x86 BLAS kernels (the Goto/BLIS loop nest), written for
// AVX2 + FMA:
//   for each block of kNC columns of c          (b's block stays in the last-level cache)
//     for each slice along k (<= kKC)           (b's slice packed: kc x nc, panels of kNR)
//       for each block of kMC rows of c         (a's block packed: kMC x kc, panels of kMR)
//         for each kNR panel x kMR panel        (the micro-kernel: a kMR x kNR tile of c in
//                                                12 vector registers, kc rank-1 updates)
// (a 16-bit c over several slices: the rows outside the slices, run_block says why)
// Each thread owns a range of c's rows or columns and runs the nest on it alone, without
// barriers; the operand both threads need is packed by each (the smaller one).
//
// Arithmetic: every element of c is sum_k a[i,k] b[k,j] in order of k, one f32 FMA a term, in
// slices of equal length (at most kKC, a multiple of 8 but the last). The first slice's sum s
// gives fma(alpha, s, pre), pre = fma(beta, c, bias) (bias rounded to c's type where c is
// 16-bit), each later one fma(alpha, s, c); a 16-bit c keeps its sums in f32 and is rounded to
// nearest even once, at the end. So an element depends neither on the number of threads nor on
// the blocking of rows and columns (tests/ops/cpu_half_matmul_test.cpp checks the bits).
// Measured, and the rule that sends products here: cpu_device.cpp, packed_gemm_on.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/cpu/fast/register_tile.h"
#include "backends/cpu/fast/vec_math.h"
#include "backends/cpu/kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define CT_GEMM_PACKED 1
#endif

namespace ct::cpu::fast::CT_CPU_ISA {

#ifdef CT_GEMM_PACKED
namespace {

constexpr int64_t kMR = 6, kNR = 16;  // the micro-tile: 6 x 2 vectors of 8 floats
constexpr int64_t kKC = 384;          // at most: a kKC x kNR panel of b (24 KB) stays in L1 (32 KB)
constexpr int64_t kMC = 120;          // a's packed block (up to 180 KB): L2
constexpr int64_t kNC = 2048;         // b's packed slice (up to 3 MB): L3
constexpr int64_t kNCHalf = 512;      // a 16-bit c summed over several slices in f32 (M x 512)
constexpr int64_t kMaxNK = kPackedGemmMaxNK;  // larger N or K: declined (matmul_packed)

// Eight elements of a 16-bit or f32 array from p (element offset i), as f32.
inline __m256 load8(const void* p, DType dt, int64_t i) {
  if (dt == DType::f32) return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  const uint16_t* h = static_cast<const uint16_t*>(p) + i;
  if (dt == DType::f16)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
  return bf16x8_to_f32(h);
}
inline float load1(const void* p, DType dt, int64_t i) {
  if (dt == DType::f32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return dt == DType::f16 ? f16_to_f32(h) : bf16_to_f32(h);
}

inline void store8(void* p, DType dt, int64_t i, __m256 v) {
  if (dt == DType::f32) return _mm256_storeu_ps(static_cast<float*>(p) + i, v);
  auto* q = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(p) + i);
  if (dt == DType::f16)
    _mm_storeu_si128(q, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  else
    _mm_storeu_si128(q, f32x8_to_bf16(v));
}
inline void store1(void* p, DType dt, int64_t i, float v) {
  if (dt == DType::f32)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<uint16_t*>(p)[i] = dt == DType::f16 ? f32_to_f16(v) : f32_to_bf16(v);
}

// One operand as the nest sees it: element (r, k) of op(x) for a (r a row of c), or (k, c) for b.
struct Operand {
  const void* p;
  DType dt;
  int64_t ld;
  bool trans;
};

// a's rows [i0, i0+mc) x k [k0, k0+kc) into panels of kMR rows: panel p holds, for each k,
// rows p*kMR .. +kMR-1 (rows past mc are zeros).
void pack_a(float* dst, const Operand& a, int64_t i0, int64_t mc, int64_t k0, int64_t kc) {
  for (int64_t p = 0; p < mc; p += kMR) {
    const int64_t rows = std::min(kMR, mc - p);
    float* d = dst + p * kc;
    if (!a.trans && rows == kMR) {  // a is (M, K): 8 k of each row, transposed
      const int64_t base = (i0 + p) * a.ld + k0;
      int64_t k = 0;
      for (; k + 8 <= kc; k += 8) {
        __m256 r[8];
        for (int64_t u = 0; u < kMR; ++u) r[u] = load8(a.p, a.dt, base + u * a.ld + k);
        r[6] = r[7] = _mm256_setzero_ps();
        transpose8(r);
        // 8 floats a k: the 2 past its 6 land where the next k's go (written after), or in
        // the buffer's slack after the last panel
        for (int64_t u = 0; u < 8; ++u) _mm256_storeu_ps(d + (k + u) * kMR, r[u]);
      }
      for (; k < kc; ++k)
        for (int64_t u = 0; u < kMR; ++u) d[k * kMR + u] = load1(a.p, a.dt, base + u * a.ld + k);
    } else if (!a.trans) {
      std::memset(d, 0, static_cast<size_t>(kc * kMR) * sizeof(float));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t base = (i0 + p + r) * a.ld + k0;
        int64_t k = 0;
        for (; k + 8 <= kc; k += 8) {
          alignas(32) float t[8];
          _mm256_store_ps(t, load8(a.p, a.dt, base + k));
          for (int64_t u = 0; u < 8; ++u) d[(k + u) * kMR + r] = t[u];
        }
        for (; k < kc; ++k) d[k * kMR + r] = load1(a.p, a.dt, base + k);
      }
    } else if (rows == kMR && i0 + p + 8 <= a.ld) {  // a is (K, M): each k's 6 rows in one load
      for (int64_t k = 0; k < kc; ++k)  // 8 stored: the 2 extra are overwritten, as above
        _mm256_storeu_ps(d + k * kMR, load8(a.p, a.dt, (k0 + k) * a.ld + i0 + p));
    } else {  // a is (K, M): for each k, the rows contiguous
      for (int64_t k = 0; k < kc; ++k) {
        const int64_t base = (k0 + k) * a.ld + i0 + p;
        for (int64_t r = 0; r < kMR; ++r)
          d[k * kMR + r] = r < rows ? load1(a.p, a.dt, base + r) : 0.0f;
      }
    }
  }
}

// b's k [k0, k0+kc) x columns [j0, j0+nc) into panels of kNR columns: panel q holds, for each
// k, columns q*kNR .. +kNR-1 (columns past nc are zeros).
void pack_b(float* dst, const Operand& b, int64_t k0, int64_t kc, int64_t j0, int64_t nc) {
  for (int64_t q = 0; q < nc; q += kNR) {
    const int64_t cols = std::min(kNR, nc - q);
    float* d = dst + q * kc;
    if (!b.trans) {  // b is (K, N): k's columns contiguous
      for (int64_t k = 0; k < kc; ++k) {
        const int64_t base = (k0 + k) * b.ld + j0 + q;
        float* dk = d + k * kNR;
        if (cols == kNR) {
          _mm256_storeu_ps(dk, load8(b.p, b.dt, base));
          _mm256_storeu_ps(dk + 8, load8(b.p, b.dt, base + 8));
        } else {
          for (int64_t c = 0; c < kNR; ++c) dk[c] = c < cols ? load1(b.p, b.dt, base + c) : 0.0f;
        }
      }
    } else if (cols == kNR) {  // b is (N, K): 8 k of each of 16 columns, transposed
      const int64_t base = (j0 + q) * b.ld + k0;
      int64_t k = 0;
      for (; k + 8 <= kc; k += 8) {
        for (int64_t half = 0; half < 2; ++half) {
          __m256 r[8];
          for (int64_t u = 0; u < 8; ++u) r[u] = load8(b.p, b.dt, base + (half * 8 + u) * b.ld + k);
          transpose8(r);
          for (int64_t u = 0; u < 8; ++u) _mm256_storeu_ps(d + (k + u) * kNR + half * 8, r[u]);
        }
      }
      for (; k < kc; ++k)
        for (int64_t c = 0; c < kNR; ++c) d[k * kNR + c] = load1(b.p, b.dt, base + c * b.ld + k);
    } else {  // b is (N, K), a last panel of fewer than kNR columns
      std::memset(d, 0, static_cast<size_t>(kc * kNR) * sizeof(float));
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t base = (j0 + q + c) * b.ld + k0;
        int64_t k = 0;
        for (; k + 8 <= kc; k += 8) {
          alignas(32) float t[8];
          _mm256_store_ps(t, load8(b.p, b.dt, base + k));
          for (int64_t u = 0; u < 8; ++u) d[(k + u) * kNR + c] = t[u];
        }
        for (; k < kc; ++k) d[k * kNR + c] = load1(b.p, b.dt, base + k);
      }
    }
  }
}

// acc (kMR x kNR, row-major) = sum over kc of a's panel column times b's panel row: the
// register tile flash attention's products use (register_tile.h), on packed panels.
static_assert(kMR == register_tile::kMR && kNR == register_tile::kNR);
inline void micro_kernel(int64_t kc, const float* a, const float* b, float* acc) {
  register_tile::tile(kc, a, 1, kMR, b, kNR, kMR,
                      [acc](int64_t u, register_tile::Vec lo, register_tile::Vec hi) {
                        register_tile::store(acc + u * kNR, lo);
                        register_tile::store(acc + u * kNR + register_tile::kLanes, hi);
                      });
}

// Where a tile's sums go: into `c` (dt, leading dimension ld). The first slice writes
// alpha * acc + pre, pre = beta * src + bias, with src the element (i + row_off, j + col_off) of
// the product's c (src_dt, src_ld; src may be c itself) and the bias rounded to c's type; each
// later slice adds alpha * acc.
struct Target {
  void* c;
  DType dt;
  int64_t ld;
  float alpha;
  bool first;
  const void* src;
  DType src_dt;
  int64_t src_ld, row_off, col_off;
  float beta;
  const float* bias;
};

void epilogue(const Target& t, const float* acc, int64_t i, int64_t j, int64_t rows, int64_t cols) {
  const __m256 alpha = _mm256_set1_ps(t.alpha), beta = _mm256_set1_ps(t.beta);
  const float* bias = t.bias ? t.bias + j + t.col_off : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = (i + r) * t.ld + j;
    const int64_t src = (i + r + t.row_off) * t.src_ld + j + t.col_off;
    const float* s = acc + r * kNR;
    int64_t c = 0;
    if (!t.first) {
      for (; c + 8 <= cols; c += 8) {
        const __m256 v = _mm256_fmadd_ps(alpha, _mm256_load_ps(s + c), load8(t.c, t.dt, row + c));
        store8(t.c, t.dt, row + c, v);
      }
      for (; c < cols; ++c)
        store1(t.c, t.dt, row + c, std::fma(t.alpha, s[c], load1(t.c, t.dt, row + c)));
    } else {
      for (; c + 8 <= cols; c += 8) {
        __m256 pre = bias ? _mm256_loadu_ps(bias + c) : _mm256_setzero_ps();
        if (t.beta != 0.0f) pre = _mm256_fmadd_ps(beta, load8(t.src, t.src_dt, src + c), pre);
        store8(t.c, t.dt, row + c, _mm256_fmadd_ps(alpha, _mm256_load_ps(s + c), pre));
      }
      for (; c < cols; ++c) {
        float pre = bias ? bias[c] : 0.0f;
        if (t.beta != 0.0f) pre = std::fma(t.beta, load1(t.src, t.src_dt, src + c), pre);
        store1(t.c, t.dt, row + c, std::fma(t.alpha, s[c], pre));
      }
    }
  }
}

void prefetch_rows(const Target& t, int64_t i, int64_t j, int64_t rows) {
  const size_t es = dtype_size(t.dt);
  for (int64_t r = 0; r < rows; ++r) {
    const char* p = static_cast<const char*>(t.c) + static_cast<size_t>((i + r) * t.ld + j) * es;
    _mm_prefetch(p, _MM_HINT_T0);
    _mm_prefetch(p + kNR * es - 1, _MM_HINT_T0);
  }
}

struct Scratch {
  std::vector<float> a, b, sums;
  float* get(std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n + 8) v.resize(static_cast<size_t>(n + 8));
    // 32-byte aligned start for the aligned loads of the micro-kernel
    auto addr = reinterpret_cast<uintptr_t>(v.data());
    return v.data() + ((32 - addr % 32) % 32) / sizeof(float);
  }
};

// The micro-tiles of an mc x nc block of c from packed a (mc x kc) and b (kc x nc), into the
// target at (i, j) + tile offsets.
void tiles(const Target& t, const float* ap, const float* bp, int64_t mc, int64_t nc, int64_t kc,
           int64_t i, int64_t j) {
  alignas(32) float acc[kMR * kNR];
  for (int64_t q = 0; q < nc; q += kNR) {
    const int64_t cols = std::min(kNR, nc - q);
    for (int64_t p = 0; p < mc; p += kMR) {
      // the next tile's rows of c, fetched while this one computes (its rows are far apart,
      // which the hardware's prefetchers do not foresee)
      if (p + kMR < mc) prefetch_rows(t, i + p + kMR, j + q, std::min(kMR, mc - p - kMR));
      micro_kernel(kc, ap + p * kc, bp + q * kc, acc);
      epilogue(t, acc, i + p, j + q, std::min(kMR, mc - p), cols);
    }
  }
}

// The nest over rows [r0, r1) x columns [n0, n1) of c.
void run_block(const MatmulPackedArgs& m, const Operand& a, const Operand& b, const float* bias,
               int64_t r0, int64_t r1, int64_t n0, int64_t n1) {
  thread_local Scratch s;
  const bool half_c = m.c_dtype != DType::f32;
  // K in slices of at most kKC, of equal length (a multiple of 8, but the last)
  const int64_t slices = (m.K + kKC - 1) / kKC;
  const int64_t kc_len = ((m.K + slices - 1) / slices + 7) / 8 * 8;
  // A 16-bit c summed over several slices: f32 sums, rounded at the end (c itself holds the
  // sums otherwise). There the rows go outside the slices: all of b's slices of a block of
  // kNCHalf columns are packed first, then each block of kMC rows takes every slice in turn
  // with its sums (kMC x kNCHalf, 240 KB) in L2. The slices inside the rows kept the sums of
  // all the thread's rows (2 MB at gpt2's 1024 x 768 on one thread) in flight between slices:
  // the 16-bit products with K > kKC ran 2-7 % slower than sgemm on widened copies.
  const bool sum_apart = half_c && slices > 1;
  const int64_t nc_max = sum_apart ? kNCHalf : kNC;
  const int64_t panel = kc_len * ((nc_max + kNR - 1) / kNR * kNR);  // one packed slice of b
  float* ap = s.get(s.a, kMC * kc_len + 8);  // + the last k's overhang (pack_a)
  float* bp = s.get(s.b, panel * (sum_apart ? slices : 1));
  float* sums = sum_apart ? s.get(s.sums, kMC * nc_max) : nullptr;
  for (int64_t j0 = n0; j0 < n1; j0 += nc_max) {
    const int64_t nc = std::min(nc_max, n1 - j0);
    if (!sum_apart) {
      Target t{m.c, m.c_dtype, m.N, m.alpha, true, m.c, m.c_dtype, m.N, 0, 0, m.beta, bias};
      for (int64_t k0 = 0; k0 < m.K; k0 += kc_len) {
        const int64_t kc = std::min(kc_len, m.K - k0);
        t.first = k0 == 0;
        pack_b(bp, b, k0, kc, j0, nc);
        for (int64_t i0 = r0; i0 < r1; i0 += kMC) {
          const int64_t mc = std::min(kMC, r1 - i0);
          pack_a(ap, a, i0, mc, k0, kc);
          tiles(t, ap, bp, mc, nc, kc, i0, j0);
        }
      }
      continue;
    }
    for (int64_t k0 = 0, q = 0; k0 < m.K; k0 += kc_len, ++q)
      pack_b(bp + q * panel, b, k0, std::min(kc_len, m.K - k0), j0, nc);
    for (int64_t i0 = r0; i0 < r1; i0 += kMC) {
      const int64_t mc = std::min(kMC, r1 - i0);
      // the sums of rows i0.. as (mc, nc), element (i, j) standing for c's (i0 + i, j0 + j)
      Target t{sums, DType::f32, nc, m.alpha, true, m.c, m.c_dtype, m.N, i0, j0, m.beta, bias};
      for (int64_t k0 = 0, q = 0; k0 < m.K; k0 += kc_len, ++q) {
        const int64_t kc = std::min(kc_len, m.K - k0);
        t.first = k0 == 0;
        pack_a(ap, a, i0, mc, k0, kc);
        tiles(t, ap, bp + q * panel, mc, nc, kc, 0, 0);
      }
      for (int64_t i = 0; i < mc; ++i) {
        const int64_t out = (i0 + i) * m.N + j0;
        int64_t c = 0;
        for (; c + 8 <= nc; c += 8)
          store8(m.c, m.c_dtype, out + c, _mm256_loadu_ps(sums + i * nc + c));
        for (; c < nc; ++c) store1(m.c, m.c_dtype, out + c, sums[i * nc + c]);
      }
    }
  }
}

// ---- one row of c ------------------------------------------------------------------------------
// c (1, N) of a product whose op(a) has one row: sampling's one-token forward (its linear layers
// and LM head). The nest above would pack all of b for that one row, which costs more than the
// arithmetic (OpenBLAS's sgemm does the same: perf of a gpt2 decode at 1 thread, its copies 38 %
// of the run, its kernel 17 %). Here b is read once, in place and in address order, widened in
// registers. The threads split c's columns.
//   b (K, N): each thread streams its columns of every row of b into f32 sums of its columns
//     (in L1/L2), so each element of c gets the nest's arithmetic: the same slices of K, one FMA
//     a term in order of k, the same epilogue, the same bits.
//   b (N, K): each element of c is a dot product along a row of b, eight partial sums (k mod 8,
//     in order of k) added as ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)), then the K % 8
//     last terms one FMA each; c = fma(alpha, sum, pre). Not the nest's order (its lanes are
//     columns, which here would read eight rows of b at once): fixed, so still the same bits
//     at any thread count.
constexpr int64_t kRowUnit = 64;  // columns a thread takes at a time (b (K, N)) or at least

// Eight lanes of partial sums added in the stated fixed order.
inline float sum_lanes(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  const __m128 q = _mm_add_ps(lo, hi);                  // s0+s4, s1+s5, s2+s6, s3+s7
  const __m128 p = _mm_add_ps(q, _mm_movehl_ps(q, q));  // (s0+s4)+(s2+s6), (s1+s5)+(s3+s7)
  return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)));
}

// b's elements of one dtype, the dtype fixed at compile time for the streaming loops.
template <DType D>
struct Elems {
  static __m256 load(const void* p, int64_t i) { return load8(p, D, i); }
  static float one(const void* p, int64_t i) { return load1(p, D, i); }
};

// c[j] for the rows j of b (N, K) in [j0, j1): four rows at a time for four chains in flight.
template <DType D>
void row_dots(const MatmulPackedArgs& m, const float* a, const Operand& b, const float* bias,
              int64_t j0, int64_t j1) {
  using E = Elems<D>;
  const int64_t K8 = m.K / 8 * 8;
  auto finish = [&](int64_t j, float sum) {
    for (int64_t k = K8; k < m.K; ++k) sum = std::fma(a[k], E::one(b.p, j * b.ld + k), sum);
    float pre = bias ? bias[j] : 0.0f;
    if (m.beta != 0.0f) pre = std::fma(m.beta, load1(m.c, m.c_dtype, j), pre);
    store1(m.c, m.c_dtype, j, std::fma(m.alpha, sum, pre));
  };
  int64_t j = j0;
  for (; j + 4 <= j1; j += 4) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    const int64_t r = j * b.ld;
    for (int64_t k = 0; k < K8; k += 8) {
      const __m256 ak = _mm256_loadu_ps(a + k);
      acc0 = _mm256_fmadd_ps(ak, E::load(b.p, r + k), acc0);
      acc1 = _mm256_fmadd_ps(ak, E::load(b.p, r + b.ld + k), acc1);
      acc2 = _mm256_fmadd_ps(ak, E::load(b.p, r + 2 * b.ld + k), acc2);
      acc3 = _mm256_fmadd_ps(ak, E::load(b.p, r + 3 * b.ld + k), acc3);
    }
    finish(j, sum_lanes(acc0));
    finish(j + 1, sum_lanes(acc1));
    finish(j + 2, sum_lanes(acc2));
    finish(j + 3, sum_lanes(acc3));
  }
  for (; j < j1; ++j) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t k = 0; k < K8; k += 8)
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), E::load(b.p, j * b.ld + k), acc);
    finish(j, sum_lanes(acc));
  }
}

// c[j] for the columns j of b (K, N) in [j0, j1): the rows of b streamed, four at a time, into
// f32 sums of the columns (sums: each sum still one FMA a term in order of k), slice by slice
// as run_block slices K; v holds c's value between slices.
template <DType D>
void row_axpys(const MatmulPackedArgs& m, const float* a, const Operand& b, const float* bias,
               int64_t j0, int64_t j1, float* sums, float* v) {
  using E = Elems<D>;
  const int64_t w = j1 - j0, w8 = w / 8 * 8;
  const int64_t slices = (m.K + kKC - 1) / kKC;
  const int64_t kc_len = ((m.K + slices - 1) / slices + 7) / 8 * 8;
  for (int64_t k0 = 0; k0 < m.K; k0 += kc_len) {
    const int64_t k1 = std::min(m.K, k0 + kc_len);
    std::fill(sums, sums + w, 0.0f);
    int64_t k = k0;
    for (; k + 4 <= k1; k += 4) {
      const __m256 a0 = _mm256_set1_ps(a[k]), a1 = _mm256_set1_ps(a[k + 1]);
      const __m256 a2 = _mm256_set1_ps(a[k + 2]), a3 = _mm256_set1_ps(a[k + 3]);
      const int64_t r = k * b.ld + j0;
      for (int64_t c = 0; c < w8; c += 8) {
        __m256 x = _mm256_loadu_ps(sums + c);
        x = _mm256_fmadd_ps(a0, E::load(b.p, r + c), x);
        x = _mm256_fmadd_ps(a1, E::load(b.p, r + b.ld + c), x);
        x = _mm256_fmadd_ps(a2, E::load(b.p, r + 2 * b.ld + c), x);
        x = _mm256_fmadd_ps(a3, E::load(b.p, r + 3 * b.ld + c), x);
        _mm256_storeu_ps(sums + c, x);
      }
      for (int64_t c = w8; c < w; ++c)
        for (int64_t u = 0; u < 4; ++u)
          sums[c] = std::fma(a[k + u], E::one(b.p, r + u * b.ld + c), sums[c]);
    }
    for (; k < k1; ++k) {
      const __m256 ak = _mm256_set1_ps(a[k]);
      const int64_t r = k * b.ld + j0;
      for (int64_t c = 0; c < w8; c += 8)
        _mm256_storeu_ps(sums + c,
                         _mm256_fmadd_ps(ak, E::load(b.p, r + c), _mm256_loadu_ps(sums + c)));
      for (int64_t c = w8; c < w; ++c) sums[c] = std::fma(a[k], E::one(b.p, r + c), sums[c]);
    }
    for (int64_t c = 0; c < w; ++c) {
      if (k0 > 0) {
        v[c] = std::fma(m.alpha, sums[c], v[c]);
        continue;
      }
      float pre = bias ? bias[j0 + c] : 0.0f;
      if (m.beta != 0.0f) pre = std::fma(m.beta, load1(m.c, m.c_dtype, j0 + c), pre);
      v[c] = std::fma(m.alpha, sums[c], pre);
    }
  }
  for (int64_t c = 0; c < w; ++c) store1(m.c, m.c_dtype, j0 + c, v[c]);
}

// One thread's columns [j0, j1) of c, b's dtype D.
template <DType D>
void row_columns(const MatmulPackedArgs& m, const float* a, const Operand& b, const float* bias,
                 int64_t j0, int64_t j1) {
  if (b.trans) return row_dots<D>(m, a, b, bias, j0, j1);
  // blocks of up to 16 units: their sums and values stay in L1
  constexpr int64_t block = 16 * kRowUnit;
  alignas(32) float sums[block], v[block];
  for (int64_t c0 = j0; c0 < j1; c0 += block)
    row_axpys<D>(m, a, b, bias, c0, std::min(j1, c0 + block), sums, v);
}

void run_row(const MatmulPackedArgs& m, const Operand& b, const float* bias) {
  // a's one row widened once: (1, K), or (K, 1) with trans_a, contiguous either way
  thread_local std::vector<float> widened;
  widened.resize(static_cast<size_t>(m.K));
  for (int64_t k = 0; k < m.K; ++k) widened[static_cast<size_t>(k)] = load1(m.a, m.a_dtype, k);
  const float* a = widened.data();  // the calling thread's buffer, read by every thread
  const int64_t units = (m.N + kRowUnit - 1) / kRowUnit;
  const int threads =
      static_cast<int>(std::min<int64_t>(omp_get_max_threads(), std::max<int64_t>(1, units / 4)));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t j0 = std::min(m.N, units * t / nt * kRowUnit);
    const int64_t j1 = std::min(m.N, units * (t + 1) / nt * kRowUnit);
    if (j1 > j0) {
      if (b.dt == DType::f32)
        row_columns<DType::f32>(m, a, b, bias, j0, j1);
      else if (b.dt == DType::bf16)
        row_columns<DType::bf16>(m, a, b, bias, j0, j1);
      else
        row_columns<DType::f16>(m, a, b, bias, j0, j1);
    }
  }
}

}  // namespace

bool matmul_packed(const MatmulPackedArgs& m) {
  if (m.M <= 0 || m.N <= 0 || m.K <= 0) return false;
  // Vocabulary-sized N or K (a language model's head) stays with sgemm on widened copies, the
  // faster there: one thread's CPU time, gpt2's head at 1024 tokens, bf16, GFLOP/s: logits
  // (N 50304) 82.8 packed vs 92.0 widened, dx (K 50304) 81.5 vs 91.5, dW (M 50304) 91 vs 94
  // (a's repacking per block of columns and the f32 sums of a 16-bit c, which sgemm's larger
  // blocks amortise better). The linear layers (N, K <= 4 x 1024 here) are faster packed.
  // (One row of c reads b once whatever its size: run_row.)
  if (m.M > 1 && (m.N > kMaxNK || m.K > kMaxNK)) return false;
  const Operand a{m.a, m.a_dtype, m.trans_a ? m.M : m.K, m.trans_a};
  const Operand b{m.b, m.b_dtype, m.trans_b ? m.K : m.N, m.trans_b};
  // The bias in c's type (a 16-bit c adds it rounded, as the reference does).
  thread_local std::vector<float> rounded;
  const float* bias = m.bias;
  if (bias && m.c_dtype != DType::f32) {
    rounded.resize(static_cast<size_t>(m.N));
    for (int64_t j = 0; j < m.N; ++j)
      rounded[static_cast<size_t>(j)] = round_to(m.c_dtype, bias[j]);
    bias = rounded.data();
  }
  if (m.M == 1) {
    run_row(m, b, bias);
    return true;
  }
  // The threads share c by rows or by columns, whichever makes them pack less twice: split by
  // columns, each packs all of a (M x K); by rows, all of b (K x N).
  const bool by_rows = m.M >= m.N;
  const int64_t units = by_rows ? (m.M + kMR - 1) / kMR : (m.N + kNR - 1) / kNR;
  const int threads =
      static_cast<int>(std::min<int64_t>(omp_get_max_threads(), std::max<int64_t>(1, units / 4)));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t u0 = units * t / nt, u1 = units * (t + 1) / nt;
    if (u1 > u0) {
      if (by_rows)
        run_block(m, a, b, bias, u0 * kMR, std::min(m.M, u1 * kMR), 0, m.N);
      else
        run_block(m, a, b, bias, 0, m.M, u0 * kNR, std::min(m.N, u1 * kNR));
    }
  }
  return true;
}

#else  // no AVX2/FMA/F16C at this level: the device widens and calls sgemm instead

bool matmul_packed(const MatmulPackedArgs&) {
  return false;
}

#endif

}  // namespace ct::cpu::fast::CT_CPU_ISA
