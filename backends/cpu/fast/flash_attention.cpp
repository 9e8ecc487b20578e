// Fast fused causal self-attention (core/device.h flash_attention_*): (batch, head) pairs in
// parallel with OpenMP; each head in blocks of query rows against the keys up to the block's
// last row, the products by sgemm (OpenBLAS single-threaded inside the parallel region) and the
// softmax between them while the block is in cache. Only lse is saved: the probabilities live in
// a per-thread (rows x T) buffer for one block, and the backward recomputes them.
// Grouped-query attention: query head h reads key/value head h / G, G = NH / NKV. The backward
// runs over (batch, key/value head) pairs instead, the G query heads of a group one after another
// in one work item, so that their sums into dk/dv never race and always have one order.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backends/cpu/fast/attention_blas.h"
#include "backends/cpu/fast/vec_math.h"
#include "backends/cpu/kernels.h"

CT_FAST_WIDE_VECTORS

namespace ct::cpu::fast::CT_CPU_ISA {

namespace {

using attention_blas::block_rows;
using attention_blas::gemm;

// p[t, 0..len) (=) exp(s - lse_t) for columns j <= t, 0 beyond; rows r0..r1 of a block whose
// row t is at p + (t - r0) * T.
void probabilities(float* p, const float* lse, int64_t r0, int64_t r1, int64_t T) {
  for (int64_t t = r0; t < r1; ++t) {
    float* row = p + (t - r0) * T;
    const float l = lse[t];
#pragma omp simd
    for (int64_t j = 0; j < r1; ++j) row[j] = j <= t ? fast_exp(row[j] - l) : 0.0f;
  }
}

// sum of exp(x[j] - mx) over j < n, added in the order of j: the exps a vector loop over a
// stack chunk, the sum a scalar loop. (One loop with `omp simd reduction(+ : sum)` ran scalar:
// GCC 12 did not if-convert fast_exp's selects there, 3 ns an element.)
float sum_exp(const float* x, int64_t n, float mx) {
  constexpr int64_t kChunk = 256;
  float e[kChunk];
  float sum = 0.0f;
  for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
    const int64_t len = std::min(kChunk, n - j0);
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) e[j] = fast_exp(x[j0 + j] - mx);
    for (int64_t j = 0; j < len; ++j) sum += e[j];
  }
  return sum;
}

// One query head's forward: q, k, v are (T,hs) with row strides ldq, ldk, ldv; o (T,hs) with
// stride ldo; l (T) its log-sum-exps; s a (blk,T) scratch block.
void forward_head(float* s, const float* q, int64_t ldq, const float* k, int64_t ldk,
                  const float* v, int64_t ldv, float* o, int64_t ldo, float* l, int64_t T,
                  int64_t hs, int64_t blk, float scale) {
  for (int64_t r0 = 0; r0 < T; r0 += blk) {
    const int64_t r1 = std::min(T, r0 + blk);
    // s = scale q[r0:r1] k[0:r1]^T; then each row's log-sum-exp over j <= t
    gemm(false, true, r1 - r0, r1, hs, scale, q + r0 * ldq, ldq, k, ldk, 0.0f, s, T);
    for (int64_t t = r0; t < r1; ++t) {
      const float* row = s + (t - r0) * T;
      const int64_t n = t + 1;
      float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < n; ++j) mx = row[j] > mx ? row[j] : mx;
      l[t] = mx + std::log(sum_exp(row, n, mx));
    }
    probabilities(s, l, r0, r1, T);
    // o[r0:r1] = p v[0:r1]
    gemm(false, false, r1 - r0, hs, r1, 1.0f, s, T, v, ldv, 0.0f, o + r0 * ldo, ldo);
  }
}

// Where one backward work item reads and writes: (T,hs) blocks with their row strides.
struct HeadGrad {
  const float *q, *d, *o, *k, *v;  // query head, its dout and out; the kv head
  int64_t ldq, ldd, ldo, ldkv;     // k and v share ldkv, dk and dv lddkv
  float *dq, *dk, *dv;
  int64_t lddq, lddkv;
};

