// vulkan_gemm_bench: GFLOP/s of the Vulkan backend's GEMM variants (register-blocked and
// shared-memory tiled) next to OpenBLAS sgemm, in the same run, on the model's GEMM shapes.
//   vulkan_gemm_bench [--backend vulkan:N] [--iters N] [--cpu-time] [--layout nn|nt|tn]
//                     [--shape MxNxK]... [--dtype f32|f16|bf16] [--json FILE] [--gelu]
//                     (CT_BENCH_VARIANTS=vec,reg picks variants)
// --dtype f16|bf16: a and b in 16 bits, c f32 (the mixed-precision GEMMs), against OpenBLAS on
// the same rounded values; the variants are then vsg, reg, tiled, tiled128 and the emulated
// cooperative-matrix builds cm8e and cm16e. tiled128 is the tiled GEMM in the shape it takes on
// discrete GPUs (128 x 128 tiles, 8 x 8 register blocks), tiled the 64 x 64 one.
// Each figure is the median over --iters runs. Every variant's product is checked against
// OpenBLAS's (max |c - c_blas| / max |c_blas| <= 1e-4): a wrong one is marked and the exit
// status is 1, so no speed is reported for a kernel that does not compute the product.
// --json FILE appends one JSON line per shape (GFLOP/s per variant, OpenBLAS, errors).
// --gelu: instead, GPT-2's MLP GELU GEMMs on the device's default GEMM, fused against unfused:
// matmul_bias_gelu (pre = a b + bias, out = gelu(pre); a [M, K], b [K, N]) against matmul then
// gelu_forward, and matmul_gelu_backward (b^T: dpre = gelu'(pre) * a b^T) against matmul then
// gelu_backward; median ms of each and the fused results' bytes checked equal to the unfused.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/philox.h"
#include "core/registry.h"

using namespace ct;
using Clock = std::chrono::steady_clock;

struct GemmShape {
  int64_t M, N, K;
  const char* what;
};

// Wall seconds, or with --cpu-time the process's CPU seconds (all threads, lavapipe's workers
// included): on a shared machine that measures work done rather than the share of cores won.
static bool g_cpu_time = false;
static double now_s() {
  if (g_cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  }
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median milliseconds of fn() over `iters` runs after a warm-up (pipeline creation).
template <class F>
static double time_ms(Device& dev, int iters, F&& fn) {
  fn();
  dev.synchronize();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    double t0 = now_s();
    fn();
    dev.synchronize();
    t.push_back((now_s() - t0) * 1e3);
  }
  return median(t);
}

static std::vector<uint8_t> bytes_of(Device& dev, const Tensor& t) {
  std::vector<uint8_t> v(t.numel() * dtype_size(t.dtype));
  dev.download(v.data(), t, v.size());
  return v;
}

