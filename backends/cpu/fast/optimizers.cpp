// Fast optimizer steps: SGD, Lion, block-wise 8-bit AdamW and Adafactor, one OpenMP pass each
// (Adafactor: three, for its statistics). Reductions go through fixed-size chunks summed in
// chunk order, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/fast/vec_math.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/nearest_code.h"

CT_FAST_WIDE_VECTORS

namespace ct::cpu::fast::CT_CPU_ISA {

namespace {

constexpr int64_t kChunk = 1 << 14;

int64_t chunks_of(int64_t n, int64_t chunk) {
  return (n + chunk - 1) / chunk;
}

// Deterministic sum over [0, n) of f(i) in fp64: per-chunk partials added in chunk order.
template <typename F>
double chunked_sum(int64_t n, F f) {
  const int64_t nc = chunks_of(n, kChunk);
  std::vector<double> part(static_cast<size_t>(nc), 0.0);
#pragma omp parallel for schedule(static) if (nc > 1)
  for (int64_t c = 0; c < nc; ++c) {
    double s = 0.0;
    const int64_t i1 = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < i1; ++i) s += f(i);
    part[static_cast<size_t>(c)] = s;
  }
  double s = 0.0;
  for (double p : part) s += p;
  return s;
}

}  // namespace

// ---- SGD --------------------------------------------------------------------------------------
// param, grad, buf are (n); buf null without momentum
void sgd(float* param, const float* grad, float* buf, const float* grad_norm, int64_t n,
         const SgdHyper& hp) {
  const float clip = static_cast<float>(clip_factor(hp.max_grad_norm, grad_norm));
  const float wd = hp.weight_decay, mom = hp.momentum, damp = 1.0f - hp.dampening, lr = hp.lr;
  const bool first = hp.step == 1, nesterov = hp.nesterov, use_buf = hp.momentum != 0.0f;
  const int64_t nc = chunks_of(n, kChunk);
#pragma omp parallel for schedule(static) if (nc > 1)
  for (int64_t c = 0; c < nc; ++c) {
    const int64_t i1 = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < i1; ++i) {
      float g = grad[i] * clip + wd * param[i];
      if (use_buf) {
        float b = first ? g : mom * buf[i] + damp * g;
        buf[i] = b;
        g = nesterov ? g + mom * b : b;
      }
      param[i] -= lr * g;
    }
  }
}

// ---- Lion -------------------------------------------------------------------------------------
// param, grad, m are (n)
void lion(float* param, const float* grad, float* m, const float* grad_norm, int64_t n,
          const LionHyper& hp) {
  const float clip = static_cast<float>(clip_factor(hp.max_grad_norm, grad_norm));
  const float b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr, decay = 1.0f - hp.lr * hp.weight_decay;
  const int64_t nc = chunks_of(n, kChunk);
#pragma omp parallel for schedule(static) if (nc > 1)
  for (int64_t c = 0; c < nc; ++c) {
    const int64_t i1 = std::min(n, (c + 1) * kChunk);
#pragma omp simd
    for (int64_t i = c * kChunk; i < i1; ++i) {
      float g = grad[i] * clip;
      float u = b1 * m[i] + (1.0f - b1) * g;
      float sign = u > 0.0f ? 1.0f : (u < 0.0f ? -1.0f : 0.0f);
      param[i] = param[i] * decay - lr * sign;
      m[i] = b2 * m[i] + (1.0f - b2) * g;
    }
  }
}

// ---- 8-bit AdamW --------------------------------------------------------------------------------
// param, grad, m_q, v_q are (n); m_absmax, v_absmax (ceil(n/256)); qmaps (256)
void adamw_8bit(float* param, const float* grad, uint8_t* m_q, uint8_t* v_q, float* m_absmax,
                float* v_absmax, const float* qmap_signed, const float* qmap_unsigned,
                const float* grad_norm, int64_t n, const AdamWHyper& hp) {
  const float clip = static_cast<float>(clip_factor(hp.max_grad_norm, grad_norm));
  const double t = static_cast<double>(hp.step);
  const float b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps;
  const float step = static_cast<float>(hp.lr / (1.0 - std::pow(static_cast<double>(b1), t)));
  const float inv_bc2_sqrt =
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(b2), t)));
  const float decay = 1.0f - hp.lr * hp.weight_decay;
  const int64_t nb = quant_blocks(n);
  const auto near_s = NearestCode::cached(qmap_signed), near_u = NearestCode::cached(qmap_unsigned);
  // Three vector loops per block: the moments (two gathers from the code tables) and the decayed
  // parameters, their square roots (sqrt_n: std::sqrt kept the one loop this was scalar), the
  // step. param * decay is rounded before the subtraction (kept apart, it is not fused into it),
  // as in the scalar loop.
