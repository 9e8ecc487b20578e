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

// One row: dx (Vp) = dloss * (softmax(x[:V]) - onehot(t)), 0 over the padding [V, Vp); x (Vp)
// may be dx. Returns the row's loss log(sum) + (max - x[t]), as crossentropy_forward's.
// One exp per element: dx holds exp(x - max) from the summing pass, then is scaled by
// dloss / sum; element i of x is read before element i of dx is written.
inline float row_backward(float* dx, const float* x, int32_t t, int64_t V, int64_t Vp,
                          float dloss) {
  const float m = row_max(x, V);
  const float xt = x[t];
  const double et = fast_exp(xt - m);
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < V; ++i) {
    float e = fast_exp(x[i] - m);
    dx[i] = e;
    s += e;
  }
  const float f = static_cast<float>(dloss / s);
#pragma omp simd
  for (int64_t i = 0; i < V; ++i) dx[i] *= f;
  // p_t - 1 = -(s - e_t) / s: no cancellation when p_t is close to 1.
  dx[t] = static_cast<float>(-static_cast<double>(dloss) * ((s - et) / s));
  for (int64_t i = V; i < Vp; ++i) dx[i] = 0.0f;
  return static_cast<float>(std::log(s) + (static_cast<double>(m) - xt));
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
void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets, int64_t N,
                           int64_t V, int64_t Vp, float dloss) {
#pragma omp parallel for schedule(static) if (N * V > (1 << 15))
  for (int64_t n = 0; n < N; ++n)
    row_backward(dlogits + n * Vp, logits + n * Vp, targets[n], V, Vp, dloss);
}

// losses is (N), logits (N,Vp) overwritten by their dlogits, targets is (N): the backward's
// three passes over a row, the loss from the same sum (the two ops take five)
void crossentropy_forward_backward(float* losses, float* logits, const int32_t* targets, int64_t N,
                                   int64_t V, int64_t Vp, float dloss) {
#pragma omp parallel for schedule(static) if (N * V > (1 << 15))
  for (int64_t n = 0; n < N; ++n)
    losses[n] = row_backward(logits + n * Vp, logits + n * Vp, targets[n], V, Vp, dloss);
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
