// Reference SwiGLU (Llama's MLP activation), evaluated in fp64.
#include <cmath>

#include "backends/cpu/kernels.h"

namespace ct::cpu::ref {

// gu is (N, 2F): gate = gu[:, :F], up = gu[:, F:]; out is (N, F)
//   out = silu(gate) * up, silu(g) = g * sigmoid(g)
void swiglu_forward(float* out, const float* gu, int64_t N, int64_t F) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < F; ++i) {
      double g = gu[n * 2 * F + i], u = gu[n * 2 * F + F + i];
      double s = 1.0 / (1.0 + std::exp(-g));
      out[n * F + i] = static_cast<float>(g * s * u);
    }
}

// dgu, gu are (N, 2F); dout is (N, F); dgu (=):
//   dgate = dout * up * silu'(gate), silu'(g) = s (1 + g (1 - s));  dup = dout * silu(gate)
// dgu may be gu: each (gate, up) pair is read before it is written.
void swiglu_backward(float* dgu, const float* gu, const float* dout, int64_t N, int64_t F) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < F; ++i) {
      double g = gu[n * 2 * F + i], u = gu[n * 2 * F + F + i], d = dout[n * F + i];
      double s = 1.0 / (1.0 + std::exp(-g));
      dgu[n * 2 * F + i] = static_cast<float>(d * u * s * (1.0 + g * (1.0 - s)));
      dgu[n * 2 * F + F + i] = static_cast<float>(d * g * s);
    }
}

}  // namespace ct::cpu::ref
