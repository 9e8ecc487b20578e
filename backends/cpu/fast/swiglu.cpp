// Fast SwiGLU: rows in parallel, fp32 arithmetic, the vectorisable portable loop.
#include <cmath>

#include "backends/cpu/kernels.h"

namespace ct::cpu::fast::CT_CPU_ISA {

// gu is (N, 2F): gate = gu[:, :F], up = gu[:, F:]; out is (N, F): out = silu(gate) * up
void swiglu_forward(float* out, const float* gu, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if (N * F > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    const float* g = gu + n * 2 * F;
    const float* u = g + F;
    float* o = out + n * F;
#pragma omp simd
    for (int64_t i = 0; i < F; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

// dgate = dout * up * s (1 + g (1 - s)), dup = dout * g s; dgu may be gu (pairs read first).
void swiglu_backward(float* dgu, const float* gu, const float* dout, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if (N * F > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    const float* g = gu + n * 2 * F;
    const float* u = g + F;
    const float* d = dout + n * F;
    float* dg = dgu + n * 2 * F;
    float* du = dg + F;
#pragma omp simd
    for (int64_t i = 0; i < F; ++i) {
      const float gi = g[i], ui = u[i];
      const float s = 1.0f / (1.0f + std::exp(-gi));
      dg[i] = d[i] * ui * s * (1.0f + gi * (1.0f - s));
      du[i] = d[i] * gi * s;
    }
  }
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
