// Which instruction-set level of the fast CPU kernels runs: what the CPU (and the OS, for the
// AVX and AVX-512 register state) offers, the levels built (CMakeLists.txt compiles
// backends/cpu/fast/*.cpp once per level), and the run-time choice, which the environment
// variable CT_CPU_ISA may force. Compiled for the x86-64 baseline, like all of core.
#pragma once

#include <string>
#include <string_view>

namespace ct::cpu {

// In increasing order; each level includes the ones below it.
enum class IsaLevel {
  kBaseline,    // below x86-64-v2: no fast table; the fast device runs the reference kernels
  kX86_64_v2,   // SSE4.2, SSSE3, POPCNT, CX16
  kAvx2,        // x86-64-v3: AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE
  kAvx512Bf16,  // x86-64-v4 (AVX512 F/BW/CD/DQ/VL) with AVX512_BF16 and AVX512_VNNI
};
inline constexpr IsaLevel kIsaLevels[] = {IsaLevel::kX86_64_v2, IsaLevel::kAvx2,
                                          IsaLevel::kAvx512Bf16};  // the levels built

// "x86-64-v2", "avx2", "avx512_bf16" (CT_CPU_ISA's values), "x86-64" for kBaseline.
const char* isa_level_name(IsaLevel level);

// What cpuid and xgetbv report. Plain fields so that tests can describe any CPU.
struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  bool sse3 = false, ssse3 = false, sse41 = false, sse42 = false, popcnt = false, cx16 = false,
       lahf = false;
  bool avx = false, avx2 = false, fma = false, f16c = false, bmi1 = false, bmi2 = false,
       lzcnt = false, movbe = false;
  bool avx512f = false, avx512bw = false, avx512cd = false, avx512dq = false, avx512vl = false,
       avx512_vnni = false, avx512_bf16 = false;
  bool os_avx = false;     // XCR0: the OS saves the YMM state
  bool os_avx512 = false;  // XCR0: the OS saves the opmask and ZMM state
};

CpuFeatures detect_cpu_features();  // this machine's (cpuid leaves 1, 7.0, 7.1, 0x80000001)
bool cpu_supports(const CpuFeatures& cpu, IsaLevel level);
IsaLevel best_isa_level(const CpuFeatures& cpu);
// The features that matter here, space-separated, e.g. "sse4.2 popcnt avx avx2 fma avx512f ...",
// with "(AVX-512 state not enabled by the OS)" where the CPU has it but the OS does not save it.
std::string describe(const CpuFeatures& cpu);

struct IsaChoice {
  IsaLevel level = IsaLevel::kBaseline;  // the level that runs
  IsaLevel best = IsaLevel::kBaseline;   // the best the CPU supports
  bool forced = false;                   // chosen by CT_CPU_ISA
};

// The choice for `cpu` given CT_CPU_ISA's value (null or empty: the best level). A value that
// names no level, or a level the CPU lacks, is an error (ErrorKind::kInvalidArgument) naming
// the level and what the CPU has: a forced level is for tests and comparisons, and silently
// running another one would make them pass while testing something else.
IsaChoice choose_isa_level(const CpuFeatures& cpu, const char* request);

// This process's choice (detect_cpu_features(), getenv("CT_CPU_ISA")), made once.
const IsaChoice& active_isa();

// For `crosstrain devices`: "avx512_bf16 (the best this CPU supports)", or
// "avx2 (forced by CT_CPU_ISA; the CPU supports avx512_bf16)".
std::string describe(const IsaChoice& choice);

}  // namespace ct::cpu
