// The one Device of every GPU target (CUDA, HIP, the CPU SIMT runtime): each op kernel of
// core/device.h resolves its tensors to device pointers and shapes and calls a launcher of
// backends/gpu/kernels.h on the target's stream. Memory comes from a caching allocator over the
// target's Runtime, accounted per category like every backend's.
//
// Graphs: begin_capture() puts the runtime's stream into capture; while it captures, every
// buffer whose address an op hands to a kernel (ptr(), the op scratch) is collected, and the
// graph keeps those buffers until it is released: a block whose address is baked into a graph
// goes back to the cache only with the graph, so no one else is handed it between replays.
//
// Plain C++ built once per target (the target's Runtime differs, this file does not). Arguments
// arrive checked (core/op_checks.cpp): defined, on this device, contiguous, in bounds, dtypes as
// the precision table allows, shapes agreeing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "backends/gpu/kernels.h"
#include "backends/gpu/runtime.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/op_support.h"
#include "core/teardown_trace.h"

namespace ct::gpu {
namespace {

std::string mib(std::int64_t bytes) {
  return std::to_string(bytes / (1024 * 1024)) + " MiB (" + std::to_string(bytes) + " bytes)";
}

// Blocks are cached by their rounded size: small ones to 512 bytes, larger ones to 1/8 of their
// power of two (at most 12.5% slack), so the sizes a training step asks for every step are
// served from the cache after the first.
std::size_t round_block(std::size_t bytes) {
  bytes = std::max<std::size_t>(bytes, 1);
  if (bytes <= (std::size_t{1} << 20)) return (bytes + 511) / 512 * 512;
  std::size_t p = std::size_t{1} << (63 - __builtin_clzll(bytes));
  std::size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}

// Device memory blocks for buffers: freed blocks are kept for reuse (a caching allocator), and
// returned to the driver when an allocation would fail otherwise or the device closes. Reuse is
// safe without waiting: every op runs on the device's one in-order stream, so work enqueued
// after a block's reuse runs after the work of its previous owner.
class BlockCache {
 public:
  explicit BlockCache(std::shared_ptr<Runtime> rt) : rt_(std::move(rt)) {}
  ~BlockCache() { trim(); }

  void* take(std::size_t rounded) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(rounded);
      if (it != free_.end()) {
        void* p = it->second;
        free_.erase(it);
        cached_bytes_ -= rounded;
        return p;
      }
    }
    void* p = rt_->allocate(rounded);
    if (!p && !rt_->capturing()) {  // trimming frees memory: it waits for the device
      trim();                       // give cached blocks back to the driver and try once more
      p = rt_->allocate(rounded);
    }
    return p;
  }
  void give(void* p, std::size_t rounded) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace(rounded, p);
    cached_bytes_ += rounded;
  }
  void trim() {
    std::multimap<std::size_t, void*> blocks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks.swap(free_);
      cached_bytes_ = 0;
    }
    if (blocks.empty()) return;
    rt_->synchronize();  // a cached block may still be read by enqueued work
    for (auto& [size, p] : blocks) rt_->release(p);
  }
  std::size_t cached_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_bytes_;
  }

 private:
  std::shared_ptr<Runtime> rt_;  // shared with the device: a buffer may outlive it
  mutable std::mutex mu_;
  std::multimap<std::size_t, void*> free_;
  std::size_t cached_bytes_ = 0;
};

class GpuBuffer final : public Buffer {
 public:
  GpuBuffer(Device& device, std::size_t size, MemCategory category, void* data, std::size_t rounded,
            std::shared_ptr<BlockCache> cache, MemoryTracker& tracker)
      : Buffer(device, size, category),
        data_(data),
        rounded_(rounded),
        cache_(std::move(cache)),
        tracker_(tracker) {}
  ~GpuBuffer() override {
    cache_->give(data_, rounded_);
    tracker_.on_free(category(), size());
  }
  void* data() const { return data_; }

 private:
  void* data_;
  std::size_t rounded_;
  std::shared_ptr<BlockCache> cache_;
  MemoryTracker& tracker_;
};

Elem elem_of(DType t) {
  switch (t) {
    case DType::f16:
      return Elem::kF16;
    case DType::bf16:
      return Elem::kBF16;
    default:
      return Elem::kF32;
  }
}

