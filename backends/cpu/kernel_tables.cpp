// The kernel tables: the reference, and the fast one per instruction-set level, chosen at run
// time. Every slot is set by name from its family's function of the same name (kernels.def).
#include "backends/cpu/kernels.h"
#include "backends/cpu/openblas_core.h"

namespace ct::cpu {

const Kernels& reference_kernels() {
  static const Kernels k{
#define CT_CPU_KERNEL(name, params) .name = ref::name,
#include "backends/cpu/kernels.def"
      .matmul_bf16 = nullptr,
      .matmul_packed = nullptr,
  // no CT_CPU_BF16_KERNELS: the reference device stages 16-bit tensors instead
#define CT_CPU_KERNEL(name, params) .name = nullptr,
      CT_CPU_BF16_KERNELS(CT_CPU_KERNEL)
#undef CT_CPU_KERNEL
  };
  return k;
}

const Kernels& fast_kernels(IsaLevel level) {
  static const Kernels v2{
#define CT_CPU_KERNEL(name, params) .name = fast::x86_64_v2::name,
#include "backends/cpu/kernels.def"
      .matmul_bf16 = fast::matmul_bf16,
      .matmul_packed = fast::x86_64_v2::matmul_packed,
#define CT_CPU_KERNEL(name, params) .name = fast::x86_64_v2::name,
      CT_CPU_BF16_KERNELS(CT_CPU_KERNEL)
#undef CT_CPU_KERNEL
  };
  static const Kernels v3{
#define CT_CPU_KERNEL(name, params) .name = fast::avx2::name,
#include "backends/cpu/kernels.def"
      .matmul_bf16 = fast::matmul_bf16,
      .matmul_packed = fast::avx2::matmul_packed,
#define CT_CPU_KERNEL(name, params) .name = fast::avx2::name,
      CT_CPU_BF16_KERNELS(CT_CPU_KERNEL)
#undef CT_CPU_KERNEL
  };
  static const Kernels v4{
#define CT_CPU_KERNEL(name, params) .name = fast::avx512_bf16::name,
#include "backends/cpu/kernels.def"
      .matmul_bf16 = fast::matmul_bf16,
      .matmul_packed = fast::avx512_bf16::matmul_packed,
#define CT_CPU_KERNEL(name, params) .name = fast::avx512_bf16::name,
      CT_CPU_BF16_KERNELS(CT_CPU_KERNEL)
#undef CT_CPU_KERNEL
  };
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
