// Each Vulkan GEMM shader variant forced in turn (CROSSTRAIN_VK_MATMUL): every transpose, batch,
// broadcast, bias, alpha/beta, against the CPU reference, at 5e-4 and at 1e-10. The variant the
// device picks by itself runs the conformance table in tests/ops/matmul_test.cpp.
#include "backends/vulkan/matmul_kind.h"
#include "tests/common/half_compare.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace ct::vktest {
namespace {

struct MatmulCase {
  int64_t batch, M, N, K;
  bool ta, tb, bias, a2d, b2d;
  float alpha, beta;
};

class MatmulTest : public VulkanTest, public ::testing::WithParamInterface<const char*> {
 protected:
  // tiled128: the tiled GEMM's discrete-GPU shape (128 x 128, 8 x 8 blocks); tiled_sg8: the
  // 64 x 64 shape in pipelines that require lavapipe's subgroup size (the size-control path).
  void SetUp() override {
    VulkanTest::SetUp();
    const std::string v = GetParam();
    setenv("CROSSTRAIN_VK_MATMUL", v.rfind("tiled", 0) == 0 ? "tiled" : v.c_str(), 1);
    if (v == "tiled128") setenv("CROSSTRAIN_VK_TILED", "128", 1);
    if (v == "tiled_sg8") setenv("CROSSTRAIN_VK_TILED_SG", "8", 1);
  }
  void TearDown() override {
    VulkanTest::TearDown();
    unsetenv("CROSSTRAIN_VK_MATMUL");
    unsetenv("CROSSTRAIN_VK_TILED");
    unsetenv("CROSSTRAIN_VK_TILED_SG");
  }
};

void run_case(const MatmulCase& k, uint64_t seed) {
  auto shp = [&](bool two_d, int64_t r, int64_t c) {
    return (k.batch > 1 && !two_d) ? Shape{k.batch, r, c} : Shape{r, c};
  };
  Shape sa = k.ta ? shp(k.a2d, k.K, k.M) : shp(k.a2d, k.M, k.K);
  Shape sb = k.tb ? shp(k.b2d, k.N, k.K) : shp(k.b2d, k.K, k.N);
  Shape sc = k.batch > 1 ? Shape{k.batch, k.M, k.N} : Shape{k.M, k.N};
  Pair a = both(sa, randn(sa.numel(), seed)), b = both(sb, randn(sb.numel(), seed + 1));
  Pair c = both(sc, randn(sc.numel(), seed + 2));
  Pair bias = both({k.N}, randn(k.N, seed + 3));
  vk().matmul(c.d, a.d, b.d, k.ta, k.tb, k.alpha, k.beta, k.bias ? &bias.d : nullptr);
  ref().matmul(c.r, a.r, b.r, k.ta, k.tb, k.alpha, k.beta, k.bias ? &bias.r : nullptr);
  std::string what = "matmul b" + std::to_string(k.batch) + " " + std::to_string(k.M) + "x" +
                     std::to_string(k.N) + "x" + std::to_string(k.K) + (k.ta ? " ta" : "") +
                     (k.tb ? " tb" : "") + (k.bias ? " bias" : "");
  EXPECT_TRUE(same(c, kTolGemm, what));
  // Anything above 5e-4 would hide real bugs; the fp32 kernels land near 1e-13.
  EXPECT_TRUE(same(c, 1e-10, what + " (tight)"));
}

TEST_P(MatmulTest, AllTransposesOddSizes) {
  uint64_t seed = 10;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      run_case({1, 37, 53, 29, ta, tb, false, false, false, 1, 0}, seed++);
}

// Sizes in multiples of 4: MM_VEC/MM_SG's vec4 loads along k, m, n (with and without a K % 4
// tail), M and N past one 64-wide tile.
TEST_P(MatmulTest, AllTransposesVec4Sizes) {
  uint64_t seed = 40;
  // tiled128: K = 36 only (its four staging modes); each of its pipelines takes lavapipe ~9 s
  // to compile cold; K = 37 runs in the 64 x 64 shape (tiled, tiled_sg8).
  const bool big = std::string(GetParam()) == "tiled128";
  for (int64_t K : big ? std::vector<int64_t>{36} : std::vector<int64_t>{36, 37})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        run_case({2, 68, 76, K, ta, tb, true, false, false, 1, 0.5f}, seed++);
}

// K % 8 == 0 (vsg64's two 4-deep steps per iteration; K = 16 with a transposed: four), M past
// one 128-row MM_SG tile, and c
// rows that are vec4-aligned, so whole 16 x 8 blocks take the vec4 epilogue through c's address
// (with beta and bias) while the edge blocks take the per-element one.
TEST_P(MatmulTest, WholeBlocksAndEdgesK8) {
  uint64_t seed = 50;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      run_case({2, 136, 132, 40, ta, tb, true, false, false, 0.75f, 0.5f}, seed++);
      run_case({1, 144, 64, 16, ta, tb, false, false, false, 1, 0}, seed++);
    }
}