class GpuDevice final : public Device {
 public:
  explicit GpuDevice(std::unique_ptr<Runtime> rt)
      : rt_(std::move(rt)), cache_(std::make_shared<BlockCache>(rt_)), info_(rt_->info()) {
    info_.extra.push_back({"gemm", rt_->gemm_library()});
    info_.graphs = info_.graphs && rt_->has_graphs();
    trace_teardown(info_.id() + " opened");
  }
  ~GpuDevice() override {
    try {
      rt_->synchronize();
    } catch (...) {
      // a device that failed already said so; closing must not throw
    }
    for (auto& [graph, buffers] : graphs_) {
      try {
        rt_->destroy_graph(static_cast<std::uint64_t>(graph));
      } catch (...) {
      }
    }
    graphs_.clear();
    workspace_.reset();
    try {
      cache_->trim();
    } catch (...) {
    }
    trace_teardown(info_.id() + " closed");
  }

  const DeviceInfo& info() const override { return info_; }

  // Every op of the precision table, f32 and 16-bit (core/op_support.h).
  bool supports(OpKind op, DType dtype) const override { return precision_table_allows(op, dtype); }

  std::shared_ptr<Buffer> allocate(std::size_t bytes, MemCategory category) override {
    const std::size_t rounded = round_block(bytes);
    void* p = cache_->take(rounded);
    if (!p) {
      std::size_t free_bytes = 0, total = 0;
      rt_->memory_info(&free_bytes, &total);
      fail(ErrorKind::kOutOfMemory,
           info_.id() + ": cannot allocate " + mib(static_cast<std::int64_t>(bytes)) + " of " +
               mem_category_name(category) + ": " + mib(static_cast<std::int64_t>(free_bytes)) +
               " free of " + mib(static_cast<std::int64_t>(total)) + " device memory (" +
               mib(memory().total_current) + " in crosstrain's tensors)");
    }
    tracker_.on_alloc(category, bytes);
    return std::make_shared<GpuBuffer>(*this, bytes, category, p, rounded, cache_, tracker_);
  }

  void flush() override {}
  void set_allow_tf32(bool on) override { rt_->set_allow_tf32(on); }
  void synchronize() override {
    ++host_waits_;
    rt_->synchronize();
  }
  Event record_event() override { return Event(this, rt_->record_event()); }
  bool event_done(const Event& e) override { return rt_->event_done(e.serial()); }
  void wait_event(const Event& e) override {
    if (!rt_->event_done(e.serial())) ++host_waits_;
    rt_->wait_event(e.serial());
  }
  std::map<std::string, std::int64_t> counters() override {
    std::map<std::string, std::int64_t> c{{"host_waits", host_waits_}};
    if (info_.graphs) c["graph_replays"] = graph_replays_;
    if (rt_->has_gemm_library()) {
      std::int64_t refused = 0;
      for (const auto& [shape, calls] : rt_->gemm_fallbacks()) refused += calls;
      c["gemm_library_fallbacks"] = refused;
    }
    return c;
  }
  void* native_stream() override { return rt_->native_stream(); }
  void* native_address(const Tensor& t) override { return ptr(t); }

  void begin_capture() override {
    if (!info_.graphs) Device::begin_capture();  // says the device has none
    rt_->begin_capture();
    captured_.clear();
    captured_seen_.clear();
  }
  std::int64_t end_capture() override {
    std::vector<std::shared_ptr<Buffer>> buffers;
    buffers.swap(captured_);
    captured_seen_.clear();
    const auto graph = static_cast<std::int64_t>(rt_->end_capture());
    graphs_[graph] = std::move(buffers);
    return graph;
  }
  void replay_graph(std::int64_t graph) override {
    if (!graphs_.count(graph))
      fail(ErrorKind::kInvalidArgument, info_.id() + ": replay_graph: no graph " +
                                            std::to_string(graph) + " (released, or never made)");
    rt_->launch_graph(static_cast<std::uint64_t>(graph));
    ++graph_replays_;
  }
  void release_graph(std::int64_t graph) override {
    auto it = graphs_.find(graph);
    if (it == graphs_.end()) return;
    rt_->destroy_graph(static_cast<std::uint64_t>(graph));
    graphs_.erase(it);  // its buffers go back to the cache (stream order keeps that safe)
  }

