// Fast fused causal self-attention (core/device.h flash_attention_*): (batch, head) pairs in
// parallel with OpenMP, each on one thread from start to end. A work item first packs its
// heads into per-thread scratch, widened to f32 where they are bf16: q, k, v and dout as
// (T, hsp) rows (hsp: hs rounded up to a tile's width, zero columns past hs), k and v also as
// panels of kNR keys (for i < hs, the panel's kNR keys in a row) for the products against the
// keys. Then it runs over blocks of kBlockRows query rows, and each block over strips of kMR
// rows; every product is a (kMR x kNR) register tile (`tile`), and a strip stops at the panel
// holding its last row, so the masked triangle costs at most a panel a strip:
//   forward:  s = scale q k^T (the strip's keys), row softmax in place, o = p v / sum;
//   backward: p = exp(scale q k^T - lse), dp = dout v^T, ds = p (dp - D) scale with
//             D = rowsum(dout * out); dv += p^T dout, dk += ds^T q, dq = ds k.
// Only lse is saved; s, p and ds live in a per-thread (kBlockRows, lds) buffer for one block.
// A key/value cache's step (the forward of the last Tq <= 2 of T > Tq rows) packs nothing: its
// rows read k and v in place (forward_rows_in_place).
// Grouped-query attention: query head h reads key/value head h / G, G = NH / NKV. The backward
// runs over (batch, key/value head) pairs, the G query heads of a group one after another in
// one work item, so that their sums into dk/dv never race and always have one order. Nothing
// depends on the number of threads. The bf16 entry points run the same code on the widened
// heads and round what they store: the bits of the f32 kernels on a widened qkv.
// Measured (ms a call, one thread's CPU time on the 2-core Zen 3, tiny: B 4, NH 6, T 256,
// hs 64): forward 3.35 (scores ~30 %, p v ~35 %, softmax ~10 %, packing ~14 %), backward 7.5
// (the five products ~80 %, near the core's FMA peak, packing and writing back 14 %, p and
// ds 6 %); the sgemm-per-block version before it took 6.1 / 10.8. The x86-64-v2 level's SSE
// tiles are ~2x slower than AVX ones: on an AVX-only CPU (Sandy Bridge) OpenBLAS's AVX sgemm
// would beat them.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backends/cpu/fast/register_tile.h"
#include "backends/cpu/fast/vec_math.h"
#include "backends/cpu/kernels.h"

CT_FAST_WIDE_VECTORS

namespace ct::cpu::fast::CT_CPU_ISA {

namespace {

using namespace register_tile;  // Vec, kLanes, kMR, kNR, load, store, splat, fmadd, tile

// Query rows a block (a multiple of kMR): the keys' panels are reused by its strips from L1,
// and p, ds (kBlockRows, T) stay in L2. 24, 30, 48, 60 and 96 rows ran within 3 % of each other
// at tiny's and gpt2's shapes.
constexpr int64_t kBlockRows = 48;

// A head's sizes: hsp = hs rounded up to kNR (the packed rows' stride), lds the score rows'
// stride (T rounded up to kNR, plus a panel so that rows 4 KB apart do not share L1 sets); the
// forward's query rows are [q0, T) (the last T - q0 positions; 0 in the backward).
struct Dims {
  int64_t T, hs, hsp, lds;
  float scale;
  int64_t q0 = 0;
};
Dims dims(int64_t T, int64_t hs, int64_t q0 = 0) {
  const int64_t hsp = (hs + kNR - 1) / kNR * kNR, lds = (T + kNR - 1) / kNR * kNR + kNR;
  return {T, hs, hsp, lds, 1.0f / std::sqrt(static_cast<float>(hs)), q0};
}

// s[t - r0][j] = scale x_t . y_j for the rows t of [r0, r1) and, in each strip of kMR rows, the
// panels of keys up to the one holding the strip's last row. x is packed rows, yt panels.
void scores(float* s, const float* x, const float* yt, int64_t r0, int64_t r1, const Dims& d,
            float scale) {
  const Vec sc = splat(scale);
  for (int64_t j0 = 0; j0 < r1; j0 += kNR) {
    const float* panel = yt + j0 * d.hs;
    // the first strip whose last row reaches j0 (later ones all do)
    int64_t s0 = r0;
    while (s0 + kMR <= j0) s0 += kMR;
    for (; s0 < r1; s0 += kMR) {
      tile(d.hs, x + s0 * d.hsp, d.hsp, 1, panel, kNR, std::min(kMR, r1 - s0),
           [&](int64_t u, Vec lo, Vec hi) {
             float* dst = s + (s0 - r0 + u) * d.lds + j0;
             store(dst, lo * sc);
             store(dst + kLanes, hi * sc);
           });
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// exp(x) for eight x <= ~88 (here x - max or x - lse, <= 0): fast_exp's polynomial in half its
// instructions (its clamps and NaN/infinity cases written as GCC did not: one max, one mask);
// x below -87.3 gives 0, NaN stays NaN.
inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3365447504019f);
  const __m256 xc = _mm256_max_ps(lo, x);  // the second operand where either is NaN: x
  // t = 1.5 2^23 + 127 + round(x / ln 2): its low mantissa bits are the exponent of 2^n
  const __m256 magic = _mm256_set1_ps(12582912.0f + 127.0f);
  const __m256 t = _mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), magic);
  const __m256 n = _mm256_sub_ps(t, magic);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t), 23));
  const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_NLT_UQ);  // x >= lo, or NaN
  return _mm256_and_ps(_mm256_mul_ps(p, scale), keep);
}
#endif