// One query head's backward, its dk and dv summed into g.dk, g.dv: p, ds are (blk,T) scratch.
void backward_head(float* p, float* ds, const HeadGrad& g, const float* l, int64_t T, int64_t hs,
                   int64_t blk, float scale) {
  for (int64_t r0 = 0; r0 < T; r0 += blk) {
    const int64_t r1 = std::min(T, r0 + blk), rows = r1 - r0;
    gemm(false, true, rows, r1, hs, scale, g.q + r0 * g.ldq, g.ldq, g.k, g.ldkv, 0.0f, p, T);
    probabilities(p, l, r0, r1, T);
    // dv[0:r1] += p^T dout[r0:r1]
    gemm(true, false, r1, hs, rows, 1.0f, p, T, g.d + r0 * g.ldd, g.ldd, 1.0f, g.dv, g.lddkv);
    // ds = dout[r0:r1] v[0:r1]^T, then the softmax backward in place
    gemm(false, true, rows, r1, hs, 1.0f, g.d + r0 * g.ldd, g.ldd, g.v, g.ldkv, 0.0f, ds, T);
    for (int64_t t = r0; t < r1; ++t) {
      const float* dt = g.d + t * g.ldd;
      const float* ot = g.o + t * g.ldo;
      float D = 0.0f;
#pragma omp simd reduction(+ : D)
      for (int64_t i = 0; i < hs; ++i) D += dt[i] * ot[i];
      float* row = ds + (t - r0) * T;
      const float* prow = p + (t - r0) * T;
#pragma omp simd
      for (int64_t j = 0; j < r1; ++j) row[j] = prow[j] * (row[j] - D) * scale;
    }
    // dq[r0:r1] = ds k[0:r1];  dk[0:r1] += ds^T q[r0:r1]
    gemm(false, false, rows, hs, r1, 1.0f, ds, T, g.k, g.ldkv, 0.0f, g.dq + r0 * g.lddq, g.lddq);
    gemm(true, false, r1, hs, rows, 1.0f, ds, T, g.q + r0 * g.ldq, g.ldq, 1.0f, g.dk, g.lddkv);
  }
}

void zero_rows(float* x, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t t = 0; t < rows; ++t)
    std::memset(x + t * ld, 0, static_cast<size_t>(cols) * sizeof(float));
}
// dst (rows,cols) contiguous f32 = src (rows,cols) bf16 with row stride ld, widened (exact)
void widen_rows(float* dst, const uint16_t* src, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t t = 0; t < rows; ++t) {
#pragma omp simd
    for (int64_t i = 0; i < cols; ++i) dst[t * cols + i] = bf16_to_f32(src[t * ld + i]);
  }
}
// dst (rows,cols) bf16 with row stride ld = src (rows,cols) contiguous f32, rounded to nearest even
void round_rows(uint16_t* dst, int64_t ld, const float* src, int64_t rows, int64_t cols) {
  for (int64_t t = 0; t < rows; ++t) {
#pragma omp simd
    for (int64_t i = 0; i < cols; ++i) dst[t * ld + i] = f32_to_bf16(src[t * cols + i]);
  }
}

}  // namespace

// out is (B,T,C); lse is (B,NH,T); qkv is (B,T,C3) holding q (NH heads) | k (NKV heads) |
// v (NKV heads), heads of hs = C/NH, C3 = C + 2 NKV hs; query head h reads kv head h / (NH/NKV)
void flash_attention_forward(Workspace& ws, float* out, float* lse, const float* qkv, int64_t B,
                             int64_t T, int64_t C, int64_t NH, int64_t NKV) {
  const int64_t hs = C / NH, C3 = C + 2 * NKV * hs, G = NH / NKV, blk = block_rows(T);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int nthreads = omp_get_max_threads();
  float* scratch =
      static_cast<float*>(ws.get(static_cast<size_t>(nthreads) * blk * T * sizeof(float)));
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      float* s = scratch + static_cast<int64_t>(omp_get_thread_num()) * blk * T;  // (blk, T)
      const float* x = qkv + b * T * C3;
      forward_head(s, x + h * hs, C3, x + C + (h / G) * hs, C3, x + C + (NKV + h / G) * hs, C3,
                   out + b * T * C + h * hs, C, lse + (b * NH + h) * T, T, hs, blk, scale);
    }
  }
}

// The same with bf16 out and qkv: each work item widens its head's q, k, v into the thread's
// scratch, runs forward_head on them and rounds its o into out -- the bits of
// flash_attention_forward on a widened qkv (the products read the same values through other
// strides), in one region and without a widened copy of the whole qkv.
void flash_attention_forward_bf16(Workspace& ws, uint16_t* out, float* lse, const uint16_t* qkv,
                                  int64_t B, int64_t T, int64_t C, int64_t NH, int64_t NKV) {
  const int64_t hs = C / NH, C3 = C + 2 * NKV * hs, G = NH / NKV, blk = block_rows(T);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int nthreads = omp_get_max_threads();
  const int64_t per = blk * T + 4 * T * hs;  // s (blk,T); q, k, v, o (T,hs)
  float* scratch = static_cast<float*>(ws.get(static_cast<size_t>(nthreads * per) * sizeof(float)));
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      float* s = scratch + static_cast<int64_t>(omp_get_thread_num()) * per;
      float *q = s + blk * T, *k = q + T * hs, *v = k + T * hs, *o = v + T * hs;
      const uint16_t* x = qkv + b * T * C3;
      widen_rows(q, x + h * hs, T, hs, C3);
      widen_rows(k, x + C + (h / G) * hs, T, hs, C3);
      widen_rows(v, x + C + (NKV + h / G) * hs, T, hs, C3);
      forward_head(s, q, hs, k, hs, v, hs, o, hs, lse + (b * NH + h) * T, T, hs, blk, scale);
      round_rows(out + b * T * C + h * hs, C, o, T, hs);
    }
  }
}

