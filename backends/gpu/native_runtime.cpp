// The native GPU targets, CUDA and HIP, from one source: ct::gpu::Runtime over the vendor's
// runtime API (one stream per device, pooled events, device memory, stream-ordered copies) and
// the backend that lists and opens the devices. The two APIs differ in their prefix (cuda*,
// hip*) and a few names; CT_API(Name) picks the prefix and the block below the rest, as
// backends/gpu/portability.h does for the kernels. Built once per plugin with CT_NATIVE_CUDA
// (backends/cuda) or CT_NATIVE_HIP (backends/hip). Every runtime call is checked; the error
// names the call.
#if defined(CT_NATIVE_CUDA)
#include <cuda_runtime_api.h>
#define CT_API(name) cuda##name
#elif defined(CT_NATIVE_HIP)
#include <hip/hip_runtime_api.h>
#define CT_API(name) hip##name
#else
#error "define CT_NATIVE_CUDA or CT_NATIVE_HIP"
#endif

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/gpu/gemm_library.h"
#include "backends/gpu/runtime.h"
#include "core/error.h"
#include "core/teardown_trace.h"

namespace ct::gpu::native {
namespace {

#if defined(CT_NATIVE_CUDA)
using ApiError = cudaError_t;
using ApiStream = cudaStream_t;
using ApiEvent = cudaEvent_t;
using ApiGraph = cudaGraph_t;
using ApiGraphExec = cudaGraphExec_t;
using ApiProp = cudaDeviceProp;
constexpr ApiError kApiOutOfMemory = cudaErrorMemoryAllocation;
constexpr cudaDeviceAttr kApiMultiprocessors = cudaDevAttrMultiProcessorCount;
constexpr const char* kTarget = "cuda";
constexpr const char* kTargetUpper = "CUDA";
constexpr const char* kLibrary = "cuBLASLt";  // the GEMM library, as --profile names it
#else
using ApiError = hipError_t;
using ApiStream = hipStream_t;
using ApiEvent = hipEvent_t;
using ApiGraph = hipGraph_t;
using ApiGraphExec = hipGraphExec_t;
using ApiProp = hipDeviceProp_t;
constexpr ApiError kApiOutOfMemory = hipErrorOutOfMemory;
constexpr hipDeviceAttribute_t kApiMultiprocessors = hipDeviceAttributeMultiprocessorCount;
constexpr const char* kTarget = "hip";
constexpr const char* kTargetUpper = "HIP";
constexpr const char* kLibrary = "rocBLAS";
#endif

// "CT_API(Malloc)(&p, n)" as the call reads in the vendor's API: "cudaMalloc(&p, n)".
std::string call_name(std::string call) {
  for (std::size_t at; (at = call.find("CT_API(")) != std::string::npos;) {
    const std::size_t close = call.find(')', at);
    call =
        call.substr(0, at) + kTarget + call.substr(at + 7, close - at - 7) + call.substr(close + 1);
  }
  return call;
}

[[noreturn]] void api_fail(const char* call, ApiError e) {
  fail(e == kApiOutOfMemory ? ErrorKind::kOutOfMemory : ErrorKind::kDevice,
       call_name(call) + ": " + CT_API(GetErrorName)(e) + " (" + CT_API(GetErrorString)(e) + ")");
}
#define CT_API_CHECK(call)                                \
  do {                                                    \
    ApiError ct_e_ = (call);                              \
    if (ct_e_ != CT_API(Success)) api_fail(#call, ct_e_); \
  } while (0)

// Why the target cannot be used here ("" when it can), and the number of devices.
int device_count(std::string* why) {
  int n = 0;
  ApiError e = CT_API(GetDeviceCount)(&n);
  if (e == CT_API(Success) && n > 0) {
    why->clear();
    return n;
  }
  (void)CT_API(GetLastError)();  // clear the sticky error
#if defined(CT_NATIVE_CUDA)
  if (e == cudaSuccess || e == cudaErrorNoDevice)
    *why = "no CUDA device (the driver is there but lists no GPU)";
  else if (e == cudaErrorInsufficientDriver)
    *why = "no usable NVIDIA driver: libcuda.so.1 is missing or older than this CUDA " +
           std::to_string(CUDART_VERSION / 1000) + "." +
           std::to_string(CUDART_VERSION % 1000 / 10) + " runtime";
#else
  if (e == hipSuccess || e == hipErrorNoDevice)
    *why = "no HIP device (no AMD GPU, or /dev/kfd not accessible)";
  else if (e == hipErrorInsufficientDriver)
    *why = "no usable AMD driver (amdgpu kernel driver / ROCm runtime missing)";
#endif
  else
    *why = std::string(kTarget) + " GetDeviceCount: " + CT_API(GetErrorName)(e) + " (" +
           CT_API(GetErrorString)(e) + ")";
  return 0;
}

#if !defined(CT_NATIVE_CUDA)
// CDNA2/CDNA3 (gfx90a, gfx94x): bf16 arithmetic and the MFMA forms of the matrix tiles
// (CT_HIP_MFMA in backends/gpu/portability.h; the plugin must be built for the target).
bool cdna_mfma(const char* gcn_arch_name) {
  const std::string a(gcn_arch_name);
  return a.rfind("gfx90a", 0) == 0 || a.rfind("gfx94", 0) == 0;
}
#endif

DeviceInfo make_info(int index) {
  ApiProp p{};
  CT_API_CHECK(CT_API(GetDeviceProperties)(&p, index));
  int driver = 0, runtime = 0;
  (void)CT_API(DriverGetVersion)(&driver);
  (void)CT_API(RuntimeGetVersion)(&runtime);
  DeviceInfo i;
  i.backend = kTarget;
  i.index = index;
  i.name = p.name;
  i.type = p.integrated ? DeviceType::kIntegratedGpu : DeviceType::kDiscreteGpu;
  i.native_stack = true;
  i.graphs = true;  // stream capture and graph launch (NativeRuntime)
  i.memory_bytes = static_cast<int64_t>(p.totalGlobalMem);
  i.max_allocation_bytes = i.memory_bytes;
  i.max_buffer_range_bytes = i.memory_bytes;
  i.dtypes = {DType::f32, DType::f16, DType::bf16, DType::i32};
#if defined(CT_NATIVE_CUDA)
  i.driver = "CUDA driver " + std::to_string(driver / 1000) + "." +
             std::to_string(driver % 1000 / 10) + ", runtime " + std::to_string(runtime / 1000) +
             "." + std::to_string(runtime % 1000 / 10);
  i.fp16_arithmetic = p.major >= 6;
  i.bf16_arithmetic = p.major >= 8;
  i.tf32 = p.major >= 8;  // TF32 tensor cores (Ampere and later), through cuBLASLt
  i.extra = {{"compute capability", std::to_string(p.major) + "." + std::to_string(p.minor)}};
#else
  i.driver = "HIP driver " + std::to_string(driver) + ", runtime " + std::to_string(runtime);
  i.fp16_arithmetic = true;
  i.bf16_arithmetic = cdna_mfma(p.gcnArchName);
  i.extra = {{"architecture", p.gcnArchName}};
#endif
  i.extra.push_back({"multiprocessors", std::to_string(p.multiProcessorCount)});
  i.extra.push_back({"warp size", std::to_string(p.warpSize)});
  // Data parallel's device collectives (--ddp-backend nccl), loaded at run time when used.
#if defined(CT_NATIVE_CUDA)
  i.extra.push_back({"collective library", "libnccl.so.2"});
#else
  i.extra.push_back({"collective library", "librccl.so.1"});
#endif
  return i;
}

// 32 on NVIDIA and RDNA, 64 on CDNA/GCN: the kernels are instantiated for the device's.
int warp_size(int index) {
  ApiProp p{};
  CT_API_CHECK(CT_API(GetDeviceProperties)(&p, index));
  return p.warpSize;
}

// A GEMM's shape as the fallback notice and --profile name it.
std::string gemm_key(const gpu::GemmArgs& g) {
  auto name = [](gpu::Elem e) {
    return e == gpu::Elem::kF32 ? "f32" : e == gpu::Elem::kF16 ? "f16" : "bf16";
  };
  return std::string(name(g.ab_elem)) + " x " + name(g.ab_elem) + " -> " + name(g.c_elem) + ", " +
         std::to_string(g.M) + "x" + std::to_string(g.N) + "x" + std::to_string(g.K) + " " +
         (g.trans_a ? "t" : "n") + (g.trans_b ? "t" : "n") + (g.bias ? ", bias" : "") +
         (g.gelu_out ? ", gelu" : "") + (g.gelu_pre ? ", dgelu" : "") + ", batch " +
         std::to_string(g.batch) + (g.beta != 0.0f ? ", beta " : "") +
         (g.beta != 0.0f ? std::to_string(g.beta) : "");
}

class NativeRuntime final : public gpu::Runtime {
 public:
  explicit NativeRuntime(int index) : index_(index), info_(make_info(index)) {
    CT_API_CHECK(CT_API(SetDevice)(index_));
    CT_API_CHECK(CT_API(StreamCreateWithFlags)(&stream_, CT_API(StreamNonBlocking)));
    int sms = 1;
    CT_API_CHECK(CT_API(DeviceGetAttribute)(&sms, kApiMultiprocessors, index_));
    sms_ = sms;
    std::size_t free_b = 0, total = 0;
    CT_API_CHECK(CT_API(MemGetInfo)(&free_b, &total));
    info_.memory_budget_bytes = static_cast<int64_t>(free_b);
    warp_ = warp_size(index_);
    blas_ = make_gemm_library();
    // Matrix cores for the own GEMM's 16-bit path: mma.sync on sm_80+, MFMA on gfx90a and gfx94x
    // (the architectures with them the plugin may be built for).
    ApiProp p{};
    CT_API_CHECK(CT_API(GetDeviceProperties)(&p, index_));
#if defined(CT_NATIVE_CUDA)
    const bool hw = p.major >= 8;
    const char* unit = "mma.sync m16n8k16";
#else
    const bool hw = cdna_mfma(p.gcnArchName);
    const char* unit = "MFMA 32x32x8";
#endif
    tiles_ = gpu::matrix_tiles_setting(hw);
    info_.extra.push_back(
        {"own GEMM, 16-bit", tiles_ ? std::string("128x128 tensor-core kernel on matrix tiles (") +
                                          (hw ? unit : "scalar form") +
                                          "; rows not 16-byte aligned: 64x64 tiles)"
                                    : std::string("scalar tiled kernel")});
  }
  ~NativeRuntime() override {
    (void)CT_API(SetDevice)(index_);
    (void)CT_API(StreamSynchronize)(stream_);
    for (auto& [id, g] : graphs_) {
      (void)CT_API(GraphExecDestroy)(g.second);
      (void)CT_API(GraphDestroy)(g.first);
    }
    blas_.reset();
    for (void* p : bias_scratch_retired_) (void)CT_API(Free)(p);
    if (bias_scratch_) (void)CT_API(Free)(bias_scratch_);
    for (auto& [serial, ev] : events_) (void)CT_API(EventDestroy)(ev);
    for (ApiEvent ev : spare_) (void)CT_API(EventDestroy)(ev);
    for (ApiEvent ev : timed_) (void)CT_API(EventDestroy)(ev);
    (void)CT_API(StreamDestroy)(stream_);
    trace_teardown(info_.id() + " stream, events and BLAS handle destroyed");
  }

  const DeviceInfo& info() const override {
    return info_;
  }
  gpu::Ctx ctx() override {
    (void)CT_API(SetDevice)(index_);
    gpu::Ctx c{warp_, stream_, sms_};
    c.matrix_tiles = tiles_;
    c.splitk = splitk_;
    c.tf32 = tf32_;
    return c;
  }
  void* allocate(std::size_t bytes) override {
    CT_API_CHECK(CT_API(SetDevice)(index_));
    void* p = nullptr;
    // cudaMalloc is not a stream operation, and a capture in thread-local mode refuses it as
    // unsafe (it would not be replayed): in relaxed mode for the call, as PyTorch's allocator
    // does. The block is not freed while a graph uses it (gpu_device.cpp keeps it), so the
    // graph's address stays valid.
    auto mode = CT_API(StreamCaptureModeRelaxed);
    if (capturing()) CT_API_CHECK(CT_API(ThreadExchangeStreamCaptureMode)(&mode));
    ApiError e = CT_API(Malloc)(&p, bytes);
    if (capturing()) CT_API_CHECK(CT_API(ThreadExchangeStreamCaptureMode)(&mode));
    if (e == kApiOutOfMemory) {
      (void)CT_API(GetLastError)();
      return nullptr;
    }
    if (e != CT_API(Success)) api_fail("CT_API(Malloc)", e);
    return p;
  }
  void release(void* p) override {
    refuse_in_capture("release (cudaFree)", "freeing device memory waits for the device");
    CT_API_CHECK(CT_API(Free)(p));
  }
  void memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override {
    CT_API_CHECK(CT_API(SetDevice)(index_));
    CT_API_CHECK(CT_API(MemGetInfo)(free_bytes, total_bytes));
  }
  void upload(void* dst, const void* host, std::size_t bytes) override {
    refuse_in_capture("upload",
                      "a copy from pageable host memory; a replay would read the host buffer "
                      "again, after the caller reused it");
    // Pageable host memory: the call returns once the bytes are staged, so `host` may be reused.
    CT_API_CHECK(CT_API(MemcpyAsync)(dst, host, bytes, CT_API(MemcpyHostToDevice), stream_));
  }
  void download(void* host, const void* src, std::size_t bytes) override {
    refuse_in_capture("download", "a blocking read waits for work that is only being recorded");
    CT_API_CHECK(CT_API(MemcpyAsync)(host, src, bytes, CT_API(MemcpyDeviceToHost), stream_));
    CT_API_CHECK(CT_API(StreamSynchronize)(stream_));
  }
  void download_async(void* host, const void* src, std::size_t bytes) override {
    refuse_in_capture("download_async", "a copy into pageable host memory");
    CT_API_CHECK(CT_API(MemcpyAsync)(host, src, bytes, CT_API(MemcpyDeviceToHost), stream_));
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    CT_API_CHECK(CT_API(MemcpyAsync)(dst, src, bytes, CT_API(MemcpyDeviceToDevice), stream_));
  }
  std::uint64_t record_event() override {
    refuse_in_capture("record_event", "the host would wait for or query an event of the graph");
    ApiEvent ev = nullptr;
    if (!spare_.empty()) {
      ev = spare_.back();
      spare_.pop_back();
    } else {
      CT_API_CHECK(CT_API(EventCreateWithFlags)(&ev, CT_API(EventDisableTiming)));
    }
    CT_API_CHECK(CT_API(EventRecord)(ev, stream_));
    events_.emplace_back(++serial_, ev);
    return serial_;
  }
  bool event_done(std::uint64_t serial) override {
    refuse_in_capture("event_done (cudaEventQuery)", "querying work that is only being recorded");
    retire();
    for (auto& [s, ev] : events_) {
      if (s != serial) continue;
      ApiError e = CT_API(EventQuery)(ev);
      if (e == CT_API(ErrorNotReady)) return false;
      if (e != CT_API(Success)) api_fail("CT_API(EventQuery)", e);
      return true;
    }
    return true;  // retired: complete
  }
  void wait_event(std::uint64_t serial) override {
    refuse_in_capture("wait_event (cudaEventSynchronize)",
                      "waiting for work that is only being recorded");
    for (auto& [s, ev] : events_)
      if (s == serial) CT_API_CHECK(CT_API(EventSynchronize)(ev));
    retire();
  }
  void synchronize() override {
    refuse_in_capture("synchronize (cudaStreamSynchronize)",
                      "waiting for work that is only being recorded");
    CT_API_CHECK(CT_API(StreamSynchronize)(stream_));
    retire();
  }
  void* native_stream() override {
    return stream_;
  }

  // Graphs: stream capture in thread-local mode (this thread's calls are checked; the offloaded
  // optimizer's host thread may go on using the runtime), instantiated once, launched on the
  // stream.
  bool has_graphs() const override {
    return true;
  }
  void launch_graph(std::uint64_t graph) override {
    auto it = graphs_.find(graph);
    if (it == graphs_.end())
      fail(ErrorKind::kInvalidArgument, info_.id() + ": launch_graph: no graph " +
                                            std::to_string(graph) + " (destroyed, or never made)");
    CT_API_CHECK(CT_API(GraphLaunch)(it->second.second, stream_));
  }
  void destroy_graph(std::uint64_t graph) override {
    auto it = graphs_.find(graph);
    if (it == graphs_.end()) return;
    CT_API_CHECK(CT_API(StreamSynchronize)(stream_));  // its launches have finished
    CT_API_CHECK(CT_API(GraphExecDestroy)(it->second.second));
    CT_API_CHECK(CT_API(GraphDestroy)(it->second.first));
    graphs_.erase(it);
  }
  void gemm(const gpu::GemmArgs& g, std::string* path) override {
    // CT_GPU_GEMM=own: always the project's kernel (benchmarks compare the two).
    if (own_gemm_) {
      const gpu::Ctx cx = ctx();
      gpu::gemm(cx, g);
      if (path) *path = "own (CT_GPU_GEMM=own) " + gpu::gemm_path(cx, g);
      return;
    }
    gpu::GemmArgs lg = g;
    if (blas_->bias_in_output_type(g)) lg.bias_lowp = bias_in(g.c_elem, g.bias, g.N);
    if (blas_->gemm(lg, stream_)) {
      if (path) *path = kLibrary;
      return;
    }
    // A GELU epilogue the library does not take (rocBLAS has none; cuBLASLt's needs N % 8 == 0):
    // the product in the library and the GELU as its own pass, which are the unfused ops' bits.
    // No fallback: the GEMM still ran in the library.
    if (g.gelu_out || g.gelu_pre) {
      gpu::GemmArgs plain = lg;
      plain.gelu_out = nullptr;
      plain.gelu_pre = nullptr;
      if (blas_->gemm(plain, stream_)) {
        const gpu::Ctx cx = ctx();
        const std::int64_t n = g.batch * g.M * g.N;
        if (g.gelu_out)
          gpu::gelu_forward(cx, g.gelu_out, g.c, g.c_elem, n);
        else
          gpu::gelu_backward(cx, g.c, g.gelu_pre, g.c, g.c_elem, n);
        if (path) *path = std::string(kLibrary) + ", then the GELU kernel (epilogue refused)";
        return;
      }
    }
    // Not silently: each shape the library refuses is said once on stderr, and counted for
    // --profile (gemm_fallbacks).
    const gpu::Ctx cx = ctx();
    const std::string key = gemm_key(g);
    if (fallbacks_[key]++ == 0)
      std::fprintf(stderr, "%s: %s has no algorithm for %s; the own kernel runs it: %s\n",
                   info_.id().c_str(), blas_->describe().c_str(), key.c_str(),
                   gpu::gemm_path(cx, g).c_str());
    gpu::gemm(cx, g);
    if (path) *path = std::string("own, ") + kLibrary + " refused: " + gpu::gemm_path(cx, g);
  }
  std::map<std::string, std::int64_t> gemm_fallbacks() const override {
    return fallbacks_;
  }
  bool has_gemm_library() const override {
    return !own_gemm_;
  }
  // Timed events from a pool of their own (the pool of record_event has timing disabled).
  std::size_t timing_mark() override {
    if (marks_used_ == timed_.size()) {
      ApiEvent ev = nullptr;
      CT_API_CHECK(CT_API(EventCreate)(&ev));
      timed_.push_back(ev);
    }
    CT_API_CHECK(CT_API(EventRecord)(timed_[marks_used_], stream_));
    return marks_used_++;
  }
  double timing_ms(std::size_t a, std::size_t b) override {
    CT_REQUIRE(a < marks_used_ && b < marks_used_, "timing_ms: no such mark");
    CT_API_CHECK(CT_API(EventSynchronize)(timed_[b]));
    float ms = 0;
    CT_API_CHECK(CT_API(EventElapsedTime)(&ms, timed_[a], timed_[b]));
    return ms;
  }
  void timing_reset() override {
    marks_used_ = 0;
  }
  // bias [n] (f32) rounded to `e` in a scratch buffer of the runtime (reused: the stream orders
  // each conversion after the product that read the previous one); nullptr when it cannot be had.
  // A buffer it outgrows is kept until the runtime closes (a few KiB): a graph may have its
  // address, and freeing it would wait for the device.
  const void* bias_in(gpu::Elem e, const float* bias, std::int64_t n) {
    const std::size_t bytes = static_cast<std::size_t>(n) * 4;  // room for any element type
    if (bytes > bias_scratch_bytes_) {
      if (bias_scratch_) bias_scratch_retired_.push_back(bias_scratch_);
      bias_scratch_ = allocate(bytes);
      bias_scratch_bytes_ = bias_scratch_ ? bytes : 0;
      if (!bias_scratch_) return nullptr;
    }
    gpu::convert(ctx(), bias_scratch_, e, bias, gpu::Elem::kF32, n);
    return bias_scratch_;
  }
  void set_allow_tf32(bool on) override {
    tf32_ = on && info_.tf32;
    blas_->set_tf32(tf32_);
  }
  std::string gemm_library() const override {
    return own_gemm_ ? "own tiled kernel (CT_GPU_GEMM=own)" : blas_->describe();
  }

 protected:
  void start_capture() override {
    CT_API_CHECK(CT_API(SetDevice)(index_));
    CT_API_CHECK(CT_API(StreamBeginCapture)(stream_, CT_API(StreamCaptureModeThreadLocal)));
  }
  std::uint64_t stop_capture() override {
    ApiGraph graph = nullptr;
    ApiError e = CT_API(StreamEndCapture)(stream_, &graph);
    if (e != CT_API(Success)) {  // invalidated: by a call refused above, or by the runtime
      (void)CT_API(GetLastError)();
      if (graph) (void)CT_API(GraphDestroy)(graph);
      if (!refused_.empty()) return 0;  // end_capture names the refused call
      api_fail("CT_API(StreamEndCapture)", e);
    }
    ApiGraphExec exec = nullptr;
#if defined(CT_NATIVE_CUDA)
    e = cudaGraphInstantiate(&exec, graph, 0);
#else
    e = hipGraphInstantiate(&exec, graph, nullptr, nullptr, 0);
#endif
    if (e != CT_API(Success)) {
      (void)CT_API(GraphDestroy)(graph);
      api_fail("CT_API(GraphInstantiate)", e);
    }
    graphs_[++last_graph_] = {graph, exec};
    return last_graph_;
  }

 private:
  // Completed events go back to the pool (in order: the stream completes them in order).
  void retire() {
    while (!events_.empty() && CT_API(EventQuery)(events_.front().second) == CT_API(Success)) {
      spare_.push_back(events_.front().second);
      events_.pop_front();
    }
    (void)CT_API(GetLastError)();
  }

  int index_;
  DeviceInfo info_;
  ApiStream stream_ = nullptr;
  int sms_ = 1;
  int warp_ = 32;
  bool tiles_ = false;
  int splitk_ = gpu::splitk_setting(0);
  bool tf32_ = false;  // set_allow_tf32 on a device with TF32 (Ctx::tf32)
  bool own_gemm_ = [] {
    const char* v = std::getenv("CT_GPU_GEMM");
    return v && std::string(v) == "own";
  }();
  std::uint64_t serial_ = 0;
  std::deque<std::pair<std::uint64_t, ApiEvent>> events_;
  std::vector<ApiEvent> spare_;
  std::unique_ptr<GemmLibrary> blas_;
  std::map<std::string, std::int64_t> fallbacks_;  // refused GEMM shape -> calls
  std::vector<ApiEvent> timed_;                    // timing_mark's events, reused
  std::size_t marks_used_ = 0;
  void* bias_scratch_ = nullptr;  // bias_in's buffer
  std::size_t bias_scratch_bytes_ = 0;
  std::vector<void*> bias_scratch_retired_;                            // the buffers it outgrew
  std::map<std::uint64_t, std::pair<ApiGraph, ApiGraphExec>> graphs_;  // made graphs, by number
  std::uint64_t last_graph_ = 0;
};

class NativeBackend final : public Backend {
 public:
  NativeBackend() { count_ = device_count(&why_); }
  std::string name() const override { return kTarget; }
  std::string unavailable_reason() const override { return why_; }
  std::vector<DeviceInfo> devices() const override {
    std::vector<DeviceInfo> v;
    for (int i = 0; i < count_; ++i) v.push_back(make_info(i));
    return v;
  }
  std::unique_ptr<Device> open(int index) override {
    if (!why_.empty())
      fail(ErrorKind::kDevice, std::string(kTargetUpper) + " is unavailable: " + why_);
    if (index < 0 || index >= count_) {
      std::string list;
      for (const auto& d : devices()) list += "\n  " + d.id() + "  " + d.name;
      fail(ErrorKind::kInvalidArgument, std::string(kTarget) + ":" + std::to_string(index) +
                                            " out of range; " + kTarget + " has " +
                                            std::to_string(count_) + " device(s):" + list);
    }
    return gpu::make_gpu_device(std::make_unique<NativeRuntime>(index));
  }

 private:
  int count_ = 0;
  std::string why_;
};

}  // namespace
}  // namespace ct::gpu::native

extern "C" {
__attribute__((visibility("default"))) int crosstrain_backend_abi_version() {
  return ct::kBackendAbiVersion;
}
__attribute__((visibility("default"))) ct::Backend* crosstrain_backend_create() {
  return new ct::gpu::native::NativeBackend();
}
}
