// Fast fused AdamW step: one pass over param, grad, m, v.
#include <algorithm>
#include <cmath>

#include "backends/cpu/kernels.h"

namespace ct::cpu::fast {

// param, grad, m, v are (n); grad_norm is (1) or null (no clipping)
void adamw(float* param, const float* grad, float* m, float* v, const float* grad_norm,
           int64_t n, const AdamWHyper& hp) {
  float clip = 1.0f;
  if (hp.max_grad_norm > 0.0f && grad_norm)
    clip = static_cast<float>(
        std::min(1.0, hp.max_grad_norm / (static_cast<double>(grad_norm[0]) + 1e-6)));
  double t = static_cast<double>(hp.step);
  float b1 = hp.beta1, b2 = hp.beta2;
  float step = static_cast<float>(hp.lr / (1.0 - std::pow(static_cast<double>(b1), t)));
  float inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(b2), t)));
  float decay = 1.0f - hp.lr * hp.weight_decay;
  float eps = hp.eps;
#pragma omp parallel for simd schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i] * clip;
    float mi = b1 * m[i] + (1.0f - b1) * g;
    float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * decay - step * mi / (std::sqrt(vi) * inv_bc2_sqrt + eps);
  }
}

}  // namespace ct::cpu::fast
