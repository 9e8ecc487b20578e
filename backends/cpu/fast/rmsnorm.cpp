// Fast RMS normalisation: rows in parallel; dw from fixed row chunks reduced in order.
#include <algorithm>
#include <cmath>

#include "backends/cpu/kernels.h"

namespace ct::cpu::fast::CT_CPU_ISA {

namespace {

// One row: on, xn are (C); w is (C); rstd is the row's statistic
inline void rmsnorm_row(float* on, float* rstd, const float* xn, const float* w, int64_t C,
                        float eps) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < C; ++i) ss += xn[i] * xn[i];
  if (!std::isfinite(ss)) {
    // |x| past ~1e19: the squares overflow fp32. The row in fp64, as the reference (an inf x
    // keeps ss = inf: rstd 0, PyTorch's rsqrt(inf); NaN stays NaN).
    double sd = 0.0;
    for (int64_t i = 0; i < C; ++i) sd += static_cast<double>(xn[i]) * xn[i];
    const double rd = 1.0 / std::sqrt(sd / static_cast<double>(C) + eps);
    for (int64_t i = 0; i < C; ++i) on[i] = static_cast<float>(xn[i] * rd * w[i]);
    *rstd = static_cast<float>(rd);
    return;
  }
  float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
#pragma omp simd
  for (int64_t i = 0; i < C; ++i) on[i] = xn[i] * r * w[i];
  *rstd = r;
}

}  // namespace

// out, x are (N,C); w is (C); rstd is (N)
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t C,
                     float eps) {
#pragma omp parallel for schedule(static) if (N * C > (1 << 14))
  for (int64_t n = 0; n < N; ++n) rmsnorm_row(out + n * C, rstd + n, x + n * C, w, C, eps);
}

// residual, out, x, r are (N,C); w is (C); rstd is (N)
// Row by row, so the sum is normalised while it is still in cache.
void residual_rmsnorm_forward(float* residual, float* out, float* rstd, const float* x,
                              const float* r, const float* w, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (N * C > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    float* rn = residual + n * C;
    const float *xn = x + n * C, *dn = r + n * C;
#pragma omp simd
    for (int64_t i = 0; i < C; ++i) rn[i] = xn[i] + dn[i];
    rmsnorm_row(out + n * C, rstd + n, rn, w, C, eps);
  }
}

// dx, dout, x are (N,C); dw, w are (C); rstd is (N)
// Rows are cut into chunks whose count depends on N only; each chunk sums its dw partial into
// the workspace (C floats per chunk), added afterwards in chunk order: the same result run to
// run and for any thread count (as layernorm_backward).
void rmsnorm_backward(Workspace& ws, float* dx, float* dw, const float* dout, const float* x,
                      const float* w, const float* rstd, int64_t N, int64_t C) {
  if (N == 0 || C == 0) return;
  int64_t rows = std::max<int64_t>(16, (N + 255) / 256);
  int64_t nchunks = (N + rows - 1) / rows;
  float* part = static_cast<float*>(ws.get(static_cast<size_t>(nchunks * C) * sizeof(float)));
#pragma omp parallel for schedule(static) if (N * C > (1 << 14))
  for (int64_t ch = 0; ch < nchunks; ++ch) {
    float* pdw = part + ch * C;
    for (int64_t i = 0; i < C; ++i) pdw[i] = 0.0f;
    int64_t n1 = std::min(N, (ch + 1) * rows);
    for (int64_t n = ch * rows; n < n1; ++n) {
      const float* dn = dout + n * C;
      const float* xn = x + n * C;
      float s = rstd[n];
      float dnorm = 0.0f;
#pragma omp simd reduction(+ : dnorm)
      for (int64_t i = 0; i < C; ++i) dnorm += dn[i] * w[i] * (xn[i] * s);
      dnorm /= static_cast<float>(C);
      float* dxn = dx + n * C;
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) {
        float xhat = xn[i] * s;
        pdw[i] += dn[i] * xhat;
        dxn[i] += s * (dn[i] * w[i] - xhat * dnorm);
      }
    }
  }
#pragma omp simd
  for (int64_t i = 0; i < C; ++i) {
    float sw = 0.0f;
    for (int64_t ch = 0; ch < nchunks; ++ch) sw += part[ch * C + i];
    dw[i] += sw;
  }
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
