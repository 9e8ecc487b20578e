// What a GPU target (CUDA, HIP, the CPU SIMT runtime) provides to the one device class of
// backends/gpu/gpu_device.h: memory, copies, one in-order stream and its events, and the GEMM
// library where the target has one. Plain C++: each target implements it in its own file
// (runtime_simt.cpp here, backends/cuda, backends/hip), and gpu_device.cpp is built unchanged
// for all of them.
//
// Every runtime call is checked: a failure throws ct::Error (core/error.h) naming the call and
// the runtime's own message ("cudaMemcpyAsync: an illegal memory access was encountered").
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/gpu/kernels.h"
#include "core/device.h"
#include "core/error.h"

namespace ct::gpu {

class Runtime {
 public:
  virtual ~Runtime() = default;

  // The device's description (backend, index, name, memory, ...) as `crosstrain devices` shows it.
  virtual const DeviceInfo& info() const = 0;
  // Warp size (32 or 64), the stream handed to launchers, and the multiprocessor count.
  virtual Ctx ctx() = 0;

  // Device memory. allocate returns nullptr when the device is out of memory (the caller frees its
  // cache and retries, then reports); any other failure throws.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* p) = 0;
  // Free and total device memory in bytes, as the driver reports them now.
  virtual void memory_info(std::size_t* free_bytes, std::size_t* total_bytes) = 0;

