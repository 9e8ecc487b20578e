// OpenBLAS's core: which kernels it runs, and the switch away from generic ones (see the header).
#include "backends/cpu/openblas_core.h"

#include <cblas.h>
#include <dlfcn.h>

#include <cctype>
#include <cstdlib>

namespace ct::cpu {

namespace {

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

std::string current_core() {
  const char* n = openblas_get_corename();
  return n ? n : "";
}

}  // namespace

BlasCoreClass classify_openblas_core(std::string_view name) {
  // OpenBLAS 0.3.21's x86-64 DYNAMIC_ARCH core names, by the widest vectors their sgemm uses.
  static constexpr std::string_view kAvx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
  static constexpr std::string_view kAvx2[] = {"Haswell", "Zen", "Excavator"};
  static constexpr std::string_view kGeneric[] = {
      "Unknown",   "Katmai", "Coppermine",  "Northwood", "Prescott",  "Banias",     "Atom",
      "Core2",     "Penryn", "Dunnington",  "Nehalem",   "Athlon",    "Opteron",    "Opteron_SSE3",
      "Barcelona", "Nano",   "Sandybridge", "Bobcat",    "Bulldozer", "Piledriver", "Steamroller"};
  for (std::string_view n : kAvx512)
    if (iequal(n, name)) return BlasCoreClass::kAvx512;
  for (std::string_view n : kAvx2)
    if (iequal(n, name)) return BlasCoreClass::kAvx2;
  for (std::string_view n : kGeneric)
    if (iequal(n, name)) return BlasCoreClass::kGeneric;
  return BlasCoreClass::kUnknown;
}

bool generic_core_on_capable_cpu(std::string_view corename, const CpuFeatures& cpu) {
  return classify_openblas_core(corename) == BlasCoreClass::kGeneric && cpu.avx2 && cpu.fma &&
         cpu.os_avx;
}

std::string matching_openblas_core(const CpuFeatures& cpu) {
  if (!(cpu.avx2 && cpu.fma && cpu.os_avx)) return "";
  bool avx512 = cpu.avx512f && cpu.avx512bw && cpu.avx512dq && cpu.avx512vl && cpu.os_avx512;
  if (avx512) return cpu.avx512_bf16 ? "Cooperlake" : "SkylakeX";
  bool amd = cpu.vendor == "AuthenticAMD" || cpu.vendor == "HygonGenuine";
  return amd ? "Zen" : "Haswell";
}

bool select_openblas_core(const std::string& name) {
  using Fn = void (*)();
  auto quit = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  auto init = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (!quit || !init) return false;  // not a DYNAMIC_ARCH build: its core is fixed
  const std::string before = current_core();
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  const bool had = env != nullptr;
  const std::string saved = had ? env : "";
  auto reselect = [&](const std::string& core) {
    setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
    quit();
    init();
  };
  reselect(name);
  const bool ok = iequal(current_core(), name);
  if (!ok) reselect(before);  // an unknown name makes OpenBLAS fall back to Prescott
  if (had)
    setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  else
    unsetenv("OPENBLAS_CORETYPE");
  return ok;
}

OpenBlasCore check_openblas_core(const CpuFeatures& cpu, bool fix) {
  OpenBlasCore r;
  r.core = current_core();
  r.selected = "chosen by OpenBLAS";
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  if (env && *env) r.selected = std::string("OPENBLAS_CORETYPE=") + env;
  if (!generic_core_on_capable_cpu(r.core, cpu)) return r;
  const std::string want = matching_openblas_core(cpu);
  const std::string isa = cpu.avx512f && cpu.os_avx512 ? "AVX-512" : "AVX2";
  if (env && *env) {
    r.warning = "OpenBLAS runs generic " + r.core + " kernels on a CPU with " + isa +
                " because OPENBLAS_CORETYPE=" + env + " is set; " + want + " would be faster";
    return r;
  }
  if (fix && select_openblas_core(want)) {
    r.selected = "switched from " + r.core + ", OpenBLAS's own choice for this CPU";
    r.core = current_core();
    return r;
  }
  r.warning = "OpenBLAS runs generic " + r.core + " kernels on a CPU with " + isa +
              (fix ? "; switching it to " + want + " failed" : "") +
              " (set OPENBLAS_CORETYPE=" + want + ")";
  return r;
}

const OpenBlasCore& openblas_core() {
  static const OpenBlasCore r = check_openblas_core(detect_cpu_features(), true);
  return r;
}

}  // namespace ct::cpu
