// Optimizer-step cost on the CPU fast device, in ns per parameter: fused AdamW (alone, writing
// the bf16 copy of the parameters in the same pass (param16), and followed by a separate bf16
// copy(), the mixed-precision trainer's two ways) and 8-bit AdamW over one flat tensor (the state
// settled by a few steps first), and the 8-bit code search on its own (ns per value):
// quantize_nearest's binary search against NearestCode's interval table, on values shaped like
// the optimizer's (block-normalised moments).
//
//   optim_bench [--n N] [--reps R] [--values V]
//
// Defaults: N = 16M parameters, R = 7 repetitions (the minimum is printed), V = 4M values.
// Threads follow OMP_NUM_THREADS; the code search is single-threaded. Wall time: on a shared
// machine note `uptime` and prefer the minimum of several runs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/nearest_code.h"
#include "core/device.h"
#include "core/optim/quant_map.h"
#include "core/philox.h"

using namespace ct;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename F>
double min_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
    f();
    best = std::min(best, now() - t0);
  }
  return best;
}

std::vector<float> gaussian(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  Philox rng(seed, 0);
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = rng.normal(static_cast<uint64_t>(i));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = int64_t{1} << 24, values = int64_t{1} << 22;
  int reps = 7;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::atoll(argv[++i]) : 0; };
    if (a == "--n")
      n = next();
    else if (a == "--reps")
      reps = static_cast<int>(next());
    else if (a == "--values")
      values = next();
    else {
      std::fprintf(stderr, "usage: optim_bench [--n N] [--reps R] [--values V]\n");
      return 2;
    }
  }
  if (n <= 0 || reps <= 0 || values <= 0) return 2;

  // ---- the code search alone -----------------------------------------------------------------
  // m / absmax and v / absmax per block of 256, from Gaussian "moments" (v = m^2).
  std::vector<float> g = gaussian(values, 1), xm(g.size()), xv(g.size());
  for (size_t b = 0; b < g.size(); b += 256) {
    const size_t e = std::min(g.size(), b + 256);
    float am = 0, av = 0;
    for (size_t i = b; i < e; ++i)
      am = std::max(am, std::abs(g[i])), av = std::max(av, g[i] * g[i]);
    for (size_t i = b; i < e; ++i) xm[i] = g[i] / am, xv[i] = g[i] * g[i] / av;
  }
  const auto& qs = dynamic_map_signed();
  const auto& qu = dynamic_map_unsigned();
  std::vector<uint8_t> out(g.size());
  auto search = [&](auto&& f) {
    return min_seconds(reps,
                       [&] {
                         for (size_t i = 0; i < g.size(); ++i) out[i] = f(i);
                       }) /
           static_cast<double>(g.size()) * 1e9;
  };
  const double t_bs_m = search([&](size_t i) { return cpu::quantize_nearest(qs.data(), xm[i]); });
  const double t_bs_v = search([&](size_t i) { return cpu::quantize_nearest(qu.data(), xv[i]); });
  const double t0 = now();
  cpu::NearestCode ns(qs.data()), nu(qu.data());
  const double t_build = (now() - t0) / 2;
  const double t_nc_m = search([&](size_t i) { return ns(xm[i]); });
  const double t_nc_v = search([&](size_t i) { return nu(xv[i]); });
  // encode(): the kernel's per-block form (vectorised), on the same normalised values.
  auto encode = [&](const cpu::NearestCode& nc, const std::vector<float>& x) {
    return min_seconds(reps,
                       [&] {
                         for (size_t b = 0; b < x.size(); b += 256)
                           nc.encode(x.data() + b, 1.0f, out.data() + b,
                                     static_cast<int64_t>(std::min<size_t>(256, x.size() - b)));
                       }) /
           static_cast<double>(x.size()) * 1e9;
  };
  const double t_en_m = encode(ns, xm), t_en_v = encode(nu, xv);
  std::printf("8-bit code search, %lld values, ns/value (single thread):\n",
              static_cast<long long>(values));
  std::printf("  binary search (quantize_nearest)      signed %.2f  unsigned %.2f\n", t_bs_m,
              t_bs_v);
  std::printf(
      "  interval table, one value at a time   signed %.2f  unsigned %.2f  (span %d/%d, built in "
      "%.2f ms)\n",
      t_nc_m, t_nc_v, ns.span(), nu.span(), t_build * 1e3);
  std::printf("  interval table, encode() per block    signed %.2f  unsigned %.2f\n", t_en_m,
              t_en_v);

  // ---- fused optimizer steps on the fast device ------------------------------------------------
  auto dev = make_cpu_device(false);
  std::vector<float> p0 = gaussian(n, 2), g0 = gaussian(n, 3);
  Tensor p = dev->empty({n}, DType::f32, MemCategory::kWeights);
  Tensor gr = dev->empty({n}, DType::f32, MemCategory::kGrads);
  Tensor gn = dev->empty({1}, DType::f32, MemCategory::kWorkspace);
  dev->upload(p, p0.data(), p0.size() * 4);
  dev->upload(gr, g0.data(), g0.size() * 4);
  const float norm = 1e3f;
  dev->upload(gn, &norm, 4);
  AdamWHyper hp;
  hp.weight_decay = 0.1f;
  hp.max_grad_norm = 1.0f;
  auto per_param = [&](auto&& step) {
    for (int w = 0; w < 3; ++w) step(w + 1);  // settle the state (8-bit: nonzero absmax)
    int64_t t = 4;
    return min_seconds(reps, [&] { step(t++); }) / static_cast<double>(n) * 1e9;
  };
  double t_adamw = 0, t_param16 = 0, t_then_copy = 0;
  {
    Tensor m = dev->empty({n}, DType::f32, MemCategory::kOptimizer),
           v = dev->empty({n}, DType::f32, MemCategory::kOptimizer);
    Tensor h = dev->empty({n}, DType::bf16, MemCategory::kWeights);
    dev->fill(m, 0.0f);
    dev->fill(v, 0.0f);
    t_adamw = per_param([&](int64_t s) {
      hp.step = s;
      dev->adamw(p, gr, m, v, gn, hp);
      dev->synchronize();
    });
    t_param16 = per_param([&](int64_t s) {
      hp.step = s;
      dev->adamw(p, gr, m, v, gn, hp, h);
      dev->synchronize();
    });
    t_then_copy = per_param([&](int64_t s) {
      hp.step = s;
      dev->adamw(p, gr, m, v, gn, hp);
      dev->copy(h, p);
      dev->synchronize();
    });
  }
  double t_8bit = 0;
  {
    const int64_t nb = quant_blocks(n);
    Tensor mq = dev->empty({n}, DType::u8, MemCategory::kOptimizer),
           vq = dev->empty({n}, DType::u8, MemCategory::kOptimizer);
    Tensor ma = dev->empty({nb}, DType::f32, MemCategory::kOptimizer),
           va = dev->empty({nb}, DType::f32, MemCategory::kOptimizer);
    Tensor ts = dev->empty({256}, DType::f32, MemCategory::kOptimizer),
           tu = dev->empty({256}, DType::f32, MemCategory::kOptimizer);
    for (const Tensor& t : {mq, vq, ma, va}) dev->fill(t, 0.0f);
    dev->upload(ts, qs.data(), 1024);
    dev->upload(tu, qu.data(), 1024);
    t_8bit = per_param([&](int64_t s) {
      hp.step = s;
      dev->adamw_8bit(p, gr, mq, vq, ma, va, ts, tu, gn, hp);
      dev->synchronize();
    });
  }
  const char* threads = std::getenv("OMP_NUM_THREADS");
  std::printf("fused steps on %s, %lld parameters, OMP_NUM_THREADS=%s, ns/param (min of %d):\n",
              dev->info().id().c_str(), static_cast<long long>(n), threads ? threads : "(unset)",
              reps);
  std::printf("  adamw                      %.2f\n", t_adamw);
  std::printf("  adamw, param16 bf16        %.2f\n", t_param16);
  std::printf("  adamw, then copy() to bf16 %.2f\n", t_then_copy);
  std::printf("  adamw_8bit                 %.2f\n", t_8bit);
  return 0;
}
