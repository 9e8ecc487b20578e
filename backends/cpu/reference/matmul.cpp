// Reference matrix multiply (fp64 dot products) and the bias gradient.
#include <vector>

#include "backends/cpu/kernels.h"

namespace ct::cpu::ref {

// c is (batch,M,N); a is (M,K) or (K,M) with trans_a; b is (K,N) or (N,K) with trans_b;
// either may be shared by the whole batch. bias is (N).
//
// Every c[i][j] is alpha * (sum over k = 0, 1, .., K-1 of op(a)[i][k] * op(b)[k][j]) + beta *
// c[i][j] + bias'[j], the sum in double in that order (a product of two floats is exact in double,
// so each step rounds once), where bias'[j] is bias[j] as c's dtype holds it: rounded to f16 or
// bf16 (nearest even) for a 16-bit c, bias[j] itself for an f32 c. The loops are arranged for the
// cache, not the arithmetic: row i of op(a) is copied out once; with b as stored (K,N), row i of c
// is accumulated over the rows of b (each column its own sum, still k ascending); with b
// transposed, each c[i][j] is a dot product of two contiguous rows. The results are the same bits
// as the textbook triple loop.
void matmul(Workspace&, const MatmulArgs& m) {
  std::vector<double> arow(static_cast<size_t>(m.K)), acc(static_cast<size_t>(m.N));
  std::vector<double> bias(m.bias ? static_cast<size_t>(m.N) : 0);  // bias'
  for (size_t j = 0; j < bias.size(); ++j) bias[j] = round_to(m.c_dtype, m.bias[j]);
  for (int64_t p = 0; p < m.batch; ++p) {
    const float* a = m.a + (m.a_batched ? p * m.M * m.K : 0);
    const float* b = m.b + (m.b_batched ? p * m.K * m.N : 0);
    float* c = m.c + p * m.M * m.N;
    for (int64_t i = 0; i < m.M; ++i) {
      for (int64_t k = 0; k < m.K; ++k) arow[k] = m.trans_a ? a[k * m.M + i] : a[i * m.K + k];
      if (!m.trans_b) {
        for (int64_t j = 0; j < m.N; ++j) acc[j] = 0.0;
        for (int64_t k = 0; k < m.K; ++k) {
          const float* brow = b + k * m.N;
          for (int64_t j = 0; j < m.N; ++j) acc[j] += arow[k] * static_cast<double>(brow[j]);
        }
      } else {
        // Four columns at a time: four independent sums (the processor overlaps them), each
        // still over k in order.
        int64_t j = 0;
        for (; j + 4 <= m.N; j += 4) {
          const float* b0 = b + j * m.K;  // column j of op(b), contiguous
          const float *b1 = b0 + m.K, *b2 = b1 + m.K, *b3 = b2 + m.K;
          double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
          for (int64_t k = 0; k < m.K; ++k) {
            s0 += arow[k] * static_cast<double>(b0[k]);
            s1 += arow[k] * static_cast<double>(b1[k]);
            s2 += arow[k] * static_cast<double>(b2[k]);
            s3 += arow[k] * static_cast<double>(b3[k]);
          }
          acc[j] = s0, acc[j + 1] = s1, acc[j + 2] = s2, acc[j + 3] = s3;
        }
        for (; j < m.N; ++j) {
          const float* bj = b + j * m.K;
          double s = 0.0;
          for (int64_t k = 0; k < m.K; ++k) s += arow[k] * static_cast<double>(bj[k]);
          acc[j] = s;
        }
      }
      for (int64_t j = 0; j < m.N; ++j) {
        double r = m.alpha * acc[j];
        if (m.beta != 0.0f) r += static_cast<double>(m.beta) * c[i * m.N + j];
        if (m.bias) r += bias[j];
        c[i * m.N + j] = static_cast<float>(r);
      }
    }
  }
}
// dbias is (N), dout is (M,N)
void bias_backward(float* dbias, const float* dout, int64_t M, int64_t N) {
  for (int64_t j = 0; j < N; ++j) {
    double acc = 0.0;
    for (int64_t i = 0; i < M; ++i) acc += dout[i * N + j];
    dbias[j] = static_cast<float>(dbias[j] + acc);
  }
}

}  // namespace ct::cpu::ref
