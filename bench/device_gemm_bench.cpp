// device_gemm_bench: GFLOP/s of Device::matmul on any device of the registry, on GPT-2's GEMM
// shapes, in f32, f16 and bf16 (median of --iters timed runs after a warm-up, the device
// synchronized around each). On CUDA/HIP, CT_GPU_GEMM=own makes the device run the project's own
// tiled kernel instead of cuBLASLt / rocBLAS, so two runs compare them (scripts/gpu-check.sh does;
// it also runs it on the GPU's Vulkan device, whose f16 products take the cooperative-matrix GEMM
// where its self-test passed, and with CROSSTRAIN_VK_COOPMAT=0 the tiled one).
//   device_gemm_bench --device cuda:0 [--iters 20] [--json out.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/registry.h"

int main(int argc, char** argv) {
  ct::ShutdownBackendsOnReturn shutdown;  // first: the backends close after everything else
  std::string spec = "simt:0", json_path;
  int iters = 10;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--device" && i + 1 < argc)
      spec = argv[++i];
    else if (a == "--iters" && i + 1 < argc)
      iters = std::max(1, std::atoi(argv[++i]));
    else if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: device_gemm_bench [--device SPEC] [--iters N] [--json FILE]\n");
      return 2;
    }
  }
  try {
    auto dev = ct::open_device(spec);
    const bool small = dev->info().test_only;  // the CPU SIMT runtime: tiny only
    struct Shape {
      int64_t M, N, K;
      bool ta, tb;
      const char* what;
    };
    std::vector<Shape> shapes = {{8192, 2304, 768, false, true, "qkv (B*T=8192)"},
                                 {8192, 3072, 768, false, true, "fc"},
                                 {8192, 768, 3072, false, true, "fc proj"},
                                 {768, 3072, 8192, true, false, "fc weight grad"},
                                 {8192, 50304, 768, false, true, "lm head"}};
    if (small) shapes = {{256, 256, 256, false, true, "256^3"}};
    nlohmann::json rows = nlohmann::json::array();
    const char* own = std::getenv("CT_GPU_GEMM");
    std::printf("%s  %s  gemm: %s\n", dev->info().id().c_str(), dev->info().name.c_str(),
                own && std::string(own) == "own" ? "own (CT_GPU_GEMM=own)" : "default");
    for (ct::DType dt : {ct::DType::f32, ct::DType::f16, ct::DType::bf16}) {
      for (const Shape& s : shapes) {
        ct::Tensor a = dev->empty(s.ta ? ct::Shape{s.K, s.M} : ct::Shape{s.M, s.K}, dt,
                                  ct::MemCategory::kActivations);
        ct::Tensor b = dev->empty(s.tb ? ct::Shape{s.N, s.K} : ct::Shape{s.K, s.N}, dt,
                                  ct::MemCategory::kActivations);
        ct::Tensor c = dev->empty({s.M, s.N}, ct::DType::f32, ct::MemCategory::kActivations);
        dev->fill(a, 0.01f);
        dev->fill(b, 0.02f);
        dev->matmul(c, a, b, s.ta, s.tb);
        dev->synchronize();
        std::vector<double> t;
        for (int i = 0; i < iters; ++i) {
          auto t0 = std::chrono::steady_clock::now();
          dev->matmul(c, a, b, s.ta, s.tb);
          dev->synchronize();
          t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(t.begin(), t.end());
        const double med = t[t.size() / 2];
        const double gflops = 2.0 * s.M * s.N * s.K / med / 1e9;
        std::printf("  %-5s %-16s %6lld x %6lld x %6lld  %9.1f GFLOP/s  (%.3f ms)\n",
                    ct::dtype_name(dt), s.what, static_cast<long long>(s.M),
                    static_cast<long long>(s.N), static_cast<long long>(s.K), gflops, med * 1e3);
        rows.push_back({{"dtype", ct::dtype_name(dt)},
                        {"shape", s.what},
                        {"M", s.M},
                        {"N", s.N},
                        {"K", s.K},
                        {"median_s", med},
                        {"gflops", gflops}});
      }
    }
    if (!json_path.empty()) {
      std::ofstream out(json_path);
      out << nlohmann::json{{"device", dev->info().id()},
                            {"name", dev->info().name},
                            {"gemm", own ? own : "default"},
                            {"rows", rows}}
                 .dump(2)
          << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "device_gemm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
