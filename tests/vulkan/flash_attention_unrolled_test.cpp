// The scalar flash attention shaders' unrolled modules (flash_attention.comp built with
// FA_UNROLL: the loops over the head unrolled for the head size the pipeline is specialized to,
// HS_SPEC), which GPUs run and a CPU device like lavapipe does not unless
// CROSSTRAIN_VK_FLASH=unrolled: out and lse byte for byte those of the plain modules (the same
// operations in the same order), dqkv within 1e-6 (normalised MSE) of them -- the backward
// modules hold a row in two invocations (FA_PAIR), whose dot products add two partial sums --,
// f32, f16 and bf16, grouped-query and multi-query heads,
// ragged T, at small head sizes (lavapipe's JIT takes seconds for each unrolled head size of 64
// and more, so the sizes the models use are left to the GPUs); the last rows' forward too.
// --profile names the modules that ran.
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
    VulkanTest::TearDown();
  }
};

TEST_F(FlashUnrolled, UnrolledModulesMatchThePlainModules) {
  if (vk().info().type != DeviceType::kCpu)
    GTEST_SKIP() << "on a GPU the unrolled modules are the default, which the fused attention's "
                    "other tests check against the reference; a GPU compiler may contract the "
                    "two forms' products differently, so their bits are compared on CPU devices";
  const FlashCase cases[] = {{2, 37, 4, 2, 8, DType::f32, 301},
                             {1, 70, 2, 1, 16, DType::bf16, 302},
                             {1, 40, 2, 2, 8, DType::f16, 303}};
  for (const FlashCase& c : cases) {
    for (int64_t Tq : {c.T, int64_t{3}}) {
      const std::string nm = c.name() + " Tq" + std::to_string(Tq);
      // the whole window's forward and backward, or the last Tq rows' forward
      auto run = [&] {
        if (Tq != c.T) return FlashOut{{}, {}, {}, last_rows(vk(), c, Tq)};
        return run_flash(vk(), c);
      };
      unsetenv("CROSSTRAIN_VK_FLASH");
      vk().set_profiling(false);
      vk().set_profiling(true);
      const FlashOut plain = run();
      const std::string plain_report = vk().profile_report();
      setenv("CROSSTRAIN_VK_FLASH", "unrolled", 1);
      vk().set_profiling(false);
      vk().set_profiling(true);
      const FlashOut unrolled = run();
      const std::string report = vk().profile_report();
      vk().set_profiling(false);
      if (Tq != c.T) {
        EXPECT_TRUE(plain.raw == unrolled.raw) << nm << ": the unrolled modules' bits differ";
      } else {
        EXPECT_TRUE(plain.out == unrolled.out) << nm << ": out differs";
        EXPECT_TRUE(plain.lse == unrolled.lse) << nm << ": lse differs";
        EXPECT_TRUE(close_nmse(unrolled.dqkv, plain.dqkv, 1e-6, "dqkv (paired) vs plain " + nm));
      }
      EXPECT_NE(report.find("flash_fwd_u"), std::string::npos) << nm << "\n" << report;
      EXPECT_EQ(plain_report.find("flash_fwd_u"), std::string::npos) << nm << "\n" << plain_report;
      if (Tq == c.T) {
        EXPECT_NE(report.find("flash_bwd_q_u"), std::string::npos) << nm << "\n" << report;
        EXPECT_NE(report.find("flash_bwd_kv_u"), std::string::npos) << nm << "\n" << report;
      }
    }
  }
}

}  // namespace
}  // namespace ct::vktest
