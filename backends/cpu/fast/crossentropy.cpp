// Fast fused log-softmax + NLL: rows in parallel, vector max / exp-sum per row.
#include <algorithm>
#include <cmath>

#include "backends/cpu/fast/vec_math.h"
#include "backends/cpu/kernels.h"

namespace ct::cpu::fast {

namespace {
// x is (V): its max and sum(exp(x - max)). The sum is kept in fp64: when one logit dominates,
// sum = 1 + (small terms), and the loss log(sum) and the target's gradient (sum - 1) / sum
// live in those small terms.
inline void row_stats(const float* x, int64_t V, float* maxval, double* sumexp) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < V; ++i) m = std::max(m, x[i]);
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < V; ++i) s += fast_exp(x[i] - m);
  *maxval = m;
  *sumexp = s;
}
}  // namespace

// losses is (N), logits is (N,V), targets is (N)
void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V) {
#pragma omp parallel for schedule(static) if (N * V > (1 << 15))
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * V;
    float m;
    double s;
    row_stats(x, V, &m, &s);
    losses[n] = static_cast<float>(std::log(s) + (static_cast<double>(m) - x[targets[n]]));
  }
}

// dlogits, logits are (N,V), possibly the same memory; targets is (N)
void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                           int64_t N, int64_t V, float dloss) {
#pragma omp parallel for schedule(static) if (N * V > (1 << 15))
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * V;
    float* dx = dlogits + n * V;
    float m;
    double s;
    row_stats(x, V, &m, &s);
    int32_t t = targets[n];
    double et = fast_exp(x[t] - m);  // read before dx (which may be x) is written
    float f = static_cast<float>(dloss / s);
#pragma omp simd
    for (int64_t i = 0; i < V; ++i) dx[i] = f * fast_exp(x[i] - m);
    // p_t - 1 = -(s - e_t) / s: no cancellation when p_t is close to 1.
    dx[t] = static_cast<float>(-static_cast<double>(dloss) * ((s - et) / s));
  }
}

}  // namespace ct::cpu::fast
