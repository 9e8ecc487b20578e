// Optimizer ops: every device against the reference over several steps at sizes that split into
// many OpenMP chunks and partial 8-bit blocks; a hand-computed Lion and SGD step; the 8-bit state
// against fp32 AdamW; the CPU kernels' 8-bit quantisation; the CPU reference's argument checks.
#include <algorithm>

#include "backends/cpu/kernels.h"
#include "core/optim/quant_map.h"
#include "tests/common/device_harness.h"

namespace ct::test {
namespace {

std::vector<uint8_t> download_u8(Device& d, const Tensor& t) {
  std::vector<uint8_t> v(static_cast<size_t>(t.numel()));
  d.download(v.data(), t, v.size());
  return v;
}

using OptimizerOps = DeviceTest;

TEST_P(OptimizerOps, LionAndSgdByHand) {
  CT_REQUIRE_SUPPORT(OpKind::kLion, DType::f32);
  CT_REQUIRE_SUPPORT(OpKind::kSgd, DType::f32);
  for (Device* d : {&ref(), &dev()}) {
    // Lion: m = 0, g = [2, -1, 0]: c = 0.1 g, sign = [1, -1, 0]; p = p (1 - lr wd) - lr sign.
    Tensor p = upload(*d, {3}, {1.0f, 1.0f, 1.0f}), g = upload(*d, {3}, {2.0f, -1.0f, 0.0f});
    Tensor m = upload(*d, {3}, Vec(3, 0.0f));
    LionHyper lh;
    lh.lr = 0.1f;
    lh.weight_decay = 0.5f;
    d->lion(p, g, m, Tensor{}, lh);
    Vec pv = download(*d, p), mv = download(*d, m);
    EXPECT_NEAR(pv[0], 0.95f - 0.1f, 1e-6);
    EXPECT_NEAR(pv[1], 0.95f + 0.1f, 1e-6);
    EXPECT_NEAR(pv[2], 0.95f, 1e-6);
    EXPECT_NEAR(mv[0], (1.0 - static_cast<double>(0.99f)) * 2.0, 1e-7);
    // SGD, momentum 0.9: step 1 buf = g; step 2 buf = 0.9 g1 + g2; nesterov adds 0.9 buf.
    Tensor q = upload(*d, {1}, {1.0f}), gg = upload(*d, {1}, {1.0f}), buf = upload(*d, {1}, {0.0f});
    SgdHyper sh;
    sh.lr = 0.1f;
    sh.momentum = 0.9f;
    sh.nesterov = true;
    d->sgd(q, gg, buf, Tensor{}, sh);  // g' = 1 + 0.9 * 1 = 1.9
    EXPECT_NEAR(download(*d, q)[0], 1.0f - 0.19f, 1e-6);
    sh.step = 2;
    d->sgd(q, gg, buf, Tensor{}, sh);  // buf = 1.9, g' = 1 + 1.71 = 2.71
    EXPECT_NEAR(download(*d, buf)[0], 1.9f, 1e-6);
    EXPECT_NEAR(download(*d, q)[0], 0.81f - 0.271f, 1e-6);
  }
}

TEST(CpuOptimizerKernels, QuantizeNearestPicksTheClosestCode) {
  const auto& s = dynamic_map_signed();
  const auto& u = dynamic_map_unsigned();
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(cpu::quantize_nearest(s.data(), s[i]), i);
    EXPECT_EQ(cpu::quantize_nearest(u.data(), u[i]), i);
  }
  Vec xs = uniform(20000, 3, -1.0f, 1.0f);
  for (float x : xs) {
    int q = cpu::quantize_nearest(s.data(), x);
    for (int i = 0; i < 256; ++i) ASSERT_LE(std::abs(s[q] - x), std::abs(s[i] - x)) << x;
  }
  EXPECT_EQ(cpu::quantize_nearest(s.data(), 2.0f), 255);
  EXPECT_EQ(cpu::quantize_nearest(u.data(), -1.0f), 0);
}

// Runs `steps` steps of op on device d from fixed inputs; returns param and float state.
struct OpRun {
  Vec param;
  std::vector<Vec> state;
  std::vector<std::vector<uint8_t>> q;
};

OpRun run_op(Device& d, const std::string& op, const Shape& shape, int steps) {
  const int64_t n = shape.numel();
  Tensor p = upload(d, shape, randn(n, 1, 0.5f));
  Tensor gn = upload(d, {1}, {4.0f});
  OpRun r;
  auto z = [&](int64_t k) { return upload(d, {k}, Vec(static_cast<size_t>(k), 0.0f)); };
  std::vector<Tensor> st;
  Tensor mq, vq, qs, qu;
  if (op == "adamw_8bit") {
    mq = d.empty({n}, DType::u8, MemCategory::kOptimizer);
    vq = d.empty({n}, DType::u8, MemCategory::kOptimizer);
    d.fill(mq, 0.0f);
    d.fill(vq, 0.0f);
    st = {z(quant_blocks(n)), z(quant_blocks(n))};
    qs = upload(d, {256}, Vec(dynamic_map_signed().begin(), dynamic_map_signed().end()));
    qu = upload(d, {256}, Vec(dynamic_map_unsigned().begin(), dynamic_map_unsigned().end()));
  } else if (op == "adafactor") {
    if (shape.ndim == 2)
      st = {z(shape[0]), z(shape[1]), z(n)};
    else
      st = {z(n), z(n)};
  } else {
    st = {z(n)};
  }
  for (int s = 1; s <= steps; ++s) {
    Tensor g = upload(d, shape, randn(n, 100 + s, 0.05f));
    if (op == "sgd") {
      SgdHyper h;
      h.lr = 0.01f, h.momentum = 0.9f, h.weight_decay = 0.01f, h.nesterov = true, h.step = s;
      h.max_grad_norm = 1.0f;
      d.sgd(p, g, st[0], gn, h);
    } else if (op == "lion") {
      LionHyper h;
      h.weight_decay = 0.1f, h.max_grad_norm = 1.0f;
      d.lion(p, g, st[0], gn, h);
    } else if (op == "adamw_8bit") {
      AdamWHyper h;
      h.lr = 1e-3f, h.weight_decay = 0.1f, h.beta2 = 0.95f, h.step = s, h.max_grad_norm = 1.0f;
      d.adamw_8bit(p, g, mq, vq, st[0], st[1], qs, qu, gn, h);
    } else {
      AdafactorHyper h;
      h.relative_step = h.scale_parameter = true;
      h.beta1 = 0.9f, h.weight_decay = 0.01f, h.step = s, h.max_grad_norm = 1.0f;
      if (shape.ndim == 2)
        d.adafactor(p, g, st[0], st[1], Tensor{}, st[2], gn, h);
      else
        d.adafactor(p, g, Tensor{}, Tensor{}, st[0], st[1], gn, h);
    }
  }
  r.param = download(d, p);
  for (const Tensor& t : st) r.state.push_back(download(d, t));
  if (mq.defined()) r.q = {download_u8(d, mq), download_u8(d, vq)};
  return r;
}

TEST_P(OptimizerOps, MatchesReferenceOverSteps) {
  for (OpKind op : {OpKind::kSgd, OpKind::kLion, OpKind::kAdamW8bit, OpKind::kAdafactor})
    CT_REQUIRE_SUPPORT(op, DType::f32);
  struct Case {
    std::string op;
    Shape shape;
  };
  for (const Case& c : {Case{"sgd", {100003}}, Case{"lion", {100003}}, Case{"adamw_8bit", {100003}},
                        Case{"adafactor", {301, 257}}, Case{"adafactor", {70001}}}) {
    OpRun a = run_op(ref(), c.op, c.shape, 3), b = run_op(dev(), c.op, c.shape, 3);
    std::string tag = c.op + c.shape.str() + " on " + id();
    // Lion's sign() flips where b1 m + (1-b1) g rounds to the other side of 0 in f32 vs f64:
    // count those instead of comparing by MSE.
    if (c.op == "lion") {
      size_t differ = 0;
      for (size_t i = 0; i < a.param.size(); ++i)
        differ += std::abs(a.param[i] - b.param[i]) > 1e-6f;
      EXPECT_LE(differ, a.param.size() / 10000) << tag;
    } else {
      EXPECT_TRUE(close_nmse(b.param, a.param, tol(), tag + " param"));
    }
    for (size_t k = 0; k < a.state.size(); ++k)
      EXPECT_TRUE(close_nmse(b.state[k], a.state[k],
                             c.op == "adamw_8bit" ? std::max(1e-9, tol()) : tol(),
                             tag + " state " + std::to_string(k)));
    for (size_t k = 0; k < a.q.size(); ++k) {
      size_t same = 0;
      for (size_t i = 0; i < a.q[k].size(); ++i) {
        EXPECT_LE(std::abs(int(a.q[k][i]) - int(b.q[k][i])), 1)
            << tag << " q" << k << "[" << i << "]";
        same += a.q[k][i] == b.q[k][i];
      }
      EXPECT_GE(same, a.q[k].size() * 999 / 1000) << tag << " q" << k;
    }
  }
}

TEST_P(OptimizerOps, IsDeterministic) {
  CT_REQUIRE_SUPPORT(OpKind::kAdafactor, DType::f32);
  OpRun a = run_op(dev(), "adafactor", {301, 257}, 2),
        b = run_op(dev(), "adafactor", {301, 257}, 2);
  EXPECT_EQ(a.param, b.param);
  EXPECT_EQ(a.state, b.state);
}

TEST_P(OptimizerOps, EightBitStateTracksFp32Adam) {
  CT_REQUIRE_SUPPORT(OpKind::kAdamW8bit, DType::f32);
  // Over 10 steps the 8-bit moments stay close to fp32 AdamW's: parameters within a small
  // relative error of the distance travelled.
  const int64_t n = 65536;
  Device& d = dev();
  Vec p0 = randn(n, 5, 0.5f);
  Tensor p8 = upload(d, {n}, p0), p32 = upload(d, {n}, p0);
  Tensor m = upload(d, {n}, Vec(n, 0.0f)), v = upload(d, {n}, Vec(n, 0.0f));
  Tensor mq = d.empty({n}, DType::u8, MemCategory::kOptimizer),
         vq = d.empty({n}, DType::u8, MemCategory::kOptimizer);
  d.fill(mq, 0.0f);
  d.fill(vq, 0.0f);
  Tensor ma = upload(d, {n / 256}, Vec(n / 256, 0.0f)),
         va = upload(d, {n / 256}, Vec(n / 256, 0.0f));
  Tensor qs = upload(d, {256}, Vec(dynamic_map_signed().begin(), dynamic_map_signed().end()));
  Tensor qu = upload(d, {256}, Vec(dynamic_map_unsigned().begin(), dynamic_map_unsigned().end()));
  AdamWHyper h;
  h.lr = 1e-3f;
  for (int s = 1; s <= 10; ++s) {
    Tensor g = upload(d, {n}, randn(n, 200 + s, 0.05f));
    h.step = s;
    d.adamw(p32, g, m, v, Tensor{}, h);
    d.adamw_8bit(p8, g, mq, vq, ma, va, qs, qu, Tensor{}, h);
  }
  Vec a = download(d, p32), b = download(d, p8);
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += (a[i] - p0[i]) * (a[i] - p0[i]);
  }
  std::printf("  8-bit vs fp32 AdamW after 10 steps: |dp8 - dp32| / |dp32| = %.4f\n",
              std::sqrt(num / den));
  EXPECT_LT(std::sqrt(num / den), 0.05);
}

