// The scalar flash attention shaders' unrolled modules (flash_attention.comp built with
// FA_UNROLL: the loops over the head unrolled for the head size the pipeline is specialized to,
// HS_SPEC), which GPUs run and a CPU device like lavapipe does not unless
// CROSSTRAIN_VK_FLASH=unrolled: out, lse and dqkv byte for byte those of the plain modules (the
// same operations in the same order), f32, f16 and bf16, grouped-query and multi-query heads,
// ragged T, at small head sizes (lavapipe's JIT takes seconds for each unrolled head size of 64
// and more, so the sizes the models use are left to the GPUs); the last rows' forward too.
// --profile names the modules that ran.
#include <cmath>
#include <cstdlib>

#include "tests/common/half_compare.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace ct::vktest {
namespace {

struct Case {
  int64_t B, T, NH, NKV, hs;
  DType dt;
  uint64_t seed;
  int64_t C() const { return NH * hs; }
  int64_t W() const { return C() + 2 * NKV * hs; }  // qkv's row
};

// The bytes of out, lse and dqkv of the forward and backward of c; Tq < T: the forward of the
// last Tq rows only.
std::vector<uint8_t> run(Device& d, const Case& c, int64_t Tq) {
  const Vec qkv = randn(c.B * c.T * c.W(), c.seed), dout = randn(c.B * c.T * c.C(), c.seed + 1);
  Tensor tq = up_as(d, {c.B, c.T, c.W()}, qkv, c.dt), td = up_as(d, {c.B, c.T, c.C()}, dout, c.dt);
  Tensor to = d.empty({c.B, Tq, c.C()}, c.dt, MemCategory::kActivations);
  Tensor tl = d.empty({c.B, c.NH, Tq}, DType::f32, MemCategory::kActivations);
  d.fill(to, NAN);
  d.fill(tl, NAN);
  const int nh = static_cast<int>(c.NH), nkv = static_cast<int>(c.NKV);
  d.flash_attention_forward(to, tl, tq, nh, nkv);
  std::vector<uint8_t> raw = raw_download(d, to), l = raw_download(d, tl);
  raw.insert(raw.end(), l.begin(), l.end());
  if (Tq == c.T) {
    Tensor tdq = d.empty({c.B, c.T, c.W()}, c.dt, MemCategory::kActivations);
    d.fill(tdq, NAN);
    d.flash_attention_backward(tdq, td, tq, to, tl, nh, nkv);
    std::vector<uint8_t> g = raw_download(d, tdq);
    raw.insert(raw.end(), g.begin(), g.end());
  }
  return raw;
}

class FlashUnrolled : public VulkanTest {
 protected:
  void TearDown() override {
    unsetenv("CROSSTRAIN_VK_FLASH");
    VulkanTest::TearDown();
  }
};

TEST_F(FlashUnrolled, UnrolledModulesGiveThePlainModulesBits) {
  if (vk().info().type != DeviceType::kCpu)
    GTEST_SKIP() << "on a GPU the unrolled modules are the default, which the fused attention's "
                    "other tests check against the reference; a GPU compiler may contract the "
                    "two forms' products differently, so their bits are compared on CPU devices";
  const Case cases[] = {{2, 37, 4, 2, 8, DType::f32, 301},
                        {1, 70, 2, 1, 16, DType::bf16, 302},
                        {1, 40, 2, 2, 8, DType::f16, 303}};
  for (const Case& c : cases) {
    for (int64_t Tq : {c.T, int64_t{3}}) {
      const std::string nm = std::string(dtype_name(c.dt)) + " T" + std::to_string(c.T) + " hs" +
                             std::to_string(c.hs) + " Tq" + std::to_string(Tq);
      unsetenv("CROSSTRAIN_VK_FLASH");
      vk().set_profiling(false);
      vk().set_profiling(true);
      const std::vector<uint8_t> plain = run(vk(), c, Tq);
      const std::string plain_report = vk().profile_report();
      setenv("CROSSTRAIN_VK_FLASH", "unrolled", 1);
      vk().set_profiling(false);
      vk().set_profiling(true);
      const std::vector<uint8_t> unrolled = run(vk(), c, Tq);
      const std::string report = vk().profile_report();
      vk().set_profiling(false);
      EXPECT_TRUE(plain == unrolled) << nm << ": the unrolled modules' bits differ";
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
