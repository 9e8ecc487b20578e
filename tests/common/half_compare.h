// 16-bit comparisons against the reference for the mixed-precision suites: 16-bit outputs
// within 1 ulp of the reference (the reference computes in fp64 and rounds twice, fp64 -> f32 ->
// h; another backend may compute in fp32 and round once, so a value near a rounding boundary may
// land one ulp apart; CT_PRINT_NMSE=1 prints how many are bitwise equal). NaN on one side only,
// or an inf the other side lacks, fails.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/common/device_harness.h"

namespace ct::test {

inline uint16_t to_h(float v, DType h) {
  return h == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
}
inline float from_h(uint16_t v, DType h) {
  return h == DType::bf16 ? bf16_to_f32(v) : f16_to_f32(v);
}

inline Tensor up_as(Device& d, const Shape& s, const Vec& v, DType dt) {
  if (dt == DType::f32) return upload(d, s, v);
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = to_h(v[i], dt);
  Tensor t = d.empty(s, dt, MemCategory::kActivations);
  d.upload(t, bits.data(), bits.size() * 2);
  return t;
}
// t as floats: f32 as it is, 16-bit widened.
inline Vec download_h(Device& d, const Tensor& t) {
  if (t.dtype == DType::f32) return download(d, t);
  std::vector<uint16_t> bits(static_cast<size_t>(t.numel()));
  d.download(bits.data(), t, bits.size() * 2);
  Vec v(bits.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = from_h(bits[i], t.dtype);
  return v;
}
inline Pair both_as(const Shape& s, const Vec& v, DType dt) {
  return {up_as(dut(), s, v, dt), up_as(ref(), s, v, dt)};
}

// Position of a 16-bit float on a monotone integer line (so that neighbours differ by 1).
inline int32_t ordered(uint16_t b) {
  return (b & 0x8000u) ? -static_cast<int32_t>(b & 0x7fffu) : b;
}
inline bool is_nan_h(uint16_t b, DType h) {
  return std::isnan(from_h(b, h));
}
inline bool is_inf_h(uint16_t b, DType h) {
  return std::isinf(from_h(b, h));
}

// 16-bit outputs: every element within 1 ulp of the reference, NaN where it has NaN; or, with
// abs_tol, within abs_tol of it (see the gelu test).
inline ::testing::AssertionResult same_h(const Pair& p, const std::string& what,
                                         double abs_tol = 0) {
  DType h = p.d.dtype;
  auto got = download_as<uint16_t>(dut(), p.d), want = download_as<uint16_t>(ref(), p.r);
  size_t equal = 0, zeros = 0, tail = 0;
  int32_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    bool gn = is_nan_h(got[i], h), wn = is_nan_h(want[i], h);
    if (gn || wn) {
      if (gn != wn)
        return ::testing::AssertionFailure()
               << what << ": NaN mismatch at " << i << ": got " << from_h(got[i], h) << ", want "
               << from_h(want[i], h);
      ++equal;
      continue;
    }
    if ((is_inf_h(got[i], h) || is_inf_h(want[i], h)) && got[i] != want[i])
      return ::testing::AssertionFailure() << what << ": inf mismatch at " << i << ": got "
                                           << from_h(got[i], h) << ", want " << from_h(want[i], h);
    int32_t d = std::abs(ordered(got[i]) - ordered(want[i]));
    if (d > 1 && std::fabs(from_h(got[i], h) - from_h(want[i], h)) <= abs_tol) {
      ++tail;
      continue;
    }
    if (d > 1)
      return ::testing::AssertionFailure() << what << ": " << d << " ulp apart at " << i << ": got "
                                           << from_h(got[i], h) << ", want " << from_h(want[i], h);
    worst = std::max(worst, d);
    if (got[i] == want[i])
      ++equal;
    else if (d == 0)
      ++zeros;  // +0 and -0: 0 ulp apart, not bitwise equal
  }
  if (std::getenv("CT_PRINT_NMSE"))
    std::printf("  16-bit %-34s %zu/%zu bitwise equal, %zu +-0, max %d ulp, %zu in the tail\n",
                what.c_str(), equal, got.size(), zeros, worst, tail);
  return ::testing::AssertionSuccess();
}

// Random normals with NaN, +-inf and a few large values spread over the first entries.
inline Vec with_specials(size_t n, uint64_t seed, float scale) {
  Vec v = randn(n, seed, scale);
  const float sp[] = {NAN, INFINITY, -INFINITY, 300.0f, -300.0f, 1e-6f, -0.0f};
  for (size_t i = 0; i < sizeof(sp) / sizeof(sp[0]) && i * 97 < n; ++i) v[i * 97] = sp[i];
  return v;
}

}  // namespace ct::test