#pragma omp parallel for schedule(static) if (nb > 64)
  for (int64_t b = 0; b < nb; ++b) {
    float m[kQuantBlockSize], v[kQuantBlockSize], root[kQuantBlockSize], decayed[kQuantBlockSize];
    const int64_t i0 = b * kQuantBlockSize, len = std::min(kQuantBlockSize, n - i0);
    const float ma = m_absmax[b], va = v_absmax[b];
    float mmax = 0.0f, vmax = 0.0f;
#pragma omp simd reduction(max : mmax, vmax)
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = i0 + j;
      float g = grad[i] * clip;
      float mi = b1 * (qmap_signed[m_q[i]] * ma) + (1.0f - b1) * g;
      float vi = b2 * (qmap_unsigned[v_q[i]] * va) + (1.0f - b2) * g * g;
      m[j] = mi;
      v[j] = vi;
      mmax = std::max(mmax, std::abs(mi));
      vmax = std::max(vmax, vi);
      decayed[j] = param[i] * decay;
    }
    sqrt_n(root, v, len);
#pragma omp simd
    for (int64_t j = 0; j < len; ++j)
      param[i0 + j] = decayed[j] - step * m[j] / (root[j] * inv_bc2_sqrt + eps);
    m_absmax[b] = mmax;
    v_absmax[b] = vmax;
    // quantize_nearest's codes, through the interval tables (bit-identical, ~10x faster).
    near_s->encode(m, mmax, m_q + i0, len);
    near_u->encode(v, vmax, v_q + i0, len);
  }
}

