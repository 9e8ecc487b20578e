// Reference rotary position embedding (Hugging Face's rotate-half form), products in fp64.
#include "backends/cpu/kernels.h"

namespace ct::cpu::ref {

// out, x are (B, T, W) with W = heads * D; cos, sin are (T, D/2). Heads h < rot_heads rotated:
//   out[i] = x[i] c - x[i + D/2] s,  out[i + D/2] = x[i + D/2] c + x[i] s   (s -> -s: inverse)
// the other heads copied. out may be x.
void rope(float* out, const float* x, const float* cos, const float* sin, int64_t B, int64_t T,
          int64_t W, int64_t D, int64_t rot_heads, bool inverse) {
  const int64_t half = D / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* xr = x + (b * T + t) * W;
      float* orow = out + (b * T + t) * W;
      for (int64_t j = rot_heads * D; j < W; ++j) orow[j] = xr[j];
      for (int64_t h = 0; h < rot_heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double c = cos[t * half + i], s = inverse ? -sin[t * half + i] : sin[t * half + i];
          const double x1 = xr[h * D + i], x2 = xr[h * D + half + i];
          orow[h * D + i] = static_cast<float>(x1 * c - x2 * s);
          orow[h * D + half + i] = static_cast<float>(x2 * c + x1 * s);
        }
    }
}

}  // namespace ct::cpu::ref
