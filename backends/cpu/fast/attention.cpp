// Fast causal self-attention, per (batch, head), in parallel with OpenMP: the forward over
// (b,h) pairs, the backward over (b, key/value head) pairs. Grouped-query attention (NKV < NH):
// query head h reads key/value head h / G, G = NH / NKV; the backward runs the G query heads of a
// group one after another in one work item, so their dk/dv sums never race and keep one order.
// With AVX-512: a register-blocked micro-kernel (attention_kernels.h: 6 rows x up to 64 columns,
// fp32 accumulation in order) for all products, rows in blocks of 6 with the scale + mask +
// softmax (or its gradient) fused between the products while the block is in L1; only the causal
// triangle (to a multiple of 16 columns) is computed. Measured against the sgemm version below on
// tiny (T=256, hs=64), single core: forward 27.5 -> 14 ms/step, backward 35.5 -> 26 ms/step;
// gpt2 (T=1024): forward 30 -> 17, backward 50 -> 45 ms per layer at B=1.
// Without AVX-512: sgemm for the products, rows in blocks so that they skip most of the masked
// triangle; OpenBLAS runs single-threaded inside the parallel region.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backends/cpu/fast/attention_blas.h"
#include "backends/cpu/fast/vec_math.h"
#include "backends/cpu/kernels.h"

#if defined(__AVX512F__)
#include "backends/cpu/fast/attention_kernels.h"
#endif

CT_FAST_WIDE_VECTORS