  // --profile: the device time of every public op (timing marks around its scope: the kernels'
  // time plus any wait for the host between them), and which kernels ran for the ops that have
  // more than one path (flash attention, matmul: the library or which own kernel), with calls.
  void set_profiling(bool on) override {
    if (on && !profiling_) {
      paths_.clear();
      op_ms_.clear();
      spans_.clear();
      rt_->timing_reset();
      profile_start_ = std::chrono::steady_clock::now();
    }
    profiling_ = on;
  }
  void op_begin(const char* op) override {
    if (depth_++ > 0 || !profiling_ || rt_->capturing()) return;  // a graph's ops are not timed
    open_ = {op, rt_->timing_mark(), 0};
    timing_ = true;
  }
  void op_end() override {
    if (depth_ == 0 || --depth_ > 0 || !timing_) return;
    timing_ = false;
    open_.end = rt_->timing_mark();
    spans_.push_back(open_);
    if (spans_.size() >= kSpansKept) collect_spans();
  }
  std::string profile_report() override {
    collect_spans();
    const double wall_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - profile_start_)
            .count();
    std::vector<std::pair<std::string, OpMs>> rows(op_ms_.begin(), op_ms_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double total = 0;
    for (const auto& [op, t] : rows) total += t.ms;
    std::string r = info_.id() + " profile: device time per op (timing marks around each op)\n";
    char line[256];
    std::snprintf(line, sizeof line, "  %-28s %9s %12s %10s %7s\n", "op", "calls", "total ms",
                  "mean us", "share");
    r += line;
    for (const auto& [op, t] : rows) {
      std::snprintf(line, sizeof line, "  %-28s %9lld %12.2f %10.1f %6.1f%%\n", op.c_str(),
                    static_cast<long long>(t.calls), t.ms,
                    t.calls ? 1e3 * t.ms / static_cast<double>(t.calls) : 0.0,
                    total > 0 ? 100.0 * t.ms / total : 0.0);
      r += line;
    }
    std::snprintf(line, sizeof line,
                  "  %-28s %9s %12.2f  (%.1f%% of the %.1f ms since profiling began)\n", "total",
                  "", total, wall_ms > 0 ? 100.0 * total / wall_ms : 0.0, wall_ms);
    r += line;
    r += info_.id() + " profile: kernel path per op (calls)\n";
    for (const auto& [path, calls] : paths_) r += "  " + path + "  " + std::to_string(calls) + "\n";
    const auto fallbacks = rt_->gemm_fallbacks();
    if (!fallbacks.empty()) r += "  GEMMs the library refused, run by the own kernel (calls):\n";
    for (const auto& [shape, calls] : fallbacks)
      r += "    " + shape + "  " + std::to_string(calls) + "\n";
    return r;
  }

 protected:
  Event download_async_kernel(void* host, const Tensor& src, std::size_t bytes) override {
    rt_->download_async(host, ptr(src), bytes);
    return record_event();
  }
  void upload_kernel(const Tensor& dst, const void* host, std::size_t bytes) override {
    rt_->upload(ptr(dst), host, bytes);
  }
  void download_kernel(void* host, const Tensor& src, std::size_t bytes) override {
    ++host_waits_;
    rt_->download(host, ptr(src), bytes);
  }

  // -- elementwise ---------------------------------------------------------------------------
  void fill_kernel(const Tensor& t, float value) override {
    // The element's bits as the CPU writes them (integers saturate), repeated.
    std::uint32_t pattern = 0;
    write_from_f32(&pattern, t.dtype, 0, value);
    const int width = static_cast<int>(dtype_size(t.dtype));
    gpu::fill_pattern(cx(), ptr(t), t.numel(), width, pattern);
  }
  void copy_kernel(const Tensor& dst, const Tensor& src) override {
    const std::int64_t n = dst.numel();
    if (dst.dtype != src.dtype) {
      gpu::convert(cx(), ptr(dst), elem_of(dst.dtype), ptr(src), elem_of(src.dtype), n);
      return;
    }
    const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(dst.dtype);
    char* d = static_cast<char*>(ptr(dst));
    const char* s = static_cast<const char*>(ptr(src));
    if (d == s || bytes == 0) return;
    if (d < s + bytes && s < d + bytes) {  // overlapping: a memmove, through scratch
      void* tmp = scratch(bytes);
      rt_->copy(tmp, s, bytes);
      rt_->copy(d, tmp, bytes);
      return;
    }
    rt_->copy(d, s, bytes);
  }
  void add_kernel(const Tensor& out, const Tensor& a, const Tensor& b) override {
    gpu::add(cx(), f(out), f(a), ptr(b), elem_of(b.dtype), out.numel());
  }
  void accumulate_kernel(const Tensor& dst, const Tensor& src) override {
    gpu::accumulate(cx(), f(dst), f(src), dst.numel());
  }
  void scale_kernel(const Tensor& t, float s) override { gpu::scale(cx(), f(t), s, t.numel()); }

