// The run-time choice of the fast CPU kernels' instruction-set level (backends/cpu/isa.h), and
// the check of OpenBLAS's core (backends/cpu/openblas_core.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cpu/isa.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/openblas_core.h"
#include "core/error.h"

namespace ct::cpu {
namespace {

CpuFeatures v2_cpu() {  // Nehalem-like: SSE4.2, no AVX
  CpuFeatures f;
  f.vendor = "GenuineIntel";
  f.sse3 = f.ssse3 = f.sse41 = f.sse42 = f.popcnt = f.cx16 = f.lahf = true;
  return f;
}
CpuFeatures avx2_cpu() {  // Haswell-like
  CpuFeatures f = v2_cpu();
  f.avx = f.avx2 = f.fma = f.f16c = f.bmi1 = f.bmi2 = f.lzcnt = f.movbe = f.os_avx = true;
  return f;
}
CpuFeatures avx512_cpu() {  // Skylake-SP-like: AVX-512 without VNNI and BF16
  CpuFeatures f = avx2_cpu();
  f.avx512f = f.avx512bw = f.avx512cd = f.avx512dq = f.avx512vl = f.os_avx512 = true;
  return f;
}
CpuFeatures avx512_bf16_cpu() {  // Cooper Lake, Sapphire/Emerald Rapids, Zen 4
  CpuFeatures f = avx512_cpu();
  f.avx512_vnni = f.avx512_bf16 = true;
  return f;
}

TEST(CpuIsa, LevelsFollowTheFeatures) {
  EXPECT_EQ(best_isa_level(CpuFeatures{}), IsaLevel::kBaseline);
  EXPECT_EQ(best_isa_level(v2_cpu()), IsaLevel::kX86_64_v2);
  EXPECT_EQ(best_isa_level(avx2_cpu()), IsaLevel::kAvx2);
  EXPECT_EQ(best_isa_level(avx512_cpu()), IsaLevel::kAvx2);  // no BF16: the AVX2 kernels
  EXPECT_EQ(best_isa_level(avx512_bf16_cpu()), IsaLevel::kAvx512Bf16);
  CpuFeatures no_popcnt = v2_cpu();
  no_popcnt.popcnt = false;
  EXPECT_EQ(best_isa_level(no_popcnt), IsaLevel::kBaseline);
  // The CPU has them but the OS does not save the registers: not usable.
  CpuFeatures no_os_zmm = avx512_bf16_cpu();
  no_os_zmm.os_avx512 = false;
  EXPECT_EQ(best_isa_level(no_os_zmm), IsaLevel::kAvx2);
  EXPECT_NE(describe(no_os_zmm).find("AVX-512 state not enabled by the OS"), std::string::npos);
  CpuFeatures no_os_ymm = avx2_cpu();
  no_os_ymm.os_avx = false;
  EXPECT_EQ(best_isa_level(no_os_ymm), IsaLevel::kX86_64_v2);
  // Every level includes the ones below it.
  for (IsaLevel l : kIsaLevels) {
    EXPECT_TRUE(cpu_supports(avx512_bf16_cpu(), l)) << isa_level_name(l);
    EXPECT_EQ(cpu_supports(v2_cpu(), l), l == IsaLevel::kX86_64_v2) << isa_level_name(l);
  }
}

TEST(CpuIsa, WithoutTheSwitchTheBestLevelRuns) {
  for (const char* request : {static_cast<const char*>(nullptr), ""}) {
    IsaChoice c = choose_isa_level(avx2_cpu(), request);
    EXPECT_EQ(c.level, IsaLevel::kAvx2);
    EXPECT_EQ(c.best, IsaLevel::kAvx2);
    EXPECT_FALSE(c.forced);
    EXPECT_EQ(describe(c), "avx2 (the best this CPU supports)");
  }
  IsaChoice old = choose_isa_level(CpuFeatures{}, nullptr);
  EXPECT_EQ(old.level, IsaLevel::kBaseline);
  EXPECT_NE(describe(old).find("reference kernels"), std::string::npos);
}

TEST(CpuIsa, TheSwitchPicksTheForcedLevel) {
  for (IsaLevel l : kIsaLevels) {
    IsaChoice c = choose_isa_level(avx512_bf16_cpu(), isa_level_name(l));
    EXPECT_EQ(c.level, l);
    EXPECT_EQ(c.best, IsaLevel::kAvx512Bf16);
    EXPECT_TRUE(c.forced);
  }
  EXPECT_EQ(describe(choose_isa_level(avx512_bf16_cpu(), "x86-64-v2")),
            "x86-64-v2 (forced by CT_CPU_ISA; the CPU supports avx512_bf16)");
}

TEST(CpuIsa, ALevelTheCpuLacksIsAnErrorNamingBoth) {
  try {
    choose_isa_level(avx512_cpu(), "avx512_bf16");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    std::string m = e.what();
    EXPECT_NE(m.find("CT_CPU_ISA=avx512_bf16"), std::string::npos) << m;
    size_t has = m.find("it has ");
    ASSERT_NE(has, std::string::npos) << m;
    std::string features = m.substr(has, m.find(", the best") - has);
    EXPECT_NE(features.find("avx512f"), std::string::npos) << m;      // what the CPU has
    EXPECT_EQ(features.find("avx512_bf16"), std::string::npos) << m;  // ... not what it lacks
    EXPECT_NE(m.find("the best level it supports is avx2"), std::string::npos) << m;
  }
  EXPECT_THROW(choose_isa_level(v2_cpu(), "avx2"), Error);
  try {
    choose_isa_level(avx2_cpu(), "avx3");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x86-64-v2, avx2, avx512_bf16"), std::string::npos)
        << e.what();
  }
}

// cpuid's reading agrees with libgcc's (which also checks the OS's register state).
TEST(CpuIsa, DetectionAgreesWithTheCompiler) {
  CpuFeatures f = detect_cpu_features();
  __builtin_cpu_init();
  EXPECT_EQ(f.sse42, static_cast<bool>(__builtin_cpu_supports("sse4.2")));
  EXPECT_EQ(f.popcnt, static_cast<bool>(__builtin_cpu_supports("popcnt")));
  EXPECT_EQ(f.avx2 && f.os_avx, static_cast<bool>(__builtin_cpu_supports("avx2")));
  EXPECT_EQ(f.fma && f.os_avx, static_cast<bool>(__builtin_cpu_supports("fma")));
  EXPECT_EQ(f.avx512f && f.os_avx512, static_cast<bool>(__builtin_cpu_supports("avx512f")));
  EXPECT_EQ(f.avx512bw && f.os_avx512, static_cast<bool>(__builtin_cpu_supports("avx512bw")));
  EXPECT_EQ(f.avx512_vnni && f.os_avx512, static_cast<bool>(__builtin_cpu_supports("avx512vnni")));
  EXPECT_EQ(f.avx512_bf16 && f.os_avx512, static_cast<bool>(__builtin_cpu_supports("avx512bf16")));
  EXPECT_FALSE(f.vendor.empty());
}

// This process runs the table chosen for this CPU and CT_CPU_ISA (ctest runs this test once per
// level the machine has, with CT_CPU_ISA set: tests/CMakeLists.txt).
TEST(CpuIsa, ThisProcessRunsTheChosenTable) {
  const char* env = std::getenv("CT_CPU_ISA");
  const IsaChoice& c = active_isa();
  EXPECT_EQ(c.best, best_isa_level(detect_cpu_features()));
  if (env && *env) {
    EXPECT_TRUE(c.forced);
    EXPECT_STREQ(isa_level_name(c.level), env);
  } else {
    EXPECT_FALSE(c.forced);
    EXPECT_EQ(c.level, c.best);
  }
  const Kernels& k = fast_kernels();
  EXPECT_EQ(&k, &fast_kernels(c.level));
  switch (c.level) {
    case IsaLevel::kBaseline:
      EXPECT_EQ(&k, &reference_kernels());
      break;
    case IsaLevel::kX86_64_v2:
      EXPECT_EQ(k.gelu_forward, &fast::x86_64_v2::gelu_forward);
      break;
    case IsaLevel::kAvx2:
      EXPECT_EQ(k.gelu_forward, &fast::avx2::gelu_forward);
      break;
    case IsaLevel::kAvx512Bf16:
      EXPECT_EQ(k.gelu_forward, &fast::avx512_bf16::gelu_forward);
      break;
  }
  // Three distinct tables.
  EXPECT_NE(fast_kernels(IsaLevel::kX86_64_v2).matmul, fast_kernels(IsaLevel::kAvx2).matmul);
  EXPECT_NE(fast_kernels(IsaLevel::kAvx2).matmul, fast_kernels(IsaLevel::kAvx512Bf16).matmul);
}

TEST(OpenBlasCore, GenericCoreOnACapableCpu) {
  EXPECT_TRUE(generic_core_on_capable_cpu("Prescott", avx512_bf16_cpu()));  // the Xeon case
  EXPECT_TRUE(generic_core_on_capable_cpu("Prescott", avx512_cpu()));
  EXPECT_TRUE(generic_core_on_capable_cpu("PRESCOTT", avx2_cpu()));
  EXPECT_TRUE(generic_core_on_capable_cpu("Sandybridge", avx2_cpu()));  // AVX1 kernels
  EXPECT_TRUE(generic_core_on_capable_cpu("Nehalem", avx512_bf16_cpu()));
  EXPECT_FALSE(generic_core_on_capable_cpu("Prescott", v2_cpu()));  // nothing better exists
  CpuFeatures no_os_ymm = avx2_cpu();
  no_os_ymm.os_avx = false;
  EXPECT_FALSE(generic_core_on_capable_cpu("Prescott", no_os_ymm));
  EXPECT_FALSE(generic_core_on_capable_cpu("Cooperlake", avx512_bf16_cpu()));
  EXPECT_FALSE(generic_core_on_capable_cpu("SkylakeX", avx512_cpu()));
  EXPECT_FALSE(generic_core_on_capable_cpu("Haswell", avx512_bf16_cpu()));
  EXPECT_FALSE(generic_core_on_capable_cpu("Zen", avx2_cpu()));
  EXPECT_FALSE(generic_core_on_capable_cpu("SapphireRapids", avx512_bf16_cpu()));
  EXPECT_FALSE(generic_core_on_capable_cpu("FutureLake", avx512_bf16_cpu()));  // unknown: trusted
  EXPECT_EQ(classify_openblas_core("cooperlake"), BlasCoreClass::kAvx512);
  EXPECT_EQ(classify_openblas_core("Haswell"), BlasCoreClass::kAvx2);
  EXPECT_EQ(classify_openblas_core("Prescott"), BlasCoreClass::kGeneric);
  EXPECT_EQ(classify_openblas_core(""), BlasCoreClass::kUnknown);
}

TEST(OpenBlasCore, MatchingCore) {
  EXPECT_EQ(matching_openblas_core(v2_cpu()), "");
  EXPECT_EQ(matching_openblas_core(avx2_cpu()), "Haswell");
  CpuFeatures zen2 = avx2_cpu();
  zen2.vendor = "AuthenticAMD";
  EXPECT_EQ(matching_openblas_core(zen2), "Zen");
  EXPECT_EQ(matching_openblas_core(avx512_cpu()), "SkylakeX");
  EXPECT_EQ(matching_openblas_core(avx512_bf16_cpu()), "Cooperlake");
  CpuFeatures no_os_zmm = avx512_bf16_cpu();
  no_os_zmm.os_avx512 = false;
  EXPECT_EQ(matching_openblas_core(no_os_zmm), "Haswell");
}

class CpuWorkspace final : public Workspace {
 public:
  void* get(size_t bytes) override {
    buf_.resize(bytes / sizeof(float) + 16);
    return buf_.data();
  }