// row[j] (=) exp(row[j] - sub) for j < n; returns their sum (in a fixed order).
float exp_row(float* row, int64_t n, float sub) {
  int64_t j = 0;
  float sum = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 m = _mm256_set1_ps(sub);
  __m256 acc = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), m));
    _mm256_storeu_ps(row + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (const float x : lanes) sum += x;
#endif
  for (; j < n; ++j) {
    row[j] = fast_exp(row[j] - sub);
    sum += row[j];
  }
  return sum;
}

// Rows r0..r1 of a block: for each row t, s[t, j] (=) exp(s - max) for j <= t and 0 for
// t < j < r1; its log-sum-exp into lse[t - q0], 1 / sum into inv[t - r0].
void softmax_rows(float* s, float* lse, float* inv, int64_t r0, int64_t r1, const Dims& d) {
  for (int64_t t = r0; t < r1; ++t) {
    float* row = s + (t - r0) * d.lds;
    const int64_t n = t + 1;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < n; ++j) mx = row[j] > mx ? row[j] : mx;
    const float sum = exp_row(row, n, mx);
    std::fill(row + n, row + std::max(n, r1), 0.0f);
    lse[t - d.q0] = mx + std::log(sum);
    inv[t - r0] = 1.0f / sum;
  }
}

// The backward's row t: p[j] (=) exp(p[j] - l) and ds[j] (=) p[j] (ds[j] - D) scale for j < n.
void grad_row(float* p, float* ds, int64_t n, float l, float D, float scale) {
  int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 vl = _mm256_set1_ps(l), vD = _mm256_set1_ps(D), vs = _mm256_set1_ps(scale);
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + j), vl));
    _mm256_storeu_ps(p + j, e);
    const __m256 g = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(ds + j), vD), vs);
    _mm256_storeu_ps(ds + j, _mm256_mul_ps(e, g));
  }
#endif
  for (; j < n; ++j) {
    p[j] = fast_exp(p[j] - l);
    ds[j] = p[j] * ((ds[j] - D) * scale);
  }
}

// One query head's forward from its packed q, k (panels kt) and v: rows [q0, T) of o (T, hsp)
// and lse (T - q0); s (kBlockRows, lds) and inv (kBlockRows) scratch.
void forward_head(float* o, float* lse, float* s, float* inv, const float* q, const float* kt,
                  const float* v, const Dims& d) {
  for (int64_t r0 = d.q0; r0 < d.T; r0 += kBlockRows) {
    const int64_t r1 = std::min(d.T, r0 + kBlockRows);
    scores(s, q, kt, r0, r1, d, d.scale);
    softmax_rows(s, lse, inv, r0, r1, d);
    // o[strip] = p[strip] v[0 .. the strip's last row] / sum
    for (int64_t s0 = r0; s0 < r1; s0 += kMR) {
      const int64_t rows = std::min(kMR, r1 - s0), kn = s0 + rows;
      for (int64_t c = 0; c < d.hsp; c += kNR) {
        tile(kn, s + (s0 - r0) * d.lds, d.lds, 1, v + c, d.hsp, rows,
             [&](int64_t u, Vec lo, Vec hi) {
               const Vec a = splat(inv[s0 - r0 + u]);
               float* dst = o + (s0 + u) * d.hsp + c;
               store(dst, lo * a);
               store(dst + kLanes, hi * a);
             });
      }
    }
  }
}

