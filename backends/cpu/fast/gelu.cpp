// Fast GELU (tanh form) with the vectorisable tanh.
#include "backends/cpu/fast/vec_math.h"
#include "backends/cpu/kernels.h"

namespace ct::cpu::fast {

namespace {
constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kA = 0.044715f;
constexpr int64_t kParallelMin = 1 << 14;
}  // namespace

// out, x are (n)
void gelu_forward(float* out, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    out[i] = 0.5f * v * (1.0f + fast_tanh(kS * (v + kA * v * v * v)));
  }
}

// dx, x, dout are (n)
void gelu_backward(float* dx, const float* x, const float* dout, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float th = fast_tanh(kS * (v + kA * v * v * v));
    float grad = 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * kS * (1.0f + 3.0f * kA * v * v);
    dx[i] = grad * dout[i];
  }
}

}  // namespace ct::cpu::fast
