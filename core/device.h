// The backend interface: devices, buffers with memory accounting, and the op set.
//
// Execution model. Every op below is *enqueued* on the device's stream, in call order; an op may
// start running before the call returns or long after (a Vulkan/CUDA device records it into a
// command buffer). Ops take Tensors only: no host pointers, no host-side reads of device data, so
// a whole training step can be recorded and submitted without the host waiting. The host waits
// only in download() and synchronize(). Scalars passed by value (eps, lr, ...) are captured at
// call time. Values that the device computes (a gradient norm, a loss) stay on the device as
// tensors and are read by later ops.
//
// Unless an op says otherwise: tensors are contiguous f32, on this device, and must not alias;
// "(+=)" marks an output that is accumulated into, "(=)" one that is overwritten.
//
// Mixed precision. Where an op's comment says "16-bit allowed", a tensor may also be f16 or bf16
// (abbreviated h below); all arithmetic is still done in fp32 and results are rounded to nearest
// even when stored in 16 bits. Every backend must follow the same table (core/amp/precision.h
// says which model tensors use which dtype):
//   matmul              a, b: f32 | h (both the same); c: f32 | a's dtype; bias f32, added
//                       rounded to c's dtype where c is h (see matmul below)
//   embedding fwd       wte, wpe: f32 | h (both the same); out f32     bwd: all f32
//   layernorm fwd       x f32; out f32 | h;            bwd: dout f32 | h; x, dx f32
//   residual layernorm  x, residual f32; r, out: both f32 or both the same h
//   rmsnorm fwd         x f32; out f32 | h;            bwd: dout f32 | h; x, dx f32
//   residual rmsnorm    x, residual f32; r, out: both f32 or both the same h
//   attention fwd/bwd   qkv, out, att, dout, dqkv: all f32 or all the same h
//   flash attention     qkv, out, dout, dqkv: all f32 or all the same h; lse f32
//   gelu fwd/bwd        x, out, dout, dx: all f32 or all the same h
//   swiglu fwd/bwd      gu, out, dout, dgu: all f32 or all the same h
//   rope fwd/bwd        x, out (dout, dx): f32 or the same h; cos, sin f32
//   dropout             x, out: both f32 or both the same h
//   crossentropy        logits (and dlogits) f32 | h; losses f32
//   bias_backward       dout f32 | h; dbias f32
//   add                 out, a f32; b f32 | h
//   copy                any float dtype to any float dtype
// supports(op, dtype) answers for the 16-bit dtype in question; given a 16-bit tensor where it
// says no, or where the table allows only f32, the op throws Error(kUnsupported) naming the op,
// the tensor and its dtype.
//
// Argument checks. Each op is a non-virtual member that checks its arguments once, in core
// (core/op_checks.cpp), with one set of messages for every backend, and then calls the protected
// virtual <op>_kernel() that a backend implements. What a kernel may take as given: every tensor
// it is handed is defined, belongs to this device (its buffer's device() is this one; another
// device of the same backend is rejected too), is contiguous, lies within its buffer, has a dtype
// the table above allows and supports() accepts, and the shapes agree. A violation is
// Error(kInvalidArgument) (the dtype cases above: kUnsupported). The rules, decided once:
//   - tensors that an op writes must not overlap the tensors it reads where the op says so:
//     matmul's c must not overlap a or b; a converting copy must not overlap its source (a
//     same-dtype copy may: it is a memmove); crossentropy_backward's dlogits may alias logits
//     exactly (in place) but not partially; crossentropy_forward_backward is in place;
//     adamw's and adamw_groups' param16, where defined, overlaps none of their other tensors.
//   - matmul: a batched a or b has c's batch dims, compared one by one ([2,3,M,K] does not match
//     c [3,2,M,N]); a 2-D a or b is broadcast over the batch.
//   - crossentropy: logits [Vp] (1-D) is one row, N = 1; 1 <= valid <= Vp.
//   - copy converts only between f32, f16 and bf16; other dtypes copy to their own dtype.
// Left to kernels: checks of data the device holds (the CPU reads token and target indices,
// host memory to it, and rejects one out of range; a GPU would need a read-back and does not)
// and a backend's own limits (Vulkan splits work to fit maxStorageBufferRange and says
// Error(kUnsupported) where it cannot).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace ct {

// ---------------------------------------------------------------------------------------------
// Memory accounting

enum class MemCategory : int { kWeights, kGrads, kOptimizer, kActivations, kWorkspace };
inline constexpr int kNumMemCategories = 5;
const char* mem_category_name(MemCategory c);  // "weights", "grads", "optimizer", ...

struct MemoryStats {
  std::array<int64_t, kNumMemCategories> current{};
  std::array<int64_t, kNumMemCategories> peak{};
  int64_t total_current = 0;
  int64_t total_peak = 0;
};

// Thread-safe per-category byte counter that every backend keeps for its buffers.
class MemoryTracker {
 public:
  void on_alloc(MemCategory c, size_t bytes);
  void on_free(MemCategory c, size_t bytes);
  MemoryStats stats() const;
  void reset_peaks();

 private:
  mutable std::mutex mu_;
  MemoryStats s_;
};

// ---------------------------------------------------------------------------------------------
// Devices and buffers

enum class DeviceType { kCpu, kIntegratedGpu, kDiscreteGpu, kVirtualGpu, kOther };
const char* device_type_name(DeviceType t);
// The two attention implementations: fused (flash-style, the probabilities never stored) and
// unfused (GEMMs and a stored softmax).
enum class AttentionPath { kFused, kUnfused };