 private:
  std::vector<float> buf_;
};

// c = a b through the fast table's matmul (OpenBLAS sgemm for this layout), against a plain loop.
void expect_sgemm_right() {
  const int64_t M = 37, N = 45, K = 53;
  std::vector<float> a(M * K), b(K * N), c(M * N, -1.0f);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 7) % 11) * 0.25f - 1.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 5) % 13) * 0.125f - 0.5f;
  MatmulArgs m;
  m.c = c.data();
  m.a = a.data();
  m.b = b.data();
  m.M = M;
  m.N = N;
  m.K = K;
  CpuWorkspace ws;
  fast_kernels(IsaLevel::kX86_64_v2).matmul(ws, m);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double want = 0;
      for (int64_t k = 0; k < K; ++k) want += double{a[i * K + k]} * b[k * N + j];
      ASSERT_NEAR(c[i * N + j], want, 1e-4) << i << "," << j;
    }
}

// The fix itself, on this machine: put OpenBLAS on generic kernels, then let the check find and
// switch them; products stay right throughout. Restores OpenBLAS's own core at the end.
TEST(OpenBlasCore, AGenericCoreIsSwitchedToTheMatchingOne) {
  const CpuFeatures cpu = detect_cpu_features();
  const std::string want = matching_openblas_core(cpu);
  if (want.empty()) GTEST_SKIP() << "this CPU has no AVX2: no core to switch to";
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  if (env && *env) GTEST_SKIP() << "OPENBLAS_CORETYPE is set: the check keeps it";
  auto corename = [&] { return check_openblas_core(cpu, /*fix=*/false).core; };
  const std::string original = corename();

  ASSERT_TRUE(select_openblas_core("Prescott"));
  EXPECT_EQ(corename(), "Prescott");
  EXPECT_EQ(std::getenv("OPENBLAS_CORETYPE"), nullptr);  // the environment is left as it was
  expect_sgemm_right();

  OpenBlasCore seen = check_openblas_core(cpu, /*fix=*/false);
  EXPECT_EQ(seen.core, "Prescott");
  EXPECT_NE(seen.warning.find("generic Prescott kernels"), std::string::npos) << seen.warning;
  EXPECT_NE(seen.warning.find("OPENBLAS_CORETYPE=" + want), std::string::npos) << seen.warning;

  OpenBlasCore fixed = check_openblas_core(cpu, /*fix=*/true);
  EXPECT_EQ(fixed.core, want);
  EXPECT_EQ(corename(), want);
  EXPECT_EQ(fixed.selected.rfind("switched from Prescott", 0), 0u) << fixed.selected;
  EXPECT_TRUE(fixed.warning.empty()) << fixed.warning;
  expect_sgemm_right();

  // A name OpenBLAS does not know leaves the core as it was.
  EXPECT_FALSE(select_openblas_core("NoSuchCore"));
  EXPECT_EQ(corename(), want);

  ASSERT_TRUE(select_openblas_core(original));
  OpenBlasCore now = check_openblas_core(cpu, /*fix=*/false);
  EXPECT_TRUE(now.warning.empty()) << now.warning;  // this machine's OpenBLAS knows its CPU
}

}  // namespace
}  // namespace ct::cpu
