// What only the Vulkan backend has in mixed precision: its supports() answers for 16-bit
// tensors, its dtype rules, and matmul in f16/bf16 with each GEMM shader variant forced in turn
// (CROSSTRAIN_VK_MATMUL; 16-bit MM_VEC runs MM_REG). The ops themselves run on every device in
// tests/ops/mixed_precision*_test.cpp.
#include "tests/common/bias_rounding_case.h"
#include "tests/common/half_compare.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace ct::vktest {
namespace {

class MixedPrecisionTest : public VulkanTest, public ::testing::WithParamInterface<DType> {
 protected:
  void SetUp() override {
    VulkanTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_TRUE(vk().supports(OpKind::kCopy, GetParam()))
        << "this Vulkan device lacks storageBuffer16BitAccess (no " << dtype_name(GetParam())
        << " tensors); lavapipe has it";
  }
};

// 16-bit outputs of sums: within 1 ulp, or within kAccTol absolutely where the sum cancels to a
// value whose ulp is below the fp32 accumulation-order difference.
constexpr double kAccTol = 1e-5;

TEST_P(MixedPrecisionTest, SupportsAnswersForTheImplementedOps) {
  DType h = GetParam();
  for (OpKind k : {OpKind::kAdd, OpKind::kGelu, OpKind::kLayerNorm, OpKind::kBiasGrad,
                   OpKind::kCrossEntropy, OpKind::kMatmul, OpKind::kAttention, OpKind::kEmbedding})
    EXPECT_TRUE(vk().supports(k, h)) << static_cast<int>(k);
  for (OpKind k :
       {OpKind::kAccumulate, OpKind::kScale, OpKind::kSum, OpKind::kNorm, OpKind::kAdamW})
    EXPECT_FALSE(vk().supports(k, h)) << static_cast<int>(k);
}

TEST_P(MixedPrecisionTest, DtypeRulesOfTheTable) {
  DType h = GetParam();
  const int64_t n = 33;
  Tensor xf = vk().empty({n}, DType::f32, MemCategory::kActivations);
  Tensor xh = vk().empty({n}, h, MemCategory::kActivations);
  vk().fill(xf, 1.0f);
  vk().fill(xh, 1.0f);
  EXPECT_THROW(vk().gelu_forward(xf, xh), Error);  // gelu: one dtype throughout
  EXPECT_THROW(vk().add(xh, xf, xf), Error);       // add: out and a are f32
  EXPECT_THROW(vk().accumulate(xf, xh), Error);    // accumulate: f32 only
  Tensor dbh = vk().empty({n}, h, MemCategory::kActivations);
  EXPECT_THROW(vk().bias_backward(dbh, xf), Error);  // dbias is f32
  // matmul: a and b share a dtype; c is f32 or a's dtype; bias f32
  DType other = h == DType::f16 ? DType::bf16 : DType::f16;
  Tensor mh = vk().empty({4, 4}, h, MemCategory::kActivations);
  Tensor mf = vk().empty({4, 4}, DType::f32, MemCategory::kActivations);
  Tensor mo = vk().empty({4, 4}, other, MemCategory::kActivations);
  Tensor bh = vk().empty({4}, h, MemCategory::kActivations);
  vk().fill(mh, 1.0f);
  vk().fill(mf, 1.0f);
  EXPECT_THROW(vk().matmul(mf, mh, mf, false, false), Error);
  EXPECT_THROW(vk().matmul(mf, mf, mh, false, false), Error);
  EXPECT_THROW(vk().matmul(mh, mf, mf, false, false), Error);
  EXPECT_THROW(vk().matmul(mo, mh, mh, false, false), Error);
  EXPECT_THROW(vk().matmul(mf, mh, mh, false, false, 1.0f, 0.0f, &bh), Error);
  // attention: one dtype throughout
  Tensor qkv = vk().empty({1, 4, 12}, h, MemCategory::kActivations);
  Tensor outf = vk().empty({1, 4, 4}, DType::f32, MemCategory::kActivations);
  Tensor atth = vk().empty({1, 2, 4, 4}, h, MemCategory::kActivations);
  EXPECT_THROW(vk().attention_forward(outf, atth, qkv, 2), Error);
}

TEST_P(MixedPrecisionTest, MatmulH) {
  DType h = GetParam();
  struct Case {
    int64_t batch, M, N, K;
  };
  uint64_t seed = 100;
  for (const char* kind : {"vsg", "reg", "tiled"}) {
    setenv("CROSSTRAIN_VK_MATMUL", kind, 1);
    for (Case k : {Case{1, 37, 53, 29}, Case{2, 68, 76, 36}, Case{1, 65, 66, 37}})
      for (int tr = 0; tr < 4; ++tr)
        for (DType tc : {DType::f32, h}) {
          bool ta = tr & 1, tb = tr & 2;
          bool bias = tr == 1, beta = tr == 2;
          auto shp = [&](int64_t r, int64_t c) {
            return k.batch > 1 ? Shape{k.batch, r, c} : Shape{r, c};
          };
          Shape sa = ta ? shp(k.K, k.M) : shp(k.M, k.K), sb = tb ? shp(k.N, k.K) : shp(k.K, k.N);
          Shape sc = shp(k.M, k.N);
          Pair a = both_as(sa, randn(sa.numel(), seed), h);
          Pair b = both_as(sb, randn(sb.numel(), seed + 1), h);
          Pair c = both_as(sc, randn(sc.numel(), seed + 2), tc);
          Pair bs = both({k.N}, randn(k.N, seed + 3));
          seed += 4;
          float alpha = bias ? 0.5f : 1.0f, bt = beta ? 0.75f : 0.0f;
          vk().matmul(c.d, a.d, b.d, ta, tb, alpha, bt, bias ? &bs.d : nullptr);
          ref().matmul(c.r, a.r, b.r, ta, tb, alpha, bt, bias ? &bs.r : nullptr);
          std::string what = std::string("matmul ") + kind + " " + std::to_string(k.M) + "x" +
                             std::to_string(k.N) + "x" + std::to_string(k.K) + (ta ? " ta" : "") +
                             (tb ? " tb" : "") + " c " + dtype_name(tc) + " " + dtype_name(h);
          if (tc == DType::f32)
            EXPECT_TRUE(same(c, kTol, what));
          else
            EXPECT_TRUE(same_h(c, what, kAccTol));
        }
  }
  unsetenv("CROSSTRAIN_VK_MATMUL");
}

// The bias of a 16-bit c rounded to c's dtype first (core/device.h; tests/common/
// bias_rounding_case.h) in every GEMM shader's epilogue: matmul.comp's variants, the tiled GEMM
// split along k (matmul_splitk.comp adds the bias), the emulated cooperative-matrix build, plain
// and split. Every element equals the host's, c 16-bit and f32.
TEST_P(MixedPrecisionTest, MatmulHBiasRoundedToCEveryShader) {
  const DType h = GetParam();
  struct Variant {
    const char* matmul;
    const char* splitk;  // nullptr: not split
  };
  uint64_t seed = 400;
  vk().set_profiling(true);
  for (Variant v : {Variant{"vsg", nullptr}, Variant{"reg", nullptr}, Variant{"tiled", nullptr},
                    Variant{"tiled", "3"}, Variant{"cm16e", nullptr}, Variant{"cm8e", "3"}}) {
    setenv("CROSSTRAIN_VK_MATMUL", v.matmul, 1);
    if (v.splitk) setenv("CROSSTRAIN_VK_SPLITK", v.splitk, 1);
    for (int tr = 0; tr < 4; ++tr) {
      const float alpha = tr == 3 ? 0.5f : 1.0f, beta = tr == 3 ? 0.5f : 0.0f;
      const BiasRoundingCase k =
          bias_rounding_case(h, 37, 53, 40, tr & 1, tr & 2, alpha, beta, seed++);
      for (DType tc : {h, DType::f32})
        EXPECT_TRUE(bias_rounding_matches(vk(), k, tc))
            << v.matmul << (v.splitk ? " split-k " : "") << (v.splitk ? v.splitk : "");
    }
    unsetenv("CROSSTRAIN_VK_SPLITK");
  }
  unsetenv("CROSSTRAIN_VK_MATMUL");
  const std::string report = vk().profile_report(), hs = dtype_name(h);
  vk().set_profiling(false);
  for (const std::string& shader : std::vector<std::string>{
           "matmul_vsg_", "matmul_reg_hhh_", "matmul_tiled_hhh_", "matmul_splitk_" + hs,
           "matmul_cme_hhh_" + hs, "matmul_cme_hhf_" + hs})
    EXPECT_NE(report.find(shader), std::string::npos) << shader << " did not run:\n" << report;
}

INSTANTIATE_TEST_SUITE_P(Vulkan, MixedPrecisionTest, ::testing::Values(DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace ct::vktest