struct DeviceInfo {
  std::string backend;  // "cpu", "vulkan", "cuda", "hip"
  int index = 0;        // index within the backend ("vulkan:1")
  std::string name;     // marketing or driver name
  DeviceType type = DeviceType::kCpu;
  std::string driver;                  // driver name and version
  int64_t memory_bytes = 0;            // total memory usable by this device
  int64_t memory_budget_bytes = 0;     // currently available (0 if unknown)
  int64_t max_allocation_bytes = 0;    // largest single allocation
  int64_t max_buffer_range_bytes = 0;  // largest range one op may bind (Vulkan storage range)
  std::vector<DType> dtypes;           // element types the op set supports
  bool cooperative_matrix = false;
  bool fp16_arithmetic = false;
  bool bf16_arithmetic = false;
  // What the host code decides by. Nothing outside a backend compares backend names: a device
  // says what it is good at, the backend that made it knows why.
  //   native_stack:  the vendor's own compute stack drives this device (CUDA, HIP, the CPU
  //                  backend's own kernels), not a portable API over it (Vulkan). --backend auto
  //                  takes GPUs first (discrete, then integrated), and among devices of one type
  //                  a native stack first; a CPU only through its native stack.
  //   test_only:     exists to test kernel sources (the SIMT runtime): never chosen by auto.
  //   preferred_attention: what --attention auto picks, the path measured faster here.
  //   tf32:          fp32 matmuls can run with TF32 inputs (Device::set_allow_tf32).
  //   graphs:        ops can be captured into a graph and replayed (Device::begin_capture).
  bool native_stack = false;
  bool test_only = false;
  AttentionPath preferred_attention = AttentionPath::kFused;
  bool tf32 = false;
  bool graphs = false;
  // Further capabilities to show in `crosstrain devices`: ordered name -> value pairs.
  std::vector<std::pair<std::string, std::string>> extra;
  // Part of this description is settled only when the device is opened (Vulkan: the coopmat
  // start-up self-test, where no verdict is cached for this driver yet): open(index)->info()
  // has the settled one, and `crosstrain devices` opens such a device to show it.
  bool settled_on_open = false;

  std::string id() const { return backend + ":" + std::to_string(index); }
};

class Device;

// A block of device memory. Freed (and un-accounted) when the last Tensor referring to it goes.
class Buffer {
 public:
  Buffer(Device& device, size_t size, MemCategory category)
      : device_(device), size_(size), category_(category) {}
  virtual ~Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  Device& device() const { return device_; }
  size_t size() const { return size_; }
  MemCategory category() const { return category_; }

 private:
  Device& device_;
  size_t size_;
  MemCategory category_;
};

// A point in one device's stream (Device::record_event, Device::download_async): complete once
// every op enqueued on that device before it has finished. A default-constructed Event is
// complete. A small value: copy it freely, but it must not outlive its device.
class Event {
 public:
  Event() = default;
  Event(Device* device, uint64_t serial) : device_(device), serial_(serial) {}
  Device* device() const { return device_; }
  // Backend-defined position in the stream (Vulkan: the batch's serial); 0 is always complete.
  uint64_t serial() const { return serial_; }
  // Whether the event has completed; never blocks (Device::event_done).
  bool done() const;
  // Blocks the host until the event has completed (Device::wait_event).
  void wait() const;

 private:
  Device* device_ = nullptr;
  uint64_t serial_ = 0;
};

// Hyper-parameters of one fused AdamW update (PyTorch semantics, decoupled weight decay).
struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;            // 1-based step count for bias correction
  float max_grad_norm = 0.0f;  // > 0: scale grads by min(1, max_grad_norm / (norm + 1e-6))
};

// The step-varying scalars of adamw_groups, which its kernel reads from a device tensor [4] f32
// that the host writes before each step (an upload on the stream, outside any captured graph), so
// that a graph replays the update with each step's values. `step` is the 1-based t (exact in f32
// below 2^24); bc1 = 1 - beta1^t and bc2 = 1 - beta2^t are computed in double and rounded to
// f32, the values adamw's fp32 kernels take (the CPU's fp64 reference computes them from t).
struct AdamWSchedule {
  float lr, step, bc1, bc2;
};
inline constexpr int64_t kAdamWScheduleLen = 4;
// hp.lr, hp.step, hp.beta1 and hp.beta2 as adamw_groups reads them. Throws Error(kInvalidArgument)
// for a step outside [1, 2^24].
AdamWSchedule adamw_schedule(const AdamWHyper& hp);

// The parameter groups of one adamw_groups call: `count` ranges [begin, begin + len) of the flat
// buffers, ascending and disjoint, each decayed (hp.weight_decay) or not (0). Elements outside
// every range are not touched (a padded LM head's rows). A fixed capacity so that the table is a
// kernel argument, no device buffer: a model's trainable rows merge into 2 or 3 such runs.
struct AdamWGroups {
  static constexpr int kMaxRanges = 8;
  struct Range {
    int64_t begin = 0, len = 0;
    bool decay = false;
  };
  int count = 0;
  Range ranges[kMaxRanges];
};

// ---- optimizers: hyper-parameters of the fused low-memory optimizer ops -----------------------
// Every field is captured at call time. `max_grad_norm` > 0 scales the gradient by
// clip = min(1, max_grad_norm / (grad_norm[0] + 1e-6)), as AdamWHyper does; 0 leaves it alone.

