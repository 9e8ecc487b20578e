// The CPU fast device's arithmetic for products of 16-bit operands (backends/cpu/cpu_device.cpp,
// native_bf16_chosen): `devices` says which one runs, and every path this CPU has -- the chosen
// one, widened to f32 (CT_CPU_BF16_MATMUL=widened: the packing GEMM of fast/gemm_packed.cpp
// where the CPU has AVX2), and widened into f32 copies for sgemm (CT_CPU_PACKED_GEMM=0 too) --
// gives the fp64 product of the (rounded) inputs within the mixed-precision suite's tolerances
// and agrees with the others. The shapes are tall enough that the paths split them over the
// threads. The packing GEMM's sums are also checked bit for bit against its stated order.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "tests/common/device_harness.h"
#include "tests/common/fp64_ops.h"
#include "tests/common/half_compare.h"

namespace ct::test {
namespace {

std::string extra(const DeviceInfo& info, const std::string& key) {
  for (const auto& [k, v] : info.extra)
    if (k == key) return v;
  return "";
}

// `name` set to `value` ("" = unset) while a fast CPU device opens, restored after.
std::unique_ptr<Device> open_fast_with(const char* name, const char* value) {
  const char* old = std::getenv(name);
  const std::string saved = old ? old : "";
  if (*value)
    setenv(name, value, 1);
  else
    unsetenv(name);
  std::unique_ptr<Device> d = make_cpu_device(false);
  if (old)
    setenv(name, saved.c_str(), 1);
  else
    unsetenv(name);
  return d;
}
// CT_CPU_BF16_MATMUL set to `choice`: "" the chosen arithmetic, "widened" never the native one.
std::unique_ptr<Device> open_fast(const char* choice) {
  return open_fast_with("CT_CPU_BF16_MATMUL", choice);
}
// The fast device without the packing GEMM: 16-bit operands widened into f32 copies for sgemm.
std::unique_ptr<Device> open_widening() {
  const char* old = std::getenv("CT_CPU_BF16_MATMUL");
  const std::string saved = old ? old : "";
  setenv("CT_CPU_BF16_MATMUL", "widened", 1);
  std::unique_ptr<Device> d = open_fast_with("CT_CPU_PACKED_GEMM", "0");
  if (old)
    setenv("CT_CPU_BF16_MATMUL", saved.c_str(), 1);
  else
    unsetenv("CT_CPU_BF16_MATMUL");
  return d;
}

// v rounded to h (f32: as it is).
float round_h(float v, DType h) {
  return h == DType::f32 ? v : from_h(to_h(v, h), h);
}
Vec round_to_h(const Vec& v, DType h) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = round_h(v[i], h);
  return r;
}

TEST(CpuHalfMatmul, DevicesSaysWhichArithmetic) {
  std::unique_ptr<Device> chosen = open_fast(""), widened = open_fast("widened");
  const std::string row = extra(chosen->info(), "bf16 matmul");
  const bool native = row.rfind("bf16 arithmetic", 0) == 0;
  EXPECT_TRUE(native || row.rfind("f32 arithmetic (operands widened to f32", 0) == 0) << row;
  EXPECT_EQ(extra(widened->info(), "bf16 matmul").rfind("f32 arithmetic", 0), 0u)
      << extra(widened->info(), "bf16 matmul");
  EXPECT_EQ(extra(chosen->info(), "f16 matmul").rfind("f32 arithmetic", 0), 0u);
  // Where the packing GEMM runs, the row names both routes of a product and the size rule.
  for (const char* dt : {"bf16 matmul", "f16 matmul"}) {
    const std::string r = extra(widened->info(), dt);
    if (r.find("packing GEMM") != std::string::npos) {
      EXPECT_NE(r.find("sgemm past that"), std::string::npos) << r;
      EXPECT_NE(r.find("N, K <= 8192"), std::string::npos) << r;
    }
  }
  // The reference: plain loops, which the report counts as an own kernel ("widened ...").
  EXPECT_EQ(extra(make_cpu_device(true)->info(), "bf16 matmul").rfind("widened to f32", 0), 0u);
}

// A product of one row (sampling's one-token forward) runs on the packing GEMM's row path also
// where bf16 products otherwise go to the native kernel (measured faster there): its bits are
// the widened device's, and `devices` says so where there is a native kernel.
TEST(CpuHalfMatmul, OneRowProductsTakeTheRowPathOnEveryChoice) {
  std::unique_ptr<Device> chosen = open_fast(""), widened = open_fast("widened");
  const std::string row = extra(chosen->info(), "bf16 matmul");
  // the row path is the packing GEMM's: at the kernel levels that have it (AVX2 and up)
  if (extra(widened->info(), "bf16 matmul").find("packing GEMM") == std::string::npos)
    GTEST_SKIP() << "no packing GEMM at this kernel level: " << row;
  if (row.rfind("bf16 arithmetic", 0) == 0) {
    EXPECT_NE(row.find("a product of one row"), std::string::npos) << row;
  }
  const int64_t K = 768, N = 2304, V = 1000;
  std::vector<uint8_t> got[2];
  for (int w = 0; w < 2; ++w) {
    Device& d = w ? *widened : *chosen;
    Tensor x = up_as(d, {1, K}, randn(K, 1), DType::bf16);
    Tensor wt = up_as(d, {N, K}, randn(N * K, 2, 0.05f), DType::bf16);  // a linear layer, b^T
    Tensor wh = up_as(d, {V, K}, randn(V * K, 3, 0.05f), DType::bf16);  // a head
    Tensor y = up_as(d, {1, N}, Vec(N, 0.0f), DType::bf16);
    Tensor logits = upload(d, {1, V}, Vec(V, 0.0f));
    d.matmul(y, x, wt, false, true);
    d.matmul(logits, x, wh, false, true);
    got[w] = raw_download(d, y);
    const std::vector<uint8_t> l = raw_download(d, logits);
    got[w].insert(got[w].end(), l.begin(), l.end());
  }
  EXPECT_TRUE(got[0] == got[1])
      << "one-row bf16 products differ between the chosen and the widened "
         "arithmetic: "
      << row;
}

// c = alpha op(a) op(b) + beta c0 (+ bias) in the layouts of a linear layer (forward with bias
// into 16-bit c, dx into 16-bit c read by beta, dW into f32 c accumulated) and a batch against a
// shared b; each path against fp64, and the two paths against each other.
TEST(CpuHalfMatmul, EveryPathWithinTolerance) {
  std::unique_ptr<Device> paths[3] = {open_fast(""), open_fast("widened"), open_widening()};
  struct Case {
    int64_t batch, M, N, K;
    bool ta, tb, bias;
    float beta;
    bool c16;
  };
  const Case cases[] = {{1, 160, 48, 72, false, false, true, 0.0f, true},
                        {1, 160, 72, 48, false, true, false, 0.5f, true},
                        {1, 72, 48, 160, true, false, false, 1.0f, false},
                        {3, 48, 40, 24, false, false, true, 0.0f, true}};
  for (DType h : {DType::bf16, DType::f16}) {
    for (const Case& k : cases) {
      SCOPED_TRACE(std::string(dtype_name(h)) + " M " + std::to_string(k.M) + " ta " +
                   std::to_string(k.ta) + " tb " + std::to_string(k.tb));
      const int64_t rows = k.batch * k.M;
      const Vec a = round_to_h(randn(rows * k.K, 1), h), b = round_to_h(randn(k.K * k.N, 2), h);
      const DType cdt = k.c16 ? h : DType::f32;
      const Vec c0 = round_to_h(randn(rows * k.N, 3), cdt == DType::f32 ? DType::bf16 : h);
      const Vec bias = randn(k.N, 4);
      VecD want(static_cast<size_t>(rows * k.N));
      for (int64_t p = 0; p < k.batch; ++p) {
        VecD ap(a.begin() + p * k.M * k.K, a.begin() + (p + 1) * k.M * k.K);
        VecD one = f64::matmul(ap, to_d(b), k.M, k.N, k.K, k.ta, k.tb);
        for (int64_t i = 0; i < k.M * k.N; ++i) {
          const int64_t e = p * k.M * k.N + i;
          const double bj =
              k.bias ? (k.c16 ? from_h(to_h(bias[i % k.N], h), h) : bias[i % k.N]) : 0.0;
          want[static_cast<size_t>(e)] = one[static_cast<size_t>(i)] + k.beta * c0[e] + bj;
        }
      }
      Vec got[3];
      const char* names[3] = {"chosen path", "widened (packing GEMM here)", "widened copies"};
      for (int p = 0; p < 3; ++p) {
        Device& d = *paths[p];
        const Shape as =
            k.batch > 1 ? Shape{k.batch, k.M, k.K} : (k.ta ? Shape{k.K, k.M} : Shape{k.M, k.K});
        const Shape bs = k.tb ? Shape{k.N, k.K} : Shape{k.K, k.N};
        const Shape cs = k.batch > 1 ? Shape{k.batch, k.M, k.N} : Shape{k.M, k.N};
        Tensor ta = up_as(d, as, a, h), tb = up_as(d, bs, b, h), tc = up_as(d, cs, c0, cdt);
        Tensor tbias = upload(d, {k.N}, bias);
        d.matmul(tc, ta, tb, k.ta, k.tb, 1.0f, k.beta, k.bias ? &tbias : nullptr);
        got[p] = download_h(d, tc);
        const double tol = k.c16 ? (h == DType::bf16 ? 2e-5 : 4e-7) : kTolGemm;
        EXPECT_TRUE(close_nmse(got[p], want, tol, names[p]));
      }
      for (int p = 1; p < 3; ++p)
        EXPECT_TRUE(close_nmse(got[0], got[p], k.c16 ? (h == DType::bf16 ? 2e-5 : 4e-7) : kTolGemm,
                               std::string("chosen vs ") + names[p]));
    }
  }
}

// The fast device keeps the f32 copy of a 16-bit operand it widened for one product and reads it
// in the next product that has the same operand (cpu_device.cpp, "widened operands kept between
// products"). The same sequences of ops on a device that widens every operand every time
// (CT_CPU_KEEP_WIDENED=0) must give the same bits: a linear layer's backward (dout in both
// products), the tied head (wte across the loss, which rewrites the logits in place, and dlogits
// in both backward products, and rewritten by the loss), an operand rewritten by upload, and one
// overwritten as a product's c.
TEST(CpuHalfMatmul, KeptOperandsGiveTheBitsOfFreshOnes) {
  const int64_t M = 160, K = 48, N = 72, V = 96;
  for (DType h : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(h));
    std::vector<std::vector<uint8_t>> got[2];
    for (int fresh = 0; fresh < 2; ++fresh) {
      if (fresh) setenv("CT_CPU_KEEP_WIDENED", "0", 1);
      std::unique_ptr<Device> dev = open_widening();  // the copies are what is kept
      unsetenv("CT_CPU_KEEP_WIDENED");
      Device& d = *dev;
      std::vector<std::vector<uint8_t>>& out = got[fresh];
      Tensor x = up_as(d, {M, K}, randn(M * K, 1), h), w = up_as(d, {N, K}, randn(N * K, 2), h);
      Tensor dout = up_as(d, {M, N}, randn(M * N, 3), h);
      Tensor dx = up_as(d, {M, K}, Vec(M * K, 0.0f), h), dw = upload(d, {K, N}, randn(K * N, 4));
      // a linear layer's backward: dx = dout w;  dw += x^T dout
      d.matmul(dx, dout, w, false, false);
      d.matmul(dw, x, dout, true, false, 1.0f, 1.0f);
      out.push_back(raw_download(d, dx));
      out.push_back(raw_download(d, dw));
      // the tied head: logits = lnf wte^T;  loss (dlogits in place);  dlnf = dlogits wte;
      // dwte += dlogits^T lnf
      Tensor wte = up_as(d, {V, K}, randn(V * K, 5, 0.3f), h), lnf = x;
      Tensor logits = up_as(d, {M, V}, Vec(M * V, 0.0f), h), losses = upload(d, {M}, Vec(M, 0.0f));
      Tensor targets = upload_i32(d, {M}, randint(M, 6, static_cast<int32_t>(V)));
      Tensor dlnf = upload(d, {M, K}, Vec(M * K, 0.0f)), dwte = upload(d, {V, K}, randn(V * K, 7));
      d.matmul(logits, lnf, wte, false, true);
      d.crossentropy_forward_backward(losses, logits, targets, V, 1.0f / M);
      d.matmul(dlnf, logits, wte, false, false);
      d.matmul(dwte, logits, lnf, true, false, 1.0f, 1.0f);
      for (const Tensor* t : {&logits, &losses, &dlnf, &dwte}) out.push_back(raw_download(d, *t));
      // the loss again over the kept dlogits (it rewrites them in place), and a product after it
      d.crossentropy_forward_backward(losses, logits, targets, V, 0.5f / M);
      d.matmul(dlnf, logits, wte, false, false);
      out.push_back(raw_download(d, dlnf));
      // an operand rewritten by upload
      Tensor c = upload(d, {M, N}, Vec(M * N, 0.0f));
      d.matmul(c, x, w, false, true);
      std::vector<uint16_t> bits(static_cast<size_t>(M * K));
      for (size_t i = 0; i < bits.size(); ++i)
        bits[i] = to_h(0.01f * static_cast<float>(i % 97), h);
      d.upload(x, bits.data(), bits.size() * 2);
      d.matmul(c, x, w, false, true);
      out.push_back(raw_download(d, c));
      // an operand overwritten as the c of a product whose own operands are kept: p = t t^T
      Tensor p = up_as(d, {M, M}, randn(M * M, 10, 0.2f), h),
             t = up_as(d, {M, K}, randn(M * K, 11), h);
      Tensor pt = upload(d, {M, K}, Vec(M * K, 0.0f));
      d.matmul(pt, p, t, false, false);
      d.matmul(p, t, t, false, true);
      d.matmul(pt, p, t, false, false);
      out.push_back(raw_download(d, pt));
    }
    ASSERT_EQ(got[0].size(), got[1].size());
    for (size_t i = 0; i < got[0].size(); ++i)
      EXPECT_TRUE(got[0][i] == got[1][i]) << "output " << i;
  }
}

