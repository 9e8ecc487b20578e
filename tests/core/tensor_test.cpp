// Shape, strides, Tensor views.
#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "core/device.h"
#include "core/error.h"

namespace ct {
namespace {

TEST(Shape, BasicsAndStrides) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.ndim, 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s[-1], 4);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  EXPECT_EQ(contiguous_strides(s), (Shape{12, 4, 1}));
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ((Shape{3, 0}).numel(), 0);
  EXPECT_NE((Shape{2, 3}), (Shape{3, 2}));
  EXPECT_THROW((Shape{1, 2, 3, 4, 5, 6}), Error);
}

TEST(Tensor, ViewsShareTheBuffer) {
  auto d = make_cpu_device(false);
  Tensor t = d->empty({4, 6}, DType::f32, MemCategory::kActivations);
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[i] = static_cast<float>(i);
  d->upload(t, v.data(), v.size() * 4);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.nbytes(), 96u);

  Tensor r = t.reshape({2, 12});
  EXPECT_EQ(r.buffer, t.buffer);
  EXPECT_EQ(r.strides, (Shape{12, 1}));
  EXPECT_THROW(t.reshape({5, 5}), Error);

  Tensor row = t[2];
  EXPECT_EQ(row.shape, (Shape{6}));
  EXPECT_EQ(row.offset, 2u * 6 * 4);
  float got[6];
  d->download(got, row, sizeof(got));
  EXPECT_EQ(got[0], 12.0f);
  EXPECT_THROW(t[4], Error);

  Tensor s = t.slice_flat(5, {3});
  d->download(got, s, 12);
  EXPECT_EQ(got[0], 5.0f);
  EXPECT_EQ(got[2], 7.0f);
  EXPECT_THROW(t.slice_flat(22, {3}), Error);

  Tensor nc = t;
  nc.strides = Shape{1, 4};  // a transposed view
  EXPECT_FALSE(nc.is_contiguous());
  EXPECT_THROW(d->scale(nc, 2.0f), Error);
  EXPECT_NE(t.describe().find("f32[4, 6]"), std::string::npos);
}

TEST(Tensor, OpsOnViewsTouchOnlyTheView) {
  auto d = make_cpu_device(false);
  Tensor t = d->empty({3, 4}, DType::f32, MemCategory::kActivations);
  d->fill(t, 1.0f);
  d->scale(t[1], 5.0f);
  float got[12];
  d->download(got, t, sizeof(got));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(got[i], (i >= 4 && i < 8) ? 5.0f : 1.0f) << i;
}

}  // namespace
}  // namespace ct