  // -- transformer ops -------------------------------------------------------------------------
  void embedding_forward_kernel(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                const Tensor& wpe) override {
    const std::int64_t C = wte.shape[-1];
    const std::int64_t T = tokens.shape[-1];
    const std::int64_t B = tokens.numel() / std::max<std::int64_t>(T, 1);
    gpu::embedding_forward(cx(), f(out), i32(tokens), ptr(wte), wpe.defined() ? ptr(wpe) : nullptr,
                           elem_of(wte.dtype), B, T, C);
  }
  void embedding_backward_kernel(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                 const Tensor& tokens) override {
    const std::int64_t C = dwte.shape[-1];
    const std::int64_t T = tokens.shape[-1];
    const std::int64_t B = tokens.numel() / std::max<std::int64_t>(T, 1);
    void* ws = scratch(gpu::embedding_backward_workspace(cx(), B, T, C));
    gpu::embedding_backward(cx(), f(dwte), dwpe.defined() ? f(dwpe) : nullptr, f(dout), i32(tokens),
                            B, T, C, ws);
  }
  void layernorm_forward_kernel(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                const Tensor& x, const Tensor& w, const Tensor& b,
                                float eps) override {
    const std::int64_t C = x.shape[-1];
    gpu::layernorm_forward(cx(), ptr(out), elem_of(out.dtype), f(mean), f(rstd), f(x), f(w), f(b),
                           x.numel() / C, C, eps);
  }
  void residual_layernorm_forward_kernel(const Tensor& residual, const Tensor& out,
                                         const Tensor& mean, const Tensor& rstd, const Tensor& x,
                                         const Tensor& r, const Tensor& w, const Tensor& b,
                                         float eps) override {
    const std::int64_t C = x.shape[-1];
    if (C == 0) return;
    gpu::residual_layernorm_forward(cx(), f(residual), ptr(out), elem_of(out.dtype), f(mean),
                                    f(rstd), f(x), ptr(r), f(w), f(b), x.numel() / C, C, eps);
  }
  void layernorm_backward_kernel(const Tensor& dx, const Tensor& dw, const Tensor& db,
                                 const Tensor& dout, const Tensor& x, const Tensor& w,
                                 const Tensor& mean, const Tensor& rstd) override {
    const std::int64_t C = x.shape[-1];
    const std::int64_t N = x.numel() / C;
    void* ws = scratch(layernorm_backward_workspace(N, C));
    gpu::layernorm_backward(cx(), f(dx), f(dw), f(db), ptr(dout), elem_of(dout.dtype), f(x), f(w),
                            f(mean), f(rstd), N, C, ws);
  }
  void rmsnorm_forward_kernel(const Tensor& out, const Tensor& rstd, const Tensor& x,
                              const Tensor& w, float eps) override {
    const std::int64_t C = x.shape[-1];
    if (C == 0) return;
    gpu::rmsnorm_forward(cx(), ptr(out), elem_of(out.dtype), f(rstd), f(x), f(w), x.numel() / C, C,
                         eps);
  }
  void residual_rmsnorm_forward_kernel(const Tensor& residual, const Tensor& out,
                                       const Tensor& rstd, const Tensor& x, const Tensor& r,
                                       const Tensor& w, float eps) override {
    const std::int64_t C = x.shape[-1];
    if (C == 0) return;
    gpu::residual_rmsnorm_forward(cx(), f(residual), ptr(out), elem_of(out.dtype), f(rstd), f(x),
                                  ptr(r), f(w), x.numel() / C, C, eps);
  }
  void rmsnorm_backward_kernel(const Tensor& dx, const Tensor& dw, const Tensor& dout,
                               const Tensor& x, const Tensor& w, const Tensor& rstd) override {
    const std::int64_t C = x.shape[-1];
    if (C == 0) return;
    const std::int64_t N = x.numel() / C;
    void* ws = scratch(rmsnorm_backward_workspace(N, C));
    gpu::rmsnorm_backward(cx(), f(dx), f(dw), ptr(dout), elem_of(dout.dtype), f(x), f(w), f(rstd),
                          N, C, ws);
  }
  void matmul_kernel(const Tensor& c, const Tensor& a, const Tensor& b, const MatmulDims& d,
                     bool trans_a, bool trans_b, float alpha, float beta,
                     const Tensor* bias) override {
    GemmArgs g = gemm_args(c, a, b, d, trans_a, trans_b, bias);
    g.alpha = alpha;
    g.beta = beta;
    run_gemm(g);
  }
  // The GELU epilogues of the own kernels, or cuBLASLt's (GELU_AUX_BIAS, DGELU).
  void matmul_bias_gelu_kernel(const Tensor& out, const Tensor& pre, const Tensor& a,
                               const Tensor& b, const MatmulDims& d, bool trans_a, bool trans_b,
                               const Tensor& bias) override {
    GemmArgs g = gemm_args(pre, a, b, d, trans_a, trans_b, &bias);
    g.gelu_out = ptr(out);
    run_gemm(g);
  }
  void matmul_gelu_backward_kernel(const Tensor& dpre, const Tensor& a, const Tensor& b,
                                   const MatmulDims& d, bool trans_a, bool trans_b,
                                   const Tensor& pre) override {
    GemmArgs g = gemm_args(dpre, a, b, d, trans_a, trans_b, nullptr);
    g.gelu_pre = ptr(pre);
    run_gemm(g);
  }
  void bias_backward_kernel(const Tensor& dbias, const Tensor& dout) override {
    const std::int64_t N = dbias.numel();
    const std::int64_t M = dout.numel() / std::max<std::int64_t>(N, 1);
    void* ws = scratch(bias_backward_workspace(M, N));
    gpu::bias_backward(cx(), f(dbias), ptr(dout), elem_of(dout.dtype), M, N, ws);
  }
  // qkv [B,T,C3], C3 = C + 2 n_kv_head (C / n_head): its last dim, as op_checks.cpp checked.
  void attention_forward_kernel(const Tensor& out, const Tensor& att, const Tensor& qkv, int n_head,
                                int n_kv_head) override {
    const std::int64_t C = out.shape[-1];
    const std::int64_t T = qkv.shape[-2], C3 = qkv.shape[-1];
    const std::int64_t B = qkv.numel() / (T * C3);
    gpu::attention_forward(cx(), ptr(out), ptr(att), ptr(qkv), elem_of(qkv.dtype), B, T, C, n_head,
                           n_kv_head);
  }
  void attention_backward_kernel(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                 const Tensor& att, int n_head, int n_kv_head) override {
    const std::int64_t C = dout.shape[-1];
    const std::int64_t T = qkv.shape[-2], C3 = qkv.shape[-1];
    const std::int64_t B = qkv.numel() / (T * C3);
    void* ws = scratch(attention_backward_workspace(B, T, C, n_head));
    gpu::attention_backward(cx(), ptr(dqkv), ptr(dout), ptr(qkv), ptr(att), elem_of(qkv.dtype), B,
                            T, C, n_head, n_kv_head, ws);
  }
  void flash_attention_forward_kernel(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                      int n_head, int n_kv_head) override {
    // out and lse: the last Tq of qkv's T positions (core/device.h)
    const std::int64_t B = out.shape[0], T = qkv.shape[1], Tq = out.shape[1], C = out.shape[2];
    check_head_size("flash_attention_forward", C / n_head);
    const Elem e = elem_of(qkv.dtype);
    if (flash_path("flash_attention_forward", e, C / n_head, {ptr(qkv)}))
      gpu::flash_attention_tc_forward(cx(), ptr(out), f(lse), ptr(qkv), e, B, T, Tq, C, n_head,
                                      n_kv_head);
    else
      gpu::flash_attention_forward(cx(), ptr(out), f(lse), ptr(qkv), e, B, T, Tq, C, n_head,
                                   n_kv_head);
  }
  void flash_attention_backward_kernel(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                       const Tensor& out, const Tensor& lse, int n_head,
                                       int n_kv_head) override {
    const std::int64_t B = dout.shape[0], T = dout.shape[1], C = dout.shape[2];
    check_head_size("flash_attention_backward", C / n_head);
    void* ws = scratch(flash_attention_backward_workspace(B, T, n_head));
    const Elem e = elem_of(qkv.dtype);
    if (flash_path("flash_attention_backward", e, C / n_head, {ptr(qkv), ptr(dout)}))
      gpu::flash_attention_tc_backward(cx(), ptr(dqkv), ptr(dout), ptr(qkv), ptr(out), f(lse), e, B,
                                       T, C, n_head, n_kv_head, ws);
    else
      gpu::flash_attention_backward(cx(), ptr(dqkv), ptr(dout), ptr(qkv), ptr(out), f(lse), e, B, T,
                                    C, n_head, n_kv_head, ws);
  }
  // Whether the matrix-tile kernels take this call (else the general ones); with --profile,
  // counts the path by name.
  bool flash_path(const char* op, Elem e, std::int64_t hs,
                  std::initializer_list<const void*> staged) {
    const std::string no = gpu::flash_attention_tc_refusal(cx(), e, hs, staged);
    if (profiling_)
      ++paths_[std::string(op) + ": " +
               (no.empty() ? "matrix tiles (flash_attention_tc.cu)"
                           : "general kernels (flash_attention.cu): " + no)];
    return no.empty();
  }
  static void check_head_size(const char* op, std::int64_t hs) {
    if (hs > gpu::kFlashMaxHeadSize)
      fail(ErrorKind::kUnsupported, std::string(op) + ": head size " + std::to_string(hs) +
                                        " exceeds the kernel's limit of " +
                                        std::to_string(gpu::kFlashMaxHeadSize));
  }
  void gelu_forward_kernel(const Tensor& out, const Tensor& x) override {
    gpu::gelu_forward(cx(), ptr(out), ptr(x), elem_of(x.dtype), x.numel());
  }
  void gelu_backward_kernel(const Tensor& dx, const Tensor& x, const Tensor& dout) override {
    gpu::gelu_backward(cx(), ptr(dx), ptr(x), ptr(dout), elem_of(x.dtype), x.numel());
  }
  void rope_kernel(const Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin,
                   std::int64_t head_dim, std::int64_t rot_heads, bool inverse) override {
    gpu::rope(cx(), ptr(out), ptr(x), elem_of(x.dtype), f(cos), f(sin), x.shape[0], x.shape[1],
              x.shape[2], head_dim, rot_heads, inverse);
  }
  void swiglu_forward_kernel(const Tensor& out, const Tensor& gu) override {
    const std::int64_t F = out.shape[-1];
    if (F == 0) return;
    gpu::swiglu_forward(cx(), ptr(out), ptr(gu), elem_of(gu.dtype), out.numel() / F, F);
  }
  void swiglu_backward_kernel(const Tensor& dgu, const Tensor& gu, const Tensor& dout) override {
    const std::int64_t F = dout.shape[-1];
    if (F == 0) return;
    gpu::swiglu_backward(cx(), ptr(dgu), ptr(gu), ptr(dout), elem_of(gu.dtype), dout.numel() / F,
                         F);
  }
  void dropout_kernel(const Tensor& out, const Tensor& x, const DropoutMask& mask) override {
    gpu::dropout(cx(), ptr(out), ptr(x), elem_of(x.dtype), x.numel(),
                 gpu::DropoutBits{mask.seed, mask.stream, mask.threshold, mask.scale});
  }
  void crossentropy_forward_kernel(const Tensor& losses, const Tensor& logits,
                                   const Tensor& targets, std::int64_t valid) override {
    const std::int64_t Vp = logits.shape[-1];
    gpu::crossentropy_forward(cx(), f(losses), ptr(logits), elem_of(logits.dtype), i32(targets),
                              logits.numel() / Vp, valid, Vp);
  }
  void crossentropy_backward_kernel(const Tensor& dlogits, const Tensor& logits,
                                    const Tensor& targets, std::int64_t valid,
                                    float dloss) override {
    const std::int64_t Vp = logits.shape[-1];
    gpu::crossentropy_backward(cx(), ptr(dlogits), ptr(logits), elem_of(logits.dtype), i32(targets),
                               logits.numel() / Vp, valid, Vp, dloss);
  }
  void crossentropy_forward_backward_kernel(const Tensor& losses, const Tensor& logits,
                                            const Tensor& targets, std::int64_t valid,
                                            float dloss) override {
    const std::int64_t Vp = logits.shape[-1];
    gpu::crossentropy_forward_backward(cx(), f(losses), ptr(logits), elem_of(logits.dtype),
                                       i32(targets), logits.numel() / Vp, valid, Vp, dloss);
  }

