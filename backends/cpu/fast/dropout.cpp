// Fast inverted dropout: one Philox block gives the keep bits of four consecutive elements
// (words 0..3 of block i / 4, as Philox::u32 numbers them), blocks split over the threads.
#include "backends/cpu/kernels.h"
#include "core/philox.h"

namespace ct::cpu::fast::CT_CPU_ISA {

namespace {
constexpr int64_t kParallelMin = 1 << 14;
}

// out, x are (n); out may be x.
void dropout(float* out, const float* x, int64_t n, const DropoutMask& mask) {
  const Philox rng(mask.seed, mask.stream);
  const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const PhiloxBlock w = rng.block(static_cast<uint64_t>(b));
    const int64_t end = b * 4 + 4 < n ? b * 4 + 4 : n;
    for (int64_t i = b * 4; i < end; ++i) {
      const bool keep = (w[static_cast<size_t>(i - b * 4)] >> 8) >= mask.threshold;
      out[i] = keep ? x[i] * mask.scale : 0.0f;
    }
  }
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
