// The `simt` and `simt64` backends: the GPU kernels of backends/gpu/kernels, compiled by the host
// compiler, run by the CPU SIMT runtime at warp size 32 (simt) or 64 (simt64; CT_SIMT_WARP).
// They exist so that every CI run executes the CUDA/HIP kernel sources and compares them with the
// CPU reference; `--backend auto` never picks them.
//
// Device memory is host memory; a launch returns when the kernel has finished, so the stream is
// always idle, events are complete when recorded and copies are plain memcpy.
//
// Graphs are a strict model of CUDA's: while capturing, launches and device-to-device copies are
// recorded (checked, not run) on the device's own stream, a replay runs them in order, and every
// call CUDA refuses on a capturing stream throws (gpu::Runtime::refuse_in_capture), so that CI
// catches on the CPU what would fail on a GPU.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/gpu/runtime.h"
#include "backends/simt/simt.h"
#include "core/dist/collective_library.h"
#include "core/error.h"

#ifndef CT_SIMT_WARP
#error "CT_SIMT_WARP (32 or 64) must be defined"
#endif

namespace ct::simt {
namespace {

constexpr int kWarp = CT_SIMT_WARP;
const std::string kName = kWarp == 32 ? "simt" : "simt" + std::to_string(kWarp);

std::int64_t host_memory_bytes(int name) {
  long pages = sysconf(name), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::int64_t>(pages) * page : 0;
}

DeviceInfo make_info() {
  DeviceInfo i;
  i.backend = kName;
  i.index = 0;
  i.name =
      "CPU SIMT runtime (CUDA/HIP kernels on host threads, warp " + std::to_string(kWarp) + ")";
  i.type = DeviceType::kVirtualGpu;
  i.test_only = true;  // never --backend auto's choice
  i.graphs = true;     // a strict model of CUDA's (SimtRuntime's capture)
  i.driver = "backends/simt (Boost.Context fibers)";
  i.memory_bytes = host_memory_bytes(_SC_PHYS_PAGES);
  i.memory_budget_bytes = host_memory_bytes(_SC_AVPHYS_PAGES);
  i.max_allocation_bytes = i.memory_bytes;
  i.max_buffer_range_bytes = i.memory_bytes;
  i.dtypes = {DType::f32, DType::f16, DType::bf16, DType::i32};
  i.extra = {{"warp size", std::to_string(kWarp)},
             {"host threads", std::to_string(default_runtime().threads())},
             {"purpose", "tests: runs the GPU kernel sources on the CPU (not fast)"},
             // data parallel's device path with NCCL's API over MPI (--ddp-backend nccl)
             {"collective library", dist::kSimtCollectives}};
  return i;
}

class SimtRuntime final : public gpu::Runtime {
 public:
  SimtRuntime() : info_(make_info()) {
    info_.extra.push_back(
        {"own GEMM, 16-bit", tiles_ ? "128x128 tensor-core kernel on matrix tiles (the runtime's "
                                      "collectives; rows not 16-byte aligned: 64x64 tiles)"
                                    : "scalar tiled kernel"});
  }
  const DeviceInfo& info() const override { return info_; }
  gpu::Ctx ctx() override {
    gpu::Ctx c;
    c.warp = kWarp;
    c.stream = &stream_;
    c.multiprocessors = default_runtime().threads();
    c.matrix_tiles = tiles_;
    c.splitk = splitk_;
    c.tf32 = tf32_;
    return c;
  }
  // The runtime executes the TF32 tile (mma.sync m16n8k8 .tf32 as a collective), so the tile flash
  // attention takes f32 here too once allowed; its info() does not claim tf32, since the own GEMM
  // has no TF32 form (the trainer's --tf32 leaves this device in fp32).
  void set_allow_tf32(bool on) override { tf32_ = on; }
  void* allocate(std::size_t bytes) override {
    // More than the machine has: out of memory, without asking the allocator (a sanitizer's
    // allocator would abort on such a request instead of returning null).
    if (bytes > static_cast<std::size_t>(info_.memory_bytes)) return nullptr;
    // 256-byte aligned like cudaMalloc; fresh memory reads as NaN (0xff bytes) in float, so a
    // kernel that reads what nobody wrote shows it.
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (p) std::memset(p, 0xff, bytes);
    return p;
  }
  void release(void* p) override {
    refuse_in_capture("release (cudaFree)", "freeing device memory waits for the device");
    std::free(p);
  }
  void memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override {
    *free_bytes = static_cast<std::size_t>(host_memory_bytes(_SC_AVPHYS_PAGES));
    *total_bytes = static_cast<std::size_t>(info_.memory_bytes);
  }
  void upload(void* dst, const void* host, std::size_t bytes) override {
    refuse_in_capture("upload",
                      "a copy from pageable host memory; a replay would read the host buffer "
                      "again, after the caller reused it");
    std::memcpy(dst, host, bytes);
  }
  void download(void* host, const void* src, std::size_t bytes) override {
    refuse_in_capture("download", "a blocking read waits for work that is only being recorded");
    std::memcpy(host, src, bytes);
  }
  void download_async(void* host, const void* src, std::size_t bytes) override {
    refuse_in_capture("download_async", "a copy into pageable host memory");
    std::memcpy(host, src, bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (std::vector<simt::Runtime::Node>* graph = stream_.capture()) {
      graph->push_back([dst, src, bytes] { std::memcpy(dst, src, bytes); });
      return;
    }
    std::memcpy(dst, src, bytes);
  }
  std::uint64_t record_event() override {
    refuse_in_capture("record_event", "the host would wait for or query an event of the graph");
    return 0;
  }
  bool event_done(std::uint64_t) override {
    refuse_in_capture("event_done (cudaEventQuery)", "querying work that is only being recorded");
    return true;
  }
  void wait_event(std::uint64_t) override {
    refuse_in_capture("wait_event (cudaEventSynchronize)",
                      "waiting for work that is only being recorded");
  }
  void synchronize() override {
    refuse_in_capture("synchronize (cudaStreamSynchronize)",
                      "waiting for work that is only being recorded");
  }
  void* native_stream() override { return nullptr; }

  bool has_graphs() const override { return true; }
  void launch_graph(std::uint64_t graph) override {
    auto it = graphs_.find(graph);
    if (it == graphs_.end())
      fail(ErrorKind::kInvalidArgument, info_.id() + ": launch_graph: no graph " +
                                            std::to_string(graph) + " (destroyed, or never made)");
    const std::vector<simt::Runtime::Node>& nodes = it->second;
    if (std::vector<simt::Runtime::Node>* outer = stream_.capture()) {  // a graph in a graph
      outer->push_back([nodes] {
        for (const auto& node : nodes) node();
      });
      return;
    }
    for (const auto& node : nodes) node();
  }
  void destroy_graph(std::uint64_t graph) override { graphs_.erase(graph); }

 protected:
  void start_capture() override {
    recording_.clear();
    stream_.begin_capture(&recording_);
  }
  std::uint64_t stop_capture() override {
    stream_.end_capture();
    graphs_[++last_graph_] = std::move(recording_);
    recording_.clear();
    return last_graph_;
  }

 private:
  // The 16-bit GEMM through the matrix tile with CT_GPU_TILES=1 (gemm_tc.cu, or matmul.cu's tile
  // kernel for unaligned rows): one call of the runtime's matrix collective per tile (it gives the
  // scalar kernel's bits, so only speed depends on it). Off by default: a round of fiber switches
  // per tile makes it ~6x slower here than the scalar kernel (backends/gpu/README.md has the
  // figures; tests/simt/mma_test.cpp and tests/ops/gemm_tc_test.cpp run the tile paths at both
  // warp sizes).
  bool tiles_ = gpu::matrix_tiles_setting(false);
  int splitk_ = gpu::splitk_setting(1);  // never by the host-thread count (gpu/kernels.h)
  bool tf32_ = false;
  DeviceInfo info_;
  // This device's stream over the process-wide host threads: its captures are its own.
  simt::Runtime stream_{&default_runtime()};
  std::vector<simt::Runtime::Node> recording_;                        // the capture in progress
  std::map<std::uint64_t, std::vector<simt::Runtime::Node>> graphs_;  // made graphs, by number
  std::uint64_t last_graph_ = 0;
};

class SimtBackend final : public Backend {
 public:
  std::string name() const override { return kName; }
  std::string unavailable_reason() const override { return ""; }
  std::vector<DeviceInfo> devices() const override { return {make_info()}; }
  std::unique_ptr<Device> open(int index) override {
    if (index != 0)
      fail(ErrorKind::kInvalidArgument, kName + ": device index " + std::to_string(index) +
                                            " out of range; " + kName + " has 1 device:\n  " +
                                            kName + ":0  " + make_info().name);
    return gpu::make_gpu_device(std::make_unique<SimtRuntime>());
  }
};

}  // namespace
}  // namespace ct::simt

extern "C" {
__attribute__((visibility("default"))) int crosstrain_backend_abi_version() {
  return ct::kBackendAbiVersion;
}
__attribute__((visibility("default"))) ct::Backend* crosstrain_backend_create() {
  return new ct::simt::SimtBackend();
}
}
