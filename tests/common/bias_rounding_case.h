// A matmul whose bias tells core/device.h's rule for a 16-bit c (the f32 bias rounded to c's
// dtype first, then added to alpha acc + beta c in fp32, the sum rounded once) from the rule it
// replaced (the f32 bias added as it is), on values where every fp32 step is exact: so every
// backend, whatever its summation order, must give the host's bits, not just agree within 1 ulp.
//
// With q the 16-bit ulp in [1, 2) (bf16 2^-7, f16 2^-10): op(a) has a column of ones and 0/1
// elsewhere, op(b) a row of ones and q * {0, 1, 2} elsewhere, so acc = op(a) @ op(b) lies in
// [1, 2) on multiples of q (exact in h for K <= 64); c0 in [1, 1.5) on multiples of q; bias[j] =
// r + d, r in [1 + q, 2 - q] on multiples of q and d in {-q/4, q/4, q/2}: the bias is not exact
// in h (or lies on a tie, which rounds to even). alpha acc + beta c0 + round(bias) then lies in
// [2, 4) on multiples of q/2, where h's spacing is 2q: many sums are ties, rounded to even, that
// the f32 bias's d would push the other way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tests/common/half_compare.h"

namespace ct::test {

struct BiasRoundingCase {
  DType h = DType::bf16;
  int64_t M = 0, N = 0, K = 0;
  bool ta = false, tb = false;
  float alpha = 1.0f, beta = 0.0f;
  Vec a, b;         // as stored: [M,K] or [K,M] with ta; [K,N] or [N,K] with tb; exact in h
  Vec bias, c0;     // bias [N]; c0 [M,N], exact in h
  VecD want_h;      // c in h: round(alpha acc + beta c0 + round(bias)), the contract
  VecD f32_bias_h;  // c in h with the f32 bias added as it is: the rule the contract replaced
  VecD want_f32;    // c in f32: alpha acc + beta c0 + bias, exact
  int64_t rules_differ = 0;  // elements where want_h and f32_bias_h differ

  std::string name() const {
    return "matmul " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
           (ta ? " ta" : "") + (tb ? " tb" : "") + " alpha " + std::to_string(alpha) + " beta " +
           std::to_string(beta) + " " + dtype_name(h);
  }
};

inline BiasRoundingCase bias_rounding_case(DType h, int64_t M, int64_t N, int64_t K, bool ta,
                                           bool tb, float alpha, float beta, uint64_t seed) {
  BiasRoundingCase k;
  k.h = h, k.M = M, k.N = N, k.K = K, k.ta = ta, k.tb = tb, k.alpha = alpha, k.beta = beta;
  const float q = h == DType::bf16 ? 0x1p-7f : 0x1p-10f;
  auto ints = [&](int64_t n, uint64_t s, int32_t hi) {
    return testdata::randint(static_cast<size_t>(n), seed + s, hi, 29);
  };
  const std::vector<int32_t> ia = ints(M * K, 0, 2), ib = ints(K * N, 1, 3);
  const std::vector<int32_t> ir = ints(N, 2, static_cast<int32_t>(1 / q) - 1), id = ints(N, 3, 3);
  const std::vector<int32_t> ic = ints(M * N, 4, 64);
  Vec oa(M * K), ob(K * N);  // op(a) [M,K], op(b) [K,N]
  for (int64_t i = 0; i < M; ++i)
    for (int64_t kk = 0; kk < K; ++kk) oa[i * K + kk] = kk == 0 ? 1.0f : ia[i * K + kk];
  for (int64_t kk = 0; kk < K; ++kk)
    for (int64_t j = 0; j < N; ++j) ob[kk * N + j] = kk == 0 ? 1.0f : q * ib[kk * N + j];
  const float ds[3] = {-q / 4, q / 4, q / 2};
  k.bias.resize(N);
  for (int64_t j = 0; j < N; ++j) k.bias[j] = 1.0f + q * (1 + ir[j]) + ds[id[j]];
  k.c0.resize(M * N);
  for (int64_t i = 0; i < M * N; ++i) k.c0[i] = 1.0f + q * ic[i];
  auto stored = [](const Vec& v, int64_t R, int64_t C, bool t) {
    if (!t) return v;
    Vec s(v.size());
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) s[c * R + r] = v[r * C + c];
    return s;
  };
  k.a = stored(oa, M, K, ta);
  k.b = stored(ob, K, N, tb);
  // The host's sums: exact in double, and (by the construction above) in fp32.
  auto round_h = [h](double v) { return static_cast<double>(round_to(h, static_cast<float>(v))); };
  k.want_h.resize(M * N), k.f32_bias_h.resize(M * N), k.want_f32.resize(M * N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t kk = 0; kk < K; ++kk)
        acc += static_cast<double>(oa[i * K + kk]) * ob[kk * N + j];
      const double v = alpha * acc + beta * static_cast<double>(k.c0[i * N + j]);
      const int64_t at = i * N + j;
      k.want_h[at] = round_h(v + round_h(k.bias[j]));
      k.f32_bias_h[at] = round_h(v + k.bias[j]);
      k.want_f32[at] = v + k.bias[j];
      k.rules_differ += k.want_h[at] != k.f32_bias_h[at];
    }
  return k;
}

// The case on device d with c of dtype tc (h or f32): every element equal to the host's.
inline ::testing::AssertionResult bias_rounding_matches(Device& d, const BiasRoundingCase& k,
                                                        DType tc) {
  Tensor a = up_as(d, k.ta ? Shape{k.K, k.M} : Shape{k.M, k.K}, k.a, k.h);
  Tensor b = up_as(d, k.tb ? Shape{k.N, k.K} : Shape{k.K, k.N}, k.b, k.h);
  Tensor bias = upload(d, {k.N}, k.bias), c = up_as(d, {k.M, k.N}, k.c0, tc);
  d.matmul(c, a, b, k.ta, k.tb, k.alpha, k.beta, &bias);
  const Vec got = download_h(d, c);
  const VecD& want = tc == DType::f32 ? k.want_f32 : k.want_h;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && bad++ == 0) first = static_cast<int64_t>(i);
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << d.info().id() << ", " << k.name() << ", c " << dtype_name(tc) << ": " << bad
         << " elements differ; at " << first << " got " << got[first] << ", want " << want[first]
         << " (with the f32 bias: " << k.f32_bias_h[first] << ")";
}

}  // namespace ct::test