// torch.optim.SGD: coupled (L2) weight decay, momentum buffer set to the first gradient.
struct SgdHyper {
  float lr = 1e-3f;
  float momentum = 0.0f;  // 0: no buffer (momentum_buf may be undefined)
  float dampening = 0.0f;
  float weight_decay = 0.0f;  // g += weight_decay * param (before momentum)
  bool nesterov = false;      // needs momentum > 0 and dampening == 0 (as PyTorch)
  int64_t step = 1;           // 1-based; step 1 sets the buffer to g instead of blending
  float max_grad_norm = 0.0f;
};

// Lion (Chen et al. 2023; bitsandbytes "lion_32bit"): sign of an interpolated momentum.
struct LionHyper {
  float lr = 1e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float weight_decay = 0.0f;  // decoupled: param *= 1 - lr * weight_decay
  float max_grad_norm = 0.0f;
};

// Adafactor with Hugging Face transformers.optimization.Adafactor semantics.
struct AdafactorHyper {
  float lr = 1e-3f;              // the step size when !relative_step
  float eps1 = 1e-30f;           // added to grad^2 (HF eps[0])
  float eps2 = 1e-3f;            // floor of the parameter RMS (HF eps[1])
  float clip_threshold = 1.0f;   // update /= max(1, RMS(update) / clip_threshold)
  float decay_rate = -0.8f;      // beta2_t = 1 - step^decay_rate
  float beta1 = 0.0f;            // > 0: first moment in exp_avg (HF beta1); 0: HF's None
  float weight_decay = 0.0f;     // param -= weight_decay * lr_t * param
  bool relative_step = false;    // lr_t from the step: min(1e-2 | 1e-6 step, 1/sqrt(step))
  bool scale_parameter = false;  // lr_t *= max(eps2, RMS(param))
  bool warmup_init = false;      // relative step 1e-6 * step instead of 1e-2
  int64_t step = 1;              // 1-based
  float max_grad_norm = 0.0f;
};

// Block size of the block-wise 8-bit optimizer states: one fp32 absmax per block of 256.
inline constexpr int64_t kQuantBlockSize = 256;
inline int64_t quant_blocks(int64_t n) {
  return (n + kQuantBlockSize - 1) / kQuantBlockSize;
}

// The bound matmul_bias_gelu and matmul_gelu_backward allow a vendor library's epilogue (GELU
// of the f32 value before its rounding to the output's dtype), relative to |pre| (|g|): two ulps
// of the dtype at 1 (bf16 2^-6, f16 2^-9), 2^-10 for f32 (the library's own tanh).
inline double gelu_epilogue_rel_tol(DType dt) {
  return dt == DType::bf16 ? 0x1p-6 : dt == DType::f16 ? 0x1p-9 : 0x1p-10;
}

// What matmul() resolved from its operands, handed to matmul_kernel().
struct MatmulDims {
  int64_t batch = 1;  // product of c's leading dims
  int64_t M = 0, N = 0, K = 0;
  bool a_batched = false, b_batched = false;  // false: a 2-D operand broadcast over the batch
};

// What dropout() resolved from p, handed to dropout_kernel(): element i is kept when
// (Philox(seed, stream).u32(i) >> 8) >= threshold, and a kept element is multiplied by scale.
struct DropoutMask {
  uint64_t seed = 0, stream = 0;
  uint32_t threshold = 0;  // round(p * 2^24), in [0, 2^24)
  float scale = 1.0f;      // 1 / (1 - p), rounded to float
};

// What supports() answers for: one kind per op family, each declared in core/ops.def with its
// number (part of the plugin ABI) and the dtypes the mixed-precision table allows it.
enum class OpKind {
#define CT_OP_KIND(kind, value, label, dtypes) kind = value,
#include "core/ops.def"
};

class Device {
 public:
  virtual ~Device() = default;

  // Static description: name, memory, limits, capabilities.
  virtual const DeviceInfo& info() const = 0;
  // Whether `op` runs here with tensors of element type `dtype`. Callers ask before dispatching
  // anything but f32 and fall back explicitly.
  virtual bool supports(OpKind op, DType dtype) const = 0;
  // Bytes in use and peak, per category, for buffers of this device.
  MemoryStats memory() const { return tracker_.stats(); }
  void reset_memory_peaks() { tracker_.reset_peaks(); }

  // -- memory ------------------------------------------------------------------------------
  // A new buffer of `bytes` bytes, uninitialised. Throws Error(kOutOfMemory) naming the size,
  // the free memory and the limit hit.
  virtual std::shared_ptr<Buffer> allocate(size_t bytes, MemCategory category) = 0;
  // A new contiguous tensor in a buffer of its own.
  Tensor empty(const Shape& shape, DType dtype, MemCategory category);
  // Copy `bytes` host bytes into `dst` (contiguous). The host memory may be reused on return.
  void upload(const Tensor& dst, const void* host, size_t bytes);
  // Wait for all enqueued work that writes `src`, then copy it into host memory.
  void download(void* host, const Tensor& src, size_t bytes);