namespace ct::cpu::fast::CT_CPU_ISA {

namespace {
// One (batch, query head)'s operands of the backward pass: q, k, v and dq, dk, dv are (T,hs) with
// row stride C3 = C + 2 NKV hs inside qkv / dqkv, k, v, dk and dv those of key/value head
// h / (NH / NKV) (shared by the query heads of its group); d (dout) is (T,hs) with row stride C;
// a (att) is (T,T).
struct HeadGrads {
  const float *q, *k, *v, *a, *d;
  float *dq, *dk, *dv;
};
HeadGrads head_grads(float* dqkv, const float* dout, const float* qkv, const float* att, int64_t b,
                     int64_t h, int64_t T, int64_t C, int64_t NH, int64_t NKV) {
  const int64_t hs = C / NH, C3 = C + 2 * NKV * hs, kv = h / (NH / NKV);
  const int64_t koff = C + kv * hs, voff = C + (NKV + kv) * hs;  // kv's k and v in a row
  HeadGrads g;
  g.q = qkv + b * T * C3 + h * hs;
  g.k = qkv + b * T * C3 + koff;
  g.v = qkv + b * T * C3 + voff;
  g.a = att + (b * NH + h) * T * T;
  g.d = dout + b * T * C + h * hs;
  g.dq = dqkv + b * T * C3 + h * hs;
  g.dk = dqkv + b * T * C3 + koff;
  g.dv = dqkv + b * T * C3 + voff;
  return g;
}
}  // namespace

#if defined(__AVX512F__)

namespace {

// Row stride of the per-thread score/probability buffers and of the packed K^T / V^T: T rounded
// up to whole vectors, plus one vector so that rows do not all fall into the same L1 sets.
int64_t padded(int64_t T) {
  return ((T + 15) & ~int64_t{15}) + 16;
}

}  // namespace

// Per (b,h), rows in blocks of 6 (the micro-kernel's height): scores for columns [0, round16(
// end of block)) from the packed K^T, the causal softmax of those rows (into att and a hot copy),
// then out = probabilities @ v for the block. Only the causal triangle (to vector granularity)
// is computed; the rest of each att row is zeroed. GQA: each query head packs its key/value
// head's K^T itself (G packs of one kv head, cheap next to the O(T^2 hs) products).
void attention_forward(Workspace& ws, float* out, float* att, const float* qkv, int64_t B,
                       int64_t T, int64_t C, int64_t NH, int64_t NKV) {
  using attn::kRows;
  int64_t hs = C / NH, C3 = C + 2 * NKV * hs, G = NH / NKV, Tp = padded(T);
  float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  int64_t per_thread = (hs + kRows) * Tp;
  float* scratch = static_cast<float*>(
      ws.get(static_cast<size_t>(omp_get_max_threads() * per_thread) * sizeof(float)));
  // att (B*NH*T*T floats) is not read again until the backward pass: with whole aligned rows it
  // is written with non-temporal stores (no read-for-ownership, no eviction of the working set).
  bool stream = T % 16 == 0 && reinterpret_cast<uintptr_t>(att) % 64 == 0;
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      float* kt = scratch + static_cast<int64_t>(omp_get_thread_num()) * per_thread;  // (hs,Tp)
      float* s = kt + hs * Tp;                                                        // (6,Tp)
      const float* q = qkv + b * T * C3 + h * hs;                  // (T,hs), row stride C3
      const float* k = qkv + b * T * C3 + C + (h / G) * hs;        // kv head h / G
      const float* v = qkv + b * T * C3 + C + (NKV + h / G) * hs;  // kv head h / G
      float* a = att + (b * NH + h) * T * T;                       // (T,T)
      float* o = out + b * T * C + h * hs;                         // (T,hs), row stride C
      attn::pack_transposed(kt, Tp, k, C3, T, hs);
      for (int64_t r0 = 0; r0 < T; r0 += kRows) {
        int R = static_cast<int>(std::min<int64_t>(kRows, T - r0));
        int64_t r1 = r0 + R, W = (r1 + 15) & ~int64_t{15};
        // s[0:R, 0:W] = q[r0:r1] k[0:W]^T (unscaled)
        attn::tile(R, W, hs, q + r0 * C3, C3, 1, kt, Tp, s, Tp);
        for (int r = 0; r < R; ++r) {
          int64_t t = r0 + r;
          float* row = s + r * Tp;
          float* arow = a + t * T;
          __m512 m = _mm512_set1_ps(-INFINITY);
          for (int64_t j = 0; j <= t; j += 16)
            m = _mm512_mask_max_ps(m, attn::upto(t, j), m, _mm512_loadu_ps(row + j));
          __m512 mx = _mm512_set1_ps(attn::reduce16<true>(m)), sc = _mm512_set1_ps(scale);
          __m512 sum = _mm512_setzero_ps();
          for (int64_t j = 0; j < W; j += 16) {
            __m512 e = attn::exp16(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(row + j), mx), sc));
            e = _mm512_maskz_mov_ps(attn::upto(t, j), e);
            _mm512_storeu_ps(row + j, e);
            sum = _mm512_add_ps(sum, e);
          }
          __m512 inv = _mm512_set1_ps(1.0f / attn::reduce16<false>(sum));
          if (stream) {
            for (int64_t j = 0; j < W; j += 16) {
              __m512 p = _mm512_mul_ps(_mm512_loadu_ps(row + j), inv);
              _mm512_storeu_ps(row + j, p);
              _mm512_stream_ps(arow + j, p);
            }
            for (int64_t j = W; j < T; j += 16) _mm512_stream_ps(arow + j, _mm512_setzero_ps());
          } else {
            for (int64_t j = 0; j < W; j += 16) {
              __m512 p = _mm512_mul_ps(_mm512_loadu_ps(row + j), inv);
              _mm512_storeu_ps(row + j, p);
              _mm512_mask_storeu_ps(arow + j, attn::upto(T - 1, j), p);
            }
            if (W < T) std::memset(arow + W, 0, static_cast<size_t>(T - W) * sizeof(float));
          }
        }
        // o[r0:r1] = p[0:R, 0:r1] v[0:r1]  (p is zero beyond each row's diagonal)
        attn::tile(R, hs, r1, s, Tp, 1, v, C3, o + r0 * C, C);
      }
      if (stream) _mm_sfence();
    }
  }
}