// --gelu: fused against unfused GELU GEMMs per shape (M = tokens, N = 4C, K = C); returns the
// number of shapes whose fused bytes differ from the unfused ones.
static int gelu_bench(Device& dev, const std::vector<GemmShape>& shapes, DType dt, int iters) {
  std::printf("%-16s %5s %10s %10s %7s %10s %10s %7s\n", "MxNxK", "dtype", "fwd fused", "unfused",
              "saved", "bwd fused", "unfused", "saved");
  int bad = 0;
  for (const auto& s : shapes) {
    Philox p(3, 4);
    auto filled = [&](const Shape& sh, DType t, float scale, uint64_t off) {
      std::vector<float> v(static_cast<size_t>(sh.numel()));
      for (size_t i = 0; i < v.size(); ++i) v[i] = p.normal(i + off) * scale;
      std::vector<uint16_t> bits(t == DType::f32 ? 0 : v.size());
      for (size_t i = 0; i < bits.size(); ++i)
        write_from_f32(bits.data(), t, static_cast<int64_t>(i), v[i]);
      Tensor x = dev.empty(sh, t, MemCategory::kWorkspace);
      if (t == DType::f32)
        dev.upload(x, v.data(), v.size() * 4);
      else
        dev.upload(x, bits.data(), bits.size() * 2);
      return x;
    };
    const float ks = 1.0f / std::sqrt(float(s.K));
    Tensor a = filled({s.M, s.K}, dt, 1.0f, 0), b = filled({s.K, s.N}, dt, ks, 1u << 28);
    Tensor bt = filled({s.N, s.K}, dt, ks, 2u << 28),
           bias = filled({s.N}, DType::f32, 0.1f, 3u << 28);
    Tensor pre = dev.empty({s.M, s.N}, dt, MemCategory::kWorkspace);
    Tensor out = dev.empty({s.M, s.N}, dt, MemCategory::kWorkspace);
    Tensor pre_u = dev.empty({s.M, s.N}, dt, MemCategory::kWorkspace);
    Tensor out_u = dev.empty({s.M, s.N}, dt, MemCategory::kWorkspace);
    Tensor dpre = dev.empty({s.M, s.N}, dt, MemCategory::kWorkspace);
    Tensor dpre_u = dev.empty({s.M, s.N}, dt, MemCategory::kWorkspace);
    const Shape flat{s.M * s.N};
    const double ff =
        time_ms(dev, iters, [&] { dev.matmul_bias_gelu(out, pre, a, b, false, false, bias); });
    const double fu = time_ms(dev, iters, [&] {
      dev.matmul(pre_u, a, b, false, false, 1.0f, 0.0f, &bias);
      dev.gelu_forward(out_u.reshape(flat), pre_u.reshape(flat));
    });
    const double bf =
        time_ms(dev, iters, [&] { dev.matmul_gelu_backward(dpre, a, bt, false, true, pre); });
    const double bu = time_ms(dev, iters, [&] {
      dev.matmul(dpre_u, a, bt, false, true);
      dev.gelu_backward(dpre_u.reshape(flat), pre.reshape(flat), dpre_u.reshape(flat));
    });
    const bool same = bytes_of(dev, pre) == bytes_of(dev, pre_u) &&
                      bytes_of(dev, out) == bytes_of(dev, out_u) &&
                      bytes_of(dev, dpre) == bytes_of(dev, dpre_u);
    bad += same ? 0 : 1;
    char dims[48];
    std::snprintf(dims, sizeof dims, "%ldx%ldx%ld", long(s.M), long(s.N), long(s.K));
    std::printf("%-16s %5s %10.2f %10.2f %6.1f%% %10.2f %10.2f %6.1f%%%s\n", dims, dtype_name(dt),
                ff, fu, 100.0 * (1.0 - ff / fu), bf, bu, 100.0 * (1.0 - bf / bu),
                same ? "" : "  (fused bytes differ!)");
  }
  return bad;
}

