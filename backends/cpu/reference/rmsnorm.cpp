// Reference RMS normalisation over the last dimension (Llama's RMSNorm), statistics in fp64.
#include <cmath>

#include "backends/cpu/kernels.h"

namespace ct::cpu::ref {

// out, x are (N,C); w is (C); rstd is (N)
//   rstd = 1 / sqrt(mean(x^2) + eps);  out = (x * rstd) * w
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t C,
                     float eps) {
  for (int64_t n = 0; n < N; ++n) {
    const float* xn = x + n * C;
    double ss = 0.0;
    for (int64_t i = 0; i < C; ++i) ss += static_cast<double>(xn[i]) * xn[i];
    double s = 1.0 / std::sqrt(ss / static_cast<double>(C) + eps);
    float* on = out + n * C;
    for (int64_t i = 0; i < C; ++i) on[i] = static_cast<float>(xn[i] * s * w[i]);
    rstd[n] = static_cast<float>(s);
  }
}

// residual, out, x, r are (N,C); w is (C); rstd is (N)
//   residual = x + r (rounded to f32, as add stores it);  out = rmsnorm(residual)
void residual_rmsnorm_forward(float* residual, float* out, float* rstd, const float* x,
                              const float* r, const float* w, int64_t N, int64_t C, float eps) {
  add(residual, x, r, N * C);
  rmsnorm_forward(out, rstd, residual, w, N, C, eps);
}

// dx, dout, x are (N,C); dw, w are (C); rstd is (N)
//   xhat = x * rstd;  dxhat = dout * w
//   dx += rstd * (dxhat - xhat * mean(dxhat * xhat));  dw += sum_n dout * xhat
void rmsnorm_backward(Workspace& ws, float* dx, float* dw, const float* dout, const float* x,
                      const float* w, const float* rstd, int64_t N, int64_t C) {
  double* dw_acc = static_cast<double*>(ws.get(static_cast<size_t>(C) * sizeof(double)));
  for (int64_t i = 0; i < C; ++i) dw_acc[i] = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    const float* dn = dout + n * C;
    const float* xn = x + n * C;
    double s = rstd[n];
    double dnorm_norm_mean = 0.0;
    for (int64_t i = 0; i < C; ++i)
      dnorm_norm_mean += static_cast<double>(dn[i]) * w[i] * (xn[i] * s);
    dnorm_norm_mean /= static_cast<double>(C);
    float* dxn = dx + n * C;
    for (int64_t i = 0; i < C; ++i) {
      double xhat = xn[i] * s;
      double dxhat = static_cast<double>(dn[i]) * w[i];
      dw_acc[i] += dn[i] * xhat;
      dxn[i] += static_cast<float>(s * (dxhat - xhat * dnorm_norm_mean));
    }
  }
  for (int64_t i = 0; i < C; ++i) dw[i] = static_cast<float>(dw[i] + dw_acc[i]);
}

}  // namespace ct::cpu::ref
