// Reference layer normalisation over the last dimension, statistics in fp64.
#include <cmath>

#include "backends/cpu/kernels.h"

namespace ct::cpu::ref {

// out, x are (N,C); w, b are (C); mean, rstd are (N)
void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C, float eps) {
  for (int64_t n = 0; n < N; ++n) {
    const float* xn = x + n * C;
    double m = 0.0;
    for (int64_t i = 0; i < C; ++i) m += xn[i];
    m /= static_cast<double>(C);
    double v = 0.0;
    for (int64_t i = 0; i < C; ++i) v += (xn[i] - m) * (xn[i] - m);
    v /= static_cast<double>(C);
    double s = 1.0 / std::sqrt(v + eps);
    float* on = out + n * C;
    for (int64_t i = 0; i < C; ++i) on[i] = static_cast<float>((xn[i] - m) * s * w[i] + b[i]);
    mean[n] = static_cast<float>(m);
    rstd[n] = static_cast<float>(s);
  }
}

// residual, out, x, r are (N,C); w, b are (C); mean, rstd are (N)
//   residual = x + r (rounded to f32, as add stores it);  out = layernorm(residual)
void residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd,
                                const float* x, const float* r, const float* w, const float* b,
                                int64_t N, int64_t C, float eps) {
  add(residual, x, r, N * C);
  layernorm_forward(out, mean, rstd, residual, w, b, N, C, eps);
}

// dx, dout, x are (N,C); dw, db, w are (C); mean, rstd are (N)
//   xhat = (x - mean) * rstd;  dxhat = dout * w
//   dx += rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
//   dw += sum_n dout * xhat;  db += sum_n dout
void layernorm_backward(Workspace& ws, float* dx, float* dw, float* db, const float* dout,
                        const float* x, const float* w, const float* mean, const float* rstd,
                        int64_t N, int64_t C) {
  double* acc = static_cast<double*>(ws.get(static_cast<size_t>(2 * C) * sizeof(double)));
  double* dw_acc = acc;
  double* db_acc = acc + C;
  for (int64_t i = 0; i < 2 * C; ++i) acc[i] = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    const float* dn = dout + n * C;
    const float* xn = x + n * C;
    double m = mean[n], s = rstd[n];
    double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
    for (int64_t i = 0; i < C; ++i) {
      double xhat = (xn[i] - m) * s;
      double dxhat = static_cast<double>(dn[i]) * w[i];
      dnorm_mean += dxhat;
      dnorm_norm_mean += dxhat * xhat;
    }
    dnorm_mean /= static_cast<double>(C);
    dnorm_norm_mean /= static_cast<double>(C);
    float* dxn = dx + n * C;
    for (int64_t i = 0; i < C; ++i) {
      double xhat = (xn[i] - m) * s;
      double dxhat = static_cast<double>(dn[i]) * w[i];
      dw_acc[i] += dn[i] * xhat;
      db_acc[i] += dn[i];
      dxn[i] += static_cast<float>(s * (dxhat - dnorm_mean - xhat * dnorm_norm_mean));
    }
  }
  for (int64_t i = 0; i < C; ++i) {
    dw[i] = static_cast<float>(dw[i] + dw_acc[i]);
    db[i] = static_cast<float>(db[i] + db_acc[i]);
  }
}

}  // namespace ct::cpu::ref