int main(int argc, char** argv) {
  ct::ShutdownBackendsOnReturn shutdown;  // first: the backends close after everything else
  std::string spec = "vulkan";
  int iters = 5;
  bool trans_a = false, trans_b = false;  // --layout nn|nt|tn
  std::vector<GemmShape> shapes;
  std::string json_path, layout = "nn";
  DType dt = DType::f32;
  bool gelu = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--backend") && i + 1 < argc)
      spec = argv[++i];
    else if (!std::strcmp(argv[i], "--gelu"))
      gelu = true;
    else if (!std::strcmp(argv[i], "--cpu-time"))
      g_cpu_time = true;
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--layout") && i + 1 < argc) {
      layout = argv[++i];
      if (layout != "nn" && layout != "nt" && layout != "tn") {
        std::fprintf(stderr, "--layout wants nn, nt or tn, not %s\n", layout.c_str());
        return 2;
      }
      trans_a = layout == "tn";
      trans_b = layout == "nt";
    } else if (!std::strcmp(argv[i], "--dtype") && i + 1 < argc) {
      std::string d = argv[++i];
      if (d != "f32" && d != "f16" && d != "bf16") {
        std::fprintf(stderr, "--dtype wants f32, f16 or bf16, not %s\n", d.c_str());
        return 2;
      }
      dt = d == "f16" ? DType::f16 : d == "bf16" ? DType::bf16 : DType::f32;
    } else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--shape") && i + 1 < argc) {
      long m, n, k;
      if (std::sscanf(argv[++i], "%ldx%ldx%ld", &m, &n, &k) != 3) {
        std::fprintf(stderr, "--shape wants MxNxK\n");
        return 2;
      }
      shapes.push_back({m, n, k, "custom"});
    } else {
      std::fprintf(stderr,
                   "usage: %s [--backend vulkan:N] [--iters N] [--cpu-time] [--layout nn|nt|tn] "
                   "[--shape MxNxK]... [--dtype f32|f16|bf16] [--json FILE] [--gelu]\n",
                   argv[0]);
      return 2;
    }
  }
  if (shapes.empty())  // tiny preset (B*T = 1024 tokens, C = 384) and a square one
    shapes = {{1024, 1152, 384, "tiny qkv"},
              {1024, 1536, 384, "tiny fc"},
              {1024, 384, 1536, "tiny proj"},
              {512, 512, 512, "square"}};
  try {
    auto dev = open_device(spec);
    std::printf("device: %s (%s); a, b %s; GFLOP per %s second\n", dev->info().name.c_str(),
                dev->info().driver.c_str(), dtype_name(dt), g_cpu_time ? "CPU" : "wall");
    if (gelu) {
      if (shapes.size() == 4 && std::strcmp(shapes[0].what, "tiny qkv") == 0)
        shapes = {{1024, 1536, 384, "tiny fc"}};  // the tiny preset's MLP (C = 384)
      const int bad = gelu_bench(*dev, shapes, dt, iters);
      if (bad)
        std::fprintf(stderr, "vulkan_gemm_bench: fused GELU bytes differ on %d shapes\n", bad);
      return bad ? 1 : 0;
    }
    std::vector<const char*> variants = {"vsg64", "vsg", "vec", "reg", "tiled", "tiled128"};
    if (dt != DType::f32) variants = {"vsg", "reg", "tiled", "tiled128", "cm8e", "cm16e"};
    if (const char* v = std::getenv("CT_BENCH_VARIANTS")) {  // comma-separated subset
      static std::string keep = v;
      variants.clear();
      for (char* t = std::strtok(keep.data(), ","); t; t = std::strtok(nullptr, ","))
        variants.push_back(t);
    }
    std::vector<std::string> wrong;
    std::printf("%-10s %-16s", "shape", "MxNxK");
    for (auto* v : variants) std::printf(" %9s", v);
    std::printf(" %9s  best/blas\n", "openblas");
    for (const auto& s : shapes) {
      Philox p(1, 2);
      std::vector<float> a(s.M * s.K), b(s.K * s.N), c(s.M * s.N);
      for (size_t i = 0; i < a.size(); ++i) a[i] = p.normal(i);
      for (size_t i = 0; i < b.size(); ++i) b[i] = p.normal(i + a.size());
      Tensor ta =
          dev->empty(trans_a ? Shape{s.K, s.M} : Shape{s.M, s.K}, dt, MemCategory::kWorkspace);
      Tensor tb =
          dev->empty(trans_b ? Shape{s.N, s.K} : Shape{s.K, s.N}, dt, MemCategory::kWorkspace);
      Tensor tc = dev->empty({s.M, s.N}, DType::f32, MemCategory::kWorkspace);
      // 16-bit operands: rounded once; OpenBLAS multiplies the same (widened) values.
      auto put = [&](const Tensor& t, std::vector<float>& v) {
        std::vector<uint16_t> bits(dt == DType::f32 ? 0 : v.size());
        for (size_t i = 0; i < bits.size(); ++i) {
          write_from_f32(bits.data(), dt, static_cast<int64_t>(i), v[i]);
          v[i] = read_as_f32(bits.data(), dt, static_cast<int64_t>(i));
        }
        if (dt == DType::f32)
          dev->upload(t, v.data(), v.size() * 4);
        else
          dev->upload(t, bits.data(), bits.size() * 2);
      };
      put(ta, a);
      put(tb, b);
      double flop = 2.0 * s.M * s.N * s.K;
      std::vector<double> ts;
      for (int it = 0; it < iters + 1; ++it) {  // the first call warms up; c is the reference
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                    trans_b ? CblasTrans : CblasNoTrans, int(s.M), int(s.N), int(s.K), 1.0f,
                    a.data(), trans_a ? int(s.M) : int(s.K), b.data(),
                    trans_b ? int(s.K) : int(s.N), 0.0f, c.data(), int(s.N));
        if (it > 0) ts.push_back(now_s() - t0);
      }
      double blas = flop / median(ts) * 1e-9, cmax = 0;
      for (float x : c) cmax = std::max(cmax, double(std::fabs(x)));
      std::vector<double> gf(variants.size()), err(variants.size());
      std::vector<float> got(c.size());
      for (size_t v = 0; v < variants.size(); ++v) {
        // tiled128: the tiled GEMM in its discrete-GPU shape (128 x 128, 8 x 8 blocks)
        const bool t128 = std::strcmp(variants[v], "tiled128") == 0;
        setenv("CROSSTRAIN_VK_MATMUL", t128 ? "tiled" : variants[v], 1);
        if (t128)
          setenv("CROSSTRAIN_VK_TILED", "128", 1);
        else
          unsetenv("CROSSTRAIN_VK_TILED");
        dev->matmul(tc, ta, tb, trans_a, trans_b);  // warm-up: pipeline creation
        dev->synchronize();
        std::vector<double> tv;
        for (int it = 0; it < iters; ++it) {
          double t0 = now_s();
          dev->matmul(tc, ta, tb, trans_a, trans_b);
          dev->synchronize();
          tv.push_back(now_s() - t0);
        }
        gf[v] = flop / median(tv) * 1e-9;
        dev->download(got.data(), tc, got.size() * 4);
        double e = 0;
        for (size_t i = 0; i < c.size(); ++i) e = std::max(e, double(std::fabs(got[i] - c[i])));
        err[v] = cmax > 0 ? e / cmax : e;
        if (!(err[v] <= 1e-4)) wrong.push_back(std::string(variants[v]) + " on " + s.what);
      }
      double top = 0;
      char dims[48];
      std::snprintf(dims, sizeof dims, "%ldx%ldx%ld", long(s.M), long(s.N), long(s.K));
      std::printf("%-10s %-16s", s.what, dims);
      nlohmann::json line = {{"shape", s.what},
                             {"M", s.M},
                             {"N", s.N},
                             {"K", s.K},
                             {"layout", layout},
                             {"dtype", dtype_name(dt)},
                             {"openblas_gflops", blas},
                             {"device", dev->info().name},
                             {"gflops", nlohmann::json::object()},
                             {"max_rel_err", nlohmann::json::object()}};
      for (size_t v = 0; v < variants.size(); ++v) {
        bool ok = err[v] <= 1e-4;
        std::printf(" %8.1f%s", gf[v], ok ? " " : "!");
        if (ok) top = std::max(top, gf[v]);
        line["gflops"][variants[v]] = gf[v];
        line["max_rel_err"][variants[v]] = err[v];
      }
      std::printf(" %9.1f  %5.1f%%\n", blas, 100.0 * top / blas);
      line["best_over_openblas"] = top / blas;
      if (!json_path.empty()) {
        std::ofstream out(json_path, std::ios::app);
        out << line.dump() << "\n";
        if (!out) throw std::runtime_error("cannot write " + json_path);
      }
    }
    if (!wrong.empty()) {
      std::fprintf(stderr,
                   "vulkan_gemm_bench: wrong products (marked !, max relative error > 1e-4):");
      for (const auto& w : wrong) std::fprintf(stderr, " %s;", w.c_str());
      std::fprintf(stderr, "\n");
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vulkan_gemm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
