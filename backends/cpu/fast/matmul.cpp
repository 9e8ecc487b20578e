// Fast matrix multiply on OpenBLAS sgemm, and the bias gradient. Compiled once per ISA level
// (CMakeLists.txt); oneDNN's loader, shared by the levels, is backends/cpu/onednn_matmul.cpp.
#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "backends/cpu/kernels.h"

namespace ct::cpu::fast::CT_CPU_ISA {

namespace {

// c is (M,N): c = beta * c + bias (rows broadcast); beta == 0 does not read c.
// Runs on the calling thread on purpose: a parallel region of its own before sgemm's costs an
// extra OpenMP barrier, and when another process takes a core that barrier waits for the
// descheduled thread (measured on the shared 2-core machine, 2 threads, interleaved runs:
// 1024x768x768 with bias 29 -> 38 GFLOP/s median, 1024x384x384 13 -> 25). Idle, the pass is
// ~1% of the product's time (one write of c, which sgemm then reads while it is warm).
void prescale_bias(float* c, const float* bias, float beta, int64_t M, int64_t N) {
#pragma omp parallel for schedule(static) if (M * N >= (1 << 18))
  for (int64_t i = 0; i < M; ++i) {
    float* ci = c + i * N;
    if (beta == 0.0f) {
      if (bias) {
#pragma omp simd
        for (int64_t j = 0; j < N; ++j) ci[j] = bias[j];
      } else {
#pragma omp simd
        for (int64_t j = 0; j < N; ++j) ci[j] = 0.0f;
      }
    } else {
      if (bias) {
#pragma omp simd
        for (int64_t j = 0; j < N; ++j) ci[j] = beta * ci[j] + bias[j];
      } else {
#pragma omp simd
        for (int64_t j = 0; j < N; ++j) ci[j] = beta * ci[j];
      }
    }
  }
}

// Products that go to oneDNN's f32 matmul rather than OpenBLAS: the layouts and sizes where it
// was the faster library on this machine (OpenBLAS 0.3.21, oneDNN 2.7; `gemm_bench`, and
// `step_profile --detail` with each choice in alternation). A fixed rule, not a run-time
// benchmark, so that the same shapes always take the same library and results stay bitwise
// reproducible from run to run.
//   a b^T (the linear layers' dx), N <= 4096: gemm_bench single thread, tiny 1024x384x1152
//     150.7 -> 166.2 GFLOP/s, 1024x384x1536 146.3 -> 165.5, 1024x1536x384 158.4 -> 165.2; gpt2
//     1024x768x2304 162.1 -> 176.6. Not gpt2's tied LM head (N = 50257: 163.0 -> 136.8).
//   a b + bias (the linear layers' forward), N <= 2048: oneDNN adds the bias in its epilogue
//     where OpenBLAS needs the pre-fill and a read of c (beta = 1). tiny per step: fcproj
//     26.2 -> 22.9 ms, fc 24.9 -> 23.5, qkv 18.5 -> 17.9, attproj 6.9 -> 6.3; gpt2 (B = 1):
//     fcproj 191 -> 181, attproj 51 -> 45, qkv (N = 2304) 139 -> 139, but fc (N = 3072)
//     183 -> 327: oneDNN's f32 kernels fall apart at N = 3072 (gemm_bench: 164 -> 59).
bool prefer_onednn_f32(const MatmulArgs& m) {
  if (m.trans_a || !(m.batch == 1 || (m.a_batched && !m.b_batched))) return false;
  if (m.trans_b) return m.N <= 4096;
  return m.bias != nullptr && m.N <= 2048;
}

// One (M,N) product with c already holding beta*c (+ bias) when `beta` is 1.
void sgemm(const MatmulArgs& m, const float* a, const float* b, float* c, int64_t M, float beta) {
  cblas_sgemm(CblasRowMajor, m.trans_a ? CblasTrans : CblasNoTrans,
              m.trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(M),
              static_cast<blasint>(m.N), static_cast<blasint>(m.K), m.alpha, a,
              static_cast<blasint>(std::max<int64_t>(1, m.trans_a ? M : m.K)), b,
              static_cast<blasint>(std::max<int64_t>(1, m.trans_b ? m.K : m.N)), beta, c,
              static_cast<blasint>(std::max<int64_t>(1, m.N)));
}

}  // namespace

// c is (batch,M,N); a is (M,K) or (K,M) with trans_a; b is (K,N) or (N,K) with trans_b;
// either may be shared by the whole batch. bias is (N); a 16-bit c_dtype takes it rounded to
// that dtype (in the workspace), as the reference does.
void matmul(Workspace& ws, const MatmulArgs& m) {
  if (m.batch == 0 || m.M == 0 || m.N == 0) return;
  const float* bias = m.bias;
  if (bias && m.c_dtype != DType::f32) {
    float* rounded = static_cast<float*>(ws.get(static_cast<size_t>(m.N) * sizeof(float)));
    for (int64_t j = 0; j < m.N; ++j) rounded[j] = round_to(m.c_dtype, m.bias[j]);
    bias = rounded;
  }
  // One row of c (sampling's one-token forward): the packing GEMM's row kernel reads b once,
  // where sgemm would pack all of it first (fast/gemm_packed.cpp, run_row).
  if (m.batch * m.M == 1 && m.K > 0) {
    MatmulPackedArgs row = one_product<MatmulPackedArgs>(m);  // f32 operands and c
    row.c = m.c;
    row.a = m.a;
    row.b = m.b;
    row.bias = bias;  // rounded to c_dtype above
    if (matmul_packed(row)) return;
  }
  if (prefer_onednn_f32(m) &&
      matmul_f32_onednn(m.c, m.a, m.b, bias, m.batch * m.M, m.N, m.K, m.trans_b, m.alpha, m.beta))
    return;
  float beta = m.beta;
  if (bias || m.K == 0) {
    prescale_bias(m.c, bias, m.beta, m.batch * m.M, m.N);
    beta = 1.0f;
    if (m.K == 0) return;
  }
  // A batch of row-major a against one shared b is a single tall product.
  if (m.batch == 1 || (m.a_batched && !m.trans_a && !m.b_batched)) {
    sgemm(m, m.a, m.b, m.c, m.batch * m.M, beta);
    return;
  }
  int64_t a_step = m.a_batched ? m.M * m.K : 0, b_step = m.b_batched ? m.K * m.N : 0;
  // Small matrices: one sgemm per thread (OpenBLAS runs single-threaded inside a parallel
  // region). Large ones: one after another, each using every thread.
  bool outer = m.M * m.N * m.K < (1 << 21) && m.batch >= 2;
#pragma omp parallel for schedule(dynamic) if (outer)
  for (int64_t p = 0; p < m.batch; ++p)
    sgemm(m, m.a + p * a_step, m.b + p * b_step, m.c + p * m.M * m.N, m.M, beta);
}

namespace {
inline float widened(float x) {
  return x;
}
inline float widened(uint16_t x) {
  return bf16_to_f32(x);
}

// dbias (N) += column sums of dout (M,N), each value widened to f32 as it is read (exact).
// Threads own column blocks and add rows in order: deterministic for any thread count, and the
// bf16 sums are those of the f32 version on a widened copy.
template <typename T>
void bias_backward_columns(float* dbias, const T* dout, int64_t M, int64_t N) {
  constexpr int64_t kBlock = 64;
  int64_t nblocks = (N + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (M * N > (1 << 15))
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    int64_t c0 = blk * kBlock, w = std::min(N, c0 + kBlock) - c0;
    float acc[kBlock] = {};
    for (int64_t i = 0; i < M; ++i) {
      const T* row = dout + i * N + c0;
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) acc[j] += widened(row[j]);
    }
    for (int64_t j = 0; j < w; ++j) dbias[c0 + j] += acc[j];
  }
}
}  // namespace

void bias_backward(float* dbias, const float* dout, int64_t M, int64_t N) {
  bias_backward_columns(dbias, dout, M, N);
}
void bias_backward_bf16(float* dbias, const uint16_t* dout, int64_t M, int64_t N) {
  bias_backward_columns(dbias, dout, M, N);
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
