// The kernel tables: the reference, and the fast one per instruction-set level, chosen at run
// time. Keep the order of the Kernels struct.
#include "backends/cpu/kernels.h"
#include "backends/cpu/openblas_core.h"

namespace ct::cpu {

#define CT_CPU_KERNEL_TABLE(ns, bf16_matmul)                                                   \
  Kernels {                                                                                    \
    ns::fill, ns::copy, ns::add, ns::accumulate, ns::scale, ns::embedding_forward,             \
        ns::embedding_backward, ns::layernorm_forward, ns::layernorm_backward,                 \
        ns::rmsnorm_forward, ns::rmsnorm_backward, ns::matmul, ns::bias_backward,              \
        ns::attention_forward, ns::attention_backward, ns::flash_attention_forward,            \
        ns::flash_attention_backward, ns::gelu_forward, ns::gelu_backward, ns::swiglu_forward, \
        ns::swiglu_backward, ns::rope, ns::dropout, ns::crossentropy_forward,                  \
        ns::crossentropy_backward, ns::sum, ns::norm, ns::check_finite, ns::unscale_check,     \
        ns::adamw, ns::sgd, ns::lion, ns::adamw_8bit, ns::adafactor, bf16_matmul               \
  }

const Kernels& reference_kernels() {
  static const Kernels k = CT_CPU_KERNEL_TABLE(ref, nullptr);
  return k;
}

const Kernels& fast_kernels(IsaLevel level) {
  static const Kernels v2 = CT_CPU_KERNEL_TABLE(fast::x86_64_v2, fast::matmul_bf16);
  static const Kernels v3 = CT_CPU_KERNEL_TABLE(fast::avx2, fast::matmul_bf16);
  static const Kernels v4 = CT_CPU_KERNEL_TABLE(fast::avx512_bf16, fast::matmul_bf16);
  switch (level) {
    case IsaLevel::kBaseline:
      break;
    case IsaLevel::kX86_64_v2:
      return v2;
    case IsaLevel::kAvx2:
      return v3;
    case IsaLevel::kAvx512Bf16:
      return v4;
  }
  return reference_kernels();  // a CPU below x86-64-v2 runs no fast table
}

// The first use (the fast device's constructor) also settles OpenBLAS's core, before the first
// product. A CT_CPU_ISA the CPU cannot run throws here, every time.
const Kernels& fast_kernels() {
  const IsaChoice& isa = active_isa();
  static const bool blas_checked = (openblas_core(), true);
  (void)blas_checked;
  return fast_kernels(isa.level);
}

}  // namespace ct::cpu