  // -- reductions and optimizers ---------------------------------------------------------------
  void sum_kernel(const Tensor& out, const Tensor& x, float s) override {
    void* ws = scratch(reduce_workspace(x.numel()));
    gpu::sum(cx(), f(out), f(x), x.numel(), s, ws);
  }
  void norm_kernel(const Tensor& out, const Tensor& x) override {
    void* ws = scratch(reduce_workspace(x.numel()));
    gpu::norm(cx(), f(out), f(x), x.numel(), ws);
  }
  void check_finite_kernel(const Tensor& flag, const Tensor& x) override {
    gpu::check_finite(cx(), i32(flag), f(x), x.numel());
  }
  void unscale_check_kernel(const Tensor& x, const Tensor& flag, float inv_scale) override {
    gpu::unscale_check(cx(), f(x), i32(flag), inv_scale, x.numel());
  }
  void adamw_kernel(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                    const Tensor& grad_norm, const AdamWHyper& hp, const Tensor& param16) override {
    gpu::adamw(cx(), f(param), f(grad), f(m), f(v), norm_ptr(grad_norm, hp.max_grad_norm),
               param.numel(), adam_args(hp), param16.defined() ? ptr(param16) : nullptr,
               elem_of(param16.dtype));
  }
  void adamw_groups_kernel(const Tensor& param, const Tensor& grad, const Tensor& m,
                           const Tensor& v, const Tensor& grad_norm, const Tensor& schedule,
                           const AdamWGroups& groups, const AdamWHyper& hp,
                           const Tensor& param16) override {
    static_assert(AdamWGroups::kMaxRanges == gpu::kAdamMaxRanges);
    gpu::AdamRange ranges[gpu::kAdamMaxRanges] = {};
    for (int i = 0; i < groups.count; ++i)
      ranges[i] = {groups.ranges[i].begin, groups.ranges[i].len, groups.ranges[i].decay};
    gpu::adamw_groups(cx(), f(param), f(grad), f(m), f(v), norm_ptr(grad_norm, hp.max_grad_norm),
                      f(schedule), ranges, groups.count, adam_args(hp),
                      param16.defined() ? ptr(param16) : nullptr, elem_of(param16.dtype));
  }
  void sgd_kernel(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                  const Tensor& grad_norm, const SgdHyper& hp) override {
    SgdArgs a{hp.lr,       hp.momentum, hp.dampening, hp.weight_decay, hp.max_grad_norm,
              hp.nesterov, hp.step};
    gpu::sgd(cx(), f(param), f(grad), hp.momentum != 0.0f ? f(momentum_buf) : nullptr,
             norm_ptr(grad_norm, hp.max_grad_norm), param.numel(), a);
  }
  void lion_kernel(const Tensor& param, const Tensor& grad, const Tensor& m,
                   const Tensor& grad_norm, const LionHyper& hp) override {
    LionArgs a{hp.lr, hp.beta1, hp.beta2, hp.weight_decay, hp.max_grad_norm};
    gpu::lion(cx(), f(param), f(grad), f(m), norm_ptr(grad_norm, hp.max_grad_norm), param.numel(),
              a);
  }
  void adamw_8bit_kernel(const Tensor& param, const Tensor& grad, const Tensor& m_q,
                         const Tensor& v_q, const Tensor& m_absmax, const Tensor& v_absmax,
                         const Tensor& qmap_signed, const Tensor& qmap_unsigned,
                         const Tensor& grad_norm, const AdamWHyper& hp) override {
    gpu::adamw_8bit(cx(), f(param), f(grad), u8(m_q), u8(v_q), f(m_absmax), f(v_absmax),
                    f(qmap_signed), f(qmap_unsigned), norm_ptr(grad_norm, hp.max_grad_norm),
                    param.numel(), adam_args(hp));
  }
  void adafactor_kernel(const Tensor& param, const Tensor& grad, const Tensor& row,
                        const Tensor& col, const Tensor& v, const Tensor& exp_avg,
                        const Tensor& grad_norm, const AdafactorHyper& hp) override {
    const bool factored = param.shape.ndim >= 2;
    const std::int64_t C = factored ? param.shape[-1] : param.numel();
    const std::int64_t R = factored ? param.numel() / C : 0;
    AdafactorArgs a{
        hp.lr,          hp.eps1,         hp.eps2,          hp.clip_threshold, hp.decay_rate,
        hp.beta1,       hp.weight_decay, hp.max_grad_norm, hp.relative_step,  hp.scale_parameter,
        hp.warmup_init, hp.step};
    void* ws = scratch(adafactor_workspace(R, C));
    gpu::adafactor(cx(), f(param), f(grad), factored ? f(row) : nullptr,
                   factored ? f(col) : nullptr, factored ? nullptr : f(v),
                   hp.beta1 > 0.0f ? f(exp_avg) : nullptr, norm_ptr(grad_norm, hp.max_grad_norm), R,
                   C, a, ws);
  }