// Long K: on CPU-type devices it runs in pieces chained through beta, the bias added once, on
// the last -- a transposed past 512 (1100 -> four pieces of 275), a b with N >= 768 past 768
// (1540 -> four of 385).
TEST_P(MatmulTest, LongKInPieces) {
  run_case({1, 70, 66, 1100, true, false, true, false, false, 0.5f, 0.25f}, 60);
  run_case({2, 36, 40, 1032, true, true, true, false, false, 1.0f, 0.0f}, 61);
  run_case({1, 20, 772, 1540, false, false, true, false, false, 0.5f, 0.25f}, 62);
}

TEST_P(MatmulTest, BiasAlphaBeta) {
  run_case({1, 65, 33, 70, false, true, true, false, false, 0.5f, 0.25f}, 20);
  run_case({1, 1, 1, 1, false, false, true, false, false, 1.0f, 1.0f}, 21);
  run_case({1, 129, 7, 3, true, false, true, false, false, -2.0f, 0.0f}, 22);
}

TEST_P(MatmulTest, BatchedAndBroadcast) {
  run_case({3, 17, 45, 66, false, false, false, false, false, 1, 0}, 30);
  run_case({4, 33, 20, 31, true, true, false, false, false, 1, 0.5f}, 31);
  run_case({3, 19, 23, 41, false, false, true, false, true, 1, 0}, 32);  // b 2-D
  run_case({2, 21, 25, 9, false, true, false, true, false, 1, 0}, 33);   // a 2-D
}

TEST_P(MatmulTest, BetaZeroIgnoresNaNInC) {
  Pair a = both({5, 6}, randn(30, 40)), b = both({6, 7}, randn(42, 41));
  Vec nan(35, NAN);
  Pair c = both({5, 7}, nan);
  vk().matmul(c.d, a.d, b.d, false, false, 1.0f, 0.0f);
  ref().matmul(c.r, a.r, b.r, false, false, 1.0f, 0.0f);
  EXPECT_TRUE(same(c, kTolGemm, "beta=0 over NaN"));
}

