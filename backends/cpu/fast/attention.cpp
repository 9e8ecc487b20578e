// Fast causal self-attention: per (batch, head), sgemm for the scores, a fused causal softmax,
// and sgemm for att @ v; the backward pass likewise. Rows are processed in blocks so that the
// products skip (most of) the masked upper triangle. (b,h) pairs run in parallel with OpenMP;
// OpenBLAS runs single-threaded inside the parallel region.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/fast/vec_math.h"
#include "backends/cpu/kernels.h"

CT_FAST_WIDE_VECTORS

namespace ct::cpu::fast {

namespace {

// Rows per block: small enough to skip most of the triangle, big enough for sgemm to be fast.
int64_t block_rows(int64_t T) { return std::clamp<int64_t>(T / 16, 32, 64); }

// y (M,N) = alpha * op(a) op(b) + beta * y, row-major with leading dimensions.
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* y, int64_t ldy) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha,
              a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, y,
              static_cast<blasint>(ldy));
}

}  // namespace

// out is (B,T,C); att is (B,NH,T,T); qkv is (B,T,3C) holding q | k | v, heads of hs = C/NH
void attention_forward(Workspace&, float* out, float* att, const float* qkv, int64_t B,
                       int64_t T, int64_t C, int64_t NH) {
  int64_t C3 = 3 * C, hs = C / NH, blk = block_rows(T);
  float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const float* q = qkv + b * T * C3 + h * hs;  // (T,hs), row stride 3C
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* a = att + (b * NH + h) * T * T;  // (T,T)
      float* o = out + b * T * C + h * hs;    // (T,hs), row stride C
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

// dqkv, qkv are (B,T,3C); dout is (B,T,C); att is (B,NH,T,T)
//   dv = att^T dout;  datt = dout v^T;  ds = att * (datt - rowsum(att * datt)) * scale
//   dq = ds k;  dk = ds^T q
// The workspace holds one (T,T) datt/ds matrix per thread.
void attention_backward(Workspace& ws, float* dqkv, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t NH) {
  int64_t C3 = 3 * C, hs = C / NH, blk = block_rows(T);
  float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  int nthreads = omp_get_max_threads();
  float* scratch =
      static_cast<float*>(ws.get(static_cast<size_t>(nthreads) * T * T * sizeof(float)));
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      float* ds = scratch + static_cast<int64_t>(omp_get_thread_num()) * T * T;  // (T,T)
      const float* q = qkv + b * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      const float* a = att + (b * NH + h) * T * T;
      const float* d = dout + b * T * C + h * hs;  // (T,hs), row stride C
      float* dq = dqkv + b * T * C3 + h * hs;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
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
        // dk[c0:c1] = ds[c0:T, c0:c1]^T q[c0:T];  dv[c0:c1] = att[c0:T, c0:c1]^T dout[c0:T]
        gemm(true, false, c1 - c0, hs, T - c0, 1.0f, ds + c0 * T + c0, T, q + c0 * C3, C3, 0.0f,
             dk + c0 * C3, C3);
        gemm(true, false, c1 - c0, hs, T - c0, 1.0f, a + c0 * T + c0, T, d + c0 * C, C, 0.0f,
             dv + c0 * C3, C3);
      }
    }
  }
}

}  // namespace ct::cpu::fast
