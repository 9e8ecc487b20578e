// Shared helpers for the per-op tests: the two CPU devices, host <-> tensor transfers, seeded
// inputs, the normalised-MSE comparison, fp64 forwards of each op, and central differences.
//
// Tolerances (normalised MSE, sum((got-want)^2) / sum(want^2)):
//   kTolF64     reference device vs the fp64 forward here: only the final f32 rounding differs.
//   kTolFast    fast device vs reference for elementwise/normalisation/loss ops (f32 sums).
//   kTolGemm    fast device vs reference for matmul/attention (sgemm's f32 accumulation).
//   kTolGrad    reference backward vs fp64 central differences.
// All far below the cross-backend defaults (1e-7, and 5e-4 for matmul/attention): on the CPU
// both sides compute the same maths in f32 or better.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/device.h"
#include "core/error.h"
#include "core/philox.h"
#include "tests/common/test_data.h"

namespace ct::test {

inline constexpr double kTolF64 = 1e-12;
inline constexpr double kTolFast = 1e-11;
inline constexpr double kTolGemm = 1e-11;
inline constexpr double kTolGrad = 1e-9;

using Vec = std::vector<float>;
using VecD = std::vector<double>;

// Both CPU devices, opened once per test binary.
inline Device& ref_dev() {
  static std::unique_ptr<Device> d = make_cpu_device(true);
  return *d;
}
inline Device& fast_dev() {
  static std::unique_ptr<Device> d = make_cpu_device(false);
  return *d;
}

inline Tensor upload(Device& d, const Shape& s, const Vec& v,
                     MemCategory c = MemCategory::kActivations) {
  Tensor t = d.empty(s, DType::f32, c);
  EXPECT_EQ(static_cast<size_t>(s.numel()), v.size()) << "upload " << s.str();
  d.upload(t, v.data(), v.size() * sizeof(float));
  return t;
}
inline Tensor upload_i32(Device& d, const Shape& s, const std::vector<int32_t>& v) {
  Tensor t = d.empty(s, DType::i32, MemCategory::kActivations);
  d.upload(t, v.data(), v.size() * sizeof(int32_t));
  return t;
}
inline Vec download(Device& d, const Tensor& t) { return testdata::download_as<float>(d, t); }
inline std::vector<int32_t> download_i32(Device& d, const Tensor& t) {
  return testdata::download_as<int32_t>(d, t);
}

// Seeded inputs (Philox streams 17, 23, 29 of `seed`).
inline Vec randn(size_t n, uint64_t seed, float scale = 1.0f) { return testdata::randn(n, seed, scale, 17); }
inline Vec uniform(size_t n, uint64_t seed, float lo, float hi) {
  return testdata::uniform(n, seed, lo, hi, 23);
}
inline std::vector<int32_t> randint(size_t n, uint64_t seed, int32_t hi) {
  return testdata::randint(n, seed, hi, 29);
}
inline VecD to_d(const Vec& v) { return VecD(v.begin(), v.end()); }

// Normalised MSE of got against want; fails on a length mismatch, a NaN on one side only, or
// an inf that the other side does not have with the same sign.
template <typename W>
::testing::AssertionResult close_nmse(const Vec& got, const std::vector<W>& want, double tol,
                                      const std::string& what = "") {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << " vs " << want.size();
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = got[i], w = static_cast<double>(want[i]);
    if (std::isnan(g) != std::isnan(w) || ((std::isinf(g) || std::isinf(w)) && g != w))
      return ::testing::AssertionFailure()
             << what << ": non-finite mismatch at " << i << ": got " << g << ", want " << w;
    if (std::isnan(g) || std::isinf(g)) continue;
    num += (g - w) * (g - w);
    den += w * w;
  }
  double e = den > 0 ? num / den : num;
  if (std::getenv("CT_PRINT_NMSE")) std::printf("  nmse %-50s %.3g (tol %.0e)\n", what.c_str(), e, tol);
  if (e <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": normalised MSE " << e << " > " << tol;
}

// d/dx of L(x) = sum_j g_j f(x)_j by central differences in fp64.
inline VecD numeric_grad(const std::function<VecD(const VecD&)>& f, VecD x, const VecD& g,
                         double h = 1e-6) {
  VecD grad(x.size());
  auto dot = [&](const VecD& y) {
    double s = 0.0;
    for (size_t j = 0; j < y.size(); ++j) s += g[j] * y[j];
    return s;
  };
  for (size_t i = 0; i < x.size(); ++i) {
    double x0 = x[i];
    x[i] = x0 + h;
    double lp = dot(f(x));
    x[i] = x0 - h;
    double lm = dot(f(x));
    x[i] = x0;
    grad[i] = (lp - lm) / (2.0 * h);
  }
  return grad;
}

// ---- fp64 forwards ----------------------------------------------------------------------------
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

// qkv is (B,T,3C) -> out (B,T,C); att (B,NH,T,T) if non-null
inline VecD attention(const VecD& qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                      VecD* att = nullptr) {
  int64_t hs = C / NH;
  double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  VecD out(static_cast<size_t>(B * T * C), 0.0);
  if (att) att->assign(static_cast<size_t>(B * NH * T * T), 0.0);
  VecD p(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        double mx = -INFINITY;
        for (int64_t u = 0; u <= t; ++u) {
          double s = 0.0;
          for (int64_t i = 0; i < hs; ++i)
            s += qkv[(b * T + t) * 3 * C + h * hs + i] * qkv[(b * T + u) * 3 * C + C + h * hs + i];
          p[u] = s * scale;
          mx = std::max(mx, p[u]);
        }
        double z = 0.0;
        for (int64_t u = 0; u <= t; ++u) z += (p[u] = std::exp(p[u] - mx));
        for (int64_t u = 0; u <= t; ++u) {
          p[u] /= z;
          if (att) (*att)[((b * NH + h) * T + t) * T + u] = p[u];
          for (int64_t i = 0; i < hs; ++i)
            out[(b * T + t) * C + h * hs + i] += p[u] * qkv[(b * T + u) * 3 * C + 2 * C + h * hs + i];
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
