// fp64 forwards of the ops, the oracle for the reference device (cpu:1) in the Reference* suites.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace ct::test {

using VecD = std::vector<double>;

namespace f64 {

// x is (N,C); w, b are (C)
inline VecD layernorm(const VecD& x, const VecD& w, const VecD& b, int64_t N, int64_t C,
                      double eps) {
  VecD out(x.size());
  for (int64_t n = 0; n < N; ++n) {
    double m = 0.0, v = 0.0;
    for (int64_t i = 0; i < C; ++i) m += x[n * C + i];
    m /= C;
    for (int64_t i = 0; i < C; ++i) v += (x[n * C + i] - m) * (x[n * C + i] - m);
    v /= C;
    double r = 1.0 / std::sqrt(v + eps);
    for (int64_t i = 0; i < C; ++i) out[n * C + i] = (x[n * C + i] - m) * r * w[i] + b[i];
  }
  return out;
}

// x is (N,C); w is (C): (x / sqrt(mean(x^2) + eps)) * w per row (Llama's RMSNorm)
inline VecD rmsnorm(const VecD& x, const VecD& w, int64_t N, int64_t C, double eps) {
  VecD out(x.size());
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0.0;
    for (int64_t i = 0; i < C; ++i) ss += x[n * C + i] * x[n * C + i];
    double r = 1.0 / std::sqrt(ss / C + eps);
    for (int64_t i = 0; i < C; ++i) out[n * C + i] = x[n * C + i] * r * w[i];
  }
  return out;
}

// gu is (N, 2F): silu(gu[:, :F]) * gu[:, F:], (N, F) (Llama's SwiGLU)
inline VecD swiglu(const VecD& gu, int64_t N, int64_t F) {
  VecD out(static_cast<size_t>(N * F));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < F; ++i) {
      double g = gu[n * 2 * F + i], u = gu[n * 2 * F + F + i];
      out[n * F + i] = g / (1.0 + std::exp(-g)) * u;
    }
  return out;
}

// x is (B, T, W = heads * D); cos, sin are (T, D/2): the first rot heads rotated in the
// rotate-half form (Hugging Face's apply_rotary_pos_emb), the rest copied
inline VecD rope(const VecD& x, const VecD& cos, const VecD& sin, int64_t B, int64_t T, int64_t W,
                 int64_t D, int64_t rot) {
  VecD out(x);
  const int64_t half = D / 2;
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t t = bt % T;
    for (int64_t h = 0; h < rot; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double c = cos[t * half + i], s = sin[t * half + i];
        const double x1 = x[bt * W + h * D + i], x2 = x[bt * W + h * D + half + i];
        out[bt * W + h * D + i] = x1 * c - x2 * s;
        out[bt * W + h * D + half + i] = x2 * c + x1 * s;
      }
  }
  return out;
}

// c (M,N) = op(a) op(b); a is (M,K) or (K,M), b is (K,N) or (N,K)
inline VecD matmul(const VecD& a, const VecD& b, int64_t M, int64_t N, int64_t K, bool ta,
                   bool tb) {
  VecD c(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0.0;
      for (int64_t k = 0; k < K; ++k)
        s += (ta ? a[k * M + i] : a[i * K + k]) * (tb ? b[j * K + k] : b[k * N + j]);
      c[i * N + j] = s;
    }
  return c;
}

// qkv is (B,T,C + 2 NKV hs), hs = C/NH: q (NH heads) | k (NKV heads) | v (NKV heads), query
// head h reading kv head h / (NH/NKV) (NKV 0: NH) -> out (B,T,C); att (B,NH,T,T) if non-null
inline VecD attention(const VecD& qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                      VecD* att = nullptr, int64_t NKV = 0) {
  if (NKV == 0) NKV = NH;
  const int64_t hs = C / NH, W = C + 2 * NKV * hs, G = NH / NKV;
  double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  VecD out(static_cast<size_t>(B * T * C), 0.0);
  if (att) att->assign(static_cast<size_t>(B * NH * T * T), 0.0);
  VecD p(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t ko = C + (h / G) * hs, vo = C + NKV * hs + (h / G) * hs;
      for (int64_t t = 0; t < T; ++t) {
        double mx = -INFINITY;
        for (int64_t u = 0; u <= t; ++u) {
          double s = 0.0;
          for (int64_t i = 0; i < hs; ++i)
            s += qkv[(b * T + t) * W + h * hs + i] * qkv[(b * T + u) * W + ko + i];
          p[u] = s * scale;
          mx = std::max(mx, p[u]);
        }
        double z = 0.0;
        for (int64_t u = 0; u <= t; ++u) z += (p[u] = std::exp(p[u] - mx));
        for (int64_t u = 0; u <= t; ++u) {
          p[u] /= z;
          if (att) (*att)[((b * NH + h) * T + t) * T + u] = p[u];
          for (int64_t i = 0; i < hs; ++i)
            out[(b * T + t) * C + h * hs + i] += p[u] * qkv[(b * T + u) * W + vo + i];
        }
      }
    }
  return out;
}

inline VecD gelu(const VecD& x) {
  VecD y(x.size());
  const double s = std::sqrt(2.0 / M_PI);
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = 0.5 * x[i] * (1.0 + std::tanh(s * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  return y;
}

// logits (N,V), targets (N) -> losses (N)
inline VecD crossentropy(const VecD& logits, const std::vector<int32_t>& targets, int64_t N,
                         int64_t V) {
  VecD l(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    double mx = -INFINITY, z = 0.0;
    for (int64_t i = 0; i < V; ++i) mx = std::max(mx, logits[n * V + i]);
    for (int64_t i = 0; i < V; ++i) z += std::exp(logits[n * V + i] - mx);
    l[n] = std::log(z) + mx - logits[n * V + targets[n]];
  }
  return l;
}

// tokens (B,T), wte (V,C), wpe (maxT,C) -> (B,T,C)
inline VecD embedding(const std::vector<int32_t>& tokens, const VecD& wte, const VecD& wpe,
                      int64_t B, int64_t T, int64_t C) {
  VecD out(static_cast<size_t>(B * T * C));
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t i = 0; i < C; ++i)
      out[bt * C + i] = wte[tokens[bt] * C + i] + wpe[(bt % T) * C + i];
  return out;
}

}  // namespace f64
}  // namespace ct::test
