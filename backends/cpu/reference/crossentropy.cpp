// Reference fused log-softmax + negative log-likelihood, fp64.
#include <cmath>

#include "backends/cpu/kernels.h"

namespace ct::cpu::ref {

namespace {
// max and log(sum(exp(x - max))) of one row, fp64
void row_stats(const float* x, int64_t V, double* maxval, double* logsum) {
  double m = -INFINITY;
  for (int64_t i = 0; i < V; ++i) m = x[i] > m ? x[i] : m;
  double s = 0.0;
  for (int64_t i = 0; i < V; ++i) s += std::exp(x[i] - m);
  *maxval = m;
  *logsum = std::log(s);
}
}  // namespace

// losses is (N); logits is (N,Vp), each row V classes and Vp - V columns of padding, which are
// never read; targets is (N), each < V
void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V, int64_t Vp) {
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * Vp;
    double m, ls;
    row_stats(x, V, &m, &ls);
    // log z + (max - x[target]): log z is not absorbed by a huge max first (logits of -1e30
    // all alike: log V, not 0)
    losses[n] = static_cast<float>(ls + (m - x[targets[n]]));
  }
}

// dlogits, logits are (N,Vp) and may be the same memory; targets is (N). The padding columns
// [V, Vp) of dlogits are written as exactly 0.
void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets, int64_t N,
                           int64_t V, int64_t Vp, float dloss) {
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * Vp;
    float* dx = dlogits + n * Vp;
    double m, ls;
    row_stats(x, V, &m, &ls);
    for (int64_t i = 0; i < V; ++i) {
      double p = std::exp(x[i] - m - ls);
      double ind = i == targets[n] ? 1.0 : 0.0;
      dx[i] = static_cast<float>(dloss * (p - ind));
    }
    for (int64_t i = V; i < Vp; ++i) dx[i] = 0.0f;
  }
}

// losses (N); logits (N,Vp) overwritten by their dlogits; targets (N). Per row: the statistics
// of the logits, the loss, then the gradient, each element read before it is written: exactly
// crossentropy_forward followed by crossentropy_backward in place.
void crossentropy_forward_backward(float* losses, float* logits, const int32_t* targets, int64_t N,
                                   int64_t V, int64_t Vp, float dloss) {
  for (int64_t n = 0; n < N; ++n) {
    crossentropy_forward(losses + n, logits + n * Vp, targets + n, 1, V, Vp);
    crossentropy_backward(logits + n * Vp, logits + n * Vp, targets + n, 1, V, Vp, dloss);
  }
}

}  // namespace ct::cpu::ref
