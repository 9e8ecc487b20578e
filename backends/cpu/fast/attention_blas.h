// Pieces of the sgemm-based attention path (fast/attention.cpp without AVX-512): the query-row
// block size and a row-major cblas_sgemm. (fast/flash_attention.cpp has kernels of its own.)
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cstdint>

namespace ct::cpu::fast::attention_blas {

// Rows per block: small enough to skip most of the masked triangle, big enough for sgemm's
// per-call cost. tiny (T 256, hs 64, 4 x 6 heads), ms a call of the fused forward / backward
// when it was built on these, 2 runs each on the 2-core Zen 3: 32 rows 3.6 / 6.6, 64 rows 3.1
// / 5.4-5.5, 128 rows 3.4 / 6.0.
inline int64_t block_rows(int64_t T) {
  return std::clamp<int64_t>(T / 4, 32, 64);
}

// y (M,N) = alpha * op(a) op(b) + beta * y, row-major with leading dimensions.
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* y, int64_t ldy) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, y,
              static_cast<blasint>(ldy));
}

}  // namespace ct::cpu::fast::attention_blas
