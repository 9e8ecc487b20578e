// adamw: a hand-computed two-step update, clipping, and every device against the reference over
// steps, with and without clipping. adamw_groups: the bits of adamw run range by range on the
// same device, the elements between ranges untouched, the reference's numbers, and its checks.
// Both with param16: the 16-bit copy they write is copy() of the updated parameters, bit for bit.
#include "tests/common/device_harness.h"

namespace ct::test {
namespace {

using AdamW = DeviceTest;

TEST_P(AdamW, TwoStepsByHand) {
  // p = [1, -2]; grads [0.5, 3] then [-0.25, 1]; lr 0.1, betas (0.9, 0.999), eps 1e-8, wd 0.01.
  // Step 1: m = 0.1 g = [0.05, 0.3]; v = 0.001 g^2 = [2.5e-4, 9e-3]; p *= (1 - lr wd);
  //         mhat / sqrt(vhat) = g / |g| = +-1, so p = [0.999 - 0.1, -1.998 - 0.1] (less eps).
  // Step 2: m = [0.02, 0.37], v = [3.1225e-4, 9.991e-3], bias corrections 0.19 and 0.001999.
  // The values below are these formulas in fp64 with the f32 hyper-parameters (0.9f, 0.999f,
  // ...), e.g. v2 = 0.999f (0.001...) 0.5^2 + (1 - 0.999f) 0.25^2 ~ 3.1225e-4.
  const Vec want_p1 = {0.8990000005173344f, -2.098000001171684f};
  const Vec want_p2 = {0.8714672981392735f, -2.1830083963514952f};
  const Vec want_m2 = {0.020000003576278402f, 0.3700000810623152f};
  const Vec want_v2 = {0.00031224598312373786f, 0.009990871485708652f};
  for (Device* d : {&ref(), &dev()}) {
    Tensor p = upload(*d, {2}, {1.0f, -2.0f}), m = upload(*d, {2}, {0.0f, 0.0f});
    Tensor v = upload(*d, {2}, {0.0f, 0.0f}), g = upload(*d, {2}, {0.5f, 3.0f});
    AdamWHyper hp;
    hp.lr = 0.1f;
    hp.weight_decay = 0.01f;
    hp.step = 1;
    d->adamw(p, g, m, v, Tensor{}, hp);
    Vec p1 = download(*d, p);
    d->upload(g, Vec{-0.25f, 1.0f}.data(), 8);
    hp.step = 2;
    d->adamw(p, g, m, v, Tensor{}, hp);
    Vec p2 = download(*d, p), m2 = download(*d, m), v2 = download(*d, v);
    // Relative 1e-6: the device rounds to f32 along the way.
    auto near = [](float got, float want) { return std::abs(got - want) <= 1e-6 * std::abs(want); };
    for (int i = 0; i < 2; ++i) {
      EXPECT_PRED2(near, p1[i], want_p1[i]) << d->info().name;
      EXPECT_PRED2(near, p2[i], want_p2[i]) << d->info().name;
      EXPECT_PRED2(near, m2[i], want_m2[i]) << d->info().name;
      EXPECT_PRED2(near, v2[i], want_v2[i]) << d->info().name;
    }
  }
}

TEST_P(AdamW, ClipsByGlobalNorm) {
  // grad_norm 10, max 1: g is scaled by 1 / (10 + 1e-6); with m = v = 0 the first step moves
  // p by lr * sign(g) whatever the scale, so check the moments instead.
  for (Device* d : {&ref(), &dev()}) {
    Tensor p = upload(*d, {3}, {1.0f, 1.0f, 1.0f}), m = upload(*d, {3}, Vec(3, 0.0f));
    Tensor v = upload(*d, {3}, Vec(3, 0.0f)), g = upload(*d, {3}, {6.0f, -8.0f, 0.0f});
    Tensor gn = upload(*d, {1}, {10.0f});
    AdamWHyper hp;
    hp.max_grad_norm = 1.0f;
    d->adamw(p, g, m, v, gn, hp);
    Vec mm = download(*d, m);
    double c = 1.0 / (10.0 + 1e-6), one_minus_b1 = 1.0 - static_cast<double>(0.9f);
    EXPECT_NEAR(mm[0], one_minus_b1 * 6.0 * c, 1e-8);
    EXPECT_NEAR(mm[1], -one_minus_b1 * 8.0 * c, 1e-8);
    EXPECT_EQ(mm[2], 0.0f);
    // A norm below the maximum leaves the gradient alone.
    d->upload(gn, Vec{0.5f}.data(), 4);
    d->fill(m, 0.0f);
    d->adamw(p, g, m, v, gn, hp);
    EXPECT_NEAR(download(*d, m)[0], one_minus_b1 * 6.0, 1e-7);
  }
}

TEST_P(AdamW, MatchesReferenceOverSteps) {
  const int64_t n = 100003;
  Vec p0 = randn(n, 1), m0(n, 0.0f), v0(n, 0.0f);
  Vec out[2][3];
  int k = 0;
  for (Device* d : {&ref(), &dev()}) {
    Tensor p = upload(*d, {n}, p0), m = upload(*d, {n}, m0), v = upload(*d, {n}, v0);
    Tensor gn = upload(*d, {1}, {3.0f});
    AdamWHyper hp;
    hp.lr = 3e-4f;
    hp.weight_decay = 0.1f;
    hp.beta2 = 0.95f;
    hp.max_grad_norm = 1.0f;
    for (int s = 1; s <= 3; ++s) {
      Tensor g = upload(*d, {n}, randn(n, 10 + s, 0.01f));
      hp.step = s;
      d->adamw(p, g, m, v, gn, hp);
    }
    out[k][0] = download(*d, p);
    out[k][1] = download(*d, m);
    out[k][2] = download(*d, v);
    ++k;
  }
  EXPECT_TRUE(close_nmse(out[1][0], out[0][0], tol(), "param on " + id()));
  EXPECT_TRUE(close_nmse(out[1][1], out[0][1], tol(), "m on " + id()));
  EXPECT_TRUE(close_nmse(out[1][2], out[0][2], tol(), "v on " + id()));
}

TEST_P(AdamW, WithAndWithoutClippingAgainstTheNormOp) {
  const int64_t n = 5003;
  for (float max_norm : {0.0f, 0.5f}) {
    Pair p = both({n}, randn(n, 130)), g = both({n}, randn(n, 131));
    Pair m = both({n}, randn(n, 132, 0.1f)), v = both({n}, uniform(n, 133, 0.0f, 0.2f));
    Pair gn = both_empty({1});
    dev().norm(gn.d, g.d);
    ref().norm(gn.r, g.r);
    AdamWHyper hp;
    hp.lr = 3e-3f;
    hp.weight_decay = 0.1f;
    hp.step = 7;
    hp.max_grad_norm = max_norm;
    for (int step = 0; step < 3; ++step) {
      hp.step = 7 + step;
      dev().adamw(p.d, g.d, m.d, v.d, gn.d, hp);
      ref().adamw(p.r, g.r, m.r, v.r, gn.r, hp);
    }
    std::string w = max_norm > 0 ? " (clipped)" : "";
    EXPECT_TRUE(same(p, tol(), "adamw param" + w));
    EXPECT_TRUE(same(m, tol(), "adamw m" + w));
    EXPECT_TRUE(same(v, tol(), "adamw v" + w));
  }
}

// Three ranges with gaps between and after them (a padded LM head's rows), decayed or not.
AdamWGroups three_ranges() {
  AdamWGroups gr;
  gr.count = 3;
  gr.ranges[0] = {0, 4000, true};
  gr.ranges[1] = {4096, 2904, true};
  gr.ranges[2] = {7001, 2998, false};
  return gr;
}

void upload_schedule(Device& d, const Tensor& sched, const AdamWHyper& hp) {
  const AdamWSchedule s = adamw_schedule(hp);
  d.upload(sched, &s, sizeof s);
}

TEST_P(AdamW, GroupsGiveTheBitsOfAdamWRangeByRange) {
  const int64_t n = 10007;
  const AdamWGroups gr = three_ranges();
  const Vec p0 = randn(n, 140), m0 = randn(n, 141, 0.1f), v0 = uniform(n, 142, 0.0f, 0.2f);
  for (Device* d : {&ref(), &dev()}) {
    Tensor p = upload(*d, {n}, p0), m = upload(*d, {n}, m0), v = upload(*d, {n}, v0);
    Tensor rp = upload(*d, {n}, p0), rm = upload(*d, {n}, m0), rv = upload(*d, {n}, v0);
    Tensor sched = d->empty({kAdamWScheduleLen}, DType::f32, MemCategory::kOptimizer);
    Tensor gn = d->empty({1}, DType::f32, MemCategory::kWorkspace);
    AdamWHyper hp;
    hp.weight_decay = 0.1f;
    hp.beta2 = 0.95f;
    hp.max_grad_norm = 1.0f;
    for (int s = 1; s <= 3; ++s) {
      Tensor g = upload(*d, {n}, randn(n, 150 + s));
      d->norm(gn, g);
      hp.step = s;
      hp.lr = 1e-3f / static_cast<float>(s);  // a schedule: lr and step change every step
      upload_schedule(*d, sched, hp);
      d->adamw_groups(p, g, m, v, gn, sched, gr, hp);
      AdamWHyper h = hp;
      for (int r = 0; r < gr.count; ++r) {
        const AdamWGroups::Range& q = gr.ranges[r];
        h.weight_decay = q.decay ? hp.weight_decay : 0.0f;
        d->adamw(rp.slice_flat(q.begin, {q.len}), g.slice_flat(q.begin, {q.len}),
                 rm.slice_flat(q.begin, {q.len}), rv.slice_flat(q.begin, {q.len}), gn, h);
      }
    }
    const std::string on = " on " + d->info().id();
    EXPECT_EQ(download(*d, p), download(*d, rp)) << "param" << on;
    EXPECT_EQ(download(*d, m), download(*d, rm)) << "m" << on;
    EXPECT_EQ(download(*d, v), download(*d, rv)) << "v" << on;
    // Between and after the ranges nothing moved.
    const Vec pv = download(*d, p);
    for (int64_t i : {int64_t{4000}, int64_t{4095}, int64_t{7000}, int64_t{9999}, n - 1})
      EXPECT_EQ(pv[static_cast<size_t>(i)], p0[static_cast<size_t>(i)]) << i << on;
  }
}

TEST_P(AdamW, GroupsMatchTheReference) {
  const int64_t n = 10007;
  const AdamWGroups gr = three_ranges();
  Pair p = both({n}, randn(n, 160)), m = both({n}, randn(n, 161, 0.1f));
  Pair v = both({n}, uniform(n, 162, 0.0f, 0.2f)), sched = both_empty({kAdamWScheduleLen});
  Pair gn = both_empty({1});
  AdamWHyper hp;
  hp.weight_decay = 0.1f;
  hp.max_grad_norm = 0.5f;
  for (int s = 1; s <= 3; ++s) {
    Pair g = both({n}, randn(n, 170 + s));
    hp.step = 20 + s;
    hp.lr = 3e-3f * static_cast<float>(s);
    upload_schedule(dev(), sched.d, hp);
    upload_schedule(ref(), sched.r, hp);
    dev().norm(gn.d, g.d);
    ref().norm(gn.r, g.r);
    dev().adamw_groups(p.d, g.d, m.d, v.d, gn.d, sched.d, gr, hp);
    ref().adamw_groups(p.r, g.r, m.r, v.r, gn.r, sched.r, gr, hp);
  }
  EXPECT_TRUE(same(p, tol(), "adamw_groups param"));
  EXPECT_TRUE(same(m, tol(), "adamw_groups m"));
  EXPECT_TRUE(same(v, tol(), "adamw_groups v"));
}

TEST_P(AdamW, GroupsRefuseOverlappingRangesAndABadSchedule) {
  Device& d = dev();
  const int64_t n = 64;
  Tensor p = upload(d, {n}, Vec(n, 1.0f)), g = upload(d, {n}, Vec(n, 0.5f));
  Tensor m = upload(d, {n}, Vec(n, 0.0f)), v = upload(d, {n}, Vec(n, 0.0f));
  Tensor sched = d.empty({kAdamWScheduleLen}, DType::f32, MemCategory::kOptimizer);
  AdamWGroups gr;
  gr.count = 2;
  gr.ranges[0] = {0, 40, true};
  gr.ranges[1] = {32, 8, false};  // starts inside the first
  auto kind = [&](const AdamWGroups& groups, const Tensor& s) {
    try {
      d.adamw_groups(p, g, m, v, Tensor{}, s, groups, AdamWHyper{});
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::kInternal;
  };
  EXPECT_EQ(kind(gr, sched), ErrorKind::kInvalidArgument);
  gr.ranges[1] = {40, 25, false};  // past the end
  EXPECT_EQ(kind(gr, sched), ErrorKind::kInvalidArgument);
  gr.ranges[1] = {40, 24, false};
  EXPECT_EQ(kind(gr, sched.slice_flat(0, {3})), ErrorKind::kInvalidArgument);
  AdamWHyper bad;
  bad.step = 0;
  EXPECT_THROW(adamw_schedule(bad), Error);
}

// Parameters whose 16-bit roundings take every path of the conversion: ordinary values, f16
// subnormals (|p| < 6.1e-5) and zeros, values past f16's range (inf) and near its top.
Vec param16_inputs(int64_t n, uint64_t seed) {
  Vec p = randn(static_cast<size_t>(n), seed);
  for (int64_t i = 0; i < n; i += 7) p[static_cast<size_t>(i)] *= 1e-6f;
  for (int64_t i = 3; i < n; i += 11) p[static_cast<size_t>(i)] *= 4e4f;
  for (int64_t i = 5; i < n; i += 101) p[static_cast<size_t>(i)] = 0.0f;
  return p;
}

// A 16-bit [n] tensor one element into a larger buffer (an offset no binding is aligned to),
// every bit pattern 0x5a5a: what an element the op must not write still holds afterwards.
Tensor sentinel16(Device& d, int64_t n, DType dt) {
  Tensor whole = d.empty({n + 2}, dt, MemCategory::kWeights);
  const std::vector<uint16_t> bits(static_cast<size_t>(n + 2), 0x5a5a);
  d.upload(whole, bits.data(), bits.size() * sizeof(uint16_t));
  return whole.slice_flat(1, {n});
}

// adamw with param16 on `d`: param, m and v as without it, param16 = copy(param) after each step.
void adamw_param16_case(Device& d, DType dt) {
  const int64_t n = 5003;
  const Vec p0 = param16_inputs(n, 180), m0 = randn(n, 181, 0.1f);
  const Vec v0 = uniform(n, 182, 0.0f, 0.2f);
  Tensor p = upload(d, {n}, p0), m = upload(d, {n}, m0), v = upload(d, {n}, v0);
  Tensor rp = upload(d, {n}, p0), rm = upload(d, {n}, m0), rv = upload(d, {n}, v0);
  Tensor h = sentinel16(d, n, dt), want = d.empty({n}, dt, MemCategory::kWeights);
  Tensor gn = d.empty({1}, DType::f32, MemCategory::kWorkspace);
  AdamWHyper hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  hp.max_grad_norm = 1.0f;
  const std::string on = std::string(" ") + dtype_name(dt) + " on " + d.info().id();
  for (int s = 1; s <= 2; ++s) {
    Tensor g = upload(d, {n}, randn(n, 190 + s));
    d.norm(gn, g);
    hp.step = s;
    d.adamw(p, g, m, v, gn, hp, h);
    d.adamw(rp, g, rm, rv, gn, hp);
    d.copy(want, p);
    EXPECT_EQ(raw_download(d, h), raw_download(d, want)) << "param16, step " << s << on;
  }
  EXPECT_EQ(download(d, p), download(d, rp)) << "param" << on;
  EXPECT_EQ(download(d, m), download(d, rm)) << "m" << on;
  EXPECT_EQ(download(d, v), download(d, rv)) << "v" << on;
}

TEST_P(AdamW, Param16IsTheCopyOfTheUpdatedParameters) {
  for (DType dt : {DType::bf16, DType::f16})
    for (Device* d : {&ref(), &dev()}) adamw_param16_case(*d, dt);
}

// adamw_groups with param16 over three_ranges(): inside the ranges copy() of the updated
// parameters, between and after them the sentinel; param, m and v as without param16.
void adamw_groups_param16_case(Device& d, DType dt) {
  const int64_t n = 10007;
  const AdamWGroups gr = three_ranges();
  const Vec p0 = param16_inputs(n, 200), m0 = randn(n, 201, 0.1f);
  const Vec v0 = uniform(n, 202, 0.0f, 0.2f);
  Tensor p = upload(d, {n}, p0), m = upload(d, {n}, m0), v = upload(d, {n}, v0);
  Tensor rp = upload(d, {n}, p0), rm = upload(d, {n}, m0), rv = upload(d, {n}, v0);
  Tensor h = sentinel16(d, n, dt), want = d.empty({n}, dt, MemCategory::kWeights);
  Tensor sched = d.empty({kAdamWScheduleLen}, DType::f32, MemCategory::kOptimizer);
  AdamWHyper hp;
  hp.weight_decay = 0.1f;
  for (int s = 1; s <= 2; ++s) {
    Tensor g = upload(d, {n}, randn(n, 210 + s));
    hp.step = s;
    hp.lr = 2e-2f / static_cast<float>(s);
    upload_schedule(d, sched, hp);
    d.adamw_groups(p, g, m, v, Tensor{}, sched, gr, hp, h);
    d.adamw_groups(rp, g, rm, rv, Tensor{}, sched, gr, hp);
  }
  const std::string on = std::string(" ") + dtype_name(dt) + " on " + d.info().id();
  EXPECT_EQ(download(d, p), download(d, rp)) << "param" << on;
  EXPECT_EQ(download(d, m), download(d, rm)) << "m" << on;
  EXPECT_EQ(download(d, v), download(d, rv)) << "v" << on;
  d.copy(want, p);
  const auto got = download_as<uint16_t>(d, h), copied = download_as<uint16_t>(d, want);
  int64_t wrong = 0, first_wrong = -1;
  for (int64_t i = 0, r = 0; i < n; ++i) {
    while (r < gr.count && i >= gr.ranges[r].begin + gr.ranges[r].len) ++r;
    const bool in = r < gr.count && i >= gr.ranges[r].begin;
    const uint16_t expect = in ? copied[static_cast<size_t>(i)] : uint16_t{0x5a5a};
    if (got[static_cast<size_t>(i)] != expect && wrong++ == 0) first_wrong = i;
  }
  EXPECT_EQ(wrong, 0) << "param16 elements differ from copy() (inside the ranges) or from the "
                         "sentinel (outside), the first at "
                      << first_wrong << on;
}

TEST_P(AdamW, GroupsWriteParam16AsCopyWouldInsideTheRangesOnly) {
  for (DType dt : {DType::bf16, DType::f16})
    for (Device* d : {&ref(), &dev()}) adamw_groups_param16_case(*d, dt);
}

TEST_P(AdamW, Param16MustBeA16BitTensorApartFromTheOthers) {
  Device& d = dev();
  const int64_t n = 64;
  Tensor p = upload(d, {n}, Vec(n, 1.0f)), g = upload(d, {n}, Vec(n, 0.5f));
  Tensor m = upload(d, {n}, Vec(n, 0.0f)), v = upload(d, {n}, Vec(n, 0.0f));
  auto kind = [&](const Tensor& param16) {
    try {
      d.adamw(p, g, m, v, Tensor{}, AdamWHyper{}, param16);
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::kInternal;
  };
  EXPECT_EQ(kind(upload(d, {n}, Vec(n, 0.0f))), ErrorKind::kInvalidArgument);  // f32
  EXPECT_EQ(kind(d.empty({n - 1}, DType::bf16, MemCategory::kWeights)),
            ErrorKind::kInvalidArgument);  // another length
  // bf16 bits over the first half of m's bytes
  Tensor over_m = m;
  over_m.dtype = DType::bf16;
  EXPECT_EQ(kind(over_m), ErrorKind::kInvalidArgument);
}

CT_INSTANTIATE_DEVICE_SUITE(AdamW);

}  // namespace
}  // namespace ct::test