 private:
  Ctx cx() { return rt_->ctx(); }
  // The device address of a tensor's first element; while capturing, its buffer joins the graph.
  void* ptr(const Tensor& t) {
    if (rt_->capturing()) keep_for_graph(t.buffer);
    return static_cast<char*>(static_cast<GpuBuffer*>(t.buffer.get())->data()) + t.offset;
  }
  void keep_for_graph(const std::shared_ptr<Buffer>& b) {
    if (captured_seen_.insert(b.get()).second) captured_.push_back(b);
  }
  float* f(const Tensor& t) { return static_cast<float*>(ptr(t)); }
  std::int32_t* i32(const Tensor& t) { return static_cast<std::int32_t*>(ptr(t)); }
  std::uint8_t* u8(const Tensor& t) { return static_cast<std::uint8_t*>(ptr(t)); }
  const float* norm_ptr(const Tensor& grad_norm, float max_grad_norm) {
    return max_grad_norm > 0.0f ? f(grad_norm) : nullptr;
  }
  static AdamArgs adam_args(const AdamWHyper& hp) {
    return AdamArgs{hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, hp.max_grad_norm, hp.step};
  }
  GemmArgs gemm_args(const Tensor& c, const Tensor& a, const Tensor& b, const MatmulDims& d,
                     bool trans_a, bool trans_b, const Tensor* bias) {
    GemmArgs g;
    g.c = ptr(c);
    g.a = ptr(a);
    g.b = ptr(b);
    g.bias = bias ? f(*bias) : nullptr;
    g.c_elem = elem_of(c.dtype);
    g.ab_elem = elem_of(a.dtype);
    g.batch = d.batch;
    g.M = d.M;
    g.N = d.N;
    g.K = d.K;
    g.stride_a = d.a_batched ? d.M * d.K : 0;
    g.stride_b = d.b_batched ? d.K * d.N : 0;
    g.stride_c = d.M * d.N;
    g.trans_a = trans_a;
    g.trans_b = trans_b;
    return g;
  }
  // The library or the own kernel (the runtime decides), and under --profile which one ran. The
  // own kernels' split-k takes its partial products in the scratch memory.
  void run_gemm(GemmArgs g) {
    g.scratch = [](void* self, std::size_t bytes) {
      return static_cast<GpuDevice*>(self)->scratch(bytes);
    };
    g.scratch_owner = this;
    if (!profiling_) return rt_->gemm(g);
    std::string path;
    rt_->gemm(g, &path);
    const char* op = g.gelu_out   ? "matmul_bias_gelu: "
                     : g.gelu_pre ? "matmul_gelu_backward: "
                                  : "matmul: ";
    ++paths_[op + path];
  }

