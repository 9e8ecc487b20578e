// Reference optimizer steps (core/device.h's contracts, read as a spec): SGD, Lion, block-wise
// 8-bit AdamW and Adafactor. fp64 scalars and accumulation, serial loops.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/kernels.h"

namespace ct::cpu::ref {

// ---- SGD --------------------------------------------------------------------------------------
// param, grad, buf are (n); buf null without momentum
void sgd(float* param, const float* grad, float* buf, const float* grad_norm, int64_t n,
         const SgdHyper& hp) {
  const double clip = clip_factor(hp.max_grad_norm, grad_norm);
  for (int64_t i = 0; i < n; ++i) {
    double p = param[i];
    double g = grad[i] * clip + static_cast<double>(hp.weight_decay) * p;
    if (hp.momentum != 0.0f) {
      double b = hp.step == 1 ? g
                              : static_cast<double>(hp.momentum) * buf[i] +
                                    (1.0 - static_cast<double>(hp.dampening)) * g;
      buf[i] = static_cast<float>(b);
      g = hp.nesterov ? g + static_cast<double>(hp.momentum) * b : b;
    }
    param[i] = static_cast<float>(p - static_cast<double>(hp.lr) * g);
  }
}

// ---- Lion -------------------------------------------------------------------------------------
// param, grad, m are (n)
void lion(float* param, const float* grad, float* m, const float* grad_norm, int64_t n,
          const LionHyper& hp) {
  const double clip = clip_factor(hp.max_grad_norm, grad_norm);
  const double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr;
  for (int64_t i = 0; i < n; ++i) {
    double g = grad[i] * clip;
    double c = b1 * m[i] + (1.0 - b1) * g;
    double sign = c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0);
    double p = param[i] * (1.0 - lr * hp.weight_decay);
    param[i] = static_cast<float>(p - lr * sign);
    m[i] = static_cast<float>(b2 * m[i] + (1.0 - b2) * g);
  }
}

// ---- 8-bit AdamW --------------------------------------------------------------------------------
// param, grad, m_q, v_q are (n); m_absmax, v_absmax (ceil(n/256)); qmaps (256)
void adamw_8bit(float* param, const float* grad, uint8_t* m_q, uint8_t* v_q, float* m_absmax,
                float* v_absmax, const float* qmap_signed, const float* qmap_unsigned,
                const float* grad_norm, int64_t n, const AdamWHyper& hp) {
  const double clip = clip_factor(hp.max_grad_norm, grad_norm);
  const double b1 = hp.beta1, b2 = hp.beta2, t = static_cast<double>(hp.step);
  const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
  float m[kQuantBlockSize], v[kQuantBlockSize];
  for (int64_t b = 0; b < quant_blocks(n); ++b) {
    const int64_t i0 = b * kQuantBlockSize, len = std::min(kQuantBlockSize, n - i0);
    float mmax = 0.0f, vmax = 0.0f;
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = i0 + j;
      double g = grad[i] * clip;
      double mi = b1 * (static_cast<double>(qmap_signed[m_q[i]]) * m_absmax[b]) + (1.0 - b1) * g;
      double vi =
          b2 * (static_cast<double>(qmap_unsigned[v_q[i]]) * v_absmax[b]) + (1.0 - b2) * g * g;
      m[j] = static_cast<float>(mi);
      v[j] = static_cast<float>(vi);
      mmax = std::max(mmax, std::abs(m[j]));
      vmax = std::max(vmax, v[j]);
      double p = param[i];
      p -= static_cast<double>(hp.lr) * hp.weight_decay * p;
      p -= hp.lr * (mi / bc1) / (std::sqrt(vi / bc2) + hp.eps);
      param[i] = static_cast<float>(p);
    }
    m_absmax[b] = mmax;
    v_absmax[b] = vmax;
    for (int64_t j = 0; j < len; ++j) {
      m_q[i0 + j] = quantize_nearest(qmap_signed, mmax > 0.0f ? m[j] / mmax : 0.0f);
      v_q[i0 + j] = quantize_nearest(qmap_unsigned, vmax > 0.0f ? v[j] / vmax : 0.0f);
    }
  }
}

// ---- Adafactor ----------------------------------------------------------------------------------
// param, grad, exp_avg are (R,C); factored: row (R), col (C); else v (R*C)
void adafactor(float* param, const float* grad, float* row, float* col, float* v, float* exp_avg,
               const float* grad_norm, int64_t R, int64_t C, const AdafactorHyper& hp) {
  const int64_t n = R * C;
  const double clip = clip_factor(hp.max_grad_norm, grad_norm);
  const double t = static_cast<double>(hp.step);
  double rho = hp.lr;
  if (hp.relative_step) rho = std::min(hp.warmup_init ? 1e-6 * t : 1e-2, 1.0 / std::sqrt(t));
  double scale = 1.0;
  if (hp.scale_parameter) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(param[i]) * param[i];
    scale = std::max(static_cast<double>(hp.eps2), std::sqrt(ss / static_cast<double>(n)));
  }
  const double lr_t = rho * scale;
  const double b2t = 1.0 - std::pow(t, static_cast<double>(hp.decay_rate));
  const double eps1 = hp.eps1;
  // Unscaled update U as a function of element i (reads the new statistics).
  std::vector<double> u(static_cast<size_t>(n));
  if (row) {
    std::vector<double> rs(static_cast<size_t>(R), 0.0), cs(static_cast<size_t>(C), 0.0);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        double g = grad[r * C + c] * clip, sq = g * g + eps1;
        rs[r] += sq;
        cs[c] += sq;
      }
    double row_sum = 0.0;
    for (int64_t r = 0; r < R; ++r) {
      row[r] = static_cast<float>(b2t * row[r] + (1.0 - b2t) * rs[r] / static_cast<double>(C));
      row_sum += row[r];
    }
    for (int64_t c = 0; c < C; ++c)
      col[c] = static_cast<float>(b2t * col[c] + (1.0 - b2t) * cs[c] / static_cast<double>(R));
    const double row_mean = row_sum / static_cast<double>(R);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c)
        u[r * C + c] = grad[r * C + c] * clip / std::sqrt(row[r] / row_mean) / std::sqrt(col[c]);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      double g = grad[i] * clip;
      v[i] = static_cast<float>(b2t * v[i] + (1.0 - b2t) * (g * g + eps1));
      u[i] = g / std::sqrt(static_cast<double>(v[i]));
    }
  }
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += u[i] * u[i];
  const double rms = std::sqrt(ss / static_cast<double>(n));
  const double k = lr_t / std::max(1.0, rms / hp.clip_threshold);
  const double b1 = hp.beta1;
  for (int64_t i = 0; i < n; ++i) {
    double upd = u[i] * k;
    if (exp_avg) {
      upd = b1 * exp_avg[i] + (1.0 - b1) * upd;
      exp_avg[i] = static_cast<float>(upd);
    }
    double p = param[i];
    p -= static_cast<double>(hp.weight_decay) * lr_t * p;
    param[i] = static_cast<float>(p - upd);
  }
}

}  // namespace ct::cpu::ref
