// The argument checks of core/op_checks.cpp, each rule once, over every device the registry
// lists (cpu:0, cpu:1, and every Vulkan device -- pinned to lavapipe where it is installed):
// the same error kind and the same message everywhere, since the checks run in core.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/registry.h"
#include "tests/common/test_data.h"

namespace ct {
namespace {

// As tests/common/device_harness.h: lavapipe unless the environment already chose a driver.
const bool kPinned = [] {
#ifdef CT_VK_LAVAPIPE_ICD
  if (std::getenv("VK_DRIVER_FILES") || std::getenv("VK_ICD_FILENAMES")) return false;
  setenv("VK_DRIVER_FILES", CT_VK_LAVAPIPE_ICD, 1);
  setenv("VK_ICD_FILENAMES", CT_VK_LAVAPIPE_ICD, 1);
  return true;
#else
  return false;
#endif
}();

// Every device of every available backend, opened once and closed by the test main's
// shutdown_backends() (never by a static destructor).
std::vector<Device*>& devices() {
  static std::vector<std::unique_ptr<Device>>* owned = [] {
    auto* v = new std::vector<std::unique_ptr<Device>>();  // leaked: see above
    for (const auto& e : backends()) {
      if (!e.backend || !e.error.empty()) continue;
      int n = static_cast<int>(e.backend->devices().size());
      for (int i = 0; i < n; ++i) v->push_back(e.backend->open(i));
    }
    at_backend_shutdown([v] { v->clear(); });
    return v;
  }();
  static std::vector<Device*> raw = [] {
    std::vector<Device*> r;
    for (auto& d : *owned) r.push_back(d.get());
    return r;
  }();
  return raw;
}

using Vec = std::vector<float>;

Tensor up(Device& d, const Shape& s, const Vec& v, DType dt = DType::f32) {
  Tensor t = d.empty(s, DType::f32, MemCategory::kActivations);
  d.upload(t, v.data(), v.size() * sizeof(float));
  if (dt == DType::f32) return t;
  Tensor h = d.empty(s, dt, MemCategory::kActivations);
  d.copy(h, t);
  return h;
}
Tensor up_i32(Device& d, const Shape& s, const std::vector<int32_t>& v) {
  Tensor t = d.empty(s, DType::i32, MemCategory::kActivations);
  d.upload(t, v.data(), v.size() * sizeof(int32_t));
  return t;
}
Vec down(Device& d, const Tensor& t) {
  return testdata::download_as<float>(d, t);
}

struct Outcome {
  bool threw = false;
  ErrorKind kind = ErrorKind::kInternal;
  std::string what;
};
Outcome run(const std::function<void()>& f) {
  Outcome o;
  try {
    f();
  } catch (const Error& e) {
    o.threw = true;
    o.kind = e.kind();
    o.what = e.what();
  }
  return o;
}

// Runs `call` on every device: each must throw `kind` with a message containing `part`, and
// the messages must be the same on every device (where `same_text`).
void expect_rule(const std::function<void(Device&)>& call, ErrorKind kind, const std::string& part,
                 bool same_text = true) {
  ASSERT_GE(devices().size(), 2u);
  std::string first;
  for (Device* d : devices()) {
    SCOPED_TRACE(d->info().id());
    Outcome o = run([&] { call(*d); });
    ASSERT_TRUE(o.threw) << "no error";
    EXPECT_EQ(o.kind, kind) << o.what;
    EXPECT_NE(o.what.find(part), std::string::npos) << o.what;
    if (first.empty()) {
      first = o.what;
    } else if (same_text) {
      EXPECT_EQ(o.what, first);
    }
    d->synchronize();
  }
}

TEST(OpChecks, ListsEveryDevice) {
  std::string ids;
  for (Device* d : devices()) ids += d->info().id() + " ";
  EXPECT_NE(ids.find("cpu:0"), std::string::npos) << ids;
  EXPECT_NE(ids.find("cpu:1"), std::string::npos) << ids;
#ifdef CT_VK_LAVAPIPE_ICD
  EXPECT_NE(ids.find("vulkan:0"), std::string::npos) << ids;  // lavapipe is installed
#endif
}

TEST(OpChecks, UndefinedNonContiguousAndOutOfBuffer) {
  expect_rule([](Device& d) { d.scale(Tensor{}, 2.0f); }, ErrorKind::kInvalidArgument,
              "scale: t is undefined");
  expect_rule(
      [](Device& d) {
        Tensor t = up(d, {2, 3}, Vec(6, 1.0f));
        t.strides = Shape{1, 2};  // a transposed view
        d.scale(t, 2.0f);
      },
      ErrorKind::kInvalidArgument, "scale: t must be contiguous");
  expect_rule(
      [](Device& d) {
        Tensor t = up(d, {4}, Vec(4, 1.0f));
        d.scale(t.reshape({2, 2}).slice_flat(0, {2}), 1.0f);  // in bounds: fine
        t.shape = Shape{5};
        d.scale(t, 2.0f);
      },
      ErrorKind::kInvalidArgument, "exceeds its buffer of 16 bytes");
  expect_rule(
      [](Device& d) {
        Tensor t = up(d, {4}, Vec(4, 1.0f));
        Vec h(5);
        d.upload(t, h.data(), 20);
      },
      ErrorKind::kInvalidArgument, "upload: 20 bytes do not fit");
}

TEST(OpChecks, TensorOfAnotherDeviceIsRejected) {
  // The message names both devices, so only its kind and wording are compared.
  Device& other = *devices().front();
  Tensor foreign = up(other, {4}, Vec(4, 1.0f));
  for (Device* d : devices()) {
    if (d == &other) continue;
    SCOPED_TRACE(d->info().id());
    Tensor mine = up(*d, {4}, Vec(4, 1.0f));
    Outcome o = run([&] { d->accumulate(mine, foreign); });
    ASSERT_TRUE(o.threw);
    EXPECT_EQ(o.kind, ErrorKind::kInvalidArgument);
    EXPECT_EQ(o.what, "accumulate: src lives on another device (" + other.info().id() +
                          ", this is " + d->info().id() + ")");
  }
}

TEST(OpChecks, SixteenBitWhereTheTableSaysF32IsUnsupported) {
  expect_rule([](Device& d) { d.scale(up(d, {4}, Vec(4, 1.0f), DType::bf16), 2.0f); },
              ErrorKind::kUnsupported, "scale: t must be f32 here, got bf16[4]");
  expect_rule(
      [](Device& d) {
        Tensor f = up(d, {4}, Vec(4, 1.0f));
        d.add(up(d, {4}, Vec(4, 1.0f), DType::f16), f, f);
      },
      ErrorKind::kUnsupported, "add: out must be f32 here, got f16[4]");
  expect_rule(
      [](Device& d) {
        Tensor f = up(d, {4}, Vec(4, 1.0f));
        d.add(f, f, up_i32(d, {4}, {1, 2, 3, 4}));
      },
      ErrorKind::kInvalidArgument, "add: b must be f32, f16 or bf16, got i32[4]");
}

TEST(OpChecks, MatmulOutputMustNotOverlapItsInputs) {
  expect_rule(
      [](Device& d) {
        Tensor a = up(d, {4, 4}, Vec(16, 1.0f)), b = up(d, {4, 4}, Vec(16, 1.0f));
        d.matmul(a, a, b, false, false);
      },
      ErrorKind::kInvalidArgument, "matmul: c must not overlap a or b");
  expect_rule(
      [](Device& d) {
        Tensor buf = up(d, {32}, Vec(32, 1.0f));
        Tensor b = buf.slice_flat(0, {4, 4}), c = buf.slice_flat(8, {2, 4});
        d.matmul(c, up(d, {2, 4}, Vec(8, 1.0f)), b, false, false);
      },
      ErrorKind::kInvalidArgument, "matmul: c must not overlap a or b");
}

TEST(OpChecks, MatmulBatchDimsAreComparedOneByOne) {
  // Same batch product (6), different dims: rejected everywhere.
  expect_rule(
      [](Device& d) {
        Tensor c = up(d, {3, 2, 2, 2}, Vec(24, 0.0f)), a = up(d, {2, 3, 2, 2}, Vec(24, 1.0f));
        d.matmul(c, a, up(d, {2, 2}, Vec(4, 1.0f)), false, false);
      },
      ErrorKind::kInvalidArgument, "matmul: batch dimensions of an operand must match c's");
  // A 2-D b is broadcast over the batch: the same product on every device.
  Vec want;
  for (Device* d : devices()) {
    SCOPED_TRACE(d->info().id());
    Tensor c = up(*d, {3, 2, 2, 2}, Vec(24, 0.0f));
    Vec av(24);
    for (int i = 0; i < 24; ++i) av[i] = static_cast<float>(i % 7) - 3.0f;
    d->matmul(c, up(*d, {3, 2, 2, 2}, av), up(*d, {2, 2}, {1, 2, 3, 4}), false, false);
    Vec got = down(*d, c);
    if (want.empty()) want = got;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
  }
}

TEST(OpChecks, OneDimensionalLogitsAreOneRow) {
  Vec logits = {0.5f, -1.0f, 2.0f, 0.0f, 1.5f};
  double lse = 0.0;
  for (float x : logits) lse += std::exp(static_cast<double>(x));
  const double want = std::log(lse) - 2.0;  // target 2
  for (Device* d : devices()) {
    SCOPED_TRACE(d->info().id());
    Tensor l = up(*d, {5}, logits), t = up_i32(*d, {1}, {2}), loss = up(*d, {1}, {0.0f});
    d->crossentropy_forward(loss, l, t, 5);
    EXPECT_NEAR(down(*d, loss)[0], want, 1e-5);
    Tensor dl = up(*d, {5}, Vec(5, 0.0f));
    d->crossentropy_backward(dl, l, t, 5, 1.0f);
    Vec g = down(*d, dl);
    for (int i = 0; i < 5; ++i) {
      double p = std::exp(static_cast<double>(logits[i])) / lse - (i == 2 ? 1.0 : 0.0);
      EXPECT_NEAR(g[i], p, 1e-5) << i;
    }
  }
  expect_rule(
      [](Device& d) {
        d.crossentropy_forward(up(d, {2}, Vec(2, 0.0f)), up(d, {5}, Vec(5, 0.0f)),
                               up_i32(d, {2}, {0, 1}), 5);
      },
      ErrorKind::kInvalidArgument, "crossentropy_forward: expected logits [N,V], targets [N]");
  for (int64_t valid : {0, 6})
    expect_rule(
        [valid](Device& d) {
          d.crossentropy_backward(up(d, {2, 5}, Vec(10, 0.0f)), up(d, {2, 5}, Vec(10, 0.0f)),
                                  up_i32(d, {2}, {0, 1}), valid, 1.0f);
        },
        ErrorKind::kInvalidArgument,
        "crossentropy_backward: valid = " + std::to_string(valid) +
            " classes must be in [1, 5] (the logits' last dimension)");
}

TEST(OpChecks, CrossEntropyGradientMayAliasLogitsOnlyExactly) {
  expect_rule(
      [](Device& d) {
        Tensor buf = up(d, {12}, Vec(12, 0.0f));
        d.crossentropy_backward(buf.slice_flat(2, {2, 4}), buf.slice_flat(0, {2, 4}),
                                up_i32(d, {2}, {0, 1}), 4, 1.0f);
      },
      ErrorKind::kInvalidArgument,
      "crossentropy_backward: dlogits may alias logits exactly but not partially");
  for (Device* d : devices()) {  // in place: allowed, and the uniform softmax is 1/4
    SCOPED_TRACE(d->info().id());
    Tensor l = up(*d, {2, 4}, Vec(8, 0.0f));
    d->crossentropy_backward(l, l, up_i32(*d, {2}, {0, 1}), 4, 1.0f);
    Vec g = down(*d, l);
    EXPECT_NEAR(g[0], -0.75f, 1e-6);
    EXPECT_NEAR(g[1], 0.25f, 1e-6);
    EXPECT_NEAR(g[5], -0.75f, 1e-6);
  }
}

TEST(OpChecks, CrossEntropyForwardBackwardLossesMustNotOverlapLogits) {
  expect_rule(
      [](Device& d) {
        Tensor buf = up(d, {8}, Vec(8, 0.0f));
        d.crossentropy_forward_backward(buf.slice_flat(6, {2}), buf.slice_flat(0, {2, 4}),
                                        up_i32(d, {2}, {0, 1}), 4, 1.0f);
      },
      ErrorKind::kInvalidArgument, "crossentropy_forward_backward: losses must not overlap logits");
  for (Device* d : devices()) {  // the uniform softmax: loss log 4, gradient 1/4 - onehot
    SCOPED_TRACE(d->info().id());
    Tensor l = up(*d, {2, 4}, Vec(8, 0.0f)), loss = up(*d, {2}, Vec(2, 0.0f));
    d->crossentropy_forward_backward(loss, l, up_i32(*d, {2}, {0, 1}), 4, 1.0f);
    Vec g = down(*d, l), ls = down(*d, loss);
    EXPECT_NEAR(ls[0], std::log(4.0), 1e-6);
    EXPECT_NEAR(ls[1], std::log(4.0), 1e-6);
    EXPECT_NEAR(g[0], -0.75f, 1e-6);
    EXPECT_NEAR(g[1], 0.25f, 1e-6);
    EXPECT_NEAR(g[5], -0.75f, 1e-6);
  }
}

TEST(OpChecks, GeluEpilogueOutputsMustNotOverlapAndMatchTheProduct) {
  expect_rule(
      [](Device& d) {
        Tensor buf = up(d, {8}, Vec(8, 0.0f));
        d.matmul_bias_gelu(buf.slice_flat(2, {2, 2}), buf.slice_flat(0, {2, 2}),
                           up(d, {2, 3}, Vec(6, 1.0f)), up(d, {3, 2}, Vec(6, 1.0f)), false, false,
                           up(d, {2}, Vec(2, 0.0f)));
      },
      ErrorKind::kInvalidArgument, "matmul_bias_gelu: out must not overlap pre, a or b");
  expect_rule(
      [](Device& d) {
        d.matmul_gelu_backward(up(d, {2, 2}, Vec(4, 0.0f)), up(d, {2, 3}, Vec(6, 1.0f)),
                               up(d, {3, 2}, Vec(6, 1.0f)), false, false,
                               up(d, {2, 3}, Vec(6, 0.0f)));
      },
      ErrorKind::kInvalidArgument, "matmul_gelu_backward: pre must have dpre's shape and dtype");
  expect_rule(
      [](Device& d) {
        d.matmul_bias_gelu(up(d, {2, 2}, Vec(4, 0.0f)), up(d, {2, 2}, Vec(4, 0.0f)),
                           up(d, {2, 3}, Vec(6, 1.0f)), up(d, {3, 2}, Vec(6, 1.0f)), false, false,
                           up(d, {3}, Vec(3, 0.0f)));
      },
      ErrorKind::kInvalidArgument, "matmul_bias_gelu: bias must be [N]");
  for (Device* d : devices()) {  // 1 + 1 + 1 + bias 1 = 4: gelu(4), and 0 * gelu'(x) = 0
    SCOPED_TRACE(d->info().id());
    Tensor out = up(*d, {2, 2}, Vec(4, 0.0f)), pre = up(*d, {2, 2}, Vec(4, 0.0f));
    d->matmul_bias_gelu(out, pre, up(*d, {2, 3}, Vec(6, 1.0f)), up(*d, {3, 2}, Vec(6, 1.0f)), false,
                        false, up(*d, {2}, Vec(2, 1.0f)));
    EXPECT_EQ(down(*d, pre)[3], 4.0f);
    EXPECT_NEAR(down(*d, out)[3], 3.99993, 1e-5);
  }
}

TEST(OpChecks, ConvertingCopyMustNotOverlapASameDtypeCopyMay) {
  expect_rule(
      [](Device& d) {
        Tensor a = up(d, {4}, Vec(4, 1.0f));
        Tensor h = a;  // the same bytes viewed as bf16
        h.dtype = DType::bf16;
        d.copy(h, a);
      },
      ErrorKind::kInvalidArgument, "copy: a converting copy must not overlap its source");
  expect_rule(
      [](Device& d) {
        Tensor i = up_i32(d, {4}, {1, 2, 3, 4});
        d.copy(up(d, {4}, Vec(4, 0.0f)), i);
      },
      ErrorKind::kInvalidArgument, "copy: converts only between f32, f16 and bf16");
  for (Device* d : devices()) {  // a memmove, both directions
    SCOPED_TRACE(d->info().id());
    Tensor s = up(*d, {6}, {1, 2, 3, 4, 5, 6});
    d->copy(s.slice_flat(0, {4}), s.slice_flat(2, {4}));
    EXPECT_EQ(down(*d, s), (Vec{3, 4, 5, 6, 5, 6}));
    Tensor t = up(*d, {6}, {1, 2, 3, 4, 5, 6});
    d->copy(t.slice_flat(2, {4}), t.slice_flat(0, {4}));
    EXPECT_EQ(down(*d, t), (Vec{1, 2, 1, 2, 3, 4}));
  }
}

TEST(OpChecks, ShapesAndOptimizerArguments) {
  expect_rule(
      [](Device& d) {
        Tensor out = up(d, {1, 4, 6}, Vec(24, 0.0f)), qkv = up(d, {1, 4, 18}, Vec(72, 0.0f));
        d.attention_forward(out, up(d, {1, 2, 4, 4}, Vec(32, 0.0f)), qkv, 4);
      },
      ErrorKind::kInvalidArgument, "attention_forward: C must be a multiple of n_head");
  expect_rule(
      [](Device& d) {
        Tensor p = up(d, {12}, Vec(12, 1.0f)), g = up(d, {12}, Vec(12, 0.1f));
        SgdHyper s;
        s.momentum = 0.9f;
        d.sgd(p, g, Tensor{}, Tensor{}, s);
      },
      ErrorKind::kInvalidArgument, "sgd: momentum_buf is undefined");
  expect_rule(
      [](Device& d) {
        Tensor p = up(d, {12}, Vec(12, 1.0f)), one = up(d, {1}, {0.0f});
        Tensor q256 = up(d, {256}, Vec(256, 0.0f));
        d.adamw_8bit(p, p, p, p, one, one, q256, q256, Tensor{}, AdamWHyper{});
      },
      ErrorKind::kInvalidArgument, "adamw_8bit: m_q must be u8, got f32[12]");
  expect_rule(
      [](Device& d) {
        Tensor p = up(d, {4}, Vec(4, 1.0f));
        AdamWHyper h;
        h.step = 0;
        d.adamw(p, p, p, p, Tensor{}, h);
      },
      ErrorKind::kInvalidArgument, "adamw: step must be >= 1 (got 0)");
}

}  // namespace
}  // namespace ct
