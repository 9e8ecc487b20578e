// device_gemm_bench: GFLOP/s of Device::matmul on any device of the registry, on GPT-2's GEMM
// shapes (B*T = 8192) in f32, f16 and bf16 (median of --iters timed runs after a warm-up, the
// device synchronized around each). Each row names the kernel path that ran, as --profile does
// ("cuBLASLt", "own gemm_tc_kernel (...)", "own, cuBLASLt refused: ..."). The 16-bit rows add
// the rest of a layer's products as the trainer issues them: the input gradients (nn, c in the
// input type) and the weight gradients (tn, accumulated into f32 c with beta 1).
// On CUDA/HIP, CT_GPU_GEMM=own makes the device run the project's own kernels instead of
// cuBLASLt / rocBLAS, so two runs compare them (scripts/gpu-check.sh does; it also runs it on the
// GPU's Vulkan device, whose f16 products take the cooperative-matrix GEMM where its self-test
// passed, and with CROSSTRAIN_VK_COOPMAT=0 the tiled one). --compare does it in one run: every
// row also on a second device opened with CT_GPU_GEMM=own and CT_GPU_TILES=1 (the own tensor-core
// GEMM for 16-bit inputs; on simt/simt64 against the default scalar kernel), and the ratio;
// where that kernel split k (gemm_tc.cu's split-k), also unsplit (CT_GPU_SPLITK=1) and split-k's
// gain.
// On the CPU, --compare runs the second device with CT_CPU_PACKED_GEMM=0: the 16-bit products on
// widened f32 copies and OpenBLAS sgemm instead of the own packing GEMM (cpu_device.cpp's
// packed_gemm_on), which is how the routing of each product there was measured. --shapes tiny
// or gpt2 takes the shapes of the CPU runs (B*T = 1024: tiny 4 x 256 with C 384 and V 256, gpt2
// 1 x 1024); --cpu-time times the process's CPU time instead of wall time (with
// OMP_NUM_THREADS=1, a product's single-core cost, which load from other processes barely moves);
// --dtypes f32,bf16 limits the dtypes; --cold evicts the caches before each timed call.
//   device_gemm_bench --device cuda:0 [--iters 20] [--compare] [--json out.json]
//   device_gemm_bench --device cpu:0 --shapes tiny --dtypes f32,bf16 --compare [--cpu-time]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/registry.h"