// One query head's backward: dq (T, hsp) (=), its dk and dv summed into dk, dv (T, hsp); p, ds
// (kBlockRows, lds) scratch.
struct HeadGrad {
  const float *q, *d, *kt, *vt, *k;  // packed: the query head's q and dout; the kv head's k, v
  const float *lse, *D;              // (T) each: the forward's lse, rowsum(dout * out)
  float *dq, *dk, *dv;
};
void backward_head(float* p, float* ds, const HeadGrad& g, const Dims& d) {
  const auto add = [&](float* c) {
    return [c, &d](int64_t u, Vec lo, Vec hi) {
      float* dst = c + u * d.hsp;
      store(dst, load(dst) + lo);
      store(dst + kLanes, load(dst + kLanes) + hi);
    };
  };
  for (int64_t r0 = 0; r0 < d.T; r0 += kBlockRows) {
    const int64_t r1 = std::min(d.T, r0 + kBlockRows);
    scores(p, g.q, g.kt, r0, r1, d, d.scale);
    scores(ds, g.d, g.vt, r0, r1, d, 1.0f);
    for (int64_t t = r0; t < r1; ++t) {
      float* prow = p + (t - r0) * d.lds;
      float* row = ds + (t - r0) * d.lds;
      const float l = g.lse[t], D = g.D[t];
      grad_row(prow, row, t + 1, l, D, d.scale);
      std::fill(prow + t + 1, prow + r1, 0.0f);
      std::fill(row + t + 1, row + r1, 0.0f);
    }
    // dv[0:r1] += p^T dout[r0:r1], dk[0:r1] += ds^T q[r0:r1]: key rows j0.. in strips, the
    // query rows from the first that reaches them (p and ds are 0 above the diagonal)
    for (int64_t j0 = 0; j0 < r1; j0 += kMR) {
      const int64_t rows = std::min(kMR, r1 - j0), kb = std::max(r0, j0);
      const float* pa = p + (kb - r0) * d.lds + j0;
      const float* sa = ds + (kb - r0) * d.lds + j0;
      for (int64_t c = 0; c < d.hsp; c += kNR) {
        tile(r1 - kb, pa, 1, d.lds, g.d + kb * d.hsp + c, d.hsp, rows, add(g.dv + j0 * d.hsp + c));
        tile(r1 - kb, sa, 1, d.lds, g.q + kb * d.hsp + c, d.hsp, rows, add(g.dk + j0 * d.hsp + c));
      }
    }
    // dq[strip] = ds[strip] k[0 .. the strip's last row]
    for (int64_t s0 = r0; s0 < r1; s0 += kMR) {
      const int64_t rows = std::min(kMR, r1 - s0), kn = s0 + rows;
      for (int64_t c = 0; c < d.hsp; c += kNR) {
        tile(kn, ds + (s0 - r0) * d.lds, d.lds, 1, g.k + c, d.hsp, rows,
             [&](int64_t u, Vec lo, Vec hi) {
               float* dst = g.dq + (s0 + u) * d.hsp + c;
               store(dst, lo);
               store(dst + kLanes, hi);
             });
      }
    }
  }
}

inline float widen(float x) {
  return x;
}
inline float widen(uint16_t x) {
  return bf16_to_f32(x);
}
inline void narrow(float* p, float x) {
  *p = x;
}
inline void narrow(uint16_t* p, float x) {
  *p = f32_to_bf16(x);
}

// The heads are rows of hs elements kilobytes apart (qkv's row), each on other pages, which the
// hardware's prefetchers do not foresee: the packing loops fetch kAhead rows ahead of the one
// they copy (1.5-2x faster packing at tiny's shape, which had been ~20 % of a call).
constexpr int64_t kAhead = 8;
template <class E>
void prefetch_row(const E* row, int64_t n, bool write) {
  const char* p = reinterpret_cast<const char*>(row);
  const int64_t bytes = n * static_cast<int64_t>(sizeof(E));
  for (int64_t b = 0; b < bytes; b += 64) {
    if (write)
      __builtin_prefetch(p + b, 1);
    else
      __builtin_prefetch(p + b, 0);
  }
}