CT_INSTANTIATE_DEVICE_SUITE(OptimizerOps);

TEST(CpuOptimizerOps, ArgumentChecks) {
  Device& d = ref();
  Tensor p = upload(d, {4, 3}, Vec(12, 1.0f)), g = upload(d, {4, 3}, Vec(12, 0.1f));
  AdafactorHyper h;
  EXPECT_THROW(
      d.adafactor(p, g, Tensor{}, Tensor{}, upload(d, {12}, Vec(12, 0.0f)), Tensor{}, Tensor{}, h),
      Error);
  EXPECT_THROW(d.adafactor(p, g, upload(d, {3}, Vec(3, 0.0f)), upload(d, {3}, Vec(3, 0.0f)),
                           Tensor{}, Tensor{}, Tensor{}, h),
               Error);
  AdamWHyper a;
  Tensor q = d.empty({12}, DType::u8, MemCategory::kOptimizer);
  Tensor one = upload(d, {1}, {0.0f}), q256 = upload(d, {256}, Vec(256, 0.0f));
  d.fill(q, 0.0f);
  Tensor q2 = d.empty({12}, DType::u8, MemCategory::kOptimizer);
  d.fill(q2, 0.0f);
  EXPECT_NO_THROW(d.adamw_8bit(p, g, q, q2, one, upload(d, {1}, {0.0f}), q256, q256, Tensor{}, a));
  EXPECT_THROW(d.adamw_8bit(p, g, g, g, one, one, q256, q256, Tensor{}, a), Error);  // q must be u8
  SgdHyper s;
  s.momentum = 0.9f;
  EXPECT_THROW(d.sgd(p, g, Tensor{}, Tensor{}, s), Error);
}

}  // namespace
}  // namespace ct::test
