// Reference inverted dropout (core/device.h): element i's keep bit read straight off the
// definition, one Philox word per element.
#include "backends/cpu/kernels.h"
#include "core/philox.h"

namespace ct::cpu::ref {

// out, x are (n); out may be x.
void dropout(float* out, const float* x, int64_t n, const DropoutMask& mask) {
  const Philox rng(mask.seed, mask.stream);
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = (rng.u32(static_cast<uint64_t>(i)) >> 8) >= mask.threshold;
    out[i] = keep ? x[i] * mask.scale : 0.0f;
  }
}

}  // namespace ct::cpu::ref