  // Scratch memory for one op at a time (256-byte aligned). Growing it drops the old buffer:
  // its block goes back to the cache, and stream order keeps the ops that used it safe.
  void* scratch(std::size_t bytes) {
    if (bytes == 0) bytes = 1;
    if (!workspace_ || workspace_->size() < bytes)
      workspace_ = allocate(bytes + bytes / 4, MemCategory::kWorkspace);
    if (rt_->capturing()) keep_for_graph(workspace_);
    return static_cast<GpuBuffer*>(workspace_.get())->data();
  }

  std::shared_ptr<Runtime> rt_;
  std::shared_ptr<BlockCache> cache_;
  DeviceInfo info_;
  std::shared_ptr<Buffer> workspace_;
  bool profiling_ = false;
  std::map<std::string, std::int64_t> paths_;  // --profile: kernel path -> calls
  // --profile's op times: spans_ (marks of finished ops) are read into op_ms_ every kSpansKept
  // ops (a wait for the stream) and at the report.
  struct Span {
    const char* op;
    std::size_t begin, end;
  };
  struct OpMs {
    std::int64_t calls = 0;
    double ms = 0;
  };
  static constexpr std::size_t kSpansKept = 4096;
  void collect_spans() {
    for (const Span& sp : spans_) {
      OpMs& t = op_ms_[sp.op];
      ++t.calls;
      t.ms += rt_->timing_ms(sp.begin, sp.end);
    }
    spans_.clear();
    if (!timing_) rt_->timing_reset();  // no op open: every mark has been read
  }
  std::vector<Span> spans_;
  std::map<std::string, OpMs> op_ms_;
  Span open_{};
  int depth_ = 0;                // nesting of op scopes
  std::int64_t host_waits_ = 0;  // counters(): blocking downloads, synchronizes and waits
  std::int64_t graph_replays_ = 0;
  // The capture in progress: the buffers its ops use (once each); the made graphs' buffers.
  std::vector<std::shared_ptr<Buffer>> captured_;
  std::unordered_set<const Buffer*> captured_seen_;
  std::map<std::int64_t, std::vector<std::shared_ptr<Buffer>>> graphs_;
  bool timing_ = false;  // the outermost open op has a begin mark
  std::chrono::steady_clock::time_point profile_start_{};
};

}  // namespace

std::unique_ptr<Device> make_gpu_device(std::unique_ptr<Runtime> rt) {
  return std::make_unique<GpuDevice>(std::move(rt));
}

}  // namespace ct::gpu