// dqkv, qkv are (B,T,C3), C3 = C + 2 NKV hs; dout, out are (B,T,C); lse is (B,NH,T). Per block
// of query rows:
//   p = exp(scale q k^T - lse);  dv += p^T dout;  dp = dout v^T;  D = rowsum(dout * out);
//   ds = p (dp - D) scale;  dq = ds k;  dk += ds^T q.
// The workspace holds two (rows, T) blocks per thread; dk and dv gather the blocks in order, and
// with GQA the query heads of the group in order (h = kv G .. kv G + G-1, each all its blocks).
void flash_attention_backward(Workspace& ws, float* dqkv, const float* dout, const float* qkv,
                              const float* out, const float* lse, int64_t B, int64_t T, int64_t C,
                              int64_t NH, int64_t NKV) {
  const int64_t hs = C / NH, C3 = C + 2 * NKV * hs, G = NH / NKV, blk = block_rows(T);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int nthreads = omp_get_max_threads();
  float* scratch =
      static_cast<float*>(ws.get(static_cast<size_t>(nthreads) * 2 * blk * T * sizeof(float)));
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t kv = 0; kv < NKV; ++kv) {
      float* p = scratch + static_cast<int64_t>(omp_get_thread_num()) * 2 * blk * T;  // (blk,T)
      float* ds = p + blk * T;                                                        // (blk,T)
      HeadGrad g;
      // key/value head kv: (T,hs), row stride C3
      g.k = qkv + b * T * C3 + C + kv * hs;
      g.v = qkv + b * T * C3 + C + (NKV + kv) * hs;
      g.dk = dqkv + b * T * C3 + C + kv * hs;
      g.dv = dqkv + b * T * C3 + C + (NKV + kv) * hs;
      g.ldq = g.ldkv = g.lddq = g.lddkv = C3;
      g.ldd = g.ldo = C;
      zero_rows(g.dk, T, hs, C3);
      zero_rows(g.dv, T, hs, C3);
      for (int64_t h = kv * G; h < (kv + 1) * G; ++h) {  // the query heads reading kv
        g.q = qkv + b * T * C3 + h * hs;
        g.d = dout + b * T * C + h * hs;
        g.o = out + b * T * C + h * hs;
        g.dq = dqkv + b * T * C3 + h * hs;
        backward_head(p, ds, g, lse + (b * NH + h) * T, T, hs, blk, scale);
      }
    }
  }
}

// The same with bf16 dqkv, dout, qkv, out, as flash_attention_forward_bf16: each work item
// widens its kv head's k, v and each query head's q, dout, out into the thread's scratch, sums
// dk, dv there and rounds dq, dk, dv into dqkv.
void flash_attention_backward_bf16(Workspace& ws, uint16_t* dqkv, const uint16_t* dout,
                                   const uint16_t* qkv, const uint16_t* out, const float* lse,
                                   int64_t B, int64_t T, int64_t C, int64_t NH, int64_t NKV) {
  const int64_t hs = C / NH, C3 = C + 2 * NKV * hs, G = NH / NKV, blk = block_rows(T);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int nthreads = omp_get_max_threads();
  const int64_t per = 2 * blk * T + 8 * T * hs;  // p, ds (blk,T); k, v, dk, dv, q, d, o, dq (T,hs)
  float* scratch = static_cast<float*>(ws.get(static_cast<size_t>(nthreads * per) * sizeof(float)));
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t kv = 0; kv < NKV; ++kv) {
      float* p = scratch + static_cast<int64_t>(omp_get_thread_num()) * per;
      float* ds = p + blk * T;
      float* heads = ds + blk * T;
      float *k = heads, *v = k + T * hs, *dk = v + T * hs, *dv = dk + T * hs;
      float *q = dv + T * hs, *d = q + T * hs, *o = d + T * hs, *dq = o + T * hs;
      const uint16_t* x = qkv + b * T * C3;
      widen_rows(k, x + C + kv * hs, T, hs, C3);
      widen_rows(v, x + C + (NKV + kv) * hs, T, hs, C3);
      std::memset(dk, 0, static_cast<size_t>(2 * T * hs) * sizeof(float));  // dk, dv
      const HeadGrad g{q, d, o, k, v, hs, hs, hs, hs, dq, dk, dv, hs, hs};
      for (int64_t h = kv * G; h < (kv + 1) * G; ++h) {  // the query heads reading kv
        widen_rows(q, x + h * hs, T, hs, C3);
        widen_rows(d, dout + b * T * C + h * hs, T, hs, C);
        widen_rows(o, out + b * T * C + h * hs, T, hs, C);
        backward_head(p, ds, g, lse + (b * NH + h) * T, T, hs, blk, scale);
        round_rows(dqkv + b * T * C3 + h * hs, C3, dq, T, hs);
      }
      round_rows(dqkv + b * T * C3 + C + kv * hs, C3, dk, T, hs);
      round_rows(dqkv + b * T * C3 + C + (NKV + kv) * hs, C3, dv, T, hs);
    }
  }
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
