// Reference matrix multiply (fp64 dot products) and the bias gradient.
#include "backends/cpu/kernels.h"

namespace ct::cpu::ref {

// c is (batch,M,N); a is (M,K) or (K,M) with trans_a; b is (K,N) or (N,K) with trans_b;
// either may be shared by the whole batch. bias is (N).
void matmul(Workspace&, const MatmulArgs& m) {
  for (int64_t p = 0; p < m.batch; ++p) {
    const float* a = m.a + (m.a_batched ? p * m.M * m.K : 0);
    const float* b = m.b + (m.b_batched ? p * m.K * m.N : 0);
    float* c = m.c + p * m.M * m.N;
    for (int64_t i = 0; i < m.M; ++i) {
      for (int64_t j = 0; j < m.N; ++j) {
        double acc = 0.0;
        for (int64_t k = 0; k < m.K; ++k) {
          double av = m.trans_a ? a[k * m.M + i] : a[i * m.K + k];
          double bv = m.trans_b ? b[j * m.K + k] : b[k * m.N + j];
          acc += av * bv;
        }
        double r = m.alpha * acc;
        if (m.beta != 0.0f) r += static_cast<double>(m.beta) * c[i * m.N + j];
        if (m.bias) r += m.bias[j];
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