// dst (T, hsp) = src (T, hs) with row stride ld, widened; columns hs..hsp zero. Rows [r0, T).
template <class E>
void pack_rows(float* dst, const E* src, int64_t ld, const Dims& d, int64_t r0 = 0) {
  for (int64_t t = r0; t < d.T; ++t) {
    if (t + kAhead < d.T) prefetch_row(src + (t + kAhead) * ld, d.hs, false);
    float* row = dst + t * d.hsp;
#pragma omp simd
    for (int64_t i = 0; i < d.hs; ++i) row[i] = widen(src[t * ld + i]);
    std::fill(row + d.hs, row + d.hsp, 0.0f);
  }
}
#if defined(__AVX2__)
// Eight elements from p as f32.
inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load8(const uint16_t* p) {
  return bf16x8_to_f32(p);
}
#endif

// dst = src (T, hs) with row stride ld, widened, as panels of kNR keys: panel j0 / kNR at
// dst + j0 hs holds, for i < hs, keys j0 .. j0 + kNR - 1 (zeros past T).
template <class E>
void pack_panels(float* dst, const E* src, int64_t ld, const Dims& d) {
  for (int64_t j0 = 0; j0 < d.T; j0 += kNR) {
    float* panel = dst + j0 * d.hs;
    int64_t i0 = 0;
#if defined(__AVX2__)
    // full panels: blocks of 8 keys x 8 elements, transposed in registers
    if (j0 + kNR <= d.T) {
      for (int64_t v = 0; v < kNR; ++v)
        if (j0 + v + kNR < d.T) prefetch_row(src + (j0 + v + kNR) * ld, d.hs, false);
      for (; i0 + 8 <= d.hs; i0 += 8) {
        for (int64_t half = 0; half < kNR; half += 8) {
          __m256 r[8];
          for (int64_t u = 0; u < 8; ++u) r[u] = load8(src + (j0 + half + u) * ld + i0);
          transpose8(r);
          for (int64_t u = 0; u < 8; ++u) _mm256_storeu_ps(panel + (i0 + u) * kNR + half, r[u]);
        }
      }
    }
#endif
    for (int64_t v = 0; v < kNR; ++v) {
      if (i0 == 0 && j0 + v + kAhead < d.T) prefetch_row(src + (j0 + v + kAhead) * ld, d.hs, false);
      if (j0 + v < d.T) {
        const E* row = src + (j0 + v) * ld;
        for (int64_t i = i0; i < d.hs; ++i) panel[i * kNR + v] = widen(row[i]);
      } else {
        for (int64_t i = i0; i < d.hs; ++i) panel[i * kNR + v] = 0.0f;
      }
    }
  }
}
// dst (T - r0, hs) with row stride ld = rows [r0, T) of src (T, hsp), rounded where E is bf16.
template <class E>
void unpack_rows(E* dst, int64_t ld, const float* src, const Dims& d, int64_t r0 = 0) {
  for (int64_t t = r0; t < d.T; ++t) {
    E* row = dst + (t - r0) * ld;
    if (t + kAhead < d.T) prefetch_row(row + kAhead * ld, d.hs, true);
#pragma omp simd
    for (int64_t i = 0; i < d.hs; ++i) narrow(row + i, src[t * d.hsp + i]);
  }
}

// Scratch a thread: n floats rounded up to 16 (64 bytes) each piece.
int64_t floats(int64_t n) {
  return (n + 15) / 16 * 16;
}

// kLanes elements from p as f32.
template <class E>
inline Vec load_wide(const E* p) {
  if constexpr (std::is_same_v<E, float>) {
    return load(p);
  } else {
#if defined(__AVX2__)
    return load8(p);
#else
    Vec v;
    for (int64_t i = 0; i < kLanes; ++i) v[i] = widen(p[i]);
    return v;
#endif
  }
}

