// Extreme inputs for every op with a transcendental or an overflow-prone expression (GELU's
// own case is Gelu.ExtremeValues): huge (1e30, 1e38) and tiny (1e-30) values, -inf logits,
// gradients whose squares overflow fp32. Each device against the reference (which computes in
// fp64 and is checked here against PyTorch's values where they are known), elementwise: finite
// where PyTorch is finite, the same inf / NaN where it has them.
//
// Lavapipe's and the CPU's built-ins follow IEEE at the ends of their range, so these cases
// alone would not catch a shader that relies on exp(inf), sqrt(inf) or 1 / inf behaving; a GPU
// driver may not (NVIDIA's gave NaN for GELU's backward at 1e30). ctest ops_vulkan_strict_math
// runs them again with CROSSTRAIN_VK_STRICT_MATH=1: the Vulkan device then dispatches the
// CT_STRICT_MATH twins of the shaders (shaders/common/math.glsl), whose exp/log/sqrt return NaN
// outside the range every driver must get right. StrictMathTwinsDispatched checks the switch.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "tests/common/device_harness.h"

namespace ct::test {
namespace {

// got[i] == want[i] to rel * |want| + abs, NaN where want is NaN, the same inf where want is inf.
::testing::AssertionResult near_each(const Vec& got, const Vec& want, double rel, double abs,
                                     const std::string& what) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const bool ok = std::isnan(w) ? std::isnan(g)
                    : std::isinf(w)
                        ? g == w
                        : std::isfinite(g) && std::abs(g - w) <= rel * std::abs(w) + abs;
    if (!ok)
      return ::testing::AssertionFailure() << what << "[" << i << "]: got " << g << ", want " << w;
  }
  return ::testing::AssertionSuccess();
}

