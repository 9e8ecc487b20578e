// The cooperative-matrix decision (backends/vulkan/coopmat.h): the gate's rules on synthetic
// device descriptions, and on lavapipe the whole start-up path -- the self-test of the emulated
// build standing in for the real one (CROSSTRAIN_VK_COOPMAT=emulate), its verdict cached per
// driver and read back, a wrong candidate rejected, the switch that turns it off -- as
// `crosstrain devices` shows it (DeviceInfo::extra "coopmat GEMM").
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "backends/vulkan/coopmat.h"
#include "core/registry.h"
#include "tests/common/half_compare.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace ct::vktest {
namespace {

using vk::coopmat_gate;
using vk::CoopmatCaps;

CoopmatCaps capable() {
  CoopmatCaps c;
  c.extension = c.feature = c.vulkan13 = c.memory_model = c.maintenance4 = c.full_subgroups =
      c.float16 = c.storage16 = true;
  c.f16_shapes = {{16, 8, 16}, {16, 16, 16}, {16, 8, 8}};  // NVIDIA's list, f16 -> f32
  c.configurations = 12;
  c.subgroup_size = 32;
  c.vendor = 0x10de;
  c.driver_id = 4;  // NVIDIA proprietary
  c.device_name = "NVIDIA H100";
  return c;
}

TEST(CoopmatGate, RulesOnDeviceDescriptions) {
  EXPECT_TRUE(coopmat_gate(capable(), true, nullptr).allowed);
  EXPECT_NE(coopmat_gate(capable(), true, nullptr).why.find("pending the start-up self-test"),
            std::string::npos);
  auto why_not = [](const CoopmatCaps& c, bool built = true, const char* env = nullptr) {
    vk::CoopmatGate g = coopmat_gate(c, built, env);
    EXPECT_FALSE(g.allowed) << g.why;
    return g.why;
  };
  EXPECT_NE(why_not(capable(), false).find("no coopmat shaders"), std::string::npos);
  CoopmatCaps c = capable();
  c.extension = false;
  EXPECT_NE(why_not(c).find("does not offer VK_KHR_cooperative_matrix"), std::string::npos);
  c = capable();
  c.f16_shapes = {{16, 16, 64}, {4, 4, 4}};  // no side of 8, 16 or 32 throughout
  EXPECT_NE(why_not(c).find("among the driver's 12 configurations"), std::string::npos);
  c = capable();
  c.maintenance4 = false;
  EXPECT_NE(why_not(c).find("maintenance4"), std::string::npos);
  c = capable();
  c.full_subgroups = false;
  EXPECT_NE(why_not(c).find("computeFullSubgroups"), std::string::npos);
  EXPECT_NE(why_not(capable(), true, "0").find("off"), std::string::npos);
  // AMD's own driver on RDNA2 (no matrix cores) is denied; RDNA3 and RADV are not.
  c = capable();
  c.vendor = 0x1002;
  c.driver_id = 2;  // AMDVLK
  c.device_name = "AMD Radeon RX 6800 XT";
  EXPECT_NE(why_not(c).find("denied"), std::string::npos);
  EXPECT_TRUE(coopmat_gate(c, true, "force").allowed);
  c.device_name = "AMD Radeon RX 7900 XTX";
  EXPECT_TRUE(coopmat_gate(c, true, nullptr).allowed);
  c.device_name = "AMD Radeon RX 6800 XT";
  c.driver_id = 3;  // RADV
  EXPECT_TRUE(coopmat_gate(c, true, nullptr).allowed);
  // The fragment shape: 16x16x16 where listed, else the largest usable one (Intel Arc: 8x16x16).
  EXPECT_EQ(coopmat_gate(capable(), true, nullptr).shape, (vk::CmShape{16, 16, 16}));
  c = capable();
  c.vendor = 0x8086;
  c.driver_id = 6;  // Intel's Mesa driver (ANV)
  c.device_name = "Intel(R) Arc(tm) A770 Graphics (DG2)";
  c.f16_shapes = {{8, 8, 16}, {8, 16, 16}};
  EXPECT_EQ(coopmat_gate(c, true, nullptr).shape, (vk::CmShape{8, 16, 16}));
  EXPECT_NE(coopmat_gate(c, true, nullptr).why.find("candidate (8x16x16 f16"), std::string::npos);
  // The emulated build stands in whatever the device has.
  vk::CoopmatGate e = coopmat_gate(CoopmatCaps{}, false, "emulate");
  EXPECT_TRUE(e.emulate);
  EXPECT_FALSE(e.allowed);
}

// A cached verdict belongs to one build of the shaders: their fingerprint is in the file's name,
// so a build with other modules runs the self-test again.
TEST(CoopmatGate, VerdictFileNamesTheShaders) {
  setenv("XDG_CACHE_HOME", "/tmp/ct-cache", 1);
  const uint8_t uuid[VK_UUID_SIZE] = {1, 2, 3};
  const std::string a = vk::coopmat_verdict_path(uuid, 7, 0x1234, false);
  const std::string b = vk::coopmat_verdict_path(uuid, 7, 0x1235, false);
  unsetenv("XDG_CACHE_HOME");
  EXPECT_NE(a, b);
  EXPECT_NE(a.find("-7-0000000000001234.txt"), std::string::npos) << a;
}

// The coopmat flash attention's tiles (plan_flash_cm): the largest that fits the device's shared
// memory, by the shader's own layout (flash_cm_words); the calls it refuses, with the reason.
TEST(CoopmatGate, FlashAttentionTiles) {
  using vk::plan_flash_cm;
  const vk::CmShape sq{16, 16, 16};
  // An H100 (48 KiB, subgroups of 32) at head size 128 and 64; lavapipe's 32 KiB.
  vk::FlashCmPlan p = plan_flash_cm(vk::kFlashCmFwd, sq, 32, 49152, 128);
  EXPECT_TRUE(p.ok && p.nw == 4 && p.kt == 32 && p.rows == 64 && p.frm == 1) << p.why;
  p = plan_flash_cm(vk::kFlashCmBwdQ, sq, 32, 49152, 128);
  EXPECT_TRUE(p.ok && p.nw == 2 && p.kt == 32 && p.rows == 32) << p.why;
  p = plan_flash_cm(vk::kFlashCmBwdKv, sq, 32, 49152, 128);
  EXPECT_TRUE(p.ok && p.nw == 2 && p.kt == 16) << p.why;
  p = plan_flash_cm(vk::kFlashCmFwd, sq, 32, 49152, 64);
  EXPECT_TRUE(p.ok && p.nw == 4 && p.kt == 64) << p.why;
  p = plan_flash_cm(vk::kFlashCmBwdQ, sq, 32, 49152, 64);  // dS in dP's region: 4 subgroups
  EXPECT_TRUE(p.ok && p.nw == 4 && p.kt == 32) << p.why;
  p = plan_flash_cm(vk::kFlashCmBwdKv, sq, 32, 32768, 128);
  EXPECT_TRUE(p.ok && p.nw == 1 && p.kt == 16) << p.why;
  for (int k : {vk::kFlashCmFwd, vk::kFlashCmBwdQ, vk::kFlashCmBwdKv})
    for (uint32_t shared : {32768u, 49152u, 65536u})
      for (uint32_t lanes : {16u, 32u, 64u})
        for (int64_t hs = 16; hs <= 128; hs += 16) {
          p = plan_flash_cm(k, sq, lanes, shared, hs);
          ASSERT_TRUE(p.ok) << p.why;
          EXPECT_LE(vk::flash_cm_words(k, p.rows, p.kt, hs, lanes) * 4, shared);
        }
  // Intel's 8x16x16: two fragment rows a subgroup, still 16 rows.
  p = plan_flash_cm(vk::kFlashCmFwd, {8, 16, 16}, 16, 65536, 64);
  EXPECT_TRUE(p.ok && p.frm == 2 && p.rows == 64) << p.why;
  // A forced tile (CROSSTRAIN_VK_FLASH_TILE), and one that does not fit.
  p = plan_flash_cm(vk::kFlashCmBwdQ, sq, 32, 32768, 64, 1, 16);
  EXPECT_TRUE(p.ok && p.nw == 1 && p.kt == 16 && p.rows == 16) << p.why;
  EXPECT_FALSE(plan_flash_cm(vk::kFlashCmBwdKv, sq, 32, 32768, 128, 4, 64).ok);
  // Refused: the scalar shaders take these.
  EXPECT_NE(plan_flash_cm(vk::kFlashCmFwd, sq, 32, 49152, 40).why.find("head size 40"),
            std::string::npos);
  EXPECT_FALSE(plan_flash_cm(vk::kFlashCmFwd, sq, 32, 49152, 256).ok);
  EXPECT_NE(plan_flash_cm(vk::kFlashCmFwd, {32, 8, 16}, 32, 49152, 64).why.find("32x8x16"),
            std::string::npos);
  EXPECT_NE(plan_flash_cm(vk::kFlashCmFwd, sq, 8, 49152, 64).why.find("subgroup size 8"),
            std::string::npos);
  EXPECT_NE(plan_flash_cm(vk::kFlashCmBwdKv, sq, 32, 16384, 128).why.find("shared memory"),
            std::string::npos);
}

// The coopmat line of a freshly opened vulkan:0, with `env` set while it opens.
std::string verdict_line(const std::map<std::string, std::string>& env) {
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  std::unique_ptr<Device> dev = open_device("vulkan:0");
  for (const auto& [k, v] : env) unsetenv(k.c_str());
  for (const auto& [k, v] : dev->info().extra)
    if (k == "coopmat GEMM") return v;
  ADD_FAILURE() << "no coopmat GEMM line in the device's description";
  return "";
}

class CoopmatStartup : public VulkanTest {
 protected:
  void SetUp() override {
    VulkanTest::SetUp();
    // The verdict cache goes to a fresh XDG_CACHE_HOME; Mesa's shader cache must not follow it
    // there, or every pipeline the device builds compiles cold (a minute on lavapipe).
    if (std::getenv("MESA_SHADER_CACHE_DIR") == nullptr) {
      const char* xdg = std::getenv("XDG_CACHE_HOME");
      const char* home = std::getenv("HOME");
      const std::string mesa =
          xdg && *xdg ? std::string(xdg) : std::string(home ? home : "/tmp") + "/.cache";
      setenv("MESA_SHADER_CACHE_DIR", mesa.c_str(), 1);
      set_mesa_ = true;
    }
    cache_ = std::filesystem::temp_directory_path() /
             ("ct-coopmat-" + std::to_string(::getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(cache_);
  }
  void TearDown() override {
    std::filesystem::remove_all(cache_);
    if (set_mesa_) unsetenv("MESA_SHADER_CACHE_DIR");
    VulkanTest::TearDown();
  }
  std::filesystem::path cache_;
  bool set_mesa_ = false;
};

TEST_F(CoopmatStartup, LavapipeHasNoCoopmatAndTheSwitchTurnsItOff) {
  EXPECT_EQ(verdict_line({{"XDG_CACHE_HOME", cache_}}),
            "not used: the driver does not offer VK_KHR_cooperative_matrix");
  EXPECT_EQ(verdict_line({{"CROSSTRAIN_VK_COOPMAT", "0"}}), "off (CROSSTRAIN_VK_COOPMAT=0)");
  EXPECT_FALSE(std::filesystem::exists(cache_));  // nothing tested, nothing cached
}

TEST_F(CoopmatStartup, EmulatedCandidateIsSelfTestedAndTheVerdictCached) {
  const std::string first =
      verdict_line({{"XDG_CACHE_HOME", cache_}, {"CROSSTRAIN_VK_COOPMAT", "emulate"}});
  // Correct on every shape, and on lavapipe far slower than the register-blocked GEMM.
  EXPECT_EQ(first.rfind("not used: slower: emulated coopmat ", 0), 0u) << first;
  int files = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(cache_))
    if (e.path().filename().string().rfind("vulkan-coopmat-", 0) == 0) ++files;
  EXPECT_EQ(files, 1);
  const std::string second =
      verdict_line({{"XDG_CACHE_HOME", cache_}, {"CROSSTRAIN_VK_COOPMAT", "emulate"}});
  EXPECT_EQ(second.rfind(first, 0), 0u) << second;
  EXPECT_NE(second.find("(cached: "), std::string::npos) << second;
}

// The device list (what `crosstrain devices` prints) before and after the self-test: pending,
// and marked to be settled by opening the device, only while no verdict is cached; then the
// cached verdict, the same one the opened device showed.
TEST_F(CoopmatStartup, ListingShowsTheCachedVerdictOnceThereIsOne) {
  const std::map<std::string, std::string> env = {{"XDG_CACHE_HOME", cache_},
                                                  {"CROSSTRAIN_VK_COOPMAT", "emulate"}};
  auto listed = [&] {
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<DeviceInfo> devs = vulkan_entry()->backend->devices();
    for (const auto& [k, v] : env) unsetenv(k.c_str());
    return devs.at(0);
  };
  auto line = [](const DeviceInfo& d) {
    for (const auto& [k, v] : d.extra)
      if (k == "coopmat GEMM") return v;
    return std::string("(none)");
  };
  const DeviceInfo before = listed();
  EXPECT_TRUE(before.settled_on_open);
  EXPECT_NE(line(before).find("no verdict cached for this driver yet"), std::string::npos)
      << line(before);
  const std::string opened = verdict_line(env);  // runs the self-test, caches the verdict
  EXPECT_EQ(opened.rfind("not used: slower: ", 0), 0u) << opened;
  const DeviceInfo after = listed();
  EXPECT_FALSE(after.settled_on_open);
  EXPECT_EQ(line(after).rfind(opened + " (cached: " + cache_.string(), 0), 0u) << line(after);
  // Without the emulation lavapipe's line is settled by the gate alone.
  const DeviceInfo plain = vulkan_entry()->backend->devices().at(0);
  EXPECT_FALSE(plain.settled_on_open);
  EXPECT_EQ(line(plain), "not used: the driver does not offer VK_KHR_cooperative_matrix");
}

TEST_F(CoopmatStartup, WrongProductsAreRejected) {
  const std::string v = verdict_line({{"XDG_CACHE_HOME", cache_},
                                      {"CROSSTRAIN_VK_COOPMAT", "emulate"},
                                      {"CROSSTRAIN_VK_COOPMAT_INJECT", "wrong"}});
  EXPECT_EQ(v.rfind("not used: wrong products: ", 0), 0u) << v;
}

// vulkan:0 opened with `env` set while it opens; its coopmat line in *line.
std::unique_ptr<Device> open_with(const std::map<std::string, std::string>& env,
                                  std::string* line) {
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  std::unique_ptr<Device> dev = open_device("vulkan:0");
  for (const auto& [k, v] : env) unsetenv(k.c_str());
  for (const auto& [k, v] : dev->info().extra)
    if (k == "coopmat GEMM") *line = v;
  return dev;
}

// f16 flash attention forward and backward on d, T 20, 2 query heads on 1 kv head of 64 (the
// self-test's pipelines): (out, dqkv), and d's profile.
struct SmallAttention {
  Vec out, dqkv;
  std::string profile;
};
SmallAttention small_attention(Device& d) {
  const int64_t T = 20, C = 128, W = C + 2 * 64;
  const Vec qkv = randn(T * W, 700), dout = randn(T * C, 701);
  d.set_profiling(true);
  Tensor tq = up_as(d, {1, T, W}, qkv, DType::f16), td = up_as(d, {1, T, C}, dout, DType::f16);
  Tensor to = d.empty({1, T, C}, DType::f16, MemCategory::kActivations);
  Tensor tl = d.empty({1, 2, T}, DType::f32, MemCategory::kActivations);
  Tensor tdq = d.empty({1, T, W}, DType::f16, MemCategory::kActivations);
  d.flash_attention_forward(to, tl, tq, 2, 1);
  d.flash_attention_backward(tdq, td, tq, to, tl, 2, 1);
  SmallAttention r{download_h(d, to), download_h(d, tdq), d.profile_report()};
  d.set_profiling(false);
  return r;
}

// A 16-bit hhf GEMM of 20x24x16 on d: d's profile (which GEMM ran).
std::string small_gemm(Device& d, DType h) {
  d.set_profiling(true);
  Tensor a = up_as(d, {20, 16}, randn(320, 710), h), b = up_as(d, {16, 24}, randn(384, 711), h);
  Tensor c = d.empty({20, 24}, DType::f32, MemCategory::kActivations);
  d.matmul(c, a, b, false, false);
  const std::string r = d.profile_report();
  d.set_profiling(false);
  return r;
}

// With the speed comparison skipped (CROSSTRAIN_VK_COOPMAT_INJECT=fast) the emulated build passes
// the self-test -- its GEMM products and its flash attention against the scalar shaders -- and is
// in use: the device runs flash attention on it, as a GPU whose coopmat passed would on its own.
TEST_F(CoopmatStartup, InUseVerdictRunsFlashAttentionOnCoopmat) {
  std::string line;
  std::unique_ptr<Device> dev = open_with({{"XDG_CACHE_HOME", cache_},
                                           {"CROSSTRAIN_VK_COOPMAT", "emulate"},
                                           {"CROSSTRAIN_VK_COOPMAT_INJECT", "fast"}},
                                          &line);
  EXPECT_EQ(line.rfind("in use: self-test passed, emulated coopmat, speed not compared", 0), 0u)
      << line;
  EXPECT_NE(line.find("; flash attention on coopmat for f16 and bf16"), std::string::npos) << line;
  EXPECT_NE(line.find("; bf16 products on coopmat"), std::string::npos) << line;
  EXPECT_NE(small_gemm(*dev, DType::bf16).find("matmul_cme_hhf_bf16"), std::string::npos);
  const SmallAttention got = small_attention(*dev), want = small_attention(ref());
  for (const char* s : {"flash_cme_fwd_f16", "flash_cme_bwd_q_f16", "flash_cme_bwd_kv_f16"})
    EXPECT_NE(got.profile.find(s), std::string::npos) << s << "\n" << got.profile;
  EXPECT_TRUE(close_nmse(got.out, want.out, kTolGemm, "out"));
  EXPECT_TRUE(close_nmse(got.dqkv, want.dqkv, kTolGemm, "dqkv"));
}

// Attention outputs that disagree with the scalar shaders keep the attention on them, and bf16
// products that disagree with the default GEMM (CROSSTRAIN_VK_COOPMAT_INJECT=bf16wrong) keep bf16
// GEMMs on it; f16 GEMMs stay on coopmat; the reasons in the device's line. (One device open for
// both: each open runs the whole self-test, cold pipelines on lavapipe.)
TEST_F(CoopmatStartup, WrongAttentionIsRejected) {
  std::string line;
  std::unique_ptr<Device> dev =
      open_with({{"XDG_CACHE_HOME", cache_},
                 {"CROSSTRAIN_VK_COOPMAT", "emulate"},
                 {"CROSSTRAIN_VK_COOPMAT_INJECT", "fast,wrong_attention,bf16wrong"}},
                &line);
  EXPECT_NE(line.find("; bf16 products on the default GEMM: wrong products: "), std::string::npos)
      << line;
  EXPECT_EQ(line.find("bf16 products on coopmat"), std::string::npos) << line;
  EXPECT_NE(small_gemm(*dev, DType::f16).find("matmul_cme_hhf_f16"), std::string::npos);
  EXPECT_EQ(small_gemm(*dev, DType::bf16).find("matmul_cme_"), std::string::npos);
  EXPECT_EQ(line.rfind("in use: self-test passed, ", 0), 0u) << line;
  EXPECT_NE(line.find("; flash attention on the scalar shaders: wrong attention: out "),
            std::string::npos)
      << line;
  EXPECT_EQ(line.find("flash attention on coopmat"), std::string::npos) << line;
  const std::string profile = small_attention(*dev).profile;
  EXPECT_NE(profile.find("flash_fwd_f16"), std::string::npos) << profile;
  EXPECT_EQ(profile.find("flash_cme_"), std::string::npos) << profile;
}

}  // namespace
}  // namespace ct::vktest
