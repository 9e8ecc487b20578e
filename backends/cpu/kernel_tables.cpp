// The two kernel tables. Keep the order of the Kernels struct.
#include "backends/cpu/kernels.h"

namespace ct::cpu {

#define CT_CPU_KERNEL_TABLE(ns, bf16_matmul)                                                     \
  Kernels {                                                                                      \
    ns::fill, ns::copy, ns::add, ns::accumulate, ns::scale, ns::embedding_forward,               \
        ns::embedding_backward, ns::layernorm_forward, ns::layernorm_backward, ns::matmul,       \
        ns::bias_backward, ns::attention_forward, ns::attention_backward, ns::gelu_forward,      \
        ns::gelu_backward, ns::crossentropy_forward, ns::crossentropy_backward, ns::sum,         \
        ns::norm, ns::check_finite, ns::unscale_check, ns::adamw, ns::sgd, ns::lion,               \
        ns::adamw_8bit, ns::adafactor, bf16_matmul                                               \
  }

const Kernels& reference_kernels() {
  static const Kernels k = CT_CPU_KERNEL_TABLE(ref, nullptr);
  return k;
}

const Kernels& fast_kernels() {
  static const Kernels k = CT_CPU_KERNEL_TABLE(fast, fast::matmul_bf16);
  return k;
}

}  // namespace ct::cpu