bool all_finite(const Vec& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

bool strict_math_requested() {
  const char* v = std::getenv("CROSSTRAIN_VK_STRICT_MATH");
  return v && *v && std::strcmp(v, "0") != 0;
}

using ExtremeValues = DeviceTest;

// silu(g) up and its backward at gates from 1e-30 to 1e38 of both signs.
TEST_P(ExtremeValues, Swiglu) {
  const Vec g = {0.0f,   -0.0f,   1e-30f, -1e-30f, 20.0f, -20.0f, 85.0f, -85.0f,
                 100.0f, -100.0f, 1e30f,  -1e30f,  1e38f, -1e38f, NAN};
  const int64_t F = static_cast<int64_t>(g.size());
  Vec gu(g);
  gu.insert(gu.end(), g.size(), 2.0f);  // up = 2
  const Vec dout(g.size(), 1.5f);
  auto run = [&](Device& d) {
    Tensor tg = upload(d, {1, 2 * F}, gu), to = upload(d, {1, F}, Vec(F, NAN));
    Tensor td = upload(d, {1, F}, dout), tdg = upload(d, {1, 2 * F}, Vec(2 * F, NAN));
    d.swiglu_forward(to, tg);
    d.swiglu_backward(tdg, tg, td);
    return std::pair{download(d, to), download(d, tdg)};
  };
  auto [ro, rd] = run(ref());
  auto [fo, fd] = run(dev());
  // PyTorch: silu(1e30) = 1e30, silu(-1e30) = -0 (-1e30 / inf), silu'(+-1e30) = 1 / 0.
  EXPECT_EQ(ro[10], 2e30f);
  EXPECT_EQ(ro[11], 0.0f);
  EXPECT_TRUE(std::signbit(ro[11]));
  EXPECT_EQ(rd[10], 3.0f);  // dgate = dout up silu'(g)
  EXPECT_EQ(rd[11], 0.0f);
  EXPECT_FLOAT_EQ(rd[F + 10], 1.5e30f);  // dup = dout silu(g)
  EXPECT_TRUE(std::isnan(ro[14]) && std::isnan(rd[14]));
  EXPECT_TRUE(near_each(fo, ro, 1e-6, 1e-30, "out on " + id()));
  EXPECT_TRUE(near_each(fd, rd, 1e-6, 1e-30, "dgu on " + id()));
}

// Cross-entropy over rows with logits of +-1e30, all equal huge negative logits, a -inf logit.
TEST_P(ExtremeValues, CrossEntropy) {
  const int64_t N = 4, V = 4;
  const Vec logits = {1e30f,  -1e30f, 0.0f,   5.0f,   1e30f, -1e30f,    0.0f, 5.0f,
                      -1e30f, -1e30f, -1e30f, -1e30f, 0.0f,  -INFINITY, 5.0f, -1e38f};
  const std::vector<int32_t> targets = {0, 1, 2, 2};
  auto run = [&](Device& d, bool fused) {
    Tensor tl = upload(d, {N, V}, logits), tt = upload_i32(d, {N}, targets);
    Tensor loss = upload(d, {N}, Vec(N, NAN)), dl = upload(d, {N, V}, Vec(N * V, NAN));
    if (fused) {
      d.crossentropy_forward_backward(loss, tl, tt, V, 1.0f);
      return std::pair{download(d, loss), download(d, tl)};
    }
    d.crossentropy_forward(loss, tl, tt, V);
    d.crossentropy_backward(dl, tl, tt, V, 1.0f);
    return std::pair{download(d, loss), download(d, dl)};
  };
  auto [rl, rd] = run(ref(), false);
  auto [fl, fd] = run(dev(), false);
  auto [gl, gd] = run(dev(), true);  // both in one pass
  // PyTorch: 0, 2e30, log 4, log(1 + e^-5); softmax one-hot / uniform.
  EXPECT_EQ(rl[0], 0.0f);
  EXPECT_EQ(rl[1], 2e30f);
  EXPECT_NEAR(rl[2], std::log(4.0), 1e-6);
  EXPECT_NEAR(rl[3], std::log1p(std::exp(-5.0)), 1e-7);
  EXPECT_TRUE(all_finite(rl) && all_finite(rd));
  EXPECT_TRUE(near_each(fl, rl, 1e-6, 1e-6, "loss on " + id()));
  EXPECT_TRUE(near_each(fd, rd, 1e-6, 1e-6, "dlogits on " + id()));
  EXPECT_TRUE(near_each(gl, rl, 1e-6, 1e-6, "forward_backward loss on " + id()));
  EXPECT_TRUE(near_each(gd, rd, 1e-6, 1e-6, "forward_backward dlogits on " + id()));
}

// Attention (unfused and flash) with scores of ~1e6 to 1e7 (q and k entries of 1e3, k_u growing
// with u): the softmax is one-hot (the newest key), exp() of -1e6 and less is 0, nothing
// overflows. The scores are exact in fp32, so the result is well conditioned. (Not ties at such
// scores: the flash backward's fp32 lse = m + log l rounds log 2 away against m = 1e6, in
// PyTorch's fp32 kernels as here; a precision limit, not a NaN.)
TEST_P(ExtremeValues, AttentionWithHugeScores) {
  const int64_t B = 1, T = 6, C = 8, NH = 2, W = 3 * C;
  Vec qkv = randn(B * T * W, 41, 1.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < C; ++i) {
      qkv[t * W + i] = 1e3f;                                  // q
      qkv[t * W + C + i] = 1e3f * static_cast<float>(t + 1);  // k
    }
  const Vec dout = randn(B * T * C, 42);
  auto run = [&](Device& d, bool flash) {
    Tensor tq = upload(d, {B, T, W}, qkv), td = upload(d, {B, T, C}, dout);
    Tensor to = upload(d, {B, T, C}, Vec(B * T * C, NAN));
    Tensor tdq = upload(d, {B, T, W}, Vec(qkv.size(), NAN));
    if (flash) {
      Tensor tl = upload(d, {B, NH, T}, Vec(B * NH * T, NAN));
      d.flash_attention_forward(to, tl, tq, NH, NH);
      d.flash_attention_backward(tdq, td, tq, to, tl, NH, NH);
    } else {
      Tensor ta = upload(d, {B, NH, T, T}, Vec(B * NH * T * T, NAN));
      d.attention_forward(to, ta, tq, NH, NH);
      d.attention_backward(tdq, td, tq, ta, NH, NH);
    }
    return std::pair{download(d, to), download(d, tdq)};
  };
  for (bool flash : {false, true}) {
    auto [ro, rd] = run(ref(), flash);
    auto [fo, fd] = run(dev(), flash);
    const std::string nm = std::string(flash ? " flash" : " unfused") + " on " + id();
    EXPECT_TRUE(all_finite(ro) && all_finite(rd)) << nm;
    EXPECT_TRUE(close_nmse(fo, ro, tol(Tol::kGemm), "out" + nm));
    // The backward at scores of 1e6..1e7 recomputes P from an fp32 log-sum-exp that has lost
    // its small log term: within 1e-7 of the fp64 reference on any build (an -O1 build of the
    // CPU kernels rounds differently from -O3), never the near-exact device tolerance.
    EXPECT_TRUE(close_nmse(fd, rd, std::max(tol(Tol::kGemm), 1e-7), "dqkv" + nm));
  }
}

// LayerNorm and RMSNorm of rows whose squares overflow fp32 (1e30, 1e36), of tiny rows (1e-30)
// and of ordinary ones. An fp32 kernel that lets the variance overflow gives rstd = 0 there (the
// bias, or 0, as output; NaN where a driver's sqrt(inf) or 1 / inf is not IEEE's); the fp64
// reference and the devices normalise them.
TEST_P(ExtremeValues, NormsOfHugeAndTinyRows) {
  const int64_t C = 37;
  for (float scale : {1e30f, 1e36f, 1e-30f, 1.0f}) {
    const int64_t N = 3;
    Vec x = randn(N * C, 50, scale), w = randn(C, 51), b = randn(C, 52);
    const Vec dout = randn(N * C, 53), dx0 = randn(N * C, 54), dw0 = randn(C, 55),
              db0 = randn(C, 56);
    for (int64_t i = 0; i < C; ++i) x[i] += 0.5f * scale;  // a mean of the same size
    const std::string nm = " scale " + std::to_string(scale) + " on " + id();
    auto ln = [&](Device& d) {
      Tensor tx = upload(d, {N, C}, x), tw = upload(d, {C}, w), tb = upload(d, {C}, b);
      Tensor to = upload(d, {N, C}, Vec(N * C, NAN));
      Tensor tm = upload(d, {N}, Vec(N, NAN)), tr = upload(d, {N}, Vec(N, NAN));
      d.layernorm_forward(to, tm, tr, tx, tw, tb, 1e-5f);
      Tensor td = upload(d, {N, C}, dout), tdx = upload(d, {N, C}, dx0);
      Tensor tdw = upload(d, {C}, dw0), tdb = upload(d, {C}, db0);
      d.layernorm_backward(tdx, tdw, tdb, td, tx, tw, tm, tr);
      return std::vector<Vec>{download(d, to),  download(d, tm),  download(d, tr),
                              download(d, tdx), download(d, tdw), download(d, tdb)};
    };
    auto rms = [&](Device& d) {
      Tensor tx = upload(d, {N, C}, x), tw = upload(d, {C}, w);
      Tensor to = upload(d, {N, C}, Vec(N * C, NAN)), tr = upload(d, {N}, Vec(N, NAN));
      d.rmsnorm_forward(to, tr, tx, tw, 1e-6f);
      Tensor td = upload(d, {N, C}, dout), tdx = upload(d, {N, C}, dx0);
      Tensor tdw = upload(d, {C}, dw0);
      d.rmsnorm_backward(tdx, tdw, td, tx, tw, tr);
      return std::vector<Vec>{download(d, to), download(d, tr), download(d, tdx), download(d, tdw)};
    };
    const char* ln_names[] = {"ln out", "ln mean", "ln rstd", "ln dx", "ln dw", "ln db"};
    const char* rms_names[] = {"rms out", "rms rstd", "rms dx", "rms dw"};
    std::vector<Vec> r = ln(ref()), f = ln(dev());
    for (size_t k = 0; k < r.size(); ++k) {
      EXPECT_TRUE(all_finite(r[k])) << ln_names[k] << nm;
      EXPECT_TRUE(close_nmse(f[k], r[k], tol(), ln_names[k] + nm));
    }
    r = rms(ref());
    f = rms(dev());
    for (size_t k = 0; k < r.size(); ++k) {
      EXPECT_TRUE(all_finite(r[k])) << rms_names[k] << nm;
      EXPECT_TRUE(close_nmse(f[k], r[k], tol(), rms_names[k] + nm));
    }
  }
}

// RoPE of huge and tiny values (the rotation keeps the norm: nothing may overflow).
TEST_P(ExtremeValues, Rope) {
  const int64_t B = 1, T = 4, H = 2, D = 8, half = D / 2;
  Vec cs(T * half), sn(T * half);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(t) / std::pow(10000.0, 2.0 * i / D);
      cs[t * half + i] = static_cast<float>(std::cos(a));
      sn[t * half + i] = static_cast<float>(std::sin(a));
    }
  for (float scale : {1e30f, 1e37f, 1e-30f}) {
    const Vec x = randn(B * T * H * D, 60, scale);
    auto run = [&](Device& d) {
      Tensor tc = upload(d, {T, half}, cs), ts = upload(d, {T, half}, sn);
      Tensor tx = upload(d, {B, T, H * D}, x), to = upload(d, {B, T, H * D}, Vec(x.size(), NAN));
      Tensor tdx = upload(d, {B, T, H * D}, Vec(x.size(), NAN));
      d.rope_forward(to, tx, tc, ts, D, H);
      d.rope_backward(tdx, tx, tc, ts, D, H);
      return std::pair{download(d, to), download(d, tdx)};
    };
    auto [ro, rd] = run(ref());
    auto [fo, fd] = run(dev());
    const std::string nm = " scale " + std::to_string(scale) + " on " + id();
    EXPECT_TRUE(all_finite(ro) && all_finite(rd)) << nm;
    EXPECT_TRUE(close_nmse(fo, ro, tol(), "out" + nm));
    EXPECT_TRUE(close_nmse(fd, rd, tol(), "dx" + nm));
  }
}