// dqkv, qkv are (B,T,C3), C3 = C + 2 NKV hs; dout is (B,T,C); att is (B,NH,T,T)
//   dv = att^T dout;  datt = dout v^T;  ds = att * (datt - rowsum(att * datt)) * scale
//   dq = ds k;  dk = ds^T q
// Per (b, key/value head kv), the query heads h = kv G .. kv G + G-1 in order (GQA; G = 1 is
// multi-head attention). Row blocks of 6: datt from the packed V^T (packed once per kv), the
// softmax gradient in place, dq. Then column blocks of 6: dk and dv with the micro-kernel reading
// ds and att transposed, over rows t >= c0; the group's first head writes them, the others add to
// them. The workspace holds one (T,Tp) ds matrix and one (hs,Tp) V^T per thread.
void attention_backward(Workspace& ws, float* dqkv, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t NH,
                        int64_t NKV) {
  using attn::kRows;
  int64_t hs = C / NH, C3 = C + 2 * NKV * hs, G = NH / NKV, Tp = padded(T);
  float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  int64_t per_thread = (T + hs) * Tp;
  float* scratch = static_cast<float*>(
      ws.get(static_cast<size_t>(omp_get_max_threads() * per_thread) * sizeof(float)));
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t kv = 0; kv < NKV; ++kv) {
      float* ds = scratch + static_cast<int64_t>(omp_get_thread_num()) * per_thread;  // (T,Tp)
      float* vt = ds + T * Tp;                                                        // (hs,Tp)
      for (int64_t h = kv * G; h < (kv + 1) * G; ++h) {
        const bool first = h == kv * G;  // writes dk/dv (=); the group's other heads add (+=)
        const auto [q, k, v, a, d, dq, dk, dv] =
            head_grads(dqkv, dout, qkv, att, b, h, T, C, NH, NKV);
        if (first) attn::pack_transposed(vt, Tp, v, C3, T, hs);
        for (int64_t r0 = 0; r0 < T; r0 += kRows) {
          int R = static_cast<int>(std::min<int64_t>(kRows, T - r0));
          int64_t r1 = r0 + R, W = (r1 + 15) & ~int64_t{15};
          float* blk = ds + r0 * Tp;
          // att comes from memory (written a whole forward pass ago): fetch the next block's rows.
          for (int64_t t = r1; t < std::min(T, r1 + kRows); ++t)
            for (int64_t j = 0; j <= t; j += 16)
              _mm_prefetch(reinterpret_cast<const char*>(a + t * T + j), _MM_HINT_T0);
          // datt[r0:r1, 0:W] = dout[r0:r1] v[0:W]^T, then the softmax backward in place
          attn::tile(R, W, hs, d + r0 * C, C, 1, vt, Tp, blk, Tp);
          for (int r = 0; r < R; ++r) {
            int64_t t = r0 + r;
            float* row = blk + r * Tp;
            const float* arow = a + t * T;
            __m512 acc = _mm512_setzero_ps();
            for (int64_t j = 0; j <= t; j += 16)
              acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(attn::upto(t, j), arow + j),
                                    _mm512_loadu_ps(row + j), acc);
            __m512 dot = _mm512_set1_ps(attn::reduce16<false>(acc)), sc = _mm512_set1_ps(scale);
            for (int64_t j = 0; j < W; j += 16) {
              __m512 p = _mm512_maskz_loadu_ps(attn::upto(t, j), arow + j);
              _mm512_storeu_ps(
                  row + j, _mm512_mul_ps(
                               _mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(row + j), dot)), sc));
            }
          }
          // dq[r0:r1] = ds[r0:r1, 0:r1] k[0:r1]
          attn::tile(R, hs, r1, blk, Tp, 1, k, C3, dq + r0 * C3, C3);
        }
        // Column blocks of 16 (one cache line of ds and att), rows in chunks of kChunk so that the
        // chunk's ds/att lines and q/dout rows stay in L1 across the 6-wide groups:
        //   dk[g0:g1] (+)= ds[i0:i1, g0:g1]^T q[i0:i1];  dv[g0:g1] (+)= att[i0:i1, g0:g1]^T
        //   dout[i0:i1]
        // Rows t >= g0 are the only ones that see keys/values in [g0, g1): ds (zeroed past each
        // row's diagonal to a multiple of 16) and att are zero above it. The first chunk of the
        // group's first head writes, every later one accumulates.
        constexpr int64_t kChunk = 64;
        for (int64_t c0 = 0; c0 < T; c0 += 16) {
          int64_t c1 = std::min(T, c0 + 16);
          for (int64_t i0 = c0; i0 < T; i0 += kChunk) {
            int64_t i1 = std::min(T, i0 + kChunk);
            for (int64_t g0 = c0; g0 < c1; g0 += kRows) {
              int R = static_cast<int>(std::min<int64_t>(kRows, c1 - g0));
              int64_t k0 = std::max(i0, g0);
              const bool add = !first || i0 != c0;
              attn::tile(R, hs, i1 - k0, ds + k0 * Tp + g0, 1, Tp, q + k0 * C3, C3, dk + g0 * C3,
                         C3, add);
              attn::tile(R, hs, i1 - k0, a + k0 * T + g0, 1, T, d + k0 * C, C, dv + g0 * C3, C3,
                         add);
            }
          }
        }
      }
    }
  }
}

