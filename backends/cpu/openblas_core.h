// Which kernels OpenBLAS runs, and the fix when it runs generic ones on a capable CPU.
// OpenBLAS built with DYNAMIC_ARCH (Debian's) picks a "core" from cpuid when it loads; 0.3.21
// does not know some newer CPUs and falls back to "Prescott" (SSE3), e.g. on a family 6 model
// 207 Xeon: 34 GFLOP/s sgemm instead of 194 with SkylakeX's kernels. The fast CPU device checks
// before its first product and, when the core is generic but the CPU has AVX2 or AVX-512,
// re-selects OpenBLAS's core: OPENBLAS_CORETYPE set to the matching core for the duration of
// OpenBLAS's own gotoblas_dynamic_quit() + gotoblas_dynamic_init() (the start-up selection,
// exported by DYNAMIC_ARCH builds, looked up at run time), then openblas_get_corename() checked.
// An OPENBLAS_CORETYPE the user set is kept (with a warning when it is generic there).
#pragma once

#include <string>
#include <string_view>

#include "backends/cpu/isa.h"

namespace ct::cpu {

enum class BlasCoreClass {
  kUnknown,  // a name not listed here (a newer OpenBLAS): trusted
  kGeneric,  // kernels without AVX2 (Prescott, Nehalem, Sandybridge, ...)
  kAvx2,     // Haswell, Zen, Excavator
  kAvx512,   // SkylakeX, Cooperlake, SapphireRapids
};
BlasCoreClass classify_openblas_core(std::string_view corename);  // case-insensitive

// True when `corename` runs kernels without AVX2 on a CPU that has (OS-enabled) AVX2 and FMA.
bool generic_core_on_capable_cpu(std::string_view corename, const CpuFeatures& cpu);

// OpenBLAS's core for `cpu`'s instruction sets: "Cooperlake" (AVX512_BF16), "SkylakeX"
// (AVX-512), "Zen" (AMD with AVX2), "Haswell" (AVX2); empty when the CPU has no AVX2.
std::string matching_openblas_core(const CpuFeatures& cpu);

// Re-runs OpenBLAS's core selection with OPENBLAS_CORETYPE=`name` (restored afterwards). True
// when openblas_get_corename() then says `name`; otherwise OpenBLAS is put back on the core it
// ran before. Not thread-safe: call before any product runs (or in a test).
bool select_openblas_core(const std::string& name);

struct OpenBlasCore {
  std::string core;      // openblas_get_corename() after the check
  std::string selected;  // how: "chosen by OpenBLAS", "switched from Prescott", "OPENBLAS_CORETYPE"
  std::string warning;   // empty, or why the kernels are still generic
};

// Checks the running core against `cpu`, and (fix) switches a generic one to the matching core.
OpenBlasCore check_openblas_core(const CpuFeatures& cpu, bool fix);

// This process's check and fix, done once (the fast kernel table's first use calls it).
const OpenBlasCore& openblas_core();

}  // namespace ct::cpu
