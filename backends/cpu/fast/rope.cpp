// Fast rotary position embedding: positions in parallel, fp32 arithmetic.
#include "backends/cpu/kernels.h"

namespace ct::cpu::fast::CT_CPU_ISA {

// out, x (B, T, W = heads * D); cos, sin (T, D/2); the first rot_heads heads rotated, the rest
// copied; out may be x. inverse rotates by the opposite angle.
void rope(float* out, const float* x, const float* cos, const float* sin, int64_t B, int64_t T,
          int64_t W, int64_t D, int64_t rot_heads, bool inverse) {
  const int64_t half = D / 2;
  const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static) if (B * T * W > (1 << 14))
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t t = bt % T;
    const float* xr = x + bt * W;
    float* orow = out + bt * W;
    const float* cr = cos + t * half;
    const float* sr = sin + t * half;
    if (orow != xr)
      for (int64_t j = rot_heads * D; j < W; ++j) orow[j] = xr[j];
    for (int64_t h = 0; h < rot_heads; ++h) {
      const float* x1 = xr + h * D;
      float* o1 = orow + h * D;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float a = x1[i], b = x1[half + i], c = cr[i], s = sign * sr[i];
        o1[i] = a * c - b * s;
        o1[half + i] = b * c + a * s;
      }
    }
  }
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
