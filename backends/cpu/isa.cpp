// The CPU's instruction sets and the run-time choice of the fast kernels' level (isa.h).
#include "backends/cpu/isa.h"

#include <cpuid.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace ct::cpu {

const char* isa_level_name(IsaLevel level) {
  switch (level) {
    case IsaLevel::kBaseline:
      return "x86-64";
    case IsaLevel::kX86_64_v2:
      return "x86-64-v2";
    case IsaLevel::kAvx2:
      return "avx2";
    case IsaLevel::kAvx512Bf16:
      return "avx512_bf16";
  }
  return "?";
}

namespace {

bool bit(uint32_t reg, int n) {
  return (reg >> n) & 1u;
}

// XCR0, the register state the OS saves on a context switch (valid when CPUID.1:ECX.OSXSAVE).
uint64_t read_xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

}  // namespace

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf == 0) return f;
  __cpuid(0, a, b, c, d);
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;

  __cpuid(1, a, b, c, d);
  f.sse3 = bit(c, 0);
  f.ssse3 = bit(c, 9);
  f.fma = bit(c, 12);
  f.cx16 = bit(c, 13);
  f.sse41 = bit(c, 19);
  f.sse42 = bit(c, 20);
  f.movbe = bit(c, 22);
  f.popcnt = bit(c, 23);
  f.avx = bit(c, 28);
  f.f16c = bit(c, 29);
  if (bit(c, 27)) {  // OSXSAVE: xgetbv is available
    uint64_t xcr0 = read_xcr0();
    f.os_avx = (xcr0 & 0x6) == 0x6;       // SSE and AVX (YMM) state
    f.os_avx512 = (xcr0 & 0xE6) == 0xE6;  // plus opmask, ZMM0-15 upper halves, ZMM16-31
  }
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    unsigned subleaves = a;
    f.bmi1 = bit(b, 3);
    f.avx2 = bit(b, 5);
    f.bmi2 = bit(b, 8);
    f.avx512f = bit(b, 16);
    f.avx512dq = bit(b, 17);
    f.avx512cd = bit(b, 28);
    f.avx512bw = bit(b, 30);
    f.avx512vl = bit(b, 31);
    f.avx512_vnni = bit(c, 11);
    if (subleaves >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      f.avx512_bf16 = bit(a, 5);
    }
  }
  if (__get_cpuid_max(0x80000000u, nullptr) >= 0x80000001u) {
    __cpuid(0x80000001u, a, b, c, d);
    f.lahf = bit(c, 0);
    f.lzcnt = bit(c, 5);
  }
  return f;
}

bool cpu_supports(const CpuFeatures& f, IsaLevel level) {
  const bool v2 = f.sse3 && f.ssse3 && f.sse41 && f.sse42 && f.popcnt && f.cx16 && f.lahf;
  const bool v3 = v2 && f.avx && f.avx2 && f.fma && f.f16c && f.bmi1 && f.bmi2 && f.lzcnt &&
                  f.movbe && f.os_avx;
  const bool v4_bf16 = v3 && f.avx512f && f.avx512bw && f.avx512cd && f.avx512dq && f.avx512vl &&
                       f.avx512_vnni && f.avx512_bf16 && f.os_avx512;
  switch (level) {
    case IsaLevel::kBaseline:
      return true;
    case IsaLevel::kX86_64_v2:
      return v2;
    case IsaLevel::kAvx2:
      return v3;
    case IsaLevel::kAvx512Bf16:
      return v4_bf16;
  }
  return false;
}

IsaLevel best_isa_level(const CpuFeatures& cpu) {
  IsaLevel best = IsaLevel::kBaseline;
  for (IsaLevel l : kIsaLevels)
    if (cpu_supports(cpu, l)) best = l;
  return best;
}

std::string describe(const CpuFeatures& f) {
  const std::pair<bool, const char*> flags[] = {{f.sse42, "sse4.2"},
                                                {f.popcnt, "popcnt"},
                                                {f.avx, "avx"},
                                                {f.avx2, "avx2"},
                                                {f.fma, "fma"},
                                                {f.f16c, "f16c"},
                                                {f.bmi2, "bmi2"},
                                                {f.avx512f, "avx512f"},
                                                {f.avx512bw, "avx512bw"},
                                                {f.avx512cd, "avx512cd"},
                                                {f.avx512dq, "avx512dq"},
                                                {f.avx512vl, "avx512vl"},
                                                {f.avx512_vnni, "avx512_vnni"},
                                                {f.avx512_bf16, "avx512_bf16"}};
  std::string out;
  for (const auto& [have, name] : flags) {
    if (!have) continue;
    if (!out.empty()) out += ' ';
    out += name;
  }
  if (out.empty()) out = "none of sse4.2 and up";
  if (f.avx && !f.os_avx) out += " (AVX state not enabled by the OS)";
  if (f.avx512f && f.os_avx && !f.os_avx512) out += " (AVX-512 state not enabled by the OS)";
  return out;
}

IsaChoice choose_isa_level(const CpuFeatures& cpu, const char* request) {
  IsaChoice c;
  c.best = best_isa_level(cpu);
  c.level = c.best;
  if (!request || !*request) return c;
  std::string_view want(request);
  std::string names;
  for (IsaLevel l : kIsaLevels) {
    if (!names.empty()) names += ", ";
    names += isa_level_name(l);
    if (want != isa_level_name(l)) continue;
    if (!cpu_supports(cpu, l))
      fail(ErrorKind::kInvalidArgument, "cpu: CT_CPU_ISA=" + std::string(want) +
                                            " asks for kernels this CPU cannot run; it has " +
                                            describe(cpu) + ", the best level it supports is " +
                                            isa_level_name(c.best));
    c.level = l;
    c.forced = true;
    return c;
  }
  fail(ErrorKind::kInvalidArgument, "cpu: CT_CPU_ISA=" + std::string(want) +
                                        " names no level of the CPU kernels; the levels are " +
                                        names + " (unset it for the best this CPU supports)");
}

const IsaChoice& active_isa() {
  static const IsaChoice c = choose_isa_level(detect_cpu_features(), std::getenv("CT_CPU_ISA"));
  return c;
}

std::string describe(const IsaChoice& c) {
  std::string s = isa_level_name(c.level);
  if (c.level == IsaLevel::kBaseline)
    return s + " (the CPU lacks x86-64-v2: the fast device runs the reference kernels)";
  if (c.forced)
    return s + " (forced by CT_CPU_ISA; the CPU supports " + isa_level_name(c.best) + ")";
  return s + " (the best this CPU supports)";
}

}  // namespace ct::cpu
