// Reference causal self-attention (llm.c's attention_forward/backward, fp64 sums), with
// grouped-query attention: query head h reads key/value head h / (NH / NKV).
#include <cmath>

#include "backends/cpu/kernels.h"

namespace ct::cpu::ref {

// out is (B,T,C); att is (B,NH,T,T); qkv is (B,T,C3) holding q (NH heads) | k (NKV heads) |
// v (NKV heads), heads of hs = C/NH, C3 = C + 2 NKV hs
void attention_forward(Workspace& ws, float* out, float* att, const float* qkv, int64_t B,
                       int64_t T, int64_t C, int64_t NH, int64_t NKV) {
  const int64_t hs = C / NH, C3 = C + 2 * NKV * hs, G = NH / NKV;
  const int64_t koff = C, voff = C + NKV * hs;  // where k and v start in a row
  double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  double* row = static_cast<double*>(ws.get(static_cast<size_t>(T) * sizeof(double)));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < NH; ++h) {
        const float* q = qkv + b * T * C3 + t * C3 + h * hs;
        float* att_bth = att + ((b * NH + h) * T + t) * T;
        // pass 1: scaled scores q.k for t2 <= t, and their maximum
        double maxval = -INFINITY;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* k = qkv + b * T * C3 + t2 * C3 + koff + (h / G) * hs;
          double dot = 0.0;
          for (int64_t i = 0; i < hs; ++i) dot += static_cast<double>(q[i]) * k[i];
          row[t2] = dot * scale;
          if (row[t2] > maxval) maxval = row[t2];
        }
        // pass 2: softmax; zero above the diagonal
        double sum = 0.0;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          row[t2] = std::exp(row[t2] - maxval);
          sum += row[t2];
        }
        for (int64_t t2 = 0; t2 <= t; ++t2) att_bth[t2] = static_cast<float>(row[t2] / sum);
        for (int64_t t2 = t + 1; t2 < T; ++t2) att_bth[t2] = 0.0f;
        // pass 3: out = att @ v
        float* out_bth = out + b * T * C + t * C + h * hs;
        for (int64_t i = 0; i < hs; ++i) {
          double acc = 0.0;
          for (int64_t t2 = 0; t2 <= t; ++t2)
            acc += (row[t2] / sum) * qkv[b * T * C3 + t2 * C3 + voff + (h / G) * hs + i];
          out_bth[i] = static_cast<float>(acc);
        }
      }
    }
  }
}

// dqkv, qkv are (B,T,C3); dout is (B,T,C); att is (B,NH,T,T)
//   datt = dout . v;  dpreatt = att * (datt - sum(att * datt));  dq = scale dpreatt k, ...
// Gradients are gathered in an fp64 copy of dqkv (workspace) and rounded once at the end; a
// key/value head's gradient is the sum over the query heads of its group.
void attention_backward(Workspace& ws, float* dqkv, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t NH,
                        int64_t NKV) {
  const int64_t hs = C / NH, C3 = C + 2 * NKV * hs, G = NH / NKV;
  const int64_t koff = C, voff = C + NKV * hs;
  double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  size_t n = static_cast<size_t>(B * T * C3);
  double* acc = static_cast<double*>(ws.get((n + static_cast<size_t>(T)) * sizeof(double)));
  double* datt = acc + n;  // (T) for one (b,t,h)
  for (size_t i = 0; i < n; ++i) acc[i] = 0.0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < NH; ++h) {
        const float* att_bth = att + ((b * NH + h) * T + t) * T;
        const float* dout_bth = dout + b * T * C + t * C + h * hs;
        const float* q = qkv + b * T * C3 + t * C3 + h * hs;
        double* dq = acc + b * T * C3 + t * C3 + h * hs;
        // backward through out = att @ v
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* v = qkv + b * T * C3 + t2 * C3 + voff + (h / G) * hs;
          double* dv = acc + b * T * C3 + t2 * C3 + voff + (h / G) * hs;
          double d = 0.0;
          for (int64_t i = 0; i < hs; ++i) {
            d += static_cast<double>(v[i]) * dout_bth[i];
            dv[i] += static_cast<double>(att_bth[t2]) * dout_bth[i];
          }
          datt[t2] = d;
        }
        // backward through the softmax
        double dot = 0.0;
        for (int64_t t2 = 0; t2 <= t; ++t2) dot += att_bth[t2] * datt[t2];
        // backward through the scaled scores q.k
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          double dpre = att_bth[t2] * (datt[t2] - dot) * scale;
          const float* k = qkv + b * T * C3 + t2 * C3 + koff + (h / G) * hs;
          double* dk = acc + b * T * C3 + t2 * C3 + koff + (h / G) * hs;
          for (int64_t i = 0; i < hs; ++i) {
            dq[i] += dpre * k[i];
            dk[i] += dpre * q[i];
          }
        }
      }
    }
  }
  for (size_t i = 0; i < n; ++i) dqkv[i] = static_cast<float>(acc[i]);
}

}  // namespace ct::cpu::ref
