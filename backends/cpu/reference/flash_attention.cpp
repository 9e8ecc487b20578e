// Reference fused causal self-attention (core/device.h flash_attention_*), fp64 sums, one query
// row at a time: what the fused kernels compute, without their blocking. Only the log-sum-exp
// of each row's scaled scores is saved; the backward recomputes the probabilities from it.
#include <cmath>

#include "backends/cpu/kernels.h"

namespace ct::cpu::ref {

// out is (B,Tq,C) and lse (B,NH,Tq): the last Tq positions' rows; qkv is (B,T,C3) holding
// q (NH heads) | k (NKV heads) | v (NKV heads), heads of hs = C/NH, C3 = C + 2 NKV hs; query head
// h reads kv head h / (NH/NKV)
void flash_attention_forward(Workspace& ws, float* out, float* lse, const float* qkv, int64_t B,
                             int64_t T, int64_t Tq, int64_t C, int64_t NH, int64_t NKV) {
  const int64_t hs = C / NH, C3 = C + 2 * NKV * hs, G = NH / NKV;
  const int64_t koff = C, voff = C + NKV * hs;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  double* s = static_cast<double*>(ws.get(static_cast<size_t>(T) * sizeof(double)));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = T - Tq; t < T; ++t) {
        const float* q = qkv + (b * T + t) * C3 + h * hs;
        // scores s[u] = scale q . k_u for the keys u <= t, and their log-sum-exp
        double mx = -INFINITY;
        for (int64_t u = 0; u <= t; ++u) {
          const float* k = qkv + (b * T + u) * C3 + koff + (h / G) * hs;
          double dot = 0.0;
          for (int64_t i = 0; i < hs; ++i) dot += static_cast<double>(q[i]) * k[i];
          s[u] = dot * scale;
          mx = std::fmax(mx, s[u]);
        }
        double sum = 0.0;
        for (int64_t u = 0; u <= t; ++u) sum += std::exp(s[u] - mx);
        const double l = mx + std::log(sum);
        const int64_t r = t - (T - Tq);  // out's and lse's row
        lse[(b * NH + h) * Tq + r] = static_cast<float>(l);
        // out = sum_u p_u v_u with p_u = exp(s_u - lse)
        float* o = out + (b * Tq + r) * C + h * hs;
        for (int64_t i = 0; i < hs; ++i) {
          double acc = 0.0;
          for (int64_t u = 0; u <= t; ++u)
            acc += std::exp(s[u] - l) * qkv[(b * T + u) * C3 + voff + (h / G) * hs + i];
          o[i] = static_cast<float>(acc);
        }
      }
}

// dqkv, qkv are (B,T,C3); dout, out are (B,T,C); lse is (B,NH,T). Per query row t:
//   D = dout_t . out_t;  for u <= t: p = exp(scale q_t.k_u - lse_t),  dv_u += p dout_t,
//   ds = p (dout_t . v_u - D) scale,  dq_t += ds k_u,  dk_u += ds q_t.
// Gradients are gathered in an fp64 copy of dqkv (workspace) and rounded once at the end; a
// key/value head's gradient is the sum over the query heads of its group.
void flash_attention_backward(Workspace& ws, float* dqkv, const float* dout, const float* qkv,
                              const float* out, const float* lse, int64_t B, int64_t T, int64_t C,
                              int64_t NH, int64_t NKV) {
  const int64_t hs = C / NH, C3 = C + 2 * NKV * hs, G = NH / NKV;
  const int64_t koff = C, voff = C + NKV * hs;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  const size_t n = static_cast<size_t>(B * T * C3);
  double* acc = static_cast<double*>(ws.get(n * sizeof(double)));
  for (size_t i = 0; i < n; ++i) acc[i] = 0.0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const float* q = qkv + (b * T + t) * C3 + h * hs;
        const float* d = dout + (b * T + t) * C + h * hs;
        const float* o = out + (b * T + t) * C + h * hs;
        const double l = lse[(b * NH + h) * T + t];
        double D = 0.0;
        for (int64_t i = 0; i < hs; ++i) D += static_cast<double>(d[i]) * o[i];
        double* dq = acc + (b * T + t) * C3 + h * hs;
        for (int64_t u = 0; u <= t; ++u) {
          const float* k = qkv + (b * T + u) * C3 + koff + (h / G) * hs;
          const float* v = qkv + (b * T + u) * C3 + voff + (h / G) * hs;
          double* dk = acc + (b * T + u) * C3 + koff + (h / G) * hs;
          double* dv = acc + (b * T + u) * C3 + voff + (h / G) * hs;
          double dot = 0.0, dp = 0.0;
          for (int64_t i = 0; i < hs; ++i) {
            dot += static_cast<double>(q[i]) * k[i];
            dp += static_cast<double>(d[i]) * v[i];
          }
          const double p = std::exp(dot * scale - l);
          const double ds = p * (dp - D) * scale;
          for (int64_t i = 0; i < hs; ++i) {
            dv[i] += p * d[i];
            dq[i] += ds * k[i];
            dk[i] += ds * q[i];
          }
        }
      }
  for (size_t i = 0; i < n; ++i) dqkv[i] = static_cast<float>(acc[i]);
}

}  // namespace ct::cpu::ref