// The forward of at most kInPlaceRows last rows (sampling's one new token a step) of one query
// head, reading k and v where they are in qkv instead of packing the whole window first (which,
// for one row, copied every cached k and v row to read it once: most of a token's attention time
// at a long context). Row t: s_j = scale q . k_j for j <= t (each a dot product along the head,
// kLanes partial sums added in lane order, then the tail), the softmax of softmax_rows (exp_row),
// o = (sum_j p_j v_j, j in order) / sum. q, k, v rows at x + t ld (+ the head's offsets); s (T)
// and o (hsp) scratch. Not the packed path's sum order: the rows agree with the whole window's
// within rounding (tests/ops/flash_attention_test.cpp, LastRowsAreTheWholeWindowsRows).
constexpr int64_t kInPlaceRows = 2;
template <class E>
void forward_rows_in_place(E* out, int64_t out_ld, float* lse, const E* q, const E* k, const E* v,
                           int64_t ld, float* s, float* o, const Dims& d) {
  const int64_t hs = d.hs, hv = hs / kLanes * kLanes;
  for (int64_t t = d.q0; t < d.T; ++t) {
    const E* qt = q + t * ld;
    const int64_t n = t + 1;
    for (int64_t j = 0; j < n; ++j) {
      const E* kj = k + j * ld;
      if (j + kAhead < n) prefetch_row(k + (j + kAhead) * ld, hs, false);
      Vec acc = splat(0.0f);
      for (int64_t i = 0; i < hv; i += kLanes)
        acc = fmadd(load_wide(qt + i), load_wide(kj + i), acc);
      float dot = 0.0f;
      for (int64_t l = 0; l < kLanes; ++l) dot += acc[l];
      for (int64_t i = hv; i < hs; ++i) dot += widen(qt[i]) * widen(kj[i]);
      s[j] = dot * d.scale;
    }
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
    const float sum = exp_row(s, n, mx);
    lse[t - d.q0] = mx + std::log(sum);
    std::fill(o, o + d.hsp, 0.0f);
    for (int64_t j = 0; j < n; ++j) {
      const E* vj = v + j * ld;
      if (j + kAhead < n) prefetch_row(v + (j + kAhead) * ld, hs, false);
      const Vec pj = splat(s[j]);
      for (int64_t i = 0; i < hv; i += kLanes)
        store(o + i, fmadd(pj, load_wide(vj + i), load(o + i)));
      for (int64_t i = hv; i < hs; ++i) o[i] += s[j] * widen(vj[i]);
    }
    const float inv = 1.0f / sum;
    E* row = out + (t - d.q0) * out_ld;
    for (int64_t i = 0; i < hs; ++i) narrow(row + i, o[i] * inv);
  }
}

// out is (B,Tq,C): the last Tq positions' rows; lse is (B,NH,Tq); qkv is (B,T,C3) holding
// q (NH heads) | k (NKV heads) | v (NKV heads), heads of hs = C/NH, C3 = C + 2 NKV hs.
template <class E>
void forward(Workspace& ws, E* out, float* lse, const E* qkv, int64_t B, int64_t T, int64_t Tq,
             int64_t C, int64_t NH, int64_t NKV) {
  const int64_t hs = C / NH, C3 = C + 2 * NKV * hs, G = NH / NKV;
  const Dims d = dims(T, hs, T - Tq);
  if (Tq <= kInPlaceRows && Tq < T) {  // (a whole window keeps the packed path)
    const int64_t per = floats(T) + floats(d.hsp);
    float* scratch = static_cast<float*>(
        ws.get(static_cast<size_t>(omp_get_max_threads() * per) * sizeof(float)));
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < NH; ++h) {
        float* sc = scratch + static_cast<int64_t>(omp_get_thread_num()) * per;
        const E* x = qkv + b * T * C3;
        forward_rows_in_place(out + b * Tq * C + h * hs, C, lse + (b * NH + h) * Tq, x + h * hs,
                              x + C + (h / G) * hs, x + C + (NKV + h / G) * hs, C3, sc,
                              sc + floats(T), d);
      }
    }
    return;
  }
  const int64_t panels = floats((T + kNR - 1) / kNR * kNR * hs), rows = floats(T * d.hsp);
  const int64_t per = panels + 3 * rows + floats(kBlockRows * d.lds) + floats(kBlockRows);
  float* scratch =
      static_cast<float*>(ws.get(static_cast<size_t>(omp_get_max_threads() * per) * sizeof(float)));
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      float* kt = scratch + static_cast<int64_t>(omp_get_thread_num()) * per;
      float *v = kt + panels, *q = v + rows, *o = q + rows, *s = o + rows;
      float* inv = s + floats(kBlockRows * d.lds);
      const E* x = qkv + b * T * C3;
      pack_panels(kt, x + C + (h / G) * hs, C3, d);
      pack_rows(v, x + C + (NKV + h / G) * hs, C3, d);
      pack_rows(q, x + h * hs, C3, d, d.q0);
      forward_head(o, lse + (b * NH + h) * Tq, s, inv, q, kt, v, d);
      unpack_rows(out + b * Tq * C + h * hs, C, o, d, d.q0);
    }
  }
}