#else  // !__AVX512F__: sgemm per row block

using attention_blas::block_rows;
using attention_blas::gemm;

// out is (B,T,C); att is (B,NH,T,T); qkv is (B,T,C3) holding q (NH heads) | k (NKV heads) |
// v (NKV heads), heads of hs = C/NH, C3 = C + 2 NKV hs; query head h reads kv head h / (NH/NKV)
void attention_forward(Workspace&, float* out, float* att, const float* qkv, int64_t B, int64_t T,
                       int64_t C, int64_t NH, int64_t NKV) {
  int64_t hs = C / NH, C3 = C + 2 * NKV * hs, G = NH / NKV, blk = block_rows(T);
  float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const float* q = qkv + b * T * C3 + h * hs;                  // (T,hs), row stride C3
      const float* k = qkv + b * T * C3 + C + (h / G) * hs;        // kv head h / G
      const float* v = qkv + b * T * C3 + C + (NKV + h / G) * hs;  // kv head h / G
      float* a = att + (b * NH + h) * T * T;                       // (T,T)
      float* o = out + b * T * C + h * hs;                         // (T,hs), row stride C
      for (int64_t r0 = 0; r0 < T; r0 += blk) {
        int64_t r1 = std::min(T, r0 + blk);
        // a[r0:r1, 0:r1] = scale * q[r0:r1] k[0:r1]^T
        gemm(false, true, r1 - r0, r1, hs, scale, q + r0 * C3, C3, k, C3, 0.0f, a + r0 * T, T);
        for (int64_t t = r0; t < r1; ++t) {
          float* row = a + t * T;
          float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
          for (int64_t j = 0; j <= t; ++j) mx = row[j] > mx ? row[j] : mx;
          // The exp loop runs on whole vectors up to len (scores up to r1 exist, from the
          // sgemm), masking j > t to zero, so no scalar remainder of exps is left.
          int64_t len = std::min(r1, (t + 16) & ~int64_t{15});
          float s = 0.0f;
#pragma omp simd reduction(+ : s)
          for (int64_t j = 0; j < len; ++j) {
            float e = fast_exp(row[j] - mx);
            e = j <= t ? e : 0.0f;
            row[j] = e;
            s += e;
          }
          float inv = 1.0f / s;
#pragma omp simd
          for (int64_t j = 0; j < len; ++j) row[j] *= inv;
          std::memset(row + len, 0, static_cast<size_t>(T - len) * sizeof(float));
        }
        // o[r0:r1] = a[r0:r1, 0:r1] v[0:r1]
        gemm(false, false, r1 - r0, hs, r1, 1.0f, a + r0 * T, T, v, C3, 0.0f, o + r0 * C, C);
      }
    }
  }
}

