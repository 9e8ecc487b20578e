// The fused optimizer ops (sgd, lion, adamw_8bit, adafactor): every device against the CPU
// reference over three steps at odd sizes (partial workgroups, a partial 8-bit block), with and
// without clipping, and once on tensors past the device's binding range (chunked).
#include "core/optim/quant_map.h"
#include "tests/common/device_harness.h"

namespace ct::test {
namespace {

using Optimizer = DeviceTest;

Pair zeros(int64_t n) {
  return both({n}, Vec(static_cast<size_t>(n), 0.0f));
}

// Elements whose parameter moved by more than `tol` differently on the two devices.
size_t count_differ(const Vec& a, const Vec& b, float tol) {
  size_t k = 0;
  for (size_t i = 0; i < a.size(); ++i) k += std::abs(a[i] - b[i]) > tol;
  return k;
}

TEST_P(Optimizer, SgdMatchesReference) {
  CT_REQUIRE_SUPPORT(OpKind::kSgd, DType::f32);
  struct Cfg {
    float momentum, dampening;
    bool nesterov;
  };
  for (float max_norm : {0.0f, 1.0f})
    for (Cfg cfg : {Cfg{0.0f, 0.0f, false}, Cfg{0.9f, 0.0f, true}, Cfg{0.8f, 0.25f, false}})
      for (int64_t n : {int64_t{1}, int64_t{100003}}) {
        Pair p = both({n}, randn(n, 300 + n, 0.5f)), buf = zeros(n), gn = both({1}, {4.0f});
        SgdHyper h;
        h.lr = 0.01f, h.momentum = cfg.momentum, h.dampening = cfg.dampening;
        h.nesterov = cfg.nesterov, h.weight_decay = 0.01f, h.max_grad_norm = max_norm;
        for (int s = 1; s <= 3; ++s) {
          Pair g = both({n}, randn(n, 310 + s, 0.05f));
          h.step = s;
          Tensor bv = cfg.momentum != 0.0f ? buf.d : Tensor{},
                 br = cfg.momentum != 0.0f ? buf.r : Tensor{};
          dut().sgd(p.d, g.d, bv, max_norm > 0 ? gn.d : Tensor{}, h);
          ref().sgd(p.r, g.r, br, max_norm > 0 ? gn.r : Tensor{}, h);
        }
        std::string w = " n=" + std::to_string(n) + " momentum=" + std::to_string(cfg.momentum) +
                        (cfg.nesterov ? " nesterov" : "") + (max_norm > 0 ? " clipped" : "");
        EXPECT_TRUE(same(p, dut_tol(), "sgd param" + w));
        if (cfg.momentum != 0.0f) {
          EXPECT_TRUE(same(buf, dut_tol(), "sgd buf" + w));
        }
      }
}

TEST_P(Optimizer, LionMatchesReference) {
  CT_REQUIRE_SUPPORT(OpKind::kLion, DType::f32);
  for (float max_norm : {0.0f, 1.0f})
    for (int64_t n : {int64_t{3}, int64_t{100003}}) {
      Pair p = both({n}, randn(n, 400 + n, 0.5f)), m = zeros(n), gn = both({1}, {4.0f});
      LionHyper h;
      h.weight_decay = 0.1f, h.max_grad_norm = max_norm;
      for (int s = 1; s <= 3; ++s) {
        Pair g = both({n}, randn(n, 410 + s, 0.05f));
        dut().lion(p.d, g.d, m.d, max_norm > 0 ? gn.d : Tensor{}, h);
        ref().lion(p.r, g.r, m.r, max_norm > 0 ? gn.r : Tensor{}, h);
      }
      std::string w = " n=" + std::to_string(n) + (max_norm > 0 ? " clipped" : "");
      EXPECT_TRUE(same(p, dut_tol(), "lion param" + w));
      EXPECT_TRUE(same(m, dut_tol(), "lion m" + w));
      // sign(c) may flip where c rounds to the other side of 0 in f32 vs the reference's f64
      Vec a = download(dut(), p.d), b = download(ref(), p.r);
      EXPECT_LE(count_differ(a, b, 1e-6f), a.size() / 10000) << "lion sign flips" << w;
    }
}

struct Adam8 {
  Pair p, mq, vq, ma, va, qs, qu;
};

Adam8 make_adam8(int64_t n, uint64_t seed) {
  Adam8 s;
  s.p = both({n}, randn(n, seed, 0.5f));
  s.mq = both_empty({n}, DType::u8);
  s.vq = both_empty({n}, DType::u8);
  for (Pair* q : {&s.mq, &s.vq}) {
    dut().fill(q->d, 0.0f);
    ref().fill(q->r, 0.0f);
  }
  s.ma = zeros(quant_blocks(n));
  s.va = zeros(quant_blocks(n));
  s.qs = both({256}, Vec(dynamic_map_signed().begin(), dynamic_map_signed().end()));
  s.qu = both({256}, Vec(dynamic_map_unsigned().begin(), dynamic_map_unsigned().end()));
  return s;
}

void step_adam8(Adam8& s, const Pair& g, const Pair& gn, const AdamWHyper& h) {
  bool clip = h.max_grad_norm > 0;
  dut().adamw_8bit(s.p.d, g.d, s.mq.d, s.vq.d, s.ma.d, s.va.d, s.qs.d, s.qu.d,
                   clip ? gn.d : Tensor{}, h);
  ref().adamw_8bit(s.p.r, g.r, s.mq.r, s.vq.r, s.ma.r, s.va.r, s.qs.r, s.qu.r,
                   clip ? gn.r : Tensor{}, h);
}

// The 8-bit contract's bounds (tests/ops/optimizer_ops_test.cpp): indices within 1 and equal on
// >= 99.9%, absmax within 1e-5 relative.
void expect_adam8_close(const Adam8& s, const std::string& w) {
  EXPECT_TRUE(same(s.p, dut_tol(), "adamw_8bit param" + w));
  for (const Pair* a : {&s.ma, &s.va}) {
    Vec got = download(dut(), a->d), want = download(ref(), a->r);
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      bad += std::abs(got[i] - want[i]) > 1e-5f * std::abs(want[i]);
    EXPECT_EQ(bad, 0u) << "adamw_8bit absmax" << w << (a == &s.ma ? " (m)" : " (v)");
  }
  for (const Pair* q : {&s.mq, &s.vq}) {
    auto got = download_as<uint8_t>(dut(), q->d), want = download_as<uint8_t>(ref(), q->r);
    size_t equal = 0, far = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      equal += got[i] == want[i];
      far += std::abs(int(got[i]) - int(want[i])) > 1;
    }
    std::string which = q == &s.mq ? " m_q" : " v_q";
    if (std::getenv("CT_PRINT_NMSE"))
      std::printf("  adamw_8bit%s%s: %zu of %zu indices equal, %zu off by more than 1\n",
                  which.c_str(), w.c_str(), equal, got.size(), far);
    EXPECT_EQ(far, 0u) << "adamw_8bit" << which << w;
    EXPECT_GE(equal, got.size() * 999 / 1000) << "adamw_8bit" << which << w;
  }
}

TEST_P(Optimizer, AdamW8bitMatchesReference) {
  CT_REQUIRE_SUPPORT(OpKind::kAdamW8bit, DType::f32);
  for (float max_norm : {0.0f, 1.0f})
    for (int64_t n : {int64_t{5}, int64_t{100003}}) {
      Adam8 s = make_adam8(n, 500 + n);
      Pair gn = both({1}, {4.0f});
      AdamWHyper h;
      h.lr = 1e-3f, h.weight_decay = 0.1f, h.beta2 = 0.95f, h.max_grad_norm = max_norm;
      for (int st = 1; st <= 3; ++st) {
        Pair g = both({n}, randn(n, 510 + st, 0.05f));
        h.step = st;
        step_adam8(s, g, gn, h);
      }
      expect_adam8_close(s, " n=" + std::to_string(n) + (max_norm > 0 ? " clipped" : ""));
    }
}

struct Afactor {
  Pair p, row, col, v, ea;
};

// `steps` Adafactor steps on both devices; factored for a rank >= 2 shape.
Afactor run_adafactor(const Shape& shape, const AdafactorHyper& base, int steps, uint64_t seed) {
  const int64_t n = shape.numel();
  const bool factored = shape.ndim >= 2;
  const int64_t C = factored ? shape[shape.ndim - 1] : n, R = n / C;
  Afactor a;
  a.p = both(shape, randn(static_cast<size_t>(n), seed, 0.5f));
  if (factored) {
    a.row = zeros(R);
    a.col = zeros(C);
  } else {
    a.v = zeros(n);
  }
  if (base.beta1 > 0) a.ea = zeros(n);
  Pair gn = both({1}, {4.0f});
  AdafactorHyper h = base;
  for (int s = 1; s <= steps; ++s) {
    Pair g = both(shape, randn(static_cast<size_t>(n), seed + 10 + s, 0.05f));
    h.step = s;
    Tensor cv = h.max_grad_norm > 0 ? gn.d : Tensor{}, cr = h.max_grad_norm > 0 ? gn.r : Tensor{};
    dut().adafactor(a.p.d, g.d, a.row.d, a.col.d, a.v.d, a.ea.d, cv, h);
    ref().adafactor(a.p.r, g.r, a.row.r, a.col.r, a.v.r, a.ea.r, cr, h);
  }
  return a;
}

TEST_P(Optimizer, AdafactorMatchesReference) {
  CT_REQUIRE_SUPPORT(OpKind::kAdafactor, DType::f32);
  AdafactorHyper hf;  // the CPU optimizer test's settings
  hf.relative_step = hf.scale_parameter = true;
  hf.beta1 = 0.9f, hf.weight_decay = 0.01f, hf.max_grad_norm = 1.0f;
  AdafactorHyper plain;  // fixed lr, no first moment, no clipping
  plain.lr = 1e-2f;
  for (const Shape& shape : {Shape{301, 257}, Shape{3, 41, 37}, Shape{70001}, Shape{1, 5}})
    for (const AdafactorHyper* h : {&hf, &plain}) {
      Afactor a = run_adafactor(shape, *h, 3, 700 + shape.numel());
      std::string w = " " + shape.str() + (h == &hf ? " relative/scaled/beta1/clipped" : " plain");
      EXPECT_TRUE(same(a.p, dut_tol(), "adafactor param" + w));
      if (shape.ndim >= 2) {
        EXPECT_TRUE(same(a.row, dut_tol(), "adafactor row" + w));
        EXPECT_TRUE(same(a.col, dut_tol(), "adafactor col" + w));
      } else {
        EXPECT_TRUE(same(a.v, dut_tol(), "adafactor v" + w));
      }
      if (h->beta1 > 0) {
        EXPECT_TRUE(same(a.ea, dut_tol(), "adafactor exp_avg" + w));
      }
    }
}

TEST_P(Optimizer, AdafactorIsDeterministic) {
  CT_REQUIRE_SUPPORT(OpKind::kAdafactor, DType::f32);
  AdafactorHyper h;
  h.relative_step = h.scale_parameter = true;
  Afactor a = run_adafactor({301, 257}, h, 2, 800), b = run_adafactor({301, 257}, h, 2, 800);
  EXPECT_EQ(download(dut(), a.p.d), download(dut(), b.p.d));
  EXPECT_EQ(download(dut(), a.col.d), download(dut(), b.col.d));
}

// Chunked: the tensors span more than one binding (maxStorageBufferRange on Vulkan).
TEST_P(Optimizer, BeyondMaxBufferRange) {
  for (OpKind op : {OpKind::kLion, OpKind::kAdamW8bit, OpKind::kAdafactor})
    CT_REQUIRE_SUPPORT(op, DType::f32);
  const int64_t n = dut().info().max_buffer_range_bytes / 4 + 1001;
  // p, g, m on both devices and on the host
  if (std::string why = cannot_hold(n * 4, 9); !why.empty()) GTEST_SKIP() << why;
  Pair gn = both({1}, {4.0f});
  Pair g = both({n}, randn(static_cast<size_t>(n), 601, 0.05f));
  {
    Pair p = both({n}, randn(static_cast<size_t>(n), 600, 0.5f)), m = zeros(n);
    LionHyper h;
    h.max_grad_norm = 1.0f;
    dut().lion(p.d, g.d, m.d, gn.d, h);
    ref().lion(p.r, g.r, m.r, gn.r, h);
    EXPECT_TRUE(same(p, dut_tol(), "lion param (large)"));
    EXPECT_TRUE(same(m, dut_tol(), "lion m (large)"));
  }
  {
    Adam8 s = make_adam8(n, 602);
    AdamWHyper h;
    h.max_grad_norm = 1.0f;
    step_adam8(s, g, gn, h);
    expect_adam8_close(s, " (large)");
  }
  {
    // factored: the rows split over two bindings, column sums from per-chunk partials
    const int64_t C = 64, R = n / C;
    AdafactorHyper h;
    h.relative_step = h.scale_parameter = true, h.beta1 = 0.9f;
    Afactor a = run_adafactor({R, C}, h, 1, 603);
    EXPECT_TRUE(same(a.p, dut_tol(), "adafactor param (large)"));
    EXPECT_TRUE(same(a.row, dut_tol(), "adafactor row (large)"));
    EXPECT_TRUE(same(a.col, dut_tol(), "adafactor col (large)"));
  }
}

CT_INSTANTIATE_DEVICE_SUITE(Optimizer);

}  // namespace
}  // namespace ct::test
