// Reference reductions: sum, global L2 norm, non-finite check. Sequential fp64 sums.
#include <cmath>

#include "backends/cpu/kernels.h"

namespace ct::cpu::ref {

// out is (1), x is (n)
void sum(float* out, const float* x, int64_t n, float scale) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += x[i];
  out[0] = static_cast<float>(acc * scale);
}

// out is (1), x is (n)
void norm(float* out, const float* x, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(x[i]) * x[i];
  out[0] = static_cast<float>(std::sqrt(acc));
}

// flag is (1) i32, x is (n)
void check_finite(int32_t* flag, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) {
      flag[0] |= 1;
      return;
    }
}

// x is (n), flag is (1) i32: x *= inv_scale; flag |= any x (before or after) is inf or NaN
void unscale_check(float* x, int32_t* flag, float inv_scale, int64_t n) {
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    bad = bad || !std::isfinite(x[i]);
    x[i] *= inv_scale;
    bad = bad || !std::isfinite(x[i]);
  }
  if (bad) flag[0] |= 1;
}

}  // namespace ct::cpu::ref
