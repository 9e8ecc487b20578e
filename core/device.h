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
//   matmul              a, b: f32 | h (both the same); c: f32 | a's dtype; bias f32
//   layernorm fwd       x f32; out f32 | h;            bwd: dout f32 | h; x, dx f32
//   attention fwd/bwd   qkv, out, att, dout, dqkv: all f32 or all the same h
//   gelu fwd/bwd        x, out, dout, dx: all f32 or all the same h
//   crossentropy        logits (and dlogits) f32 | h; losses f32
//   bias_backward       dout f32 | h; dbias f32
//   add                 out, a f32; b f32 | h
//   copy                any float dtype to any float dtype
// supports(op, dtype) answers for the 16-bit dtype in question; a backend that says no for h
// must throw Error(kUnsupported) when given it.
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

struct DeviceInfo {
  std::string backend;  // "cpu", "vulkan", "cuda", "hip"
  int index = 0;        // index within the backend ("vulkan:1")
  std::string name;     // marketing or driver name
  DeviceType type = DeviceType::kCpu;
  std::string driver;                // driver name and version
  int64_t memory_bytes = 0;          // total memory usable by this device
  int64_t memory_budget_bytes = 0;   // currently available (0 if unknown)
  int64_t max_allocation_bytes = 0;  // largest single allocation
  int64_t max_buffer_range_bytes = 0;  // largest range one op may bind (Vulkan storage range)
  std::vector<DType> dtypes;           // element types the op set supports
  bool cooperative_matrix = false;
  bool fp16_arithmetic = false;
  bool bf16_arithmetic = false;
  // Further capabilities to show in `crosstrain devices`: ordered name -> value pairs.
  std::vector<std::pair<std::string, std::string>> extra;

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

enum class OpKind {
  kFill, kCopy, kAdd, kAccumulate, kScale,
  kEmbedding, kLayerNorm, kMatmul, kBiasGrad, kAttention, kGelu,
  kCrossEntropy, kSum, kNorm, kAdamW, kCheckFinite, kUnscaleCheck,
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
  virtual void upload(const Tensor& dst, const void* host, size_t bytes) = 0;
  // Wait for all enqueued work that writes `src`, then copy it into host memory.
  virtual void download(void* host, const Tensor& src, size_t bytes) = 0;

  // -- stream ------------------------------------------------------------------------------
  // Submit what has been recorded so far without waiting for it.
  virtual void flush() = 0;
  // Submit and wait until every enqueued op has finished.
  virtual void synchronize() = 0;

  // -- elementwise ---------------------------------------------------------------------------
  // t (=) value, any dtype (integers take the value truncated).
  virtual void fill(const Tensor& t, float value) = 0;
  // dst (=) src, same numel; converts between float dtypes (round to nearest even).
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;
  // out (=) a + b, all [N].
  virtual void add(const Tensor& out, const Tensor& a, const Tensor& b) = 0;
  // dst (+=) src, both [N].
  virtual void accumulate(const Tensor& dst, const Tensor& src) = 0;
  // t (=) t * s, [N].
  virtual void scale(const Tensor& t, float s) = 0;

