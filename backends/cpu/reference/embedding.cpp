// Reference token + position embedding.
#include "backends/cpu/kernels.h"

namespace ct::cpu::ref {

// out is (B,T,C), tokens is (B,T), wte is (V,C), wpe is (maxT,C) or null (no positions)
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C) {
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      float* out_bt = out + (b * T + t) * C;
      const float* wte_ix = wte + static_cast<int64_t>(tokens[b * T + t]) * C;
      if (wpe == nullptr) {
        for (int64_t i = 0; i < C; ++i) out_bt[i] = wte_ix[i];
        continue;
      }
      const float* wpe_t = wpe + t * C;
      for (int64_t i = 0; i < C; ++i) out_bt[i] = wte_ix[i] + wpe_t[i];
    }
  }
}

// dwte is (V,C), dwpe is (maxT,C) or null, dout is (B,T,C), tokens is (B,T)
// Contributions are added in (b,t) order, one float add each, as the contract fixes.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C) {
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const float* dout_bt = dout + (b * T + t) * C;
      float* dwte_ix = dwte + static_cast<int64_t>(tokens[b * T + t]) * C;
      for (int64_t i = 0; i < C; ++i) dwte_ix[i] += dout_bt[i];
      if (dwpe == nullptr) continue;
      float* dwpe_t = dwpe + t * C;
      for (int64_t i = 0; i < C; ++i) dwpe_t[i] += dout_bt[i];
    }
  }
}

}  // namespace ct::cpu::ref