namespace {

struct Shape {
  int64_t M, N, K;
  bool ta, tb;
  const char* what;
  bool wgrad = false;      // a weight gradient: c f32, beta 1 (16-bit rows only)
  bool half_only = false;  // a row of the 16-bit dtypes only
  bool c_half = false;     // c in the input type (16-bit rows)
};

struct Timing {
  double median_s = 0, gflops = 0;
  std::string path;  // the profile's matmul line, "" where the device has no profile
};

bool g_cpu_time = false;  // --cpu-time
bool g_cold = false;      // --cold

// --cold: 64 MiB written before each timed call, so the product's operands and c come from
// memory, as in a training step, where the ops between two products evict them (a weight
// gradient's c was last touched a step earlier). Without it every call finds them in cache.
void evict_caches() {
  static std::vector<unsigned char> junk(size_t{64} << 20);
  static unsigned char v = 0;
  std::memset(junk.data(), ++v, junk.size());
}

// Seconds of wall time, or with --cpu-time of this process's CPU time (all threads).
double now_s() {
  if (!g_cpu_time)
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The model's products for B*T rows, width C, vocabulary V: the first five rows as before (c
// f32, beta 0, every dtype), then, 16-bit only, a layer's products as bf16 training issues them.
std::vector<Shape> model_shapes(int64_t BT, int64_t C, int64_t V) {
  const int64_t C3 = 3 * C, C4 = 4 * C;
  return {
      {BT, C3, C, false, true, "qkv"},
      {BT, C4, C, false, true, "fc"},
      {BT, C, C4, false, true, "fc proj"},
      {C, C4, BT, true, false, "fc weight grad"},
      {BT, V, C, false, true, "lm head"},
      {BT, C3, C, false, true, "qkv fwd", false, true, true},
      {BT, C, C, false, true, "attn proj fwd", false, true, true},
      {BT, C4, C, false, true, "fc fwd", false, true, true},
      {BT, C, C4, false, true, "fc proj fwd", false, true, true},
      {BT, C, C3, false, false, "qkv dx", false, true, true},
      {BT, C, C4, false, false, "fc dx", false, true, true},
      {BT, C4, C, false, false, "fc proj dx", false, true, true},
      {C3, C, BT, true, false, "qkv dw", true, true},
      {C, C, BT, true, false, "attn proj dw", true, true},
      {C4, C, BT, true, false, "fc dw", true, true},
      {C, C4, BT, true, false, "fc proj dw", true, true},
      {BT, V, C, false, true, "lm head fwd", false, true, true},
      {BT, C, V, false, false, "lm head dx", false, true, true},
      {V, C, BT, true, false, "lm head dw", true, true},
  };
}

// One row on dev: a warm-up call (profiled, for the path), then `iters` timed calls.
Timing time_row(ct::Device& dev, const Shape& s, ct::DType dt, int iters) {
  const bool half = dt != ct::DType::f32;
  const ct::DType cdt = half && s.c_half ? dt : ct::DType::f32;
  const float beta = half && s.wgrad ? 1.0f : 0.0f;
  ct::Tensor a = dev.empty(s.ta ? ct::Shape{s.K, s.M} : ct::Shape{s.M, s.K}, dt,
                           ct::MemCategory::kActivations);
  ct::Tensor b = dev.empty(s.tb ? ct::Shape{s.N, s.K} : ct::Shape{s.K, s.N}, dt,
                           ct::MemCategory::kActivations);
  ct::Tensor c = dev.empty({s.M, s.N}, cdt, ct::MemCategory::kActivations);
  dev.fill(a, 0.01f);
  dev.fill(b, 0.02f);
  dev.fill(c, 0.0f);
  Timing r;
  dev.set_profiling(true);
  dev.matmul(c, a, b, s.ta, s.tb, 1.0f, beta);
  dev.synchronize();
  const std::string report = dev.profile_report();
  dev.set_profiling(false);
  // "matmul: <path> <calls>" (the GPU devices), or the CPU's "matmul <dtype>: <path>  <calls>"
  std::size_t at = report.find("matmul: "), skip = 8;
  const std::size_t paths = report.find("kernel path per op");
  if (at == std::string::npos && paths != std::string::npos &&
      (at = report.find("  matmul ", paths)) != std::string::npos)
    skip = report.find(": ", at) + 2 - at;
  if (at != std::string::npos) {
    const std::size_t end = report.find('\n', at);
    r.path =
        report.substr(at + skip, end == std::string::npos ? std::string::npos : end - at - skip);
    const std::size_t calls = r.path.find_last_not_of("0123456789");  // the trailing call count
    if (calls != std::string::npos) r.path = r.path.substr(0, calls + 1);
    while (!r.path.empty() && r.path.back() == ' ') r.path.pop_back();
  }
  // A fill before each call drops what the CPU device keeps between products (widened copies of
  // 16-bit operands, cpu_device.cpp's kept_slot): every timed call widens its operands, as the
  // first product that reads them in a training step does.
  ct::Tensor drop = dev.empty({1}, ct::DType::f32, ct::MemCategory::kActivations);
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    dev.fill(drop, 0.0f);
    dev.synchronize();
    if (g_cold) evict_caches();
    const double t0 = now_s();
    dev.matmul(c, a, b, s.ta, s.tb, 1.0f, beta);
    dev.synchronize();
    t.push_back(now_s() - t0);
  }
  std::sort(t.begin(), t.end());
  r.median_s = t[t.size() / 2];
  r.gflops = 2.0 * s.M * s.N * s.K / r.median_s / 1e9;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  ct::ShutdownBackendsOnReturn shutdown;  // first: the backends close after everything else
  std::string spec = "simt:0", json_path, shape_set = "gpt2-8k", dtypes = "f32,f16,bf16";
  int iters = 10;
  bool compare = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--device" && i + 1 < argc)
      spec = argv[++i];
    else if (a == "--iters" && i + 1 < argc)
      iters = std::max(1, std::atoi(argv[++i]));
    else if (a == "--compare")
      compare = true;
    else if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else if (a == "--shapes" && i + 1 < argc)
      shape_set = argv[++i];
    else if (a == "--dtypes" && i + 1 < argc)
      dtypes = argv[++i];
    else if (a == "--cpu-time")
      g_cpu_time = true;
    else if (a == "--cold")
      g_cold = true;
    else {
      std::fprintf(
          stderr,
          "usage: device_gemm_bench [--device SPEC] [--iters N] [--compare] [--json "
          "FILE] [--shapes gpt2-8k|gpt2|tiny] [--dtypes f32,f16,bf16] [--cpu-time] [--cold]\n");
      return 2;
    }
  }
  try {
    auto dev = ct::open_device(spec);
    // The comparison device: each backend reads only its own variables (the CPU's packing GEMM
    // off, so widened copies + sgemm; a GPU's own tile kernels instead of the library).
    std::unique_ptr<ct::Device> own, own_unsplit;
    if (compare)
      own = ct::open_device_with_env(
          spec, {{"CT_CPU_PACKED_GEMM", "0"}, {"CT_GPU_GEMM", "own"}, {"CT_GPU_TILES", "1"}});
    const bool small = dev->info().test_only;  // the CPU SIMT runtime: tiny only
    std::vector<Shape> shapes = shape_set == "tiny"   ? model_shapes(1024, 384, 256)
                                : shape_set == "gpt2" ? model_shapes(1024, 768, 50304)
                                                      : model_shapes(8192, 768, 50304);
    if (small)
      shapes = {{256, 256, 256, false, true, "256^3"},
                {256, 256, 256, true, false, "256^3 dw", true, true}};
    nlohmann::json rows = nlohmann::json::array();
    const char* own_env = std::getenv("CT_GPU_GEMM");
    std::printf("%s  %s  gemm: %s%s%s%s\n", dev->info().id().c_str(), dev->info().name.c_str(),
                own_env && std::string(own_env) == "own" ? "own (CT_GPU_GEMM=own)" : "default",
                !compare ? ""
                         : "; --compare: own = CT_GPU_GEMM=own CT_GPU_TILES=1 on a GPU, "
                           "CT_CPU_PACKED_GEMM=0 (widened copies + sgemm) on the CPU",
                g_cpu_time ? "; process CPU time" : "",
                g_cold ? "; caches evicted before each call" : "");
    for (ct::DType dt : {ct::DType::f32, ct::DType::f16, ct::DType::bf16}) {
      if (("," + dtypes + ",").find("," + std::string(ct::dtype_name(dt)) + ",") ==
          std::string::npos)
        continue;
      const bool half = dt != ct::DType::f32;
      for (const Shape& s : shapes) {
        if (s.half_only && !half) continue;
        const Timing t = time_row(*dev, s, dt, iters);
        const std::string layout = std::string(s.ta ? "t" : "n") + (s.tb ? "t" : "n");
        const char* cname = half && s.c_half ? ct::dtype_name(dt) : "f32";
        std::printf("  %-5s %-16s %6lld x %6lld x %6lld %s -> %-4s%s %9.1f GFLOP/s (%.3f ms)",
                    ct::dtype_name(dt), s.what, static_cast<long long>(s.M),
                    static_cast<long long>(s.N), static_cast<long long>(s.K), layout.c_str(), cname,
                    half && s.wgrad ? " +=" : "   ", t.gflops, t.median_s * 1e3);
        nlohmann::json row = {{"dtype", ct::dtype_name(dt)},
                              {"shape", s.what},
                              {"M", s.M},
                              {"N", s.N},
                              {"K", s.K},
                              {"layout", layout},
                              {"c", cname},
                              {"beta", half && s.wgrad ? 1.0 : 0.0},
                              {"median_s", t.median_s},
                              {"gflops", t.gflops},
                              {"path", t.path}};
        Timing unsplit;
        if (own) {
          const Timing o = time_row(*own, s, dt, iters);
          std::printf("  own %9.1f GFLOP/s (%.2fx)", o.gflops, o.gflops / t.gflops);
          row["own_gflops"] = o.gflops;
          row["own_median_s"] = o.median_s;
          row["own_path"] = o.path;
          row["own_over_default"] = o.gflops / t.gflops;
          // Where the own kernel split k, the same kernel unsplit (CT_GPU_SPLITK=1) beside it.
          if (o.path.find("split-k") != std::string::npos) {
            if (!own_unsplit)
              own_unsplit = ct::open_device_with_env(
                  spec, {{"CT_GPU_GEMM", "own"}, {"CT_GPU_TILES", "1"}, {"CT_GPU_SPLITK", "1"}});
            unsplit = time_row(*own_unsplit, s, dt, iters);
            std::printf("  unsplit %9.1f (split-k %.2fx)", unsplit.gflops,
                        o.gflops / unsplit.gflops);
            row["own_unsplit_gflops"] = unsplit.gflops;
            row["own_unsplit_path"] = unsplit.path;
          }
        }
        std::printf("\n        path: %s\n", t.path.c_str());
        if (own) std::printf("        own:  %s\n", row["own_path"].get<std::string>().c_str());
        if (!unsplit.path.empty()) std::printf("        unsplit: %s\n", unsplit.path.c_str());
        rows.push_back(row);
      }
    }
    if (!json_path.empty()) {
      std::ofstream out(json_path);
      out << nlohmann::json{{"device", dev->info().id()},
                            {"name", dev->info().name},
                            {"gemm", own_env ? own_env : "default"},
                            {"compare", compare},
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
