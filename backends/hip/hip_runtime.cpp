// The HIP target: ct::gpu::Runtime over the HIP runtime API (libamdhip64), and the `hip` backend
// that lists and opens its devices (warp size from the device: 64 on CDNA/GCN, 32 on RDNA).
// Every runtime call is checked; the error names the call. GEMMs: rocBLAS when it is installed
// (backends/hip/rocblas.h), else the project's own kernel.
#include <hip/hip_runtime_api.h>

#include <cstdlib>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/gpu/runtime.h"
#include "backends/hip/rocblas.h"
#include "core/error.h"

namespace ct::hip {
namespace {

[[noreturn]] void hip_fail(const char* call, hipError_t e) {
  fail(e == hipErrorOutOfMemory ? ErrorKind::kOutOfMemory : ErrorKind::kDevice,
       std::string(call) + ": " + hipGetErrorName(e) + " (" + hipGetErrorString(e) + ")");
}
#define CT_HIP(call)                                 \
  do {                                               \
    hipError_t ct_e_ = (call);                       \
    if (ct_e_ != hipSuccess) hip_fail(#call, ct_e_); \
  } while (0)

// Why HIP cannot be used here ("" when it can), and the number of devices.
int device_count(std::string* why) {
  int n = 0;
  hipError_t e = hipGetDeviceCount(&n);
  if (e == hipSuccess && n > 0) {
    why->clear();
    return n;
  }
  (void)hipGetLastError();  // clear the sticky error
  if (e == hipSuccess || e == hipErrorNoDevice)
    *why = "no HIP device (no AMD GPU, or /dev/kfd not accessible)";
  else if (e == hipErrorInsufficientDriver)
    *why = "no usable AMD driver (amdgpu kernel driver / ROCm runtime missing)";
  else
    *why =
        std::string("hipGetDeviceCount: ") + hipGetErrorName(e) + " (" + hipGetErrorString(e) + ")";
  return 0;
}

DeviceInfo make_info(int index) {
  hipDeviceProp_t p{};
  CT_HIP(hipGetDeviceProperties(&p, index));
  int driver = 0, runtime = 0;
  (void)hipDriverGetVersion(&driver);
  (void)hipRuntimeGetVersion(&runtime);
  DeviceInfo i;
  i.backend = "hip";
  i.index = index;
  i.name = p.name;
  i.type = p.integrated ? DeviceType::kIntegratedGpu : DeviceType::kDiscreteGpu;
  i.driver = "HIP driver " + std::to_string(driver) + ", runtime " + std::to_string(runtime);
  i.memory_bytes = static_cast<int64_t>(p.totalGlobalMem);
  i.max_allocation_bytes = i.memory_bytes;
  i.max_buffer_range_bytes = i.memory_bytes;
  i.dtypes = {DType::f32, DType::f16, DType::bf16, DType::i32};
  i.fp16_arithmetic = true;
  i.bf16_arithmetic = std::string(p.gcnArchName).rfind("gfx90a", 0) == 0;
  i.extra = {{"architecture", p.gcnArchName},
             {"multiprocessors", std::to_string(p.multiProcessorCount)},
             {"warp size", std::to_string(p.warpSize)}};
  return i;
}

class HipRuntime final : public gpu::Runtime {
 public:
  explicit HipRuntime(int index) : index_(index), info_(make_info(index)) {
    hipDeviceProp_t p{};
    CT_HIP(hipGetDeviceProperties(&p, index_));
    warp_ = p.warpSize;
    CT_HIP(hipSetDevice(index_));
    CT_HIP(hipStreamCreateWithFlags(&stream_, hipStreamNonBlocking));
    int sms = 1;
    CT_HIP(hipDeviceGetAttribute(&sms, hipDeviceAttributeMultiprocessorCount, index_));
    sms_ = sms;
    std::size_t free_b = 0, total = 0;
    CT_HIP(hipMemGetInfo(&free_b, &total));
    info_.memory_budget_bytes = static_cast<int64_t>(free_b);
    blas_ = std::make_unique<Rocblas>();
  }
  ~HipRuntime() override {
    (void)hipSetDevice(index_);
    (void)hipStreamSynchronize(stream_);
    blas_.reset();
    for (auto& [serial, ev] : events_) (void)hipEventDestroy(ev);
    for (hipEvent_t ev : spare_) (void)hipEventDestroy(ev);
    (void)hipStreamDestroy(stream_);
  }

  const DeviceInfo& info() const override { return info_; }
  gpu::Ctx ctx() override {
    (void)hipSetDevice(index_);
    return gpu::Ctx{warp_, stream_, sms_};
  }
  void* allocate(std::size_t bytes) override {
    CT_HIP(hipSetDevice(index_));
    void* p = nullptr;
    hipError_t e = hipMalloc(&p, bytes);
    if (e == hipErrorOutOfMemory) {
      (void)hipGetLastError();
      return nullptr;
    }
    if (e != hipSuccess) hip_fail("hipMalloc", e);
    return p;
  }
  void release(void* p) override { CT_HIP(hipFree(p)); }
  void memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override {
    CT_HIP(hipSetDevice(index_));
    CT_HIP(hipMemGetInfo(free_bytes, total_bytes));
  }
  void upload(void* dst, const void* host, std::size_t bytes) override {
    // Pageable host memory: the call returns once the bytes are staged, so `host` may be reused.
    CT_HIP(hipMemcpyAsync(dst, host, bytes, hipMemcpyHostToDevice, stream_));
  }
  void download(void* host, const void* src, std::size_t bytes) override {
    CT_HIP(hipMemcpyAsync(host, src, bytes, hipMemcpyDeviceToHost, stream_));
    CT_HIP(hipStreamSynchronize(stream_));
  }
  void download_async(void* host, const void* src, std::size_t bytes) override {
    CT_HIP(hipMemcpyAsync(host, src, bytes, hipMemcpyDeviceToHost, stream_));
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    CT_HIP(hipMemcpyAsync(dst, src, bytes, hipMemcpyDeviceToDevice, stream_));
  }
  std::uint64_t record_event() override {
    hipEvent_t ev = nullptr;
    if (!spare_.empty()) {
      ev = spare_.back();
      spare_.pop_back();
    } else {
      CT_HIP(hipEventCreateWithFlags(&ev, hipEventDisableTiming));
    }
    CT_HIP(hipEventRecord(ev, stream_));
    events_.emplace_back(++serial_, ev);
    return serial_;
  }
  bool event_done(std::uint64_t serial) override {
    retire();
    for (auto& [s, ev] : events_) {
      if (s != serial) continue;
      hipError_t e = hipEventQuery(ev);
      if (e == hipErrorNotReady) return false;
      if (e != hipSuccess) hip_fail("hipEventQuery", e);
      return true;
    }
    return true;  // retired: complete
  }
  void wait_event(std::uint64_t serial) override {
    for (auto& [s, ev] : events_)
      if (s == serial) CT_HIP(hipEventSynchronize(ev));
    retire();
  }
  void synchronize() override {
    CT_HIP(hipStreamSynchronize(stream_));
    retire();
  }
  void* native_stream() override { return stream_; }
  void gemm(const gpu::GemmArgs& g) override {
    // CT_GPU_GEMM=own: always the project's kernel (benchmarks compare the two).
    if (own_gemm_ || !blas_->gemm(g, stream_)) gpu::gemm(ctx(), g);
  }
  std::string gemm_library() const override {
    return own_gemm_ ? "own tiled kernel (CT_GPU_GEMM=own)" : blas_->describe();
  }

 private:
  // Completed events go back to the pool (in order: the stream completes them in order).
  void retire() {
    while (!events_.empty() && hipEventQuery(events_.front().second) == hipSuccess) {
      spare_.push_back(events_.front().second);
      events_.pop_front();
    }
    (void)hipGetLastError();
  }

  int index_;
  DeviceInfo info_;
  hipStream_t stream_ = nullptr;
  int sms_ = 1;
  bool own_gemm_ = [] {
    const char* v = std::getenv("CT_GPU_GEMM");
    return v && std::string(v) == "own";
  }();
  int warp_ = 64;
  std::uint64_t serial_ = 0;
  std::deque<std::pair<std::uint64_t, hipEvent_t>> events_;
  std::vector<hipEvent_t> spare_;
  std::unique_ptr<Rocblas> blas_;
};

class HipBackend final : public Backend {
 public:
  HipBackend() { count_ = device_count(&why_); }
  std::string name() const override { return "hip"; }
  std::string unavailable_reason() const override { return why_; }
  std::vector<DeviceInfo> devices() const override {
    std::vector<DeviceInfo> v;
    for (int i = 0; i < count_; ++i) v.push_back(make_info(i));
    return v;
  }
  std::unique_ptr<Device> open(int index) override {
    if (!why_.empty()) fail(ErrorKind::kDevice, "HIP is unavailable: " + why_);
    if (index < 0 || index >= count_) {
      std::string list;
      for (const auto& d : devices()) list += "\n  " + d.id() + "  " + d.name;
      fail(ErrorKind::kInvalidArgument, "hip:" + std::to_string(index) + " out of range; hip has " +
                                            std::to_string(count_) + " device(s):" + list);
    }
    return gpu::make_gpu_device(std::make_unique<HipRuntime>(index));
  }

 private:
  int count_ = 0;
  std::string why_;
};

}  // namespace
}  // namespace ct::hip

extern "C" {
__attribute__((visibility("default"))) int crosstrain_backend_abi_version() {
  return ct::kBackendAbiVersion;
}
__attribute__((visibility("default"))) ct::Backend* crosstrain_backend_create() {
  return new ct::hip::HipBackend();
}
}