// AdamW with gradients whose squares overflow fp32: the fp64 reference steps by ~lr (mhat /
// sqrt(vhat) = sign g) and stores v = inf, after which those elements only decay (m / inf = 0).
// PyTorch's fp32 step stores the same v = inf. Then a global norm of inf: clip 0.
TEST_P(ExtremeValues, AdamWHugeGradients) {
  const Vec p0 = {1.0f, -1.0f, 2.0f, 0.5f, 1.0f, 1.0f, -3.0f};
  const Vec g1 = {1e30f, -1e30f, 3e38f, 1e-30f, 0.5f, -2.0f, 1e19f};
  const Vec g2 = {1.0f, -1.0f, 1.0f, 1.0f, 0.25f, 1.0f, -1e20f};
  const int64_t n = static_cast<int64_t>(p0.size());
  auto run = [&](Device& d) {
    Tensor p = upload(d, {n}, p0), m = upload(d, {n}, Vec(n, 0.0f));
    Tensor v = upload(d, {n}, Vec(n, 0.0f)), g = upload(d, {n}, g1);
    AdamWHyper hp;
    hp.lr = 1e-2f;
    hp.weight_decay = 0.1f;
    hp.step = 1;
    d.adamw(p, g, m, v, Tensor{}, hp);
    std::vector<Vec> out = {download(d, p), download(d, m), download(d, v)};
    d.upload(g, g2.data(), g2.size() * sizeof(float));
    hp.step = 2;
    d.adamw(p, g, m, v, Tensor{}, hp);
    for (const Tensor* t : {&p, &m, &v}) out.push_back(download(d, *t));
    Tensor gn = upload(d, {1}, {INFINITY});  // clipping by an overflowed norm
    hp.step = 3;
    hp.max_grad_norm = 1.0f;
    d.adamw(p, g, m, v, gn, hp);
    for (const Tensor* t : {&p, &m}) out.push_back(download(d, *t));
    return out;
  };
  const std::vector<Vec> r = run(ref()), f = run(dev());
  const char* names[] = {"p1", "m1", "v1", "p2", "m2", "v2", "p3", "m3"};
  EXPECT_NEAR(r[0][0], 1.0f * (1.0f - 1e-3f) - 1e-2f, 1e-6);  // one step of lr
  EXPECT_NEAR(r[0][2], 2.0f * (1.0f - 1e-3f) - 1e-2f, 1e-6);
  EXPECT_EQ(r[2][0], INFINITY);  // 1e-3 * 1e60 in fp32, as PyTorch
  for (size_t k = 0; k < r.size(); ++k) {
    if (k != 2 && k != 5) {
      EXPECT_TRUE(all_finite(r[k])) << names[k];
    }
    EXPECT_TRUE(near_each(f[k], r[k], 2e-6, 1e-30, std::string(names[k]) + " on " + id()));
  }
}

// With CROSSTRAIN_VK_STRICT_MATH=1 a Vulkan device runs the CT_STRICT_MATH twins (their names
// end in _strict in the profile); without it, never.
TEST_P(ExtremeValues, StrictMathTwinsDispatched) {
  if (dev().info().backend != "vulkan") GTEST_SKIP() << "a Vulkan switch";
  try {
    dev().set_profiling(true);
  } catch (const std::exception& e) {
    GTEST_SKIP() << e.what();
  }
  Tensor x = upload(dev(), {4}, {1.0f, 2.0f, 3.0f, 4.0f}), o = upload(dev(), {4}, Vec(4, 0.0f));
  dev().gelu_forward(o, x);
  download(dev(), o);
  const std::string report = dev().profile_report();
  dev().set_profiling(false);
  if (report.empty()) GTEST_SKIP() << "no profile on " << id();
  EXPECT_NE(report.find("gelu_fwd"), std::string::npos) << report;
  EXPECT_EQ(report.find("gelu_fwd_strict") != std::string::npos, strict_math_requested()) << report;
}

CT_INSTANTIATE_DEVICE_SUITE(ExtremeValues);

}  // namespace
}  // namespace ct::test