// The split-k rule (matmul_kind.h) on the inputs a GPU would give it: small products with long K
// split into slices of at least 1024, never on a CPU-type device, never past the limits.
TEST(SplitKRule, WhenAndHowFar) {
  const int64_t lim = int64_t(1) << 25;
  // tiny's dW (64 x 192 of 64 x 64 tiles: 3 groups) over 8 x 512 tokens: K / 1024 = 4 slices
  vk::SplitK s = vk::plan_splitk(false, 0, 3, 4096, 32, 65535, 64 * 192, lim);
  EXPECT_EQ(s.S, 4u);
  EXPECT_EQ(s.kchunk, 1024u);
  EXPECT_EQ(vk::plan_splitk(true, 0, 3, 4096, 32, 65535, 64 * 192, lim).S, 1u);       // CPU-like
  EXPECT_EQ(vk::plan_splitk(false, 0, 200, 65536, 32, 65535, 64 * 192, lim).S, 1u);   // enough
  EXPECT_EQ(vk::plan_splitk(false, 0, 3, 2000, 32, 65535, 64 * 192, lim).S, 1u);      // short K
  EXPECT_EQ(vk::plan_splitk(false, 0, 1, 1 << 20, 32, 65535, 64 * 192, lim).S, 16u);  // at most
  EXPECT_EQ(vk::plan_splitk(false, 0, 64, 1 << 20, 32, 65535, 64 * 192, lim).S, 4u);  // 2 x 128
  EXPECT_EQ(vk::plan_splitk(false, 0, 1, 1 << 20, 32, 65535, lim / 3, lim).S, 3u);    // binding
  EXPECT_EQ(vk::plan_splitk(false, 0, 1, 1 << 20, 32, 5, 64, lim).S, 5u);             // grid z
  // forced: ragged last slice; never more slices than tbk steps
  s = vk::plan_splitk(true, 3, 1, 130, 32, 65535, 64, lim);
  EXPECT_EQ(s.S, 3u);
  EXPECT_EQ(s.kchunk, 64u);
  EXPECT_EQ(vk::plan_splitk(true, 8, 1, 40, 16, 65535, 64, lim).S, 3u);
  EXPECT_EQ(vk::plan_splitk(true, 0, 1, 40, 16, 65535, 64, lim).kchunk, 40u);  // unsplit: K
}

// The shared-memory tiled GEMM split along k (CROSSTRAIN_VK_SPLITK=S: f32 partials, then
// matmul_splitk's ordered sum with alpha, beta, bias and c's dtype), f32 and 16-bit operands.
TEST_F(VulkanTest, TiledSplitK) {
  setenv("CROSSTRAIN_VK_MATMUL", "tiled", 1);
  setenv("CROSSTRAIN_VK_SPLITK", "3", 1);
  vk().set_profiling(true);
  run_case({1, 70, 66, 100, true, false, true, false, false, 0.5f, 0.25f}, 70);
  run_case({3, 37, 53, 300, false, true, false, false, true, 1.0f, 0.0f}, 71);
  run_case({2, 64, 64, 48, true, true, true, false, false, -1.0f, 0.5f}, 72);  // 16 deep each
  for (DType h : {DType::f16, DType::bf16})
    for (bool c16 : {false, true}) {
      const Shape sa{45, 130}, sb{130, 29}, sc{45, 29};
      Pair a = both_as(sa, randn(sa.numel(), 73), h), b = both_as(sb, randn(sb.numel(), 74), h);
      Pair c = both_as(sc, randn(sc.numel(), 75), c16 ? h : DType::f32);
      Pair bias = both({29}, randn(29, 76));
      vk().matmul(c.d, a.d, b.d, false, false, 0.5f, 0.5f, &bias.d);
      ref().matmul(c.r, a.r, b.r, false, false, 0.5f, 0.5f, &bias.r);
      const std::string what = std::string("split-k ") + dtype_name(h) + (c16 ? " hhh" : " hhf");
      if (c16)
        EXPECT_TRUE(same_h(c, what, 1e-5));
      else
        EXPECT_TRUE(same(c, 1e-5, what));
    }
  const std::string report = vk().profile_report();
  EXPECT_NE(report.find("matmul_splitk "), std::string::npos) << report;
  EXPECT_NE(report.find("matmul_splitk_bf16"), std::string::npos) << report;
  vk().set_profiling(false);
  unsetenv("CROSSTRAIN_VK_SPLITK");
  unsetenv("CROSSTRAIN_VK_MATMUL");
}

// Named by the variant (Variants/MatmulTest.LongKInPieces/tiled128), so ctest's name is the gtest
// name (gtest_discover_tests NO_PRETTY_VALUES: names without spaces, which ctest's cost file
// needs).
INSTANTIATE_TEST_SUITE_P(Variants, MatmulTest,
                         ::testing::Values("vsg64", "vsg", "vec", "reg", "tiled", "tiled128",
                                           "tiled_sg8"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param);
                         });

}  // namespace
}  // namespace ct::vktest
