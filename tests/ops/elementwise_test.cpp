// fill (every dtype), copy (f32 <-> f16 <-> bf16, edge values), add, accumulate, scale: every
// device against the reference and the host's conversions.
#include <cstring>

#include "tests/common/device_harness.h"

namespace ct::test {
namespace {

using Elementwise = DeviceTest;

TEST_P(Elementwise, FillEveryDtype) {
  Device& d = dev();
  std::string skipped;
  for (int64_t n : {3, 1011, 70001}) {
    auto check = [&](DType dt, float value, auto expect) {
      std::string why = unsupported(OpKind::kFill, dt);
      if (!why.empty()) {
        if (n == 3) skipped += "; " + why;
        return;
      }
      Tensor t = d.empty({n}, dt, MemCategory::kActivations);
      d.fill(t, value);
      auto bytes = raw_download(d, t);
      Tensor r = ref().empty({n}, dt, MemCategory::kActivations);
      ref().fill(r, value);
      EXPECT_EQ(bytes, raw_download(ref(), r)) << id() << " " << dtype_name(dt) << " n " << n;
      using E = decltype(expect);
      for (int64_t i = 0; i < n; i += n / 3 + 1) {
        E got;
        std::memcpy(&got, bytes.data() + i * sizeof(E), sizeof(E));
        ASSERT_EQ(got, expect) << id() << " " << dtype_name(dt) << " n " << n;
      }
    };
    check(DType::f32, -1.5f, -1.5f);
    check(DType::f16, -1.5f, f32_to_f16(-1.5f));
    check(DType::bf16, 3.14159f, f32_to_bf16(3.14159f));
    check(DType::bf16, -2.75f, f32_to_bf16(-2.75f));
    check(DType::i32, -7.9f, int32_t{-7});
    check(DType::i8, 300.0f, int8_t{127});
    check(DType::u8, 42.7f, uint8_t{42});
  }
  if (!skipped.empty()) GTEST_SKIP() << "the supported dtypes passed" << skipped;
}

TEST_P(Elementwise, FillOddOffsetView16) {
  CT_REQUIRE_SUPPORT(OpKind::kFill, DType::bf16);
  Tensor t = dev().empty({9}, DType::bf16, MemCategory::kActivations);
  dev().fill(t, 0.0f);
  dev().fill(t.slice_flat(3, {3}), 1.0f);
  auto got = download_as<uint16_t>(dev(), t);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(got[i], (i >= 3 && i < 6) ? 0x3f80 : 0) << i;
}

TEST_P(Elementwise, CopyConvertsBetweenFloatTypes) {
  CT_REQUIRE_SUPPORT(OpKind::kCopy, DType::f16);
  CT_REQUIRE_SUPPORT(OpKind::kCopy, DType::bf16);
  Device& d = dev();
  Vec x = randn(50001, 1, 10.0f);
  x[0] = 1e6f;  // beyond f16: inf
  x[1] = NAN;
  x[2] = 1e-7f;  // f16 subnormal
  int64_t n = static_cast<int64_t>(x.size());
  Tensor src = upload(d, {n}, x);
  Tensor h = d.empty({n}, DType::f16, MemCategory::kActivations);
  Tensor b = d.empty({n}, DType::bf16, MemCategory::kActivations);
  Tensor b2 = d.empty({n}, DType::bf16, MemCategory::kActivations);
  Tensor back = d.empty({n}, DType::f32, MemCategory::kActivations);
  d.copy(h, src);
  d.copy(b, src);
  auto hb = raw_download(d, h), bb = raw_download(d, b);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t hv, bv;
    std::memcpy(&hv, hb.data() + 2 * i, 2);
    std::memcpy(&bv, bb.data() + 2 * i, 2);
    ASSERT_EQ(hv, f32_to_f16(x[i])) << i;
    ASSERT_EQ(bv, f32_to_bf16(x[i])) << i;
  }
  d.copy(back, h);
  Vec hf = download(d, back);
  d.copy(back, b);
  Vec bf = download(d, back);
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) {
      ASSERT_TRUE(std::isnan(hf[i]) && std::isnan(bf[i]));
      continue;
    }
    ASSERT_EQ(hf[i], f16_to_f32(f32_to_f16(x[i]))) << i;
    ASSERT_EQ(bf[i], bf16_to_f32(f32_to_bf16(x[i]))) << i;
  }
  d.copy(b2, h);  // f16 -> bf16 through f32
  auto b2b = raw_download(d, b2);
  uint16_t v;
  std::memcpy(&v, b2b.data() + 2 * 5, 2);
  EXPECT_EQ(v, f32_to_bf16(f16_to_f32(f32_to_f16(x[5]))));
  Tensor same = d.empty({n}, DType::f32, MemCategory::kActivations);
  d.copy(same, src);
  EXPECT_EQ(raw_download(d, same), raw_download(d, src));
}