// ---- Adafactor ----------------------------------------------------------------------------------
// param, grad, exp_avg are (R,C); factored: row (R), col (C); else v (R*C)
void adafactor(float* param, const float* grad, float* row, float* col, float* v, float* exp_avg,
               const float* grad_norm, int64_t R, int64_t C, const AdafactorHyper& hp) {
  const int64_t n = R * C;
  const float clip = static_cast<float>(clip_factor(hp.max_grad_norm, grad_norm));
  const double t = static_cast<double>(hp.step);
  double rho = hp.lr;
  if (hp.relative_step) rho = std::min(hp.warmup_init ? 1e-6 * t : 1e-2, 1.0 / std::sqrt(t));
  double scale = 1.0;
  if (hp.scale_parameter) {
    double ss = chunked_sum(n, [&](int64_t i) { return static_cast<double>(param[i]) * param[i]; });
    scale = std::max(static_cast<double>(hp.eps2), std::sqrt(ss / static_cast<double>(n)));
  }
  const double lr_t = rho * scale;
  const float b2t = static_cast<float>(1.0 - std::pow(t, static_cast<double>(hp.decay_rate)));
  const float eps1 = hp.eps1;
  // Statistics: row means in parallel over rows; column means in parallel over column tiles,
  // each walking the rows in order (both orders fixed).
  std::vector<float> rfac, cfac;  // 1/sqrt(row/mean(row)) per row, 1/sqrt(col) per column
  if (row) {
#pragma omp parallel for schedule(static) if (n > kChunk)
    for (int64_t r = 0; r < R; ++r) {
      double s = 0.0;
      for (int64_t c = 0; c < C; ++c) {
        float g = grad[r * C + c] * clip;
        s += static_cast<double>(g * g + eps1);
      }
      row[r] = static_cast<float>(b2t * static_cast<double>(row[r]) +
                                  (1.0 - b2t) * s / static_cast<double>(C));
    }
    constexpr int64_t kTile = 256;
    const int64_t tiles = chunks_of(C, kTile);
#pragma omp parallel for schedule(static) if (n > kChunk)
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const int64_t c0 = tile * kTile, c1 = std::min(C, c0 + kTile);
      double s[kTile] = {};
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          float g = grad[r * C + c] * clip;
          s[c - c0] += static_cast<double>(g * g + eps1);
        }
      for (int64_t c = c0; c < c1; ++c)
        col[c] = static_cast<float>(b2t * static_cast<double>(col[c]) +
                                    (1.0 - b2t) * s[c - c0] / static_cast<double>(R));
    }
    double row_sum = 0.0;
    for (int64_t r = 0; r < R; ++r) row_sum += row[r];
    const double row_mean = row_sum / static_cast<double>(R);
    rfac.resize(static_cast<size_t>(R));
    cfac.resize(static_cast<size_t>(C));
    for (int64_t r = 0; r < R; ++r)
      rfac[r] = static_cast<float>(1.0 / std::sqrt(row[r] / row_mean));
    for (int64_t c = 0; c < C; ++c)
      cfac[c] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(col[c])));
  } else {
#pragma omp parallel for schedule(static) if (n > kChunk)
    for (int64_t i = 0; i < n; ++i) {
      float g = grad[i] * clip;
      v[i] = b2t * v[i] + (1.0f - b2t) * (g * g + eps1);
    }
  }
  // RMS of the unscaled update: per-row (factored) or per-chunk partials, summed in order.
  double ss = 0.0;
  if (row) {
    std::vector<double> part(static_cast<size_t>(R));
#pragma omp parallel for schedule(static) if (n > kChunk)
    for (int64_t r = 0; r < R; ++r) {
      const float* g = grad + r * C;
      const float rf = rfac[r] * clip;
      double s = 0.0;
      for (int64_t c = 0; c < C; ++c) {
        float u = g[c] * rf * cfac[c];
        s += static_cast<double>(u) * u;
      }
      part[r] = s;
    }
    for (double x : part) ss += x;
  } else {
    ss = chunked_sum(n, [&](int64_t i) {
      double u = grad[i] * clip / std::sqrt(v[i]);
      return u * u;
    });
  }
  const double rms = std::sqrt(ss / static_cast<double>(n));
  const float k = static_cast<float>(lr_t / std::max(1.0, rms / hp.clip_threshold));
  const float b1 = hp.beta1, decay = static_cast<float>(1.0 - hp.weight_decay * lr_t);
  // Elements [i0, i1) of one row (factored: rf the row factor) or of the vector, in spans of
  // kSpan: the unscaled update, then the step, each a vector loop (one loop with std::sqrt in
  // it, as this was, stays scalar; sqrt_n has its bits).
  auto apply = [&](int64_t i0, int64_t i1, float rf) {
    constexpr int64_t kSpan = 256;
    float u[kSpan];
    for (int64_t s0 = i0; s0 < i1; s0 += kSpan) {
      const int64_t len = std::min(kSpan, i1 - s0);
      const float* g = grad + s0;
      if (row) {
        const float* cf = cfac.data() + (s0 - i0);
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) u[j] = g[j] * clip * rf * cf[j];
      } else {
        sqrt_n(u, v + s0, len);
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) u[j] = g[j] * clip / u[j];
      }
      float* p = param + s0;
      if (exp_avg) {
        float* ea = exp_avg + s0;
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) {
          const float upd = b1 * ea[j] + (1.0f - b1) * (u[j] * k);
          ea[j] = upd;
          p[j] = p[j] * decay - upd;
        }
      } else {
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) p[j] = p[j] * decay - u[j] * k;
      }
    }
  };
  if (row) {
#pragma omp parallel for schedule(static) if (n > kChunk)
    for (int64_t r = 0; r < R; ++r) apply(r * C, (r + 1) * C, rfac[r]);
  } else {
    const int64_t nc = chunks_of(n, kChunk);
#pragma omp parallel for schedule(static) if (nc > 1)
    for (int64_t c = 0; c < nc; ++c) apply(c * kChunk, std::min(n, (c + 1) * kChunk), 0.0f);
  }
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