// dqkv, qkv are (B,T,C3), C3 = C + 2 NKV hs; dout is (B,T,C); att is (B,NH,T,T)
//   dv = att^T dout;  datt = dout v^T;  ds = att * (datt - rowsum(att * datt)) * scale
//   dq = ds k;  dk = ds^T q
// Per (b, key/value head kv), the query heads h = kv G .. kv G + G-1 in order (GQA): the first
// writes dk/dv (beta 0), the others add to them (beta 1).
// The workspace holds one (T,T) datt/ds matrix per thread.
void attention_backward(Workspace& ws, float* dqkv, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t NH,
                        int64_t NKV) {
  int64_t hs = C / NH, C3 = C + 2 * NKV * hs, G = NH / NKV, blk = block_rows(T);
  float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  int nthreads = omp_get_max_threads();
  float* scratch =
      static_cast<float*>(ws.get(static_cast<size_t>(nthreads) * T * T * sizeof(float)));
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t kv = 0; kv < NKV; ++kv) {
      float* ds = scratch + static_cast<int64_t>(omp_get_thread_num()) * T * T;  // (T,T)
      for (int64_t h = kv * G; h < (kv + 1) * G; ++h) {
        const float beta = h == kv * G ? 0.0f : 1.0f;  // dk/dv: (=) for the group's first head
        const auto [q, k, v, a, d, dq, dk, dv] =
            head_grads(dqkv, dout, qkv, att, b, h, T, C, NH, NKV);
        for (int64_t r0 = 0; r0 < T; r0 += blk) {
          int64_t r1 = std::min(T, r0 + blk);
          // datt[r0:r1, 0:r1] = dout[r0:r1] v[0:r1]^T, then the softmax backward in place
          gemm(false, true, r1 - r0, r1, hs, 1.0f, d + r0 * C, C, v, C3, 0.0f, ds + r0 * T, T);
          for (int64_t t = r0; t < r1; ++t) {
            float* row = ds + t * T;
            const float* arow = a + t * T;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t j = 0; j <= t; ++j) dot += arow[j] * row[j];
#pragma omp simd
            for (int64_t j = 0; j <= t; ++j) row[j] = arow[j] * (row[j] - dot) * scale;
            for (int64_t j = t + 1; j < r1; ++j) row[j] = 0.0f;
          }
          // dq[r0:r1] = ds[r0:r1, 0:r1] k[0:r1]
          gemm(false, false, r1 - r0, hs, r1, 1.0f, ds + r0 * T, T, k, C3, 0.0f, dq + r0 * C3, C3);
        }
        // Column blocks: rows t >= c0 are the only ones that see keys/values in [c0, c1).
        for (int64_t c0 = 0; c0 < T; c0 += blk) {
          int64_t c1 = std::min(T, c0 + blk);
          // dk[c0:c1] (+)= ds[c0:T, c0:c1]^T q[c0:T];  dv[c0:c1] (+)= att[c0:T, c0:c1]^T dout[c0:T]
          gemm(true, false, c1 - c0, hs, T - c0, 1.0f, ds + c0 * T + c0, T, q + c0 * C3, C3, beta,
               dk + c0 * C3, C3);
          gemm(true, false, c1 - c0, hs, T - c0, 1.0f, a + c0 * T + c0, T, d + c0 * C, C, beta,
               dv + c0 * C3, C3);
        }
      }
    }
  }
}

#endif  // __AVX512F__

}  // namespace ct::cpu::fast::CT_CPU_ISA