  // Stream-ordered copies. upload: `host` may be reused as soon as it returns. download: waits
  // for the copy (and so for everything enqueued before it). download_async: returns at once;
  // the bytes are in `host` once an event recorded after it has completed. copy: device to
  // device, the ranges do not overlap.
  virtual void upload(void* dst, const void* host, std::size_t bytes) = 0;
  virtual void download(void* host, const void* src, std::size_t bytes) = 0;
  virtual void download_async(void* host, const void* src, std::size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;

  // Events: a serial after everything enqueued so far (0: nothing pending, always complete).
  virtual std::uint64_t record_event() = 0;
  virtual bool event_done(std::uint64_t serial) = 0;
  virtual void wait_event(std::uint64_t serial) = 0;
  virtual void synchronize() = 0;
  virtual void* native_stream() = 0;

  // c = alpha op(a) op(b) + beta c (+ bias) through the target's GEMM library where it has one
  // for these arguments; the default (and the fallback) is the project's own kernel. With `path`,
  // also says which ran, as --profile names it (the library, or gemm_path's own kernel).
  virtual void gemm(const GemmArgs& g, std::string* path = nullptr) {
    const Ctx cx = ctx();
    ::ct::gpu::gemm(cx, g);
    if (path) *path = "own " + ::ct::gpu::gemm_path(cx, g);
  }
  // The GEMMs the target's library refused and the own kernel ran instead, by shape ("bf16 x
  // bf16 -> f32, 768x3072x8192 tn, bias, batch 1" -> calls). Empty where the target has no
  // library (there the own kernel is the GEMM by design, not a fallback).
  virtual std::map<std::string, std::int64_t> gemm_fallbacks() const { return {}; }
  // Whether GEMMs go to a library first (so that gemm_fallbacks() counts what it refused).
  virtual bool has_gemm_library() const { return false; }
  // Device::set_allow_tf32: fp32 GEMMs with TF32 inputs where the target's library has them, and
  // Ctx::tf32 (the tile flash attention in TF32) where the target runs the TF32 tile.
  virtual void set_allow_tf32(bool on) { (void)on; }
  // Lines for `crosstrain devices` describing which GEMM runs ("cuBLASLt 13.0", "own tiled").
  virtual std::string gemm_library() const { return "own tiled kernel (backends/gpu/kernels)"; }

  // Timing marks (--profile): timing_mark() puts a mark after everything enqueued so far and
  // returns its number (0, 1, 2, ... since the last timing_reset); timing_ms(a, b) waits for both
  // and returns the milliseconds between them; timing_reset() forgets every mark. The default is
  // the host's clock, right where the kernels run when they are launched (the SIMT runtime); a
  // target with a device clock (CUDA, HIP) records timed events on its stream.
  virtual std::size_t timing_mark() {
    host_marks_.push_back(std::chrono::steady_clock::now());
    return host_marks_.size() - 1;
  }
  virtual double timing_ms(std::size_t a, std::size_t b) {
    return std::chrono::duration<double, std::milli>(host_marks_.at(b) - host_marks_.at(a)).count();
  }
  virtual void timing_reset() { host_marks_.clear(); }

  // Graphs (Device::begin_capture, core/device.h): CUDA's stream capture and graph launch, HIP's,
  // and the SIMT runtime's model of them. begin_capture() starts recording what is enqueued on
  // the stream; end_capture() stops, and returns the graph (> 0) or throws when the capture was
  // invalidated (a refused call, below) or could not be made into a graph; launch_graph()
  // enqueues a graph's work; destroy_graph() frees it once its launches have finished.
  // While capturing, a target refuses, through refuse_in_capture(), every call CUDA refuses on a
  // capturing stream: upload (pageable host memory), download and download_async, synchronize,
  // record_event, event_done, wait_event and release (cudaFree waits for the device), and the
  // capture is invalidated. Device-to-device copies, launches and the GEMM library are recorded;
  // allocation is allowed (CUDA's cudaMalloc in relaxed mode for the call: it is not replayed, so
  // the block must stay the graph's, which the device class sees to).
  virtual bool has_graphs() const { return false; }
  void begin_capture() {
    if (capturing_) refuse_in_capture("begin_capture", "captures do not nest");
    refused_.clear();
    start_capture();
    capturing_ = true;
  }
  std::uint64_t end_capture() {
    if (!capturing_) fail(ErrorKind::kInvalidArgument, info().id() + ": end_capture: no capture");
    capturing_ = false;
    const std::uint64_t graph = stop_capture();
    if (!refused_.empty()) {
      if (graph) destroy_graph(graph);
      fail(ErrorKind::kInvalidArgument,
           info().id() + ": the graph capture was invalidated by " + refused_);
    }
    return graph;
  }
  bool capturing() const { return capturing_; }
  virtual void launch_graph(std::uint64_t graph) { (void)graph; }
  virtual void destroy_graph(std::uint64_t graph) { (void)graph; }

 protected:
  // The target's own begin and end of a capture; stop_capture() returns 0 where the target's
  // runtime already refused the capture (refused_ then says why).
  virtual void start_capture() {}
  virtual std::uint64_t stop_capture() { return 0; }
  // Throws for `call` made during a capture (`why`: what CUDA's rule protects), and invalidates
  // the capture; a no-op outside one.
  void refuse_in_capture(const char* call, const std::string& why) {
    if (!capturing_) return;
    const std::string what = std::string(call) + " during a graph capture: " + why +
                             " (CUDA and HIP refuse it on a capturing stream: "
                             "cudaErrorStreamCaptureUnsupported)";
    if (refused_.empty()) refused_ = what;
    fail(ErrorKind::kInvalidArgument, info().id() + ": " + what);
  }
  std::string refused_;  // the first refused call of the capture, "" while none

 private:
  std::vector<std::chrono::steady_clock::time_point> host_marks_;
  bool capturing_ = false;
};

// The device of a target's Runtime: every op of core/device.h through the launchers of
// backends/gpu/kernels.h, with a caching allocator. Defined in gpu_device.cpp.
std::unique_ptr<Device> make_gpu_device(std::unique_ptr<Runtime> rt);

// Whether the own GEMM takes 16-bit inputs through the matrix tile (Ctx::matrix_tiles): the
// runtime's default unless CT_GPU_TILES is 0 or 1 (benchmarks compare the two paths).
inline bool matrix_tiles_setting(bool fallback) {
  const char* v = std::getenv("CT_GPU_TILES");
  if (v && (v[0] == '0' || v[0] == '1') && v[1] == '\0') return v[0] == '1';
  return fallback;
}

// Ctx::splitk: CT_GPU_SPLITK=n (n >= 1) where set, else the runtime's default.
inline int splitk_setting(int fallback) {
  const char* v = std::getenv("CT_GPU_SPLITK");
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end == '\0' && n >= 1 && n <= 64 ? static_cast<int>(n) : fallback;
}

}  // namespace ct::gpu
