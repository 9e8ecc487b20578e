// sum, norm, check_finite and adamw: Vulkan vs the CPU reference.
#include "tests/vulkan/vk_test_util.h"

namespace ct::vktest {
namespace {

using ReduceTest = VulkanTest;

TEST_F(ReduceTest, SumAndNorm) {
  for (int64_t n : {1, 255, 4097, 1000003}) {
    Pair x = both({n}, randn(n, 100 + n)), s = both_empty({1}), nr = both_empty({1});
    vk().sum(s.v, x.v, 0.5f);
    ref().sum(s.r, x.r, 0.5f);
    EXPECT_TRUE(same(s, kTol, "sum n=" + std::to_string(n)));
    vk().norm(nr.v, x.v);
    ref().norm(nr.r, x.r);
    EXPECT_TRUE(same(nr, kTol, "norm n=" + std::to_string(n)));
  }
}

TEST_F(ReduceTest, SumIsDeterministic) {
  Tensor x = up(vk(), {777777}, randn(777777, 110));
  Tensor s = vk().empty({1}, DType::f32, MemCategory::kWorkspace);
  vk().sum(s, x, 1.0f);
  float first = down(vk(), s)[0];
  for (int i = 0; i < 3; ++i) {
    vk().sum(s, x, 1.0f);
    EXPECT_EQ(down(vk(), s)[0], first);
  }
}

TEST_F(ReduceTest, CheckFinite) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    Vec xs = randn(3001, 120);
    Tensor flag = up_i32(vk(), {1}, {0});
    Tensor x = up(vk(), {3001}, xs);
    vk().check_finite(flag, x);
    EXPECT_EQ(down_as<int32_t>(vk(), flag)[0], 0);
    xs[2999] = bad;
    Tensor y = up(vk(), {3001}, xs);
    vk().check_finite(flag, y);
    EXPECT_EQ(down_as<int32_t>(vk(), flag)[0], 1) << bad;
    vk().check_finite(flag, x);  // sticky: or-ed into the flag
    EXPECT_EQ(down_as<int32_t>(vk(), flag)[0], 1);
  }
}

// The fused loss-scaler step against the reference device's scale + check_finite.
TEST_F(ReduceTest, UnscaleCheckFused) {
  Vec xs = randn(5003, 121, 1000.0f);
  Pair x = both({5003}, xs);
  Pair flag = both_i32({1}, {0});
  vk().unscale_check(x.v, flag.v, 1.0f / 1024.0f);
  ref().unscale_check(x.r, flag.r, 1.0f / 1024.0f);
  EXPECT_TRUE(same(x, 0.0, "unscaled"));  // one multiply: exact
  EXPECT_EQ(down_as<int32_t>(vk(), flag.v)[0], 0);
  xs[17] = 3e38f;  // finite, overflows to inf when scaled up
  xs[4001] = NAN;
  for (int i = 0; i < 2; ++i) {
    Tensor y = up(vk(), {5003}, xs);
    Tensor f = up_i32(vk(), {1}, {0});
    vk().unscale_check(y, f, i == 0 ? 4.0f : 0.5f);
    EXPECT_EQ(down_as<int32_t>(vk(), f)[0], 1) << i;
  }
}

TEST_F(ReduceTest, AdamWWithAndWithoutClipping) {
  const int64_t n = 5003;
  for (float max_norm : {0.0f, 0.5f}) {
    Pair p = both({n}, randn(n, 130)), g = both({n}, randn(n, 131));
    Pair m = both({n}, randn(n, 132, 0.1f)), v = both({n}, uniform(n, 133, 0.0f, 0.2f));
    Pair gn = both_empty({1});
    vk().norm(gn.v, g.v);
    ref().norm(gn.r, g.r);
    AdamWHyper hp;
    hp.lr = 3e-3f;
    hp.weight_decay = 0.1f;
    hp.step = 7;
    hp.max_grad_norm = max_norm;
    for (int step = 0; step < 3; ++step) {
      hp.step = 7 + step;
      vk().adamw(p.v, g.v, m.v, v.v, gn.v, hp);
      ref().adamw(p.r, g.r, m.r, v.r, gn.r, hp);
    }
    std::string w = max_norm > 0 ? " (clipped)" : "";
    EXPECT_TRUE(same(p, kTol, "adamw param" + w));
    EXPECT_TRUE(same(m, kTol, "adamw m" + w));
    EXPECT_TRUE(same(v, kTol, "adamw v" + w));
  }
}

}  // namespace
}  // namespace ct::vktest
