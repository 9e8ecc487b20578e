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
      const float* q = qkv + b * T * C3 + h * hs;                  // (T,hs), row stride C3
      const float* k = qkv + b * T * C3 + C + (h / G) * hs;        // kv head h / G
      const float* v = qkv + b * T * C3 + C + (NKV + h / G) * hs;  // kv head h / G
      float* o = out + b * T * C + h * hs;
      float* l = lse + (b * NH + h) * T;
      for (int64_t r0 = 0; r0 < T; r0 += blk) {
        const int64_t r1 = std::min(T, r0 + blk);
        // s = scale q[r0:r1] k[0:r1]^T; then each row's log-sum-exp over j <= t
        gemm(false, true, r1 - r0, r1, hs, scale, q + r0 * C3, C3, k, C3, 0.0f, s, T);
        for (int64_t t = r0; t < r1; ++t) {
          const float* row = s + (t - r0) * T;
          float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
          for (int64_t j = 0; j <= t; ++j) mx = row[j] > mx ? row[j] : mx;
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j <= t; ++j) sum += fast_exp(row[j] - mx);
          l[t] = mx + std::log(sum);
        }
        probabilities(s, l, r0, r1, T);
        // o[r0:r1] = p v[0:r1]
        gemm(false, false, r1 - r0, hs, r1, 1.0f, s, T, v, C3, 0.0f, o + r0 * C, C);
      }
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
      // key/value head kv: (T,hs), row stride C3
      const float* k = qkv + b * T * C3 + C + kv * hs;
      const float* v = qkv + b * T * C3 + C + (NKV + kv) * hs;
      float* dk = dqkv + b * T * C3 + C + kv * hs;
      float* dv = dqkv + b * T * C3 + C + (NKV + kv) * hs;
      for (int64_t t = 0; t < T; ++t) {
        std::memset(dk + t * C3, 0, static_cast<size_t>(hs) * sizeof(float));
        std::memset(dv + t * C3, 0, static_cast<size_t>(hs) * sizeof(float));
      }
      for (int64_t h = kv * G; h < (kv + 1) * G; ++h) {  // the query heads reading kv
        const float* q = qkv + b * T * C3 + h * hs;
        const float* d = dout + b * T * C + h * hs;
        const float* o = out + b * T * C + h * hs;
        const float* l = lse + (b * NH + h) * T;
        float* dq = dqkv + b * T * C3 + h * hs;
        for (int64_t r0 = 0; r0 < T; r0 += blk) {
          const int64_t r1 = std::min(T, r0 + blk), rows = r1 - r0;
          gemm(false, true, rows, r1, hs, scale, q + r0 * C3, C3, k, C3, 0.0f, p, T);
          probabilities(p, l, r0, r1, T);
          // dv[0:r1] += p^T dout[r0:r1]
          gemm(true, false, r1, hs, rows, 1.0f, p, T, d + r0 * C, C, 1.0f, dv, C3);
          // ds = dout[r0:r1] v[0:r1]^T, then the softmax backward in place
          gemm(false, true, rows, r1, hs, 1.0f, d + r0 * C, C, v, C3, 0.0f, ds, T);
          for (int64_t t = r0; t < r1; ++t) {
            const float* dt = d + t * C;
            const float* ot = o + t * C;
            float D = 0.0f;
#pragma omp simd reduction(+ : D)
            for (int64_t i = 0; i < hs; ++i) D += dt[i] * ot[i];
            float* row = ds + (t - r0) * T;
            const float* prow = p + (t - r0) * T;
#pragma omp simd
            for (int64_t j = 0; j < r1; ++j) row[j] = prow[j] * (row[j] - D) * scale;
          }
          // dq[r0:r1] = ds k[0:r1];  dk[0:r1] += ds^T q[r0:r1]
          gemm(false, false, rows, hs, r1, 1.0f, ds, T, k, C3, 0.0f, dq + r0 * C3, C3);
          gemm(true, false, r1, hs, rows, 1.0f, ds, T, q + r0 * C3, C3, 1.0f, dk, C3);
        }
      }
    }
  }
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