// The packing GEMM's arithmetic as fast/gemm_packed.cpp states it: each element of c sums
// a[i,k] b[k,j] in order of k with one f32 FMA a term, in slices of equal length (at most 384,
// a multiple of 8 but the last); the first slice's sum s gives fma(alpha, s, pre), pre =
// fma(beta, c0, bias (rounded to c's type where c is 16-bit)), each later one fma(alpha, s, c);
// a 16-bit c is rounded once, at the end. So the bits do not depend on the threads or blocks.
// A product of one row with b (N, K) (run_row's dot products along b's rows) sums instead eight
// partial sums, k mod 8 in order of k, as ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)), the
// K % 8 last terms one FMA each, then fma(alpha, sum, pre).
float packed_model(const Vec& a, const Vec& b, int64_t M, int64_t N, int64_t K, bool ta, bool tb,
                   int64_t i, int64_t j, float alpha, float pre) {
  if (M == 1 && tb) {
    float lane[8] = {};
    const int64_t K8 = K / 8 * 8;
    for (int64_t k = 0; k < K8; ++k)
      lane[k % 8] =
          std::fma(a[static_cast<size_t>(k)], b[static_cast<size_t>(j * K + k)], lane[k % 8]);
    float sum =
        ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    for (int64_t k = K8; k < K; ++k)
      sum = std::fma(a[static_cast<size_t>(k)], b[static_cast<size_t>(j * K + k)], sum);
    return std::fma(alpha, sum, pre);
  }
  const int64_t slices = (K + 383) / 384, kc = ((K + slices - 1) / slices + 7) / 8 * 8;
  float c = pre;
  for (int64_t k0 = 0; k0 < K; k0 += kc) {
    float s = 0.0f;
    for (int64_t k = k0; k < std::min(K, k0 + kc); ++k)
      s = std::fma(a[static_cast<size_t>(ta ? k * M + i : i * K + k)],
                   b[static_cast<size_t>(tb ? j * K + k : k * N + j)], s);
    c = std::fma(alpha, s, c);
  }
  return c;
}