// Every pair of float types, through a middle one, on edge values (ties, overflow, subnormals,
// NaN, inf): byte for byte what the reference gives.
TEST_P(Elementwise, CopyConvertsLikeTheReference) {
  Vec x = randn(4099, 2, 3.0f);
  Vec edges = {
      0.0f,   -0.0f, 1.0f + 1.0f / 256, 65504.0f,  65520.0f,    1e-7f,      6e-8f, 3e-5f, 1e30f,
      -1e30f, NAN,   INFINITY,          -INFINITY, 1.00390625f, 1.01171875f};
  x.insert(x.end(), edges.begin(), edges.end());
  Shape s{static_cast<int64_t>(x.size())};
  DType fl[] = {DType::f32, DType::f16, DType::bf16};
  std::string skipped;
  for (DType from : fl)
    for (DType to : fl) {
      std::string why = unsupported(OpKind::kCopy, from) + unsupported(OpKind::kCopy, to);
      if (!why.empty()) {
        skipped += "; " + why;
        continue;
      }
      Pair src = both(s, x);
      Pair mid = both_empty(s, from), out = both_empty(s, to);
      dev().copy(mid.d, src.d);
      ref().copy(mid.r, src.r);
      dev().copy(out.d, mid.d);
      ref().copy(out.r, mid.r);
      EXPECT_EQ(raw_download(dev(), out.d), raw_download(ref(), out.r))
          << dtype_name(from) << " -> " << dtype_name(to);
    }
  if (!skipped.empty()) GTEST_SKIP() << "the supported pairs passed" << skipped;
}

// One IEEE add or multiply per element: the same bits on every device.
TEST_P(Elementwise, AddAccumulateScale) {
  for (int64_t n : {1, 13, 10007, 100003}) {
    Vec a = randn(n, 1 + n), b = randn(n, 2 + n);
    Vec res[2][3];
    int k = 0;
    for (Device* d : {&ref(), &dev()}) {
      Tensor ta = upload(*d, {n}, a), tb = upload(*d, {n}, b), out = upload(*d, {n}, Vec(n, NAN));
      d->add(out, ta, tb);
      res[k][0] = download(*d, out);
      d->accumulate(ta, tb);
      res[k][1] = download(*d, ta);
      d->scale(tb, -0.375f);
      res[k][2] = download(*d, tb);
      ++k;
    }
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(res[0][0][i], a[i] + b[i]);
      ASSERT_EQ(res[0][1][i], a[i] + b[i]);
      ASSERT_EQ(res[0][2][i], b[i] * -0.375f);
    }
    for (int j = 0; j < 3; ++j)
      EXPECT_EQ(res[1][j], res[0][j]) << id() << " n " << n << " op " << j;
  }
}

CT_INSTANTIATE_DEVICE_SUITE(Elementwise);

// Argument checks and supports() answers of the CPU backend's devices.
TEST(CpuElementwise, RejectsCountMismatchAndOverlappingConversion) {
  for (const char* spec : {"cpu:1", "cpu:0"}) {
    Device& d = open_cached(spec);
    Tensor a = upload(d, {4}, Vec(4, 0.0f)), b = upload(d, {5}, Vec(5, 0.0f));
    EXPECT_THROW(d.copy(a, b), Error);
    Tensor h = a;  // the same bytes viewed as bf16
    h.dtype = DType::bf16;
    EXPECT_THROW(d.copy(h, a), Error);
    Tensor s = upload(d, {6}, {1, 2, 3, 4, 5, 6});
    d.copy(s.slice_flat(0, {4}), s.slice_flat(2, {4}));  // same dtype: a memmove
    EXPECT_EQ(download(d, s), (Vec{3, 4, 5, 6, 5, 6}));
  }
}

TEST(CpuElementwise, RejectsWrongDtypeAndForeignTensors) {
  Device& fast = open_cached("cpu:0");
  Tensor h = fast.empty({4}, DType::f16, MemCategory::kActivations);
  Tensor f = upload(fast, {4}, Vec(4, 1.0f));
  Tensor i = fast.empty({4}, DType::i32, MemCategory::kActivations);
  try {
    fast.scale(h, 2.0f);  // scale is f32-only: unsupported, not a bad argument
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
  }
  EXPECT_THROW(fast.add(h, f, f), Error);  // out must be f32
  EXPECT_THROW(fast.add(f, f, i), Error);
  Tensor other = upload(ref(), {4}, Vec(4, 1.0f));
  try {
    fast.accumulate(f, other);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another device"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fast.supports(OpKind::kMatmul, DType::bf16));
  EXPECT_TRUE(fast.supports(OpKind::kMatmul, DType::f32));
  EXPECT_TRUE(fast.supports(OpKind::kCopy, DType::bf16));
  EXPECT_FALSE(fast.supports(OpKind::kAdamW, DType::bf16));
  EXPECT_TRUE(fast.supports(OpKind::kEmbedding, DType::f16));  // 16-bit tables: a frozen base
  EXPECT_FALSE(fast.supports(OpKind::kSum, DType::f16));
  EXPECT_FALSE(fast.supports(OpKind::kMatmul, DType::i8));
}

}  // namespace
}  // namespace ct::test
