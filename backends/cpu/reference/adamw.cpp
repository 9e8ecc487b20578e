// Reference fused AdamW step (PyTorch semantics, decoupled weight decay), fp64 scalars.
#include <algorithm>
#include <cmath>

#include "backends/cpu/kernels.h"

namespace ct::cpu::ref {

// param, grad, m, v are (n); grad_norm is (1) or null (no clipping); param16 (n) of dt16 or null
void adamw(float* param, const float* grad, float* m, float* v, const float* grad_norm, int64_t n,
           const AdamWHyper& hp, void* param16, DType dt16) {
  double clip = 1.0;
  if (hp.max_grad_norm > 0.0f && grad_norm)
    clip = std::min(1.0, hp.max_grad_norm / (static_cast<double>(grad_norm[0]) + 1e-6));
  double b1 = hp.beta1, b2 = hp.beta2, t = static_cast<double>(hp.step);
  double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
  for (int64_t i = 0; i < n; ++i) {
    double g = grad[i] * clip;
    double mi = b1 * m[i] + (1.0 - b1) * g;
    double vi = b2 * v[i] + (1.0 - b2) * g * g;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    double p = param[i];
    p -= static_cast<double>(hp.lr) * hp.weight_decay * p;
    p -= hp.lr * (mi / bc1) / (std::sqrt(vi / bc2) + hp.eps);
    param[i] = static_cast<float>(p);
  }
  if (param16) copy(param16, dt16, param, DType::f32, n);
}

}  // namespace ct::cpu::ref
