// Reference GELU, tanh approximation, evaluated in fp64.
#include <cmath>

#include "backends/cpu/kernels.h"

namespace ct::cpu::ref {

namespace {
constexpr double kS = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kA = 0.044715;
}  // namespace

// out, x are (n)
void gelu_forward(float* out, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i];
    out[i] = static_cast<float>(0.5 * v * (1.0 + std::tanh(kS * (v + kA * v * v * v))));
  }
}

// dx, x, dout are (n); dx (=) dout * gelu'(x)
void gelu_backward(float* dx, const float* x, const float* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i];
    double th = std::tanh(kS * (v + kA * v * v * v));
    double sech2 = 1.0 - th * th;
    double grad = 0.5 * (1.0 + th) + 0.5 * v * sech2 * kS * (1.0 + 3.0 * kA * v * v);
    dx[i] = static_cast<float>(grad * dout[i]);
  }
}

}  // namespace ct::cpu::ref
