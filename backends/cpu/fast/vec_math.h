// Branch-free float exp and tanh that GCC vectorises inside `omp simd` loops (libm's expf and
// tanhf stay scalar without -ffast-math). Relative error of fast_exp ~2 ulp (Cephes expf
// polynomial); fast_tanh's absolute error is ~1e-7.
#pragma once

#include <cstdint>
#include <cstring>

namespace ct::cpu::fast {

#pragma omp declare simd notinbranch
inline float fast_exp(float x) {
  const float kHi = 88.3762626647949f, kLo = -87.3365447504019f;
  float xc = x > kHi ? kHi : x;
  xc = xc < kLo ? kLo : xc;
  float n = __builtin_floorf(xc * 1.44269504088896341f + 0.5f);
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t e = static_cast<int32_t>(n) + 127;
  uint32_t bits = static_cast<uint32_t>(e) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  float y = p * scale;
  y = x < kLo ? 0.0f : y;
  y = x > kHi ? __builtin_inff() : y;
  return x != x ? x : y;
}

#pragma omp declare simd notinbranch
inline float fast_tanh(float u) {
  float e = fast_exp(2.0f * u);
  return 1.0f - 2.0f / (e + 1.0f);
}

}  // namespace ct::cpu::fast
