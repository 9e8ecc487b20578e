// Fast fused log-softmax + NLL: rows in parallel, vector max / exp-sum per row.
#include <cmath>

#include "backends/cpu/fast/vec_math.h"
#include "backends/cpu/kernels.h"

CT_FAST_WIDE_VECTORS

namespace ct::cpu::fast::CT_CPU_ISA {

namespace {
// x is (V)
inline float row_max(const float* x, int64_t V) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < V; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// x is (V): sum(exp(x - m)). The sum is kept in fp64: when one logit dominates, the sum is
// 1 + (small terms), and both the loss log(sum) and the target's gradient (sum - 1) / sum live
// in those small terms.
inline double row_sumexp(const float* x, int64_t V, float m) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < V; ++i) s += fast_exp(x[i] - m);
  return s;
}
}  // namespace

// losses is (N), logits is (N,Vp) of V classes and Vp - V padding columns, targets is (N)
void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V, int64_t Vp) {
#pragma omp parallel for schedule(static) if (N * V > (1 << 15))
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * Vp;
    float m = row_max(x, V);
    double s = row_sumexp(x, V, m);
    losses[n] = static_cast<float>(std::log(s) + (static_cast<double>(m) - x[targets[n]]));
  }
}

// dlogits, logits are (N,Vp), possibly the same memory; targets is (N)
// One exp per element: dx holds exp(x - max) from the summing pass, then is scaled by
// dloss / sum; element i of x is read before element i of dx is written. The padding columns
// [V, Vp) of dx are written as 0.
void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets, int64_t N,
                           int64_t V, int64_t Vp, float dloss) {
#pragma omp parallel for schedule(static) if (N * V > (1 << 15))
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * Vp;
    float* dx = dlogits + n * Vp;
    int32_t t = targets[n];
    float m = row_max(x, V);
    double et = fast_exp(x[t] - m);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < V; ++i) {
      float e = fast_exp(x[i] - m);
      dx[i] = e;
      s += e;
    }
    float f = static_cast<float>(dloss / s);
#pragma omp simd
    for (int64_t i = 0; i < V; ++i) dx[i] *= f;
    // p_t - 1 = -(s - e_t) / s: no cancellation when p_t is close to 1.
    dx[t] = static_cast<float>(-static_cast<double>(dloss) * ((s - et) / s));
    for (int64_t i = V; i < Vp; ++i) dx[i] = 0.0f;
  }
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
