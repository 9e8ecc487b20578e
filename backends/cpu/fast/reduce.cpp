// Fast reductions. sum and norm cut x into a fixed number of contiguous parts (independent of
// the thread count), sum each in fp64 with fixed accumulator lanes, and add the parts in order:
// the result is identical run to run and for any number of threads.
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels.h"

namespace ct::cpu::fast::CT_CPU_ISA {

namespace {
constexpr int64_t kParts = 64;
constexpr int64_t kParallelMin = 1 << 15;
constexpr int64_t kLanes = 32;  // independent fp64 accumulators: hides the add latency

// x[i0, i1) summed (squared if Square) in fp64, in a fixed order.
template <bool Square>
double span_sum(const float* x, int64_t i0, int64_t i1) {
  double acc[kLanes] = {};
  int64_t i = i0;
  for (; i + kLanes <= i1; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) {
      double v = x[i + j];
      acc[j] += Square ? v * v : v;
    }
  for (int64_t j = 0; i + j < i1; ++j) {
    double v = x[i + j];
    acc[j] += Square ? v * v : v;
  }
  double s = 0.0;
  for (int64_t j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}
}  // namespace

// out is (1), x is (n)
void sum(float* out, const float* x, int64_t n, float scale) {
  double part[kParts];
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t p = 0; p < kParts; ++p) {
    part[p] = span_sum<false>(x, n * p / kParts, n * (p + 1) / kParts);
  }
  double total = 0.0;
  for (int64_t p = 0; p < kParts; ++p) total += part[p];
  out[0] = static_cast<float>(total * scale);
}

// out is (1), x is (n)
void norm(float* out, const float* x, int64_t n) {
  double part[kParts];
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t p = 0; p < kParts; ++p) {
    part[p] = span_sum<true>(x, n * p / kParts, n * (p + 1) / kParts);
  }
  double total = 0.0;
  for (int64_t p = 0; p < kParts; ++p) total += part[p];
  out[0] = static_cast<float>(std::sqrt(total));
}

// flag is (1) i32, x is (n): an exponent of all ones is inf or NaN
void check_finite(int32_t* flag, const float* x, int64_t n) {
  const uint32_t* u = reinterpret_cast<const uint32_t*>(x);
  uint32_t bad = 0;
#pragma omp parallel for simd schedule(static) reduction(| : bad) if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) bad |= ((u[i] & 0x7f800000u) == 0x7f800000u) ? 1u : 0u;
  if (bad) flag[0] |= 1;
}

// x is (n), flag is (1) i32: one pass that scales and tests before and after
void unscale_check(float* x, int32_t* flag, float inv_scale, int64_t n) {
  uint32_t bad = 0;
#pragma omp parallel for simd schedule(static) reduction(| : bad) if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float a = x[i], b = a * inv_scale;
    x[i] = b;
    uint32_t ua, ub;
    std::memcpy(&ua, &a, 4);
    std::memcpy(&ub, &b, 4);
    bad |= (((ua & 0x7f800000u) == 0x7f800000u) | ((ub & 0x7f800000u) == 0x7f800000u)) ? 1u : 0u;
  }
  if (bad) flag[0] |= 1;
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