  // -- stream ------------------------------------------------------------------------------
  // Submit what has been recorded so far without waiting for it.
  virtual void flush() = 0;
  // Submit and wait until every enqueued op has finished.
  virtual void synchronize() = 0;
  // Events and asynchronous copies. The defaults synchronize (correct, not asynchronous); a
  // backend with a real stream overrides all four of event_done, wait_event, record_event and
  // download_async_kernel.
  // An event after every op enqueued so far. It may stay unsubmitted until flush(), or the first
  // done()/wait() on it (which submit what it waits for).
  virtual Event record_event() {
    synchronize();
    return Event(this, 0);
  }
  // Whether `e`, an event of this device, has completed. Never waits for the device.
  virtual bool event_done(const Event& e) {
    (void)e;
    return true;
  }
  // Blocks the host until `e`, an event of this device, has completed. Downloads made with
  // download_async() up to `e` have landed in host memory when this returns.
  virtual void wait_event(const Event& e) { (void)e; }
  // Later ops on this stream run after `e` completed. An event of this device is already
  // ordered (one in-order stream); the default waits on the host for another device's event.
  virtual void stream_wait(const Event& e) {
    if (e.device() && e.device() != this) e.wait();
  }
  // Copies `bytes` bytes of `src` (contiguous, on this device) into `host` without waiting for
  // the device: the copy is ordered after every op enqueued so far, and the bytes are in `host`
  // once the returned event has completed and was observed (done() returned true, wait(), or
  // synchronize()). `host` must stay valid and untouched until then. Later ops may overwrite
  // `src` at once: the copy sees its value at this point of the stream. Checked here (the same
  // rules as download), then download_async_kernel() does the work.
  Event download_async(void* host, const Tensor& src, size_t bytes);
  // The native stream or queue a collective library (NCCL, RCCL, ...) enqueues on, or nullptr.
  //   cpu:    nullptr (ops run eagerly on the calling thread)
  //   vulkan: the VkQueue the device submits to; call flush() first so that recorded ops are
  //           on the queue, and submit to it only from the thread that drives this device
  //   cuda:   cudaStream_t;  hip: hipStream_t   (the backends' own stream)
  virtual void* native_stream() { return nullptr; }
  // The address a collective library (NCCL, RCCL, the SIMT runtime's own) reads and writes for
  // `t`'s first element: its buffer's device memory plus the offset; nullptr where the device
  // hands its memory to no such library (cpu, vulkan). `t` is defined and on this device.
  virtual void* native_address(const Tensor& t) {
    (void)t;
    return nullptr;
  }

 protected:
  virtual Event download_async_kernel(void* host, const Tensor& src, size_t bytes) {
    download(host, src, bytes);
    return Event(this, 0);
  }

 public:
  // Profiling (crosstrain train --profile): record per-op device times from now on, where the
  // backend can; profile_report() is a printable table of them ("" where not supported).
  virtual void set_profiling(bool on) { (void)on; }
  virtual std::string profile_report() { return ""; }
  // Running totals since the device was opened, by name, for metrics.jsonl and the tests; a
  // backend reports those it keeps (none by default):
  //   "host_waits"             calls that blocked the host until device work had finished
  //                            (download, synchronize, wait_event on an event not yet done)
  //   "gemm_library_fallbacks" GEMMs the device's library (cuBLASLt, rocBLAS) refused and the
  //                            own kernel ran instead (a target without a library has none)
  //   "graph_replays"          replay_graph calls (a device with graphs)
  virtual std::map<std::string, int64_t> counters() { return {}; }

  // Graphs (CUDA / HIP graphs; the SIMT runtime keeps a strict model of them), where
  // info().graphs says the device has them; elsewhere the four calls throw Error(kUnsupported).
  // Between begin_capture() and end_capture() the ops enqueued on this device are recorded, not
  // run; their scalar arguments are taken at call time, as always. Nothing in between may make
  // the host wait for the device or copy host memory: download, download_async, upload,
  // synchronize, record_event and the waits and queries of events throw Error(kInvalidArgument)
  // naming the call, as CUDA refuses them on a capturing stream, and invalidate the capture.
  // end_capture() leaves capture and returns the graph (a number > 0), or throws when the
  // capture was invalidated. Every buffer that an op of the graph uses stays allocated, its
  // address handed to no one else, until release_graph(graph) (the graph's own pool).
  // replay_graph(graph) enqueues the recorded ops again, in order, with the same arguments,
  // reading and writing the same buffers: one launch instead of one per op.
  virtual void begin_capture();
  virtual int64_t end_capture();
  virtual void replay_graph(int64_t graph);
  virtual void release_graph(int64_t graph);
  // The scope of one public op, opened by core/op_checks.cpp around each (the checks and the
  // kernel; an op that calls other ops nests their scopes in its own): where the backend profiles
  // per op, the device time of the outermost scope is counted under `op`, its public name.
  virtual void op_begin(const char* op) { (void)op; }
  virtual void op_end() {}
  // fp32 matmuls (and the GPU devices' tile flash attention) may take TF32 inputs from now on
  // (crosstrain train --tf32, PyTorch's allow_tf32), where info().tf32 says the device can; a
  // no-op elsewhere (the SIMT runtime, a test device, takes it for its attention only). Off when
  // opened.
  virtual void set_allow_tf32(bool on) { (void)on; }

  // -- elementwise ---------------------------------------------------------------------------
  // t (=) value, any dtype (integers take the value truncated).
  void fill(const Tensor& t, float value);
  // dst (=) src, same numel; converts between float dtypes (round to nearest even).
  void copy(const Tensor& dst, const Tensor& src);
  // out (=) a + b, all [N].
  void add(const Tensor& out, const Tensor& a, const Tensor& b);
  // dst (+=) src, both [N].
  void accumulate(const Tensor& dst, const Tensor& src);
  // t (=) t * s, [N].
  void scale(const Tensor& t, float s);

