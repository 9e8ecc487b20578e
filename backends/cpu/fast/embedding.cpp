// Fast token + position embedding.
#include <algorithm>

#include "backends/cpu/kernels.h"

namespace ct::cpu::fast::CT_CPU_ISA {

// out is (B,T,C), tokens is (B,T), wte is (V,C), wpe is (maxT,C) or null (no positions)
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static) if (B * T * C > (1 << 15))
  for (int64_t bt = 0; bt < B * T; ++bt) {
    int64_t t = bt % T;
    float* o = out + bt * C;
    const float* e = wte + static_cast<int64_t>(tokens[bt]) * C;
    if (wpe == nullptr) {
      std::copy(e, e + C, o);
      continue;
    }
    const float* p = wpe + t * C;
#pragma omp simd
    for (int64_t i = 0; i < C; ++i) o[i] = e[i] + p[i];
  }
}

// dwte is (V,C), dwpe is (maxT,C) or null, dout is (B,T,C), tokens is (B,T)
// Threads own column blocks and walk every (b,t) in order, so each element receives its
// contributions in (b,t) order: the same float sums as the reference, for any thread count.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C) {
  constexpr int64_t kBlock = 64;
  int64_t nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (B * T * C > (1 << 15))
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    int64_t c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        const float* d = dout + (b * T + t) * C;
        float* e = dwte + static_cast<int64_t>(tokens[b * T + t]) * C;
#pragma omp simd
        for (int64_t i = c0; i < c1; ++i) e[i] += d[i];
        if (dwpe == nullptr) continue;
        float* p = dwpe + t * C;
#pragma omp simd
        for (int64_t i = c0; i < c1; ++i) p[i] += d[i];
      }
    }
  }
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