TEST(CpuHalfMatmul, PackedGemmSumsInTheStatedOrder) {
  std::unique_ptr<Device> dev = open_fast("widened");
  if (extra(dev->info(), "bf16 matmul").find("packing GEMM") == std::string::npos)
    GTEST_SKIP() << "no packing GEMM at this CPU's level: " << extra(dev->info(), "bf16 matmul");
  Device& d = *dev;
  struct Case {
    int64_t M, N, K;
    bool ta, tb, bias, c16;
    float alpha, beta;
  };
  // one slice and several (K 800: 3 of 272, the last 256); rows split (M >= N) and columns;
  // edges that are not whole 6 x 16 tiles; the transposed packings; a 16-bit c over several
  // slices in more than one block of rows (120) and of columns (512 a thread, up to 4 threads)
  const Case cases[] = {{100, 37, 72, false, true, true, true, 1.0f, 0.0f},
                        {130, 2100, 800, false, false, true, true, 1.0f, 1.0f},
                        {61, 130, 800, false, false, false, true, 0.5f, 0.75f},
                        {77, 50, 800, true, false, false, false, 1.0f, 1.0f},
                        {130, 45, 395, false, true, true, true, 1.0f, 1.0f},
                        {24, 200, 40, true, true, true, false, 2.0f, 0.0f},
                        // one row of c (run_row: b read in place, also for f32 operands): b (K,N)
                        // over three slices, N past whole blocks of 64 and of 8; b (N,K) with a
                        // vocabulary-sized N; K not a multiple of 8, a (K,1), f32 c
                        {1, 2100, 800, false, false, true, true, 1.0f, 1.0f},
                        {1, 9000, 72, false, true, true, true, 1.0f, 0.0f},
                        {1, 45, 395, true, true, false, false, 0.5f, 0.75f}};
  for (DType h : {DType::bf16, DType::f16, DType::f32}) {
    for (const Case& k : cases) {
      if (h == DType::f32 && k.M != 1) continue;  // f32 products go to sgemm but for one row
      SCOPED_TRACE(std::string(dtype_name(h)) + " " + std::to_string(k.M) + "x" +
                   std::to_string(k.N) + "x" + std::to_string(k.K) + " ta " + std::to_string(k.ta) +
                   " tb " + std::to_string(k.tb));
      const Vec a = round_to_h(randn(k.M * k.K, 21), h), b = round_to_h(randn(k.K * k.N, 22), h);
      const DType cdt = k.c16 ? h : DType::f32;
      const Vec c0 = round_to_h(randn(k.M * k.N, 23), h), bias = randn(k.N, 24);
      Tensor tc = up_as(d, {k.M, k.N}, c0, cdt), tbias = upload(d, {k.N}, bias);
      d.matmul(tc, up_as(d, k.ta ? Shape{k.K, k.M} : Shape{k.M, k.K}, a, h),
               up_as(d, k.tb ? Shape{k.N, k.K} : Shape{k.K, k.N}, b, h), k.ta, k.tb, k.alpha,
               k.beta, k.bias ? &tbias : nullptr);
      const Vec got = download_h(d, tc);
      int64_t wrong = 0;
      for (int64_t i = 0; i < k.M; ++i)
        for (int64_t j = 0; j < k.N; ++j) {
          const size_t e = static_cast<size_t>(i * k.N + j);
          float pre = k.bias ? (k.c16 ? round_h(bias[static_cast<size_t>(j)], h)
                                      : bias[static_cast<size_t>(j)])
                             : 0.0f;
          if (k.beta != 0.0f) pre = std::fma(k.beta, c0[e], pre);
          float want = packed_model(a, b, k.M, k.N, k.K, k.ta, k.tb, i, j, k.alpha, pre);
          if (k.c16) want = round_h(want, h);
          if (std::memcmp(&want, &got[e], sizeof(float)) != 0 && wrong++ < 3)
            ADD_FAILURE() << "c[" << i << "," << j << "] = " << got[e]
                          << ", stated order: " << want;
        }
      EXPECT_EQ(wrong, 0);
    }
  }
}

}  // namespace
}  // namespace ct::test