  // -- transformer ops -------------------------------------------------------------------------
  // out[b,t,:] (=) wte[tokens[b,t],:] + wpe[t,:] (16-bit tables allowed: widened, added in fp32).
  // out [B,T,C]; tokens [B,T] i32 in [0,V); wte [V,C]; wpe [maxT,C] with maxT >= T, or
  // undefined: no position table (rotary models), out[b,t,:] (=) wte[tokens[b,t],:].
  void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                         const Tensor& wpe = Tensor());
  // dwte (+=) scatter of dout by token, dwpe (+=) sum of dout over the batch (dwpe undefined:
  // none). Deterministic: for every row of dwte, contributions are added in (b,t) order.
  void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens);

  // out (=) (x - mean) * rstd * w + b over the last dim; saves mean and rstd.
  // x, out [N,C]; w, b [C]; mean, rstd [N] (f32). Statistics in fp32 or better.
  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                         const Tensor& w, const Tensor& b, float eps);
  // residual (=) x + r, then out, mean, rstd (=) layernorm_forward(residual, w, b, eps): the
  // residual add and the layernorm of its sum in one pass over each row (llm.c's
  // fused_residual_forward), the same numbers as add() then layernorm_forward(): the sum is
  // rounded to f32 once, as add() stores it, and normalised as stored.
  // x, residual [N,C] f32; r, out [N,C] f32 or the same h; w, b [C]; mean, rstd [N] (f32).
  // residual must not overlap any other tensor.
  void residual_layernorm_forward(const Tensor& residual, const Tensor& out, const Tensor& mean,
                                  const Tensor& rstd, const Tensor& x, const Tensor& r,
                                  const Tensor& w, const Tensor& b, float eps);
  // dx (+=), dw (+=), db (+=), from dout [N,C] and the saved x, w, mean, rstd.
  void layernorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dout,
                          const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd);

  // out (=) (x * rstd) * w over the last dim, rstd = 1 / sqrt(mean(x^2) + eps) (Llama's
  // RMSNorm, in fp32 as Hugging Face computes it); saves rstd.
  // x, out [N,C]; w [C]; rstd [N] (f32). Statistics in fp32 or better.
  void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w,
                       float eps);
  // residual (=) x + r, then out, rstd (=) rmsnorm_forward(residual, w, eps), in one pass over
  // each row, with the numbers of add() then rmsnorm_forward() (as residual_layernorm_forward).
  // x, residual [N,C] f32; r, out [N,C] f32 or the same h; w [C]; rstd [N] (f32). residual must
  // not overlap any other tensor.
  void residual_rmsnorm_forward(const Tensor& residual, const Tensor& out, const Tensor& rstd,
                                const Tensor& x, const Tensor& r, const Tensor& w, float eps);
  // dx (+=), dw (+=), from dout [N,C] and the saved x, w, rstd:
  //   xhat = x * rstd, dxhat = dout * w; dx += rstd * (dxhat - xhat * mean(dxhat * xhat)),
  //   dw += sum over rows of dout * xhat.
  void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x,
                        const Tensor& w, const Tensor& rstd);

  // c (=) alpha * op(a) @ op(b) + beta * c (+ bias broadcast over rows, if given).
  // op(a) [..., M, K], op(b) [..., K, N], c [..., M, N]; op(x) is x or its transpose over the
  // last two dims as stored ([..., K, M] with trans_a). Leading (batch) dims of c are matched by
  // a and b, or a/b is 2-D and broadcast over the batch. bias [N]. fp32 accumulation:
  //   c[i][j] = round_c(alpha * acc[i][j] + beta * c[i][j] + bias'[j]), added in that order,
  // acc the fp32 sum of products and round_c the one rounding to c's dtype (none for f32). With
  // an f32 c, bias' is the f32 bias; with an f16/bf16 c, bias' is the bias rounded to c's dtype
  // (nearest even, as every 16-bit store) and widened back, as cuBLASLt's bias epilogue, PyTorch's
  // autocast and llm.c add it there.
  void matmul(const Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
              float alpha = 1.0f, float beta = 0.0f, const Tensor* bias = nullptr);
  // The MLP's first product with its activation in the epilogue (llm.c's GELU fusion):
  //   pre (=) op(a) @ op(b) + bias, as matmul(pre, a, b, trans_a, trans_b, 1, 0, &bias) stores it;
  //   out (=) gelu(pre) as gelu_forward(out, pre) computes it from the stored pre.
  // pre, out [..., M, N] of one dtype: f32, or a's 16-bit dtype; bias [N] f32; pre (saved for the
  // backward) and out overlap neither each other nor a, b. A device's own kernels give exactly
  // the bits of those two ops on that device. Where a vendor library runs the product (cuBLASLt's
  // GELU_AUX_BIAS epilogue on CUDA), pre is the library's product with bias, as its matmul would
  // store it, and out is GELU of the f32 sum before pre's rounding, rounded once: then
  //   |out - gelu(pre)| <= gelu_epilogue_rel_tol(dtype) * |pre| + 1e-6
  // (pre's rounding moves gelu by at most 0.57 of pre's ulp, the library's tanh and out's own
  // rounding by less than one ulp of the dtype).
  void matmul_bias_gelu(const Tensor& out, const Tensor& pre, const Tensor& a, const Tensor& b,
                        bool trans_a, bool trans_b, const Tensor& bias);
  // The GELU's backward in the epilogue of the product that gives its output's gradient (the
  // MLP's c_proj dgrad):
  //   dpre (=) gelu_backward(pre, g), g = op(a) @ op(b) as matmul(g, a, b, trans_a, trans_b)
  //   stores it in dpre's dtype,
  // without storing g. dpre, pre [..., M, N] of one dtype, f32 or a's 16-bit dtype; dpre
  // overlaps neither pre nor a, b. A device's own kernels give exactly the bits of matmul() into
  // a tensor of dpre's dtype then gelu_backward(); a vendor library (cuBLASLt's DGELU epilogue)
  // multiplies the f32 g before its rounding: |dpre - gelu_backward(pre, g)| <=
  // gelu_epilogue_rel_tol(dtype) * |g| + 1e-6, g as the library's matmul would store it.
  void matmul_gelu_backward(const Tensor& dpre, const Tensor& a, const Tensor& b, bool trans_a,
                            bool trans_b, const Tensor& pre);
  // dbias (+=) column sums of dout: dout [M,N], dbias [N].
  void bias_backward(const Tensor& dbias, const Tensor& dout);

  // Causal multi-head self-attention, scale 1/sqrt(hs), hs = C/n_head, with grouped-query
  // attention: n_kv_head (dividing n_head; 0 means n_head, plain multi-head attention) key/value
  // heads, query head h reading key/value head h / (n_head / n_kv_head).
  // qkv [B,T,C + 2 n_kv_head hs] holds q (n_head heads) | k (n_kv_head heads) | v (n_kv_head
  // heads); out [B,T,C] with heads concatenated; att [B,n_head,T,T] (=) softmax probabilities,
  // zero above the diagonal.
  void attention_forward(const Tensor& out, const Tensor& att, const Tensor& qkv, int n_head,
                         int n_kv_head = 0);
  // dqkv (=) gradient w.r.t. qkv, from dout [B,T,C] and the saved qkv and att. A key/value
  // head's gradient sums over the query heads of its group.
  void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                          const Tensor& att, int n_head, int n_kv_head = 0);

  // The same attention fused (flash-style): blocks of queries against blocks of keys with an
  // online softmax, so the probabilities are never stored. qkv and out as above; lse
  // [B,n_head,T] f32 (=) per query row, log sum_{t2<=t} exp(scale q_t . k_t2), the one
  // statistic saved for the backward. The forward may take the last rows only (sampling's
  // key/value cache): out [B,Tq,C] and lse [B,n_head,Tq], 1 <= Tq <= T, are the rows of the
  // positions T - Tq .. T - 1, each attending to the keys up to its position.
  void flash_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int n_head,
                               int n_kv_head = 0);
  // dqkv (=) gradient w.r.t. qkv, from dout [B,T,C] and the saved qkv, out and lse (the
  // probabilities are recomputed: p = exp(scale q.k - lse)).
  void flash_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                const Tensor& out, const Tensor& lse, int n_head,
                                int n_kv_head = 0);

  // GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). x, out [N].
  void gelu_forward(const Tensor& out, const Tensor& x);
  // dx (=) dout * gelu'(x). dx, dout, x [N].
  void gelu_backward(const Tensor& dx, const Tensor& x, const Tensor& dout);
  // out [...,F] (=) silu(gate) * up, gate = gu[...,:F], up = gu[...,F:] (Llama's MLP: gate_proj
  // and up_proj as one fused projection gu [...,2F]); silu(g) = g * sigmoid(g), fp32 arithmetic.
  void swiglu_forward(const Tensor& out, const Tensor& gu);
  // dgu [...,2F] (=) (dout * up * silu'(gate), dout * silu(gate)), silu'(g) = s (1 + g (1 - s)),
  // s = sigmoid(g). dgu may be gu (the gradient overwrites the saved projection).
  void swiglu_backward(const Tensor& dgu, const Tensor& gu, const Tensor& dout);
  // Rotary position embedding in Hugging Face's rotate-half form. x, out [B,T,W]: W / head_dim
  // heads of head_dim (even) per position; the first rot_heads heads are rotated, the others
  // copied (untouched when out is x). For a rotated head, position t and i < head_dim / 2, with
  // c = cos[t,i], s = sin[t,i] (cos, sin [T, head_dim/2] f32, the caller's tables):
  //   out[i] = x[i] c - x[i + D/2] s;   out[i + D/2] = x[i + D/2] c + x[i] s.
  void rope_forward(const Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin,
                    int64_t head_dim, int64_t rot_heads);
  // dx (=) the rotation by the opposite angle of dout (the transpose of the forward's); dx may
  // be dout.
  void rope_backward(const Tensor& dx, const Tensor& dout, const Tensor& cos, const Tensor& sin,
                     int64_t head_dim, int64_t rot_heads);

  // Inverted dropout with a counter-based mask: out[i] (=) keep(i) ? x[i] * scale : 0, where
  // keep(i) = (Philox(seed, stream).u32(i) >> 8) >= threshold (core/philox.h: the i-th word of
  // stream `stream`), threshold = round(p * 2^24) and scale = 1 / (1 - p) as a float, for p in
  // [0, 1). The mask is a pure function of (seed, stream, i): the same on every backend, and the
  // backward is this op applied to dout with the same seed and stream. x, out [N]; out may be x.
  void dropout(const Tensor& out, const Tensor& x, float p, uint64_t seed, uint64_t stream);

  // Fused log-softmax + negative log-likelihood, fp32, over the first `valid` columns of each
  // row: logits [N,Vp] with 1 <= valid <= Vp hold `valid` classes and Vp - valid columns of
  // padding (a vocabulary padded to an aligned width, core/model/model_base.h), which the
  // softmax never sees. targets [N] i32, each < valid. valid == Vp: every column is a class.
  // losses [N] (=) -log softmax(logits[n, :valid])[targets[n]].
  void crossentropy_forward(const Tensor& losses, const Tensor& logits, const Tensor& targets,
                            int64_t valid);
  // dlogits[:, :valid] (=) dloss * (softmax(logits[:, :valid]) - onehot(targets)) and
  // dlogits[:, valid:] (=) exactly 0; dlogits may alias logits (in-place).
  void crossentropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                             int64_t valid, float dloss);
  // The two above in one pass over each row, in place, for a training step that runs backward
  // right after its forward (llm.c's fused classifier): losses (=) as crossentropy_forward, then
  // logits (=) dlogits as crossentropy_backward(logits, logits, ...) would write them. Each row's
  // logits are read for the statistics and once more to write their gradient, instead of once
  // per op and per statistic. losses must not overlap logits.
  void crossentropy_forward_backward(const Tensor& losses, const Tensor& logits,
                                     const Tensor& targets, int64_t valid, float dloss);

  // -- reductions and optimizer ------------------------------------------------------------------
  // out[0] (=) scale * sum(x). out [1], x [N]. Deterministic order.
  void sum(const Tensor& out, const Tensor& x, float scale = 1.0f);
  // out[0] (=) sqrt(sum(x^2)) (the global L2 norm). out [1], x [N]. Deterministic order.
  void norm(const Tensor& out, const Tensor& x);
  // flag[0] (=) flag[0] | (any element of x is inf or NaN). flag [1] i32, x [N].
  void check_finite(const Tensor& flag, const Tensor& x);
  // Loss-scaler step, fused where the backend can: x (=) x * inv_scale, and flag[0] (=) flag[0] |
  // (any element of x, before or after scaling, is inf or NaN). x [N] f32, flag [1] i32.
  // The default runs scale() then check_finite().
  void unscale_check(const Tensor& x, const Tensor& flag, float inv_scale);
  // One fused AdamW step on param, grad, m, v (all [N]). grad_norm [1] is the global norm of
  // all gradients, read only when hp.max_grad_norm > 0 (clipping); may be undefined otherwise.
  //   g = grad * clip;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
  //   param -= lr * wd * param;  param -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
  // param16, when defined, is an f16 or bf16 [N] overlapping none of the others: each updated
  // parameter is also stored into it in the same pass, rounded exactly as copy(param16, param)
  // rounds (to nearest even) -- the 16-bit compute copy of a mixed-precision model, without a
  // second pass over the weights (llm.c's AdamW kernel does the same).
  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
             const Tensor& grad_norm, const AdamWHyper& hp, const Tensor& param16 = Tensor{});
  // adamw over the ranges of `groups` of param, grad, m, v [N], in one dispatch where the backend
  // can (one per range on Vulkan), each element computed as adamw computes it, bit for bit: with
  // weight decay hp.weight_decay in a decayed range and 0 elsewhere, and the learning rate and
  // step read when the op runs from `schedule` [4] f32 (AdamWSchedule; hp.lr and hp.step are not
  // read). A captured graph of this op replays with what `schedule` holds at each replay.
  // param16 as adamw's: the elements of the ranges are rounded into it, the others untouched.
  void adamw_groups(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                    const Tensor& grad_norm, const Tensor& schedule, const AdamWGroups& groups,
                    const AdamWHyper& hp, const Tensor& param16 = Tensor{});

  // -- optimizers --------------------------------------------------------------------------------
  // Fused optimizer steps. Each call updates one group of parameters in one dispatch; all
  // arithmetic in fp32 (the CPU reference in fp64). param and grad are f32 with the same numel;
  // grad_norm [1] f32 is read only when hp.max_grad_norm > 0 (may be undefined otherwise);
  // clip = min(1, max_grad_norm / (grad_norm[0] + 1e-6)) and g = grad * clip below. State
  // tensors are updated in place. The default kernels throw Error(kUnsupported) naming the op,
  // so a backend without the kernel says so; supports(kSgd | kLion | kAdamW8bit | kAdafactor,
  // f32) answers whether it has it.

  // SGD, torch.optim.SGD semantics. param, grad, momentum_buf [N] (momentum_buf undefined when
  // hp.momentum == 0):
  //   g += wd * param
  //   if momentum:  buf = (step == 1) ? g : momentum * buf + (1 - dampening) * g
  //                 g = nesterov ? g + momentum * buf : buf
  //   param -= lr * g
  void sgd(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
           const Tensor& grad_norm, const SgdHyper& hp);
  // Lion. param, grad, m [N]:
  //   c = b1 * m + (1 - b1) * g
  //   param *= 1 - lr * wd;  param -= lr * sign(c)      (sign(0) = 0)
  //   m = b2 * m + (1 - b2) * g
  void lion(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& grad_norm,
            const LionHyper& hp);
  // AdamW with both moments quantised block-wise to 8 bits (bitsandbytes' blockwise 8-bit Adam).
  // param, grad [N] f32; m_q, v_q [N] u8 (indices into the code tables); m_absmax, v_absmax
  // [quant_blocks(N)] f32; qmap_signed, qmap_unsigned [256] f32, each sorted ascending (the
  // dynamic codes of core/optim/quant_map.h; m uses the signed one, v the unsigned one).
  // Block b holds elements [256 b, min(N, 256 b + 256)); blocks are independent. Per element:
  //   m = qmap_signed[m_q] * m_absmax[b];  v = qmap_unsigned[v_q] * v_absmax[b]    (dequantise)
  //   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2                                  (fp32)
  //   param -= lr * wd * param;  param -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
  // with the unquantised new m, v (as AdamW). Then per block:
  //   m_absmax[b] = max |m|,  v_absmax[b] = max v   over the block's new values
  //   m_q = nearest(qmap_signed, m / m_absmax[b]),  v_q = nearest(qmap_unsigned, v / v_absmax[b])
  // where nearest(code, x) is the index i minimising |code[i] - x|, the lower index on a tie,
  // and x is taken as 0 when the block's absmax is 0. A fresh optimizer is absmax 0 (every index
  // then dequantises to 0; the optimizer zero-fills m_q and v_q too).
  void adamw_8bit(const Tensor& param, const Tensor& grad, const Tensor& m_q, const Tensor& v_q,
                  const Tensor& m_absmax, const Tensor& v_absmax, const Tensor& qmap_signed,
                  const Tensor& qmap_unsigned, const Tensor& grad_norm, const AdamWHyper& hp);
  // Adafactor (HF semantics) on ONE parameter tensor; the reductions below are inside the op
  // and deterministic (a fixed summation order that does not depend on thread count).
  // Factored when param has rank >= 2: param, grad [R, C] (R = product of the leading dims,
  // C = the last), row [R], col [C], v undefined. Otherwise param, grad, v [N], row/col undefined.
  // exp_avg has param's numel when hp.beta1 > 0, else undefined.
  //   rho   = hp.relative_step ? min(warmup_init ? 1e-6 t : 1e-2, 1/sqrt(t)) : hp.lr
  //   lr_t  = rho * (scale_parameter ? max(eps2, RMS(param)) : 1)   RMS(x) = sqrt(mean(x^2))
  //   b2t   = 1 - t^decay_rate;   u = g^2 + eps1
  //   factored:  row = b2t row + (1-b2t) mean_c(u);  col = b2t col + (1-b2t) mean_r(u)
  //              U[r,c] = g[r,c] / sqrt(row[r] / mean(row)) / sqrt(col[c])
  //   else:      v = b2t v + (1-b2t) u;  U = g / sqrt(v)
  //   U /= max(1, RMS(U) / clip_threshold);  U *= lr_t
  //   if beta1 > 0:  exp_avg = b1 exp_avg + (1-b1) U;  U = exp_avg
  //   param -= wd * lr_t * param;  param -= U
  void adafactor(const Tensor& param, const Tensor& grad, const Tensor& row, const Tensor& col,
                 const Tensor& v, const Tensor& exp_avg, const Tensor& grad_norm,
                 const AdafactorHyper& hp);

 protected:
  // -- kernels -------------------------------------------------------------------------------
  // What a backend implements: one protected virtual per op, called by the public op of the
  // same name once its arguments passed the checks of core/op_checks.cpp (see "Argument checks"
  // at the top of this file for what a kernel may take as given). Backends check nothing of
  // their own beyond their limits and data they read anyway.
  virtual void upload_kernel(const Tensor& dst, const void* host, size_t bytes) = 0;
  virtual void download_kernel(void* host, const Tensor& src, size_t bytes) = 0;
  // The op kernels, one per CT_OP_KERNEL line of core/ops.def, in its order: `void
  // <op>_kernel(parameters)`, pure virtual, or with a default in core (CT_OP_KERNEL_DEFAULT:
  // unscale_check runs scale_kernel() then check_finite_kernel(); the optimizers' throw
  // Error(kUnsupported) naming the op and the device). ops.def's comments say what a kernel is
  // handed beyond its public op's arguments.
