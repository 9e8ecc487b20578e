// Fast GELU (tanh form) with the vectorisable tanh.
#include "backends/cpu/fast/vec_math.h"
#include "backends/cpu/kernels.h"

CT_FAST_WIDE_VECTORS

namespace ct::cpu::fast {

namespace {
constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kA = 0.044715f;
constexpr int64_t kParallelMin = 1 << 14;
// Beyond |x| = 10, tanh(...) is +-1 in f32; clamping keeps x^3 from overflowing into 0 * inf.
inline float clamp10(float x) { return x > 10.0f ? 10.0f : (x < -10.0f ? -10.0f : x); }
}  // namespace

// out, x are (n)
void gelu_forward(float* out, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i], c = clamp10(v);
    out[i] = 0.5f * v * (1.0f + fast_tanh(kS * (c + kA * c * c * c)));
  }
}

// dx, x, dout are (n)
void gelu_backward(float* dx, const float* x, const float* dout, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float c = clamp10(x[i]);  // NaN passes through clamp10
    float th = fast_tanh(kS * (c + kA * c * c * c));
    float grad = 0.5f * (1.0f + th) + 0.5f * c * (1.0f - th * th) * kS * (1.0f + 3.0f * kA * c * c);
    dx[i] = grad * dout[i];
  }
}

}  // namespace ct::cpu::fast
