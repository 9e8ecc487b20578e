// Fast fused AdamW step: one pass over param, grad, m, v (and the 16-bit copy of param).
#include <algorithm>
#include <cmath>

#include "backends/cpu/fast/vec_math.h"
#include "backends/cpu/kernels.h"

CT_FAST_WIDE_VECTORS

namespace ct::cpu::fast::CT_CPU_ISA {

namespace {

struct AdamWConsts {
  float clip, b1, b2, step, inv_bc2_sqrt, decay, eps;
};

// elements [i0, i1) of param, grad, m, v
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t i0, int64_t i1,
                const AdamWConsts& k) {
  // A gradient past 1e19 (or NaN) in the span: g^2 overflows fp32 and v becomes inf, while the
  // reference's fp64 step stays finite. Such a span is stepped in fp64, as the reference.
  float gmax = 0.0f;
#pragma omp simd reduction(max : gmax)
  for (int64_t i = i0; i < i1; ++i) gmax = std::max(gmax, std::abs(grad[i]));
  if (!(gmax * k.clip < 1e19f)) {
    for (int64_t i = i0; i < i1; ++i) {
      const double g = static_cast<double>(grad[i]) * k.clip;
      const double mi = k.b1 * static_cast<double>(m[i]) + (1.0 - k.b1) * g;
      const double vi = k.b2 * static_cast<double>(v[i]) + (1.0 - k.b2) * g * g;
      m[i] = static_cast<float>(mi);
      v[i] = static_cast<float>(vi);
      param[i] = static_cast<float>(static_cast<double>(param[i]) * k.decay -
                                    k.step * mi / (std::sqrt(vi) * k.inv_bc2_sqrt + k.eps));
    }
    return;
  }
  // The constants in locals: read through the reference, the compiler must assume the stores
  // to param/m/v may change them, reloads them every element and keeps the loop scalar (2.8 ns a
  // parameter against 0.8 for the vector loop, the memory's speed here).
  const float clip = k.clip, b1 = k.b1, b2 = k.b2, step = k.step, inv_bc2_sqrt = k.inv_bc2_sqrt,
              decay = k.decay, eps = k.eps;
#pragma omp simd
  for (int64_t i = i0; i < i1; ++i) {
    float g = grad[i] * clip;
    float mi = b1 * m[i] + (1.0f - b1) * g;
    float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * decay - step * mi / (fast_sqrt(vi) * inv_bc2_sqrt + eps);
  }
}

// The same, then those parameters rounded into param16 (of dt16) while they are in cache, by
// this level's copy(): the bits copy(param16, param) gives.
void adamw_span(float* param, const float* grad, float* m, float* v, int64_t i0, int64_t i1,
                const AdamWConsts& k, void* param16, DType dt16) {
  adamw_step(param, grad, m, v, i0, i1, k);
  if (param16)
    copy(static_cast<char*>(param16) + i0 * static_cast<int64_t>(dtype_size(dt16)), dt16,
         param + i0, DType::f32, i1 - i0);
}

}  // namespace

// param, grad, m, v are (n); grad_norm is (1) or null (no clipping); param16 (n) of dt16 or null
void adamw(float* param, const float* grad, float* m, float* v, const float* grad_norm, int64_t n,
           const AdamWHyper& hp, void* param16, DType dt16) {
  AdamWConsts k;
  k.clip = 1.0f;
  if (hp.max_grad_norm > 0.0f && grad_norm)
    k.clip = static_cast<float>(
        std::min(1.0, hp.max_grad_norm / (static_cast<double>(grad_norm[0]) + 1e-6)));
  double t = static_cast<double>(hp.step);
  k.b1 = hp.beta1;
  k.b2 = hp.beta2;
  k.step = static_cast<float>(hp.lr / (1.0 - std::pow(static_cast<double>(hp.beta1), t)));
  k.inv_bc2_sqrt =
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(hp.beta2), t)));
  k.decay = 1.0f - hp.lr * hp.weight_decay;
  k.eps = hp.eps;
  constexpr int64_t kChunk = 1 << 14;
  int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c)
    adamw_span(param, grad, m, v, c * kChunk, std::min(n, (c + 1) * kChunk), k, param16, dt16);
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