#define CT_OP_KERNEL(op, params) virtual void op##_kernel params = 0;
#define CT_OP_KERNEL_DEFAULT(op, params) virtual void op##_kernel params;
#include "core/ops.def"

  MemoryTracker tracker_;
};

// ---------------------------------------------------------------------------------------------
// Backends: a set of devices of one kind, built in (cpu) or loaded from a plugin.

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Empty if the backend can be used; otherwise why not ("no Vulkan loader: libvulkan.so.1 ...").
  virtual std::string unavailable_reason() const = 0;
  virtual std::vector<DeviceInfo> devices() const = 0;
  // Opens device `index`. Throws Error(kInvalidArgument) listing the devices if out of range.
  virtual std::unique_ptr<Device> open(int index) = 0;
};

// A plugin is a shared library named libcrosstrain_backend_<name>.so next to the executable that
// exports these two C symbols.
inline constexpr int kBackendAbiVersion = 20;  // core/backend_abi.h: the history
extern "C" {
typedef int (*BackendAbiVersionFn)();
typedef Backend* (*BackendCreateFn)();
}
#define CT_BACKEND_ABI_SYMBOL "crosstrain_backend_abi_version"
#define CT_BACKEND_CREATE_SYMBOL "crosstrain_backend_create"

}  // namespace ct