  // -- transformer ops -------------------------------------------------------------------------
  // out[b,t,:] (=) wte[tokens[b,t],:] + wpe[t,:].
  // out [B,T,C]; tokens [B,T] i32 in [0,V); wte [V,C]; wpe [maxT,C] with maxT >= T.
  virtual void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                 const Tensor& wpe) = 0;
  // dwte (+=) scatter of dout by token, dwpe (+=) sum of dout over the batch. Deterministic:
  // for every row of dwte, contributions are added in (b,t) order.
  virtual void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                  const Tensor& tokens) = 0;

  // out (=) (x - mean) * rstd * w + b over the last dim; saves mean and rstd.
  // x, out [N,C]; w, b [C]; mean, rstd [N] (f32). Statistics in fp32 or better.
  virtual void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                 const Tensor& x, const Tensor& w, const Tensor& b,
                                 float eps) = 0;
  // dx (+=), dw (+=), db (+=), from dout [N,C] and the saved x, w, mean, rstd.
  virtual void layernorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db,
                                  const Tensor& dout, const Tensor& x, const Tensor& w,
                                  const Tensor& mean, const Tensor& rstd) = 0;

  // c (=) alpha * op(a) @ op(b) + beta * c (+ bias broadcast over rows, if given).
  // op(a) [..., M, K], op(b) [..., K, N], c [..., M, N]; op(x) is x or its transpose over the
  // last two dims as stored ([..., K, M] with trans_a). Leading (batch) dims of c are matched by
  // a and b, or a/b is 2-D and broadcast over the batch. bias [N]. fp32 accumulation.
  virtual void matmul(const Tensor& c, const Tensor& a, const Tensor& b, bool trans_a,
                      bool trans_b, float alpha = 1.0f, float beta = 0.0f,
                      const Tensor* bias = nullptr) = 0;
  // dbias (+=) column sums of dout: dout [M,N], dbias [N].
  virtual void bias_backward(const Tensor& dbias, const Tensor& dout) = 0;

  // Causal multi-head self-attention, scale 1/sqrt(C/n_head).
  // qkv [B,T,3C] holds q | k | v, each split into n_head heads of C/n_head; out [B,T,C] with
  // heads concatenated; att [B,n_head,T,T] (=) softmax probabilities, zero above the diagonal.
  virtual void attention_forward(const Tensor& out, const Tensor& att, const Tensor& qkv,
                                 int n_head) = 0;
  // dqkv (=) gradient w.r.t. qkv, from dout [B,T,C] and the saved qkv and att.
  virtual void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                  const Tensor& att, int n_head) = 0;

  // GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). x, out [N].
  virtual void gelu_forward(const Tensor& out, const Tensor& x) = 0;
  // dx (=) dout * gelu'(x). dx, dout, x [N].
  virtual void gelu_backward(const Tensor& dx, const Tensor& x, const Tensor& dout) = 0;

  // Fused log-softmax + negative log-likelihood, fp32.
  // losses [N] (=) -log softmax(logits[n,:])[targets[n]]; logits [N,V]; targets [N] i32.
  virtual void crossentropy_forward(const Tensor& losses, const Tensor& logits,
                                    const Tensor& targets) = 0;
  // dlogits (=) dloss * (softmax(logits) - onehot(targets)); dlogits may alias logits (in-place).
  virtual void crossentropy_backward(const Tensor& dlogits, const Tensor& logits,
                                     const Tensor& targets, float dloss) = 0;

  // -- reductions and optimizer ------------------------------------------------------------------
  // out[0] (=) scale * sum(x). out [1], x [N]. Deterministic order.
  virtual void sum(const Tensor& out, const Tensor& x, float scale = 1.0f) = 0;
  // out[0] (=) sqrt(sum(x^2)) (the global L2 norm). out [1], x [N]. Deterministic order.
  virtual void norm(const Tensor& out, const Tensor& x) = 0;
  // flag[0] (=) flag[0] | (any element of x is inf or NaN). flag [1] i32, x [N].
  virtual void check_finite(const Tensor& flag, const Tensor& x) = 0;
  // Loss-scaler step, fused where the backend can: x (=) x * inv_scale, and flag[0] (=) flag[0] |
  // (any element of x, before or after scaling, is inf or NaN). x [N] f32, flag [1] i32.
  // The default runs scale() then check_finite().
  virtual void unscale_check(const Tensor& x, const Tensor& flag, float inv_scale) {
    scale(x, inv_scale);
    check_finite(flag, x);
  }
  // One fused AdamW step on param, grad, m, v (all [N]). grad_norm [1] is the global norm of
  // all gradients, read only when hp.max_grad_norm > 0 (clipping); may be undefined otherwise.
  //   g = grad * clip;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
  //   param -= lr * wd * param;  param -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
  virtual void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                     const Tensor& grad_norm, const AdamWHyper& hp) = 0;

 protected:
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
inline constexpr int kBackendAbiVersion = 1;
extern "C" {
typedef int (*BackendAbiVersionFn)();
typedef Backend* (*BackendCreateFn)();
}
#define CT_BACKEND_ABI_SYMBOL "crosstrain_backend_abi_version"
#define CT_BACKEND_CREATE_SYMBOL "crosstrain_backend_create"

}  // namespace ct
