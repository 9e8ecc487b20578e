// GEMM throughput for the model's shapes: OpenBLAS sgemm vs oneDNN f32 matmul, plus oneDNN bf16
// (bf16 inputs, f32 output) for reference. Median GFLOP/s over repeats; this decides which BLAS
// the CPU fast path uses.
//
//   gemm_bench [--reps N] [--quick] [--no-dnnl] [--shape MxKxN]
//
// --shape measures that one shape only (e.g. 1024x768x3072; bench/train_bench.py uses it).
//
// Each shape M x K x N is run in the three layouts of a linear layer y = x W (x [M,K]):
//   fwd   y  = x W          NN  (M, N, K)
//   dx    dx = dy W^T       NT  (M, K, N)
//   dw    dW = x^T dy       TN  (K, N, M)
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#ifdef CT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace {

bool g_cpu_time = false;

double seconds_now() {
  timespec t;
  clock_gettime(g_cpu_time ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &t);
  double s = static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  return g_cpu_time ? s / omp_get_max_threads() : s;
}

struct Gemm {
  bool ta, tb;
  long M, N, K;  // c (M,N) = op(a) (M,K) op(b) (K,N)
};

double median_seconds(const std::function<void()>& fn, int reps) {
  fn();  // warm up: page in buffers, create threads
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    double t0 = seconds_now();
    fn();
    t.push_back(seconds_now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<float> random_vec(size_t n, unsigned seed) {
  std::vector<float> v(n);
  unsigned s = seed * 2654435761u + 1;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / 16777216.0f - 0.5f;
  }
  return v;
}

double openblas(const Gemm& g, int reps) {
  auto a = random_vec(g.M * g.K, 1), b = random_vec(g.K * g.N, 2);
  std::vector<float> c(g.M * g.N);
  return median_seconds(
      [&] {
        cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans,
                    g.tb ? CblasTrans : CblasNoTrans, g.M, g.N, g.K, 1.0f, a.data(),
                    g.ta ? g.M : g.K, b.data(), g.tb ? g.K : g.N, 0.0f, c.data(), g.N);
      },
      reps);
}

#ifdef CT_HAVE_DNNL
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

double onednn(const Gemm& g, int reps, bool bf16) {
  using namespace dnnl;
  using dt = memory::data_type;
  static engine eng(engine::kind::cpu, 0);
  static stream s(eng);
  dt in = bf16 ? dt::bf16 : dt::f32;
  // Row-major operands; a transposed operand is the stored matrix read with swapped strides.
  memory::desc a_md({g.M, g.K}, in, g.ta ? memory::dims{1, g.M} : memory::dims{g.K, 1});
  memory::desc b_md({g.K, g.N}, in, g.tb ? memory::dims{1, g.K} : memory::dims{g.N, 1});
  memory::desc c_md({g.M, g.N}, dt::f32, memory::dims{g.N, 1});
  matmul::primitive_desc pd(matmul::desc(a_md, b_md, c_md), eng);
  matmul prim(pd);
  auto af = random_vec(g.M * g.K, 1), bf = random_vec(g.K * g.N, 2);
  std::vector<uint16_t> ah, bh;
  void* ap = af.data();
  void* bp = bf.data();
  if (bf16) {
    for (float x : af) ah.push_back(to_bf16(x));
    for (float x : bf) bh.push_back(to_bf16(x));
    ap = ah.data();
    bp = bh.data();
  }
  std::vector<float> c(g.M * g.N);
  memory am(a_md, eng, ap), bm(b_md, eng, bp), cm(c_md, eng, c.data());
  return median_seconds(
      [&] {
        prim.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
        s.wait();
      },
      reps);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  int reps = 7;
  bool quick = false, dnnl_on = true;
  long shape_m = 0, shape_k = 0, shape_n = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--no-dnnl") {
      dnnl_on = false;
    } else if (a == "--cpu-time") {
      g_cpu_time = true;
    } else if (a == "--shape" && i + 1 < argc &&
               std::sscanf(argv[i + 1], "%ldx%ldx%ld", &shape_m, &shape_k, &shape_n) == 3 &&
               shape_m > 0 && shape_k > 0 && shape_n > 0) {
      ++i;
    } else {
      std::fprintf(stderr, "usage: gemm_bench [--reps N] [--quick] [--no-dnnl] [--shape MxKxN]\n");
      return 2;
    }
  }
#ifndef CT_HAVE_DNNL
  dnnl_on = false;
#endif
  struct Shape {
    long M, K, N;
    const char* what;
  };
  std::vector<Shape> shapes = {
      {1024, 384, 1152, "qkv    6L/384"}, {1024, 384, 1536, "fc     6L/384"},
      {1024, 1536, 384, "proj   6L/384"}, {1024, 768, 2304, "qkv    124M"},
      {1024, 768, 3072, "fc     124M"},   {1024, 3072, 768, "proj   124M"},
      {1024, 768, 50257, "lmhead 124M"}};
  if (quick) shapes.resize(3);
  if (shape_m > 0) shapes = {{shape_m, shape_k, shape_n, "custom"}};
  std::printf("OpenBLAS %s, %d threads; median of %d runs (%s); GFLOP/s\n", openblas_get_config(),
              openblas_get_num_threads(), reps, g_cpu_time ? "CPU time / threads" : "wall time");
  std::printf("%-14s %-18s %-4s %10s %12s %12s\n", "layer", "M x K x N", "op", "OpenBLAS",
              "oneDNN f32", "oneDNN bf16");
  for (const Shape& sh : shapes) {
    const Gemm layouts[3] = {{false, false, sh.M, sh.N, sh.K},
                             {false, true, sh.M, sh.K, sh.N},
                             {true, false, sh.K, sh.N, sh.M}};
    const char* names[3] = {"fwd", "dx", "dw"};
    for (int l = 0; l < 3; ++l) {
      const Gemm& g = layouts[l];
      double flops = 2.0 * g.M * g.N * g.K;
      int r = flops > 2e10 ? std::max(3, reps / 2) : reps;
      double ob = flops / openblas(g, r) / 1e9;
      char dims[64];
      std::snprintf(dims, sizeof(dims), "%ldx%ldx%ld", sh.M, sh.K, sh.N);
      std::printf("%-14s %-18s %-4s %10.1f", sh.what, dims, names[l], ob);
#ifdef CT_HAVE_DNNL
      if (dnnl_on) {
        double f32 = flops / onednn(g, r, false) / 1e9;
        double b16 = flops / onednn(g, r, true) / 1e9;
        std::printf(" %12.1f %12.1f", f32, b16);
      }
#endif
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}
