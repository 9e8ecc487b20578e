// fill, copy (conversions), add, accumulate, scale, gelu: Vulkan vs the CPU reference.
#include "tests/vulkan/vk_test_util.h"

namespace ct::vktest {
namespace {

using ElementwiseTest = VulkanTest;

TEST_F(ElementwiseTest, FillEveryDtype) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i8, DType::u8}) {
    if (!vk().supports(OpKind::kFill, dt)) continue;
    Pair p = both_empty({3, 337}, dt);
    vk().fill(p.v, -2.75f);
    ref().fill(p.r, -2.75f);
    size_t bytes = p.v.nbytes();
    std::vector<uint8_t> a(bytes), b(bytes);
    vk().download(a.data(), p.v, bytes);
    ref().download(b.data(), p.r, bytes);
    EXPECT_EQ(a, b) << dtype_name(dt);
  }
}

TEST_F(ElementwiseTest, FillOddOffsetView16) {
  Tensor t = vk().empty({9}, DType::bf16, MemCategory::kActivations);
  vk().fill(t, 0.0f);
  vk().fill(t.slice_flat(3, {3}), 1.0f);
  auto got = down_as<uint16_t>(vk(), t);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(got[i], (i >= 3 && i < 6) ? 0x3f80 : 0) << i;
}

TEST_F(ElementwiseTest, CopyConvertsLikeTheReference) {
  Vec x = randn(4099, 2, 3.0f);
  // edge values: ties, overflow, subnormals, NaN, inf
  Vec edges = {0.0f, -0.0f, 1.0f + 1.0f / 256, 65504.0f, 65520.0f, 1e-7f, 6e-8f, 3e-5f,
               1e30f, -1e30f, NAN, INFINITY, -INFINITY, 1.00390625f, 1.01171875f};
  x.insert(x.end(), edges.begin(), edges.end());
  Shape s{static_cast<int64_t>(x.size())};
  DType fl[] = {DType::f32, DType::f16, DType::bf16};
  for (DType from : fl)
    for (DType to : fl) {
      if (!vk().supports(OpKind::kCopy, from) || !vk().supports(OpKind::kCopy, to)) continue;
      Pair src = both(s, x);
      Pair mid = both_empty(s, from), out = both_empty(s, to);
      vk().copy(mid.v, src.v);
      ref().copy(mid.r, src.r);
      vk().copy(out.v, mid.v);
      ref().copy(out.r, mid.r);
      size_t bytes = out.v.nbytes();
      std::vector<uint8_t> a(bytes), b(bytes);
      vk().download(a.data(), out.v, bytes);
      ref().download(b.data(), out.r, bytes);
      EXPECT_EQ(a, b) << dtype_name(from) << " -> " << dtype_name(to);
    }
}

TEST_F(ElementwiseTest, AddAccumulateScale) {
  const int64_t n = 10007;
  Pair a = both({n}, randn(n, 3)), b = both({n}, randn(n, 4)), o = both_empty({n});
  vk().add(o.v, a.v, b.v);
  ref().add(o.r, a.r, b.r);
  EXPECT_TRUE(same(o, kTol, "add"));
  vk().accumulate(a.v, b.v);
  ref().accumulate(a.r, b.r);
  EXPECT_TRUE(same(a, kTol, "accumulate"));
  vk().scale(a.v, -0.37f);
  ref().scale(a.r, -0.37f);
  EXPECT_TRUE(same(a, kTol, "scale"));
}

TEST_F(ElementwiseTest, GeluForwardBackward) {
  const int64_t n = 3 * 1001;
  Vec xs = randn(n, 5, 4.0f);
  xs[0] = 30.0f;  // large |x| must not produce NaN (tanh overflow)
  xs[1] = -30.0f;
  Pair x = both({n}, xs), d = both({n}, randn(n, 6)), o = both_empty({n}), dx = both_empty({n});
  vk().gelu_forward(o.v, x.v);
  ref().gelu_forward(o.r, x.r);
  EXPECT_TRUE(same(o, kTol, "gelu_forward"));
  vk().gelu_backward(dx.v, x.v, d.v);
  ref().gelu_backward(dx.r, x.r, d.r);
  EXPECT_TRUE(same(dx, kTol, "gelu_backward"));
}

// A tensor beyond maxStorageBufferRange: elementwise ops bind it in ranges.
TEST_F(ElementwiseTest, TensorLargerThanMaxStorageBufferRange) {
  int64_t range = vk().info().max_buffer_range_bytes;
  int64_t n = range / 4 + 1234567;  // > range bytes of f32
  if (n * 4 > vk().info().max_allocation_bytes) GTEST_SKIP() << "device cannot allocate it";
  Vec xs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) xs[i] = static_cast<float>(i % 1000) * 0.5f;
  Pair a = both({n}, xs), b = both({n}, xs);
  vk().accumulate(a.v, b.v);
  ref().accumulate(a.r, b.r);
  vk().scale(a.v, 0.5f);
  ref().scale(a.r, 0.5f);
  Vec got = down(vk(), a.v);
  EXPECT_TRUE(close_nmse(got, down(ref(), a.r), kTol, "large accumulate+scale"));
  EXPECT_EQ(got[n - 1], xs[n - 1]);
}

}  // namespace
}  // namespace ct::vktest