// dqkv, qkv are (B,T,C3), C3 = C + 2 NKV hs; dout, out are (B,T,C); lse is (B,NH,T).
template <class E>
void backward(Workspace& ws, E* dqkv, const E* dout, const E* qkv, const E* out, const float* lse,
              int64_t B, int64_t T, int64_t C, int64_t NH, int64_t NKV) {
  const int64_t hs = C / NH, C3 = C + 2 * NKV * hs, G = NH / NKV;
  const Dims d = dims(T, hs);
  const int64_t panels = floats((T + kNR - 1) / kNR * kNR * hs), rows = floats(T * d.hsp);
  const int64_t block = floats(kBlockRows * d.lds);
  const int64_t per = 2 * panels + 6 * rows + floats(T) + 2 * block;
  float* scratch =
      static_cast<float*>(ws.get(static_cast<size_t>(omp_get_max_threads() * per) * sizeof(float)));
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t kv = 0; kv < NKV; ++kv) {
      float* kt = scratch + static_cast<int64_t>(omp_get_thread_num()) * per;
      float *vt = kt + panels, *k = vt + panels, *q = k + rows, *dd = q + rows;
      float *dq = dd + rows, *dk = dq + rows, *dv = dk + rows, *D = dv + rows;
      float* p = D + floats(T);
      float* ds = p + block;
      const E* x = qkv + b * T * C3;
      E* dx = dqkv + b * T * C3;
      pack_panels(kt, x + C + kv * hs, C3, d);
      pack_panels(vt, x + C + (NKV + kv) * hs, C3, d);
      pack_rows(k, x + C + kv * hs, C3, d);
      std::fill(dk, dk + 2 * rows, 0.0f);                // dk, dv
      for (int64_t h = kv * G; h < (kv + 1) * G; ++h) {  // the query heads reading kv
        pack_rows(q, x + h * hs, C3, d);
        pack_rows(dd, dout + b * T * C + h * hs, C, d);
        // D from out widened into dq (which backward_head overwrites): one loop on floats for
        // both E (a loop on E vectorised differently for bf16 at the SSE level)
        pack_rows(dq, out + b * T * C + h * hs, C, d);
        for (int64_t t = 0; t < T; ++t) {
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t i = 0; i < hs; ++i) sum += dd[t * d.hsp + i] * dq[t * d.hsp + i];
          D[t] = sum;
        }
        const HeadGrad g{q, dd, kt, vt, k, lse + (b * NH + h) * T, D, dq, dk, dv};
        backward_head(p, ds, g, d);
        unpack_rows(dx + h * hs, C3, dq, d);
      }
      unpack_rows(dx + C + kv * hs, C3, dk, d);
      unpack_rows(dx + C + (NKV + kv) * hs, C3, dv, d);
    }
  }
}

}  // namespace

void flash_attention_forward(Workspace& ws, float* out, float* lse, const float* qkv, int64_t B,
                             int64_t T, int64_t Tq, int64_t C, int64_t NH, int64_t NKV) {
  forward(ws, out, lse, qkv, B, T, Tq, C, NH, NKV);
}

void flash_attention_forward_bf16(Workspace& ws, uint16_t* out, float* lse, const uint16_t* qkv,
                                  int64_t B, int64_t T, int64_t Tq, int64_t C, int64_t NH,
                                  int64_t NKV) {
  forward(ws, out, lse, qkv, B, T, Tq, C, NH, NKV);
}

void flash_attention_backward(Workspace& ws, float* dqkv, const float* dout, const float* qkv,
                              const float* out, const float* lse, int64_t B, int64_t T, int64_t C,
                              int64_t NH, int64_t NKV) {
  backward(ws, dqkv, dout, qkv, out, lse, B, T, C, NH, NKV);
}

void flash_attention_backward_bf16(Workspace& ws, uint16_t* dqkv, const uint16_t* dout,
                                   const uint16_t* qkv, const uint16_t* out, const float* lse,
                                   int64_t B, int64_t T, int64_t C, int64_t NH, int64_t NKV) {
  backward(ws, dqkv, dout, qkv, out, lse, B, T, C, NH, NKV);
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
