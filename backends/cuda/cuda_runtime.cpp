// The CUDA target: ct::gpu::Runtime over the CUDA runtime API (linked statically: the plugin needs
// only the driver, libcuda.so.1, which cudart opens at run time), and the `cuda` backend that
// lists and opens its devices. Every runtime call is checked; the error names the call.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cublaslt.h"
#include "backends/gpu/runtime.h"
#include "core/error.h"

namespace ct::cuda {
namespace {

[[noreturn]] void cuda_fail(const char* call, cudaError_t e) {
  fail(e == cudaErrorMemoryAllocation ? ErrorKind::kOutOfMemory : ErrorKind::kDevice,
       std::string(call) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
#define CT_CUDA(call)                                  \
  do {                                                 \
    cudaError_t ct_e_ = (call);                        \
    if (ct_e_ != cudaSuccess) cuda_fail(#call, ct_e_); \
  } while (0)

// Why CUDA cannot be used here ("" when it can), and the number of devices.
int device_count(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) {
    why->clear();
    return n;
  }
  (void)cudaGetLastError();  // clear the sticky error
  if (e == cudaSuccess || e == cudaErrorNoDevice)
    *why = "no CUDA device (the driver is there but lists no GPU)";
  else if (e == cudaErrorInsufficientDriver)
    *why = "no usable NVIDIA driver: libcuda.so.1 is missing or older than this CUDA " +
           std::to_string(CUDART_VERSION / 1000) + "." +
           std::to_string(CUDART_VERSION % 1000 / 10) + " runtime";
  else
    *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + " (" +
           cudaGetErrorString(e) + ")";
  return 0;
}

DeviceInfo make_info(int index) {
  cudaDeviceProp p{};
  CT_CUDA(cudaGetDeviceProperties(&p, index));
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  DeviceInfo i;
  i.backend = "cuda";
  i.index = index;
  i.name = p.name;
  i.type = p.integrated ? DeviceType::kIntegratedGpu : DeviceType::kDiscreteGpu;
  i.driver = "CUDA driver " + std::to_string(driver / 1000) + "." +
             std::to_string(driver % 1000 / 10) + ", runtime " + std::to_string(runtime / 1000) +
             "." + std::to_string(runtime % 1000 / 10);
  i.memory_bytes = static_cast<int64_t>(p.totalGlobalMem);
  i.max_allocation_bytes = i.memory_bytes;
  i.max_buffer_range_bytes = i.memory_bytes;
  i.dtypes = {DType::f32, DType::f16, DType::bf16, DType::i32};
  i.fp16_arithmetic = p.major >= 6;
  i.bf16_arithmetic = p.major >= 8;
  i.extra = {{"compute capability", std::to_string(p.major) + "." + std::to_string(p.minor)},
             {"multiprocessors", std::to_string(p.multiProcessorCount)},
             {"warp size", std::to_string(p.warpSize)}};
  return i;
}

class CudaRuntime final : public gpu::Runtime {
 public:
  explicit CudaRuntime(int index) : index_(index), info_(make_info(index)) {
    CT_CUDA(cudaSetDevice(index_));
    CT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    int sms = 1;
    CT_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, index_));
    sms_ = sms;
    std::size_t free_b = 0, total = 0;
    CT_CUDA(cudaMemGetInfo(&free_b, &total));
    info_.memory_budget_bytes = static_cast<int64_t>(free_b);
    const char* tf32 = std::getenv("CT_TF32");
    blas_ = std::make_unique<Cublaslt>(tf32 && tf32[0] == '1');
    info_.extra.push_back({"tf32", blas_->tf32() ? "on (CT_TF32=1)" : "off"});
  }
  ~CudaRuntime() override {
    (void)cudaSetDevice(index_);
    (void)cudaStreamSynchronize(stream_);
    blas_.reset();
    for (auto& [serial, ev] : events_) (void)cudaEventDestroy(ev);
    for (cudaEvent_t ev : spare_) (void)cudaEventDestroy(ev);
    (void)cudaStreamDestroy(stream_);
  }

  const DeviceInfo& info() const override { return info_; }
  gpu::Ctx ctx() override {
    (void)cudaSetDevice(index_);
    return gpu::Ctx{32, stream_, sms_};
  }
  void* allocate(std::size_t bytes) override {
    CT_CUDA(cudaSetDevice(index_));
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    if (e != cudaSuccess) cuda_fail("cudaMalloc", e);
    return p;
  }
  void release(void* p) override { CT_CUDA(cudaFree(p)); }
  void memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override {
    CT_CUDA(cudaSetDevice(index_));
    CT_CUDA(cudaMemGetInfo(free_bytes, total_bytes));
  }
  void upload(void* dst, const void* host, std::size_t bytes) override {
    // Pageable host memory: the call returns once the bytes are staged, so `host` may be reused.
    CT_CUDA(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
  }
  void download(void* host, const void* src, std::size_t bytes) override {
    CT_CUDA(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
    CT_CUDA(cudaStreamSynchronize(stream_));
  }
  void download_async(void* host, const void* src, std::size_t bytes) override {
    CT_CUDA(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    CT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  std::uint64_t record_event() override {
    cudaEvent_t ev = nullptr;
    if (!spare_.empty()) {
      ev = spare_.back();
      spare_.pop_back();
    } else {
      CT_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    }
    CT_CUDA(cudaEventRecord(ev, stream_));
    events_.emplace_back(++serial_, ev);
    return serial_;
  }
  bool event_done(std::uint64_t serial) override {
    retire();
    for (auto& [s, ev] : events_) {
      if (s != serial) continue;
      cudaError_t e = cudaEventQuery(ev);
      if (e == cudaErrorNotReady) return false;
      if (e != cudaSuccess) cuda_fail("cudaEventQuery", e);
      return true;
    }
    return true;  // retired: complete
  }
  void wait_event(std::uint64_t serial) override {
    for (auto& [s, ev] : events_)
      if (s == serial) CT_CUDA(cudaEventSynchronize(ev));
    retire();
  }
  void synchronize() override {
    CT_CUDA(cudaStreamSynchronize(stream_));
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
    while (!events_.empty() && cudaEventQuery(events_.front().second) == cudaSuccess) {
      spare_.push_back(events_.front().second);
      events_.pop_front();
    }
    (void)cudaGetLastError();
  }

  int index_;
  DeviceInfo info_;
  cudaStream_t stream_ = nullptr;
  int sms_ = 1;
  bool own_gemm_ = [] {
    const char* v = std::getenv("CT_GPU_GEMM");
    return v && std::string(v) == "own";
  }();
  std::uint64_t serial_ = 0;
  std::deque<std::pair<std::uint64_t, cudaEvent_t>> events_;
  std::vector<cudaEvent_t> spare_;
  std::unique_ptr<Cublaslt> blas_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend() { count_ = device_count(&why_); }
  std::string name() const override { return "cuda"; }
  std::string unavailable_reason() const override { return why_; }
  std::vector<DeviceInfo> devices() const override {
    std::vector<DeviceInfo> v;
    for (int i = 0; i < count_; ++i) v.push_back(make_info(i));
    return v;
  }
  std::unique_ptr<Device> open(int index) override {
    if (!why_.empty()) fail(ErrorKind::kDevice, "CUDA is unavailable: " + why_);
    if (index < 0 || index >= count_) {
      std::string list;
      for (const auto& d : devices()) list += "\n  " + d.id() + "  " + d.name;
      fail(ErrorKind::kInvalidArgument, "cuda:" + std::to_string(index) +
                                            " out of range; cuda has " + std::to_string(count_) +
                                            " device(s):" + list);
    }
    return gpu::make_gpu_device(std::make_unique<CudaRuntime>(index));
  }

 private:
  int count_ = 0;
  std::string why_;
};

}  // namespace
}  // namespace ct::cuda

extern "C" {
__attribute__((visibility("default"))) int crosstrain_backend_abi_version() {
  return ct::kBackendAbiVersion;
}
__attribute__((visibility("default"))) ct::Backend* crosstrain_backend_create() {
  return new ct::cuda::CudaBackend();
}
}
