// The scalar flash attention shaders' unrolled modules (flash_attention.comp built with
// FA_UNROLL: the loops over the head unrolled for the head size the pipeline is specialized to,
// HS_SPEC), which GPUs run and a CPU device like lavapipe does not unless
// CROSSTRAIN_VK_FLASH=unrolled. They hold a row in two invocations (FA_PAIR), or four (past head
// size 64 on GPUs), whose dot products add the partial sums: out and dqkv within 1e-6 (normalised
// MSE) of the plain modules', lse within 1e-12; f32, f16 and bf16, grouped-query and multi-query
// heads, ragged T, at small head sizes (lavapipe's JIT takes seconds for each unrolled head size
// of 64 and more, so the sizes the models use are left to the GPUs); the last rows' forward gives
// the whole window's rows byte for byte. --profile names the modules that ran.
#include <cmath>
#include <cstdlib>

#include "tests/common/half_compare.h"
#include "tests/vulkan/flash_case.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace ct::vktest {
namespace {

// The bytes of out and lse of the forward of c's last Tq rows only.
std::vector<uint8_t> last_rows(Device& d, const FlashCase& c, int64_t Tq) {
  const Vec qkv = randn(c.B * c.T * c.W(), c.seed);
  Tensor tq = up_as(d, {c.B, c.T, c.W()}, qkv, c.dt);
  Tensor to = d.empty({c.B, Tq, c.C()}, c.dt, MemCategory::kActivations);
  Tensor tl = d.empty({c.B, c.NH, Tq}, DType::f32, MemCategory::kActivations);
  d.fill(to, NAN);
  d.fill(tl, NAN);
  d.flash_attention_forward(to, tl, tq, static_cast<int>(c.NH), static_cast<int>(c.NKV));
  std::vector<uint8_t> raw = raw_download(d, to), l = raw_download(d, tl);
  raw.insert(raw.end(), l.begin(), l.end());
  return raw;
}

class FlashUnrolled : public VulkanTest {
 protected:
  void TearDown() override {
    unsetenv("CROSSTRAIN_VK_FLASH");
    unsetenv("CROSSTRAIN_VK_FLASH_LANES");
    VulkanTest::TearDown();
  }
  // c's forward and backward with a fresh profile, whose report (the modules that ran) goes to
  // *report.
  FlashOut profiled(const FlashCase& c, std::string* report) {
    vk().set_profiling(false);
    vk().set_profiling(true);
    FlashOut r = run_flash(vk(), c);
    *report = vk().profile_report();
    vk().set_profiling(false);
    return r;
  }
};

TEST_F(FlashUnrolled, UnrolledModulesMatchThePlainModules) {
  if (vk().info().type != DeviceType::kCpu)
    GTEST_SKIP() << "on a GPU the unrolled modules are the default, which the fused attention's "
                    "other tests check against the reference; a GPU compiler may contract the "
                    "two forms' products differently, so they are compared on CPU devices";
  const FlashCase cases[] = {{2, 37, 4, 2, 8, DType::f32, 301},
                             {1, 70, 2, 1, 16, DType::bf16, 302},
                             {1, 40, 2, 2, 8, DType::f16, 303}};
  for (const FlashCase& c : cases) {
    const std::string nm = c.name();
    std::string plain_report, report;
    unsetenv("CROSSTRAIN_VK_FLASH");
    const FlashOut plain = profiled(c, &plain_report);
    setenv("CROSSTRAIN_VK_FLASH", "unrolled", 1);
    const FlashOut unrolled = profiled(c, &report);
    EXPECT_TRUE(close_nmse(unrolled.out, plain.out, 1e-6, "out (paired) vs plain " + nm));
    EXPECT_TRUE(close_nmse(unrolled.lse, plain.lse, 1e-12, "lse (paired) vs plain " + nm));
    EXPECT_TRUE(close_nmse(unrolled.dqkv, plain.dqkv, 1e-6, "dqkv (paired) vs plain " + nm));
    for (const char* k : {"flash_fwd_u", "flash_bwd_q_u", "flash_bwd_kv_u"}) {
      EXPECT_NE(report.find(k), std::string::npos) << nm << "\n" << report;
      EXPECT_EQ(plain_report.find(k), std::string::npos) << nm << "\n" << plain_report;
    }
    // The last Tq rows' forward: the unrolled modules' whole-window rows byte for byte.
    const int64_t es = dtype_size(c.dt), out_bytes = c.B * c.T * c.C() * es;
    const std::vector<uint8_t> whole = last_rows(vk(), c, c.T);
    for (int64_t Tq : {int64_t{3}, c.T - 20}) {
      std::vector<uint8_t> want;
      for (int64_t b = 0; b < c.B; ++b)
        want.insert(want.end(), whole.begin() + (b * c.T + c.T - Tq) * c.C() * es,
                    whole.begin() + (b + 1) * c.T * c.C() * es);
      for (int64_t bh = 0; bh < c.B * c.NH; ++bh)
        want.insert(want.end(), whole.begin() + out_bytes + (bh * c.T + c.T - Tq) * 4,
                    whole.begin() + out_bytes + (bh + 1) * c.T * 4);
      EXPECT_TRUE(last_rows(vk(), c, Tq) == want) << nm << " Tq " << Tq << ": the rows differ";
    }
  }
}

// The modules with four invocations a row (what GPUs run past head size 64; forced here by
// CROSSTRAIN_VK_FLASH_LANES=4 at head sizes 8 and 16, two elements a lane at 8): out and dqkv
// within 1e-6 of the plain modules'. Dropping either step of the lanes' butterfly (xor 1 or
// xor 2) fails it.
TEST_F(FlashUnrolled, FourLanesARowMatchThePlainModules) {
  if (vk().info().type != DeviceType::kCpu)
    GTEST_SKIP() << "compared with the plain modules on CPU devices (as above)";
  const FlashCase cases[] = {{2, 37, 4, 2, 8, DType::f32, 311},
                             {1, 70, 2, 1, 16, DType::bf16, 312}};
  for (const FlashCase& c : cases) {
    unsetenv("CROSSTRAIN_VK_FLASH");
    unsetenv("CROSSTRAIN_VK_FLASH_LANES");
    const FlashOut plain = run_flash(vk(), c);
    setenv("CROSSTRAIN_VK_FLASH", "unrolled", 1);
    setenv("CROSSTRAIN_VK_FLASH_LANES", "4", 1);
    std::string report;
    const FlashOut four = profiled(c, &report);
    EXPECT_TRUE(close_nmse(four.out, plain.out, 1e-6, "out (4 lanes) vs plain " + c.name()));
    EXPECT_TRUE(close_nmse(four.dqkv, plain.dqkv, 1e-6, "dqkv (4 lanes) vs plain " + c.name()));
    for (const char* k : {"flash_fwd_u", "flash_bwd_q_u", "flash_bwd_kv_u"})
      EXPECT_NE(report.find(k), std::string::npos) << c.name() << "\n" << report;
  }
}

}  // namespace
}  // namespace ct::vktest
