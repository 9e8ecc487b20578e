// The CPU devices: host buffers with accounting, and each op's kernel dispatched to the fast
// (OpenBLAS + OpenMP) or the reference kernel table (core/op_checks.cpp checks the arguments).
// Ops run eagerly on the calling thread, so flush() and synchronize() have nothing to do.
#include <cblas.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <new>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/openblas_core.h"
#include "backends/cpu/system_info.h"
#include "core/error.h"
#include "core/op_support.h"

namespace ct {
namespace cpu {
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kHugePage = size_t{2} << 20;

// Host memory for a tensor. Buffers of 2 MiB or more are aligned to 2 MiB and marked for
// transparent huge pages (Linux's default THP mode is "madvise": nothing is huge unless asked):
// the GEMMs and streaming passes over the activations then take far fewer TLB misses. Freed
// with std::free like the small ones.
void* allocate_host(size_t rounded) {
  if (rounded < kHugePage) return std::aligned_alloc(kAlign, rounded);
  size_t bytes = (rounded + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, bytes);
#if defined(MADV_HUGEPAGE)
  if (p) madvise(p, bytes, MADV_HUGEPAGE);  // advice only: failure leaves normal pages
#endif
  return p;
}

class CpuBuffer final : public Buffer {
 public:
  CpuBuffer(Device& device, size_t size, MemCategory category, void* data, MemoryTracker& tracker)
      : Buffer(device, size, category), data_(data), tracker_(tracker) {}
  ~CpuBuffer() override {
    std::free(data_);
    tracker_.on_free(category(), size());
  }
  void* data() const { return data_; }

 private:
  void* data_;
  MemoryTracker& tracker_;
};

std::string mib(int64_t bytes) {
  return std::to_string(bytes / (1024 * 1024)) + " MiB (" + std::to_string(bytes) + " bytes)";
}

DeviceInfo make_info(bool reference) {
  DeviceInfo i;
  i.backend = "cpu";
  i.index = reference ? 1 : 0;
  i.type = DeviceType::kCpu;
  i.native_stack = true;  // the CPU's own kernels (OpenBLAS, oneDNN, the fast/ kernels)
  i.name =
      reference ? "CPU reference (single-threaded, fp64 accumulation)" : "CPU (OpenBLAS + OpenMP)";
  i.driver = reference ? "built in" : std::string(openblas_get_config());
  i.memory_bytes = total_memory_bytes();
  i.memory_budget_bytes = available_memory_bytes();
  i.max_allocation_bytes = i.memory_bytes;
  i.max_buffer_range_bytes = i.memory_bytes;
  i.dtypes = {DType::f32, DType::f16, DType::bf16, DType::i32};
  i.extra = {{"processor", cpu_model_name()},
             {"threads", std::to_string(reference ? 1 : cpu_threads())},
             {"isa", cpu_isa_flags()},
             {"blas", reference ? std::string("none (plain loops)") : fast::f32_matmul_library()},
             {"16-bit tensors", "widened to f32, rounded to nearest even on store"},
             {"bf16 matmul", reference ? std::string("widened to f32")
                                       : std::string(fast::bf16_matmul_library())}};
  // The fast device: which level of its kernels runs (fast_kernels() chose it, and settled
  // OpenBLAS's core, before this is built), and which kernels OpenBLAS runs.
  if (!reference) {
    i.extra.push_back({"cpu kernels", describe(active_isa())});
    const OpenBlasCore& blas = openblas_core();
    i.extra.push_back({"openblas core", blas.core + " (" + blas.selected + ")"});
    if (!blas.warning.empty()) i.extra.push_back({"warning", blas.warning});
  }
  return i;
}

class CpuDevice final : public Device, private Workspace {
 public:
  explicit CpuDevice(bool reference)
      : k_(reference ? reference_kernels() : fast_kernels()), info_(make_info(reference)) {}

  const DeviceInfo& info() const override { return info_; }

  // f32 everywhere; f16/bf16 where core/device.h's mixed-precision table allows them. 16-bit
  // tensors are widened to f32 in workspace, computed in f32 and rounded back when stored.
  bool supports(OpKind op, DType dtype) const override { return precision_table_allows(op, dtype); }

  std::shared_ptr<Buffer> allocate(size_t bytes, MemCategory category) override {
    size_t rounded = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    int64_t limit = info_.memory_bytes;
    if (static_cast<int64_t>(rounded) > free_memory_fast_bytes()) {
      int64_t avail = available_memory_bytes();
      if (static_cast<int64_t>(rounded) > avail || static_cast<int64_t>(rounded) > limit)
        fail(ErrorKind::kOutOfMemory, "cpu: cannot allocate " + mib(static_cast<int64_t>(bytes)) +
                                          " of " + mem_category_name(category) + ": " + mib(avail) +
                                          " available of " + mib(limit) + " host memory");
    }
    void* p = allocate_host(rounded);
    if (!p)
      fail(ErrorKind::kOutOfMemory, "cpu: aligned_alloc of " + mib(static_cast<int64_t>(bytes)) +
                                        " failed; " + mib(available_memory_bytes()) +
                                        " available of " + mib(limit));
    tracker_.on_alloc(category, bytes);
    return std::make_shared<CpuBuffer>(*this, bytes, category, p, tracker_);
  }

  void flush() override {}
  void synchronize() override {}
  // Eager: every op has finished when its call returns, so events are complete at once and
  // download_async copies before it returns. native_stream() stays nullptr.
  Event record_event() override { return Event(this, 0); }
  bool event_done(const Event&) override { return true; }
  void wait_event(const Event&) override {}
  Event download_async_kernel(void* host, const Tensor& src, size_t bytes) override {
    std::memcpy(host, raw(src), bytes);
    return Event(this, 0);
  }

 protected:
  // Kernels only: core/op_checks.cpp has checked the arguments (core/device.h, "Argument
  // checks"). What stays here reads data: token and target indices, host memory to this device,
  // are range-checked before a kernel indexes with them.
  void upload_kernel(const Tensor& dst, const void* host, size_t bytes) override {
    std::memcpy(raw(dst), host, bytes);
  }
  void download_kernel(void* host, const Tensor& src, size_t bytes) override {
    std::memcpy(host, raw(src), bytes);
  }

  // -- elementwise ----------------------------------------------------------------------------
  void fill_kernel(const Tensor& t, float value) override {
    k_.fill(raw(t), t.dtype, t.numel(), value);
  }
  void copy_kernel(const Tensor& dst, const Tensor& src) override {
    k_.copy(raw(dst), dst.dtype, raw(src), src.dtype, dst.numel());
  }
  void add_kernel(const Tensor& out, const Tensor& a, const Tensor& b) override {
    k_.add(f(out), f(a), in(b, 0), out.numel());
  }
  void accumulate_kernel(const Tensor& dst, const Tensor& src) override {
    k_.accumulate(f(dst), f(src), dst.numel());
  }
  void scale_kernel(const Tensor& t, float s) override { k_.scale(f(t), s, t.numel()); }

  // -- transformer ops -------------------------------------------------------------------------
  void embedding_forward_kernel(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                const Tensor& wpe) override {
    int64_t B = out.shape[0], T = out.shape[1], C = out.shape[2];
    check_indices("embedding_forward", "tokens", tokens, wte.shape[0]);
    if (wte.dtype == DType::f32) {
      k_.embedding_forward(f(out), idx(tokens), f(wte), wpe.defined() ? f(wpe) : nullptr, B, T, C);
      return;
    }
    // 16-bit tables (a frozen base held in 16 bits): each row widened exactly, one fp32 add --
    // the bits of the f32 kernel on the widened tables, without widening the whole table.
    const auto* te = static_cast<const uint16_t*>(raw(wte));
    const auto* pe = wpe.defined() ? static_cast<const uint16_t*>(raw(wpe)) : nullptr;
    const bool bf = wte.dtype == DType::bf16;
    float* o = f(out);
    const int32_t* tok = idx(tokens);
    auto widen = [bf](uint16_t v) { return bf ? bf16_to_f32(v) : f16_to_f32(v); };
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const uint16_t* wr = te + static_cast<int64_t>(tok[bt]) * C;
      if (pe == nullptr) {
        for (int64_t c = 0; c < C; ++c) o[bt * C + c] = widen(wr[c]);
        continue;
      }
      const uint16_t* pr = pe + (bt % T) * C;
      for (int64_t c = 0; c < C; ++c) o[bt * C + c] = widen(wr[c]) + widen(pr[c]);
    }
  }
  void embedding_backward_kernel(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                 const Tensor& tokens) override {
    int64_t B = dout.shape[0], T = dout.shape[1], C = dout.shape[2];
    check_indices("embedding_backward", "tokens", tokens, dwte.shape[0]);
    k_.embedding_backward(f(dwte), dwpe.defined() ? f(dwpe) : nullptr, f(dout), idx(tokens), B, T,
                          C);
  }

  void layernorm_forward_kernel(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                const Tensor& x, const Tensor& w, const Tensor& b,
                                float eps) override {
    int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
    float* o = out_(out, 0, false);
    k_.layernorm_forward(o, f(mean), f(rstd), f(x), f(w), f(b), N, C, eps);
    store(out, o);
  }
  void residual_layernorm_forward_kernel(const Tensor& residual, const Tensor& out,
                                         const Tensor& mean, const Tensor& rstd, const Tensor& x,
                                         const Tensor& r, const Tensor& w, const Tensor& b,
                                         float eps) override {
    int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
    float* o = out_(out, 1, false);
    k_.residual_layernorm_forward(f(residual), o, f(mean), f(rstd), f(x), in(r, 0), f(w), f(b), N,
                                  C, eps);
    store(out, o);
  }
  void layernorm_backward_kernel(const Tensor& dx, const Tensor& dw, const Tensor& db,
                                 const Tensor& dout, const Tensor& x, const Tensor& w,
                                 const Tensor& mean, const Tensor& rstd) override {
    int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
    k_.layernorm_backward(*this, f(dx), f(dw), f(db), in(dout, 0), f(x), f(w), f(mean), f(rstd), N,
                          C);
  }

  void rmsnorm_forward_kernel(const Tensor& out, const Tensor& rstd, const Tensor& x,
                              const Tensor& w, float eps) override {
    int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
    float* o = out_(out, 0, false);
    k_.rmsnorm_forward(o, f(rstd), f(x), f(w), N, C, eps);
    store(out, o);
  }
  void residual_rmsnorm_forward_kernel(const Tensor& residual, const Tensor& out,
                                       const Tensor& rstd, const Tensor& x, const Tensor& r,
                                       const Tensor& w, float eps) override {
    int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
    float* o = out_(out, 1, false);
    k_.residual_rmsnorm_forward(f(residual), o, f(rstd), f(x), in(r, 0), f(w), N, C, eps);
    store(out, o);
  }
  void rmsnorm_backward_kernel(const Tensor& dx, const Tensor& dw, const Tensor& dout,
                               const Tensor& x, const Tensor& w, const Tensor& rstd) override {
    int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
    k_.rmsnorm_backward(*this, f(dx), f(dw), in(dout, 0), f(x), f(w), f(rstd), N, C);
  }

  void matmul_kernel(const Tensor& c, const Tensor& a, const Tensor& b, const MatmulDims& d,
                     bool trans_a, bool trans_b, float alpha, float beta,
                     const Tensor* bias) override {
    MatmulArgs m;
    m.M = d.M;
    m.N = d.N;
    m.K = d.K;
    m.batch = d.batch;
    m.a_batched = d.a_batched;
    m.b_batched = d.b_batched;
    if (bias) m.bias = f(*bias);
    m.c_dtype = c.dtype;
    m.trans_a = trans_a;
    m.trans_b = trans_b;
    m.alpha = alpha;
    m.beta = beta;
    if (native_bf16_matmul(c, a, b, m)) return;
    m.c = out_(c, 0, beta != 0.0f);
    m.a = in(a, 1);
    m.b = in(b, 2);
    k_.matmul(*this, m);
    store(c, m.c);
  }
  void bias_backward_kernel(const Tensor& dbias, const Tensor& dout) override {
    int64_t N = dout.shape[-1];
    k_.bias_backward(f(dbias), in(dout, 0), N ? dout.numel() / N : 0, N);
  }

  void attention_forward_kernel(const Tensor& out, const Tensor& att, const Tensor& qkv, int n_head,
                                int n_kv_head) override {
    const int64_t B = out.shape[0], T = out.shape[1], C = out.shape[2], W = qkv.shape[2];
    // 16-bit: one batch element at a time, so the f32 staging holds [NH,T,T] rather than the
    // whole att (gpt2-medium at 4 x 1024: 64 MiB instead of 256 MiB per slot).
    const int64_t nb = out.dtype == DType::f32 ? B : 1;
    for (int64_t b0 = 0; b0 < B; b0 += nb) {
      const int64_t oe = b0 * T * C, ae = b0 * n_head * T * T, qe = b0 * T * W;
      float* o = out_range(out, 0, oe, nb * T * C);
      float* a = out_range(att, 1, ae, nb * n_head * T * T);
      k_.attention_forward(*this, o, a, in_range(qkv, 2, qe, nb * T * W), nb, T, C, n_head,
                           n_kv_head);
      store_range(out, o, oe, nb * T * C);
      store_range(att, a, ae, nb * n_head * T * T);
    }
  }
  void attention_backward_kernel(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                 const Tensor& att, int n_head, int n_kv_head) override {
    const int64_t B = dout.shape[0], T = dout.shape[1], C = dout.shape[2], W = qkv.shape[2];
    const int64_t nb = dqkv.dtype == DType::f32 ? B : 1;  // as in attention_forward
    for (int64_t b0 = 0; b0 < B; b0 += nb) {
      const int64_t oe = b0 * T * C, ae = b0 * n_head * T * T, qe = b0 * T * W;
      float* d = out_range(dqkv, 0, qe, nb * T * W);
      k_.attention_backward(*this, d, in_range(dout, 1, oe, nb * T * C),
                            in_range(qkv, 2, qe, nb * T * W),
                            in_range(att, 3, ae, nb * n_head * T * T), nb, T, C, n_head, n_kv_head);
      store_range(dqkv, d, qe, nb * T * W);
    }
  }

  void flash_attention_forward_kernel(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                      int n_head, int n_kv_head) override {
    const int64_t B = out.shape[0], T = out.shape[1], C = out.shape[2];
    float* o = out_(out, 0, false);
    k_.flash_attention_forward(*this, o, f(lse), in(qkv, 1), B, T, C, n_head, n_kv_head);
    store(out, o);
  }
  void flash_attention_backward_kernel(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                       const Tensor& out, const Tensor& lse, int n_head,
                                       int n_kv_head) override {
    const int64_t B = dout.shape[0], T = dout.shape[1], C = dout.shape[2];
    float* d = out_(dqkv, 0, false);
    k_.flash_attention_backward(*this, d, in(dout, 1), in(qkv, 2), in(out, 3), f(lse), B, T, C,
                                n_head, n_kv_head);
    store(dqkv, d);
  }

  void gelu_forward_kernel(const Tensor& out, const Tensor& x) override {
    float* o = out_(out, 0, false);
    k_.gelu_forward(o, in(x, 1), x.numel());
    store(out, o);
  }
  void gelu_backward_kernel(const Tensor& dx, const Tensor& x, const Tensor& dout) override {
    float* d = out_(dx, 0, false);
    k_.gelu_backward(d, in(x, 1), in(dout, 2), x.numel());
    store(dx, d);
  }
  void swiglu_forward_kernel(const Tensor& out, const Tensor& gu) override {
    const int64_t F = out.shape[-1], N = F ? out.numel() / F : 0;
    float* o = out_(out, 0, false);
    k_.swiglu_forward(o, in(gu, 1), N, F);
    store(out, o);
  }
  void swiglu_backward_kernel(const Tensor& dgu, const Tensor& gu, const Tensor& dout) override {
    const int64_t F = dout.shape[-1], N = F ? dout.numel() / F : 0;
    const float* g = in(gu, 1);  // staged first: dgu may be gu
    float* d = out_(dgu, 0, false);
    k_.swiglu_backward(d, g, in(dout, 2), N, F);
    store(dgu, d);
  }
  void rope_kernel(const Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin,
                   int64_t head_dim, int64_t rot_heads, bool inverse) override {
    const int64_t B = x.shape[0], T = x.shape[1], W = x.shape[2];
    const float* xin = in(x, 1);  // staged first: out may be x
    float* o = out.dtype == DType::f32 ? f(out) : out_(out, 0, false);
    k_.rope(o, xin, f(cos), f(sin), B, T, W, head_dim, rot_heads, inverse);
    store(out, o);
  }
  void dropout_kernel(const Tensor& out, const Tensor& x, const DropoutMask& mask) override {
    float* o = out_(out, 0, false);
    k_.dropout(o, in(x, 1), x.numel(), mask);
    store(out, o);
  }

  void crossentropy_forward_kernel(const Tensor& losses, const Tensor& logits,
                                   const Tensor& targets, int64_t valid) override {
    const int64_t Vp = logits.shape[-1], N = targets.numel();
    check_indices("crossentropy_forward", "targets", targets, valid);
    // 16-bit logits: widened stage_rows(Vp) rows at a time (GPT-2's [B*T, 50304] would need
    // 0.8 GB of f32 staging at 4 x 1024 in one piece).
    const int64_t rows = logits.dtype == DType::f32 ? N : stage_rows(Vp);
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
      const int64_t nr = std::min(rows, N - r0);
      k_.crossentropy_forward(f(losses) + r0, in_range(logits, 0, r0 * Vp, nr * Vp),
                              idx(targets) + r0, nr, valid, Vp);
    }
  }
  void crossentropy_backward_kernel(const Tensor& dlogits, const Tensor& logits,
                                    const Tensor& targets, int64_t valid, float dloss) override {
    const int64_t Vp = logits.shape[-1], N = targets.numel();
    check_indices("crossentropy_backward", "targets", targets, valid);
    // In place with 16 bits: one staging copy serves as both (the kernel allows aliasing).
    // 16-bit: in row chunks, as in crossentropy_forward.
    const bool same = raw(dlogits) == raw(logits);
    const int64_t rows = logits.dtype == DType::f32 ? N : stage_rows(Vp);
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
      const int64_t nr = std::min(rows, N - r0), e0 = r0 * Vp;
      const float* l = in_range(logits, 0, e0, nr * Vp);
      float* d = same ? const_cast<float*>(l) : out_range(dlogits, 1, e0, nr * Vp);
      k_.crossentropy_backward(d, l, idx(targets) + r0, nr, valid, Vp, dloss);
      store_range(dlogits, d, e0, nr * Vp);
    }
  }
  void crossentropy_forward_backward_kernel(const Tensor& losses, const Tensor& logits,
                                            const Tensor& targets, int64_t valid,
                                            float dloss) override {
    const int64_t Vp = logits.shape[-1], N = targets.numel();
    check_indices("crossentropy_forward_backward", "targets", targets, valid);
    // 16-bit: one staging copy per row chunk, widened once and rounded back once.
    const int64_t rows = logits.dtype == DType::f32 ? N : stage_rows(Vp);
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
      const int64_t nr = std::min(rows, N - r0), e0 = r0 * Vp;
      float* l = in_range(logits, 0, e0, nr * Vp);
      k_.crossentropy_forward_backward(f(losses) + r0, l, idx(targets) + r0, nr, valid, Vp, dloss);
      store_range(logits, l, e0, nr * Vp);
    }
  }

  // -- reductions and optimizer ----------------------------------------------------------------
  void sum_kernel(const Tensor& out, const Tensor& x, float s) override {
    k_.sum(f(out), f(x), x.numel(), s);
  }
  void norm_kernel(const Tensor& out, const Tensor& x) override {
    k_.norm(f(out), f(x), x.numel());
  }
  void check_finite_kernel(const Tensor& flag, const Tensor& x) override {
    k_.check_finite(idx(flag), f(x), x.numel());
  }
  void unscale_check_kernel(const Tensor& x, const Tensor& flag, float inv_scale) override {
    k_.unscale_check(f(x), idx(flag), inv_scale, x.numel());
  }
  void adamw_kernel(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                    const Tensor& grad_norm, const AdamWHyper& hp) override {
    k_.adamw(f(param), f(grad), f(m), f(v), clip_norm(grad_norm, hp.max_grad_norm), param.numel(),
             hp);
  }

  // -- optimizers (backends/cpu/*/optimizers.cpp) ---------------------------------------------
  void sgd_kernel(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                  const Tensor& grad_norm, const SgdHyper& hp) override {
    float* buf = hp.momentum != 0.0f ? f(momentum_buf) : nullptr;
    k_.sgd(f(param), f(grad), buf, clip_norm(grad_norm, hp.max_grad_norm), param.numel(), hp);
  }
  void lion_kernel(const Tensor& param, const Tensor& grad, const Tensor& m,
                   const Tensor& grad_norm, const LionHyper& hp) override {
    k_.lion(f(param), f(grad), f(m), clip_norm(grad_norm, hp.max_grad_norm), param.numel(), hp);
  }
  void adamw_8bit_kernel(const Tensor& param, const Tensor& grad, const Tensor& m_q,
                         const Tensor& v_q, const Tensor& m_absmax, const Tensor& v_absmax,
                         const Tensor& qmap_signed, const Tensor& qmap_unsigned,
                         const Tensor& grad_norm, const AdamWHyper& hp) override {
    k_.adamw_8bit(f(param), f(grad), static_cast<uint8_t*>(raw(m_q)),
                  static_cast<uint8_t*>(raw(v_q)), f(m_absmax), f(v_absmax), f(qmap_signed),
                  f(qmap_unsigned), clip_norm(grad_norm, hp.max_grad_norm), param.numel(), hp);
  }
  void adafactor_kernel(const Tensor& param, const Tensor& grad, const Tensor& row,
                        const Tensor& col, const Tensor& v, const Tensor& exp_avg,
                        const Tensor& grad_norm, const AdafactorHyper& hp) override {
    const bool factored = param.ndim() >= 2;
    const int64_t C = factored ? param.shape[-1] : param.numel(), R = param.numel() / C;
    k_.adafactor(f(param), f(grad), factored ? f(row) : nullptr, factored ? f(col) : nullptr,
                 factored ? nullptr : f(v), hp.beta1 > 0.0f ? f(exp_avg) : nullptr,
                 clip_norm(grad_norm, hp.max_grad_norm), R, C, hp);
  }

 private:
  // Workspace: one cached kWorkspace buffer, grown on demand.
  void* get(size_t bytes) override {
    if (!ws_ || ws_->size() < bytes) {
      ws_.reset();
      ws_ = allocate(bytes + bytes / 4, MemCategory::kWorkspace);
    }
    return static_cast<CpuBuffer*>(ws_.get())->data();
  }

  static bool is_h(DType d) { return d == DType::f16 || d == DType::bf16; }

  // bf16 operands straight to the kernel table's native bf16 matmul, where there is one and it
  // takes the call (one product: batch 1, or a batch of row-major a against a shared b).
  bool native_bf16_matmul(const Tensor& c, const Tensor& a, const Tensor& b, MatmulArgs m) {
    if (!k_.matmul_bf16 || a.dtype != DType::bf16 || m.K == 0 || m.M == 0 || m.N == 0) return false;
    if (m.batch != 1 && !(m.a_batched && !m.trans_a && !m.b_batched)) return false;
    MatmulBf16Args x;
    x.c = raw(c);
    x.c_bf16 = c.dtype == DType::bf16;
    x.a = static_cast<const uint16_t*>(raw(a));
    x.b = static_cast<const uint16_t*>(raw(b));
    x.bias = m.bias;
    x.M = m.batch * m.M;
    x.N = m.N;
    x.K = m.K;
    x.trans_a = m.trans_a;
    x.trans_b = m.trans_b;
    x.alpha = m.alpha;
    x.beta = m.beta;
    return k_.matmul_bf16(x);
  }

  // -- 16-bit staging: f32 copies of 16-bit tensors in workspace slots ----------------------
  float* stage(int slot, size_t n) {
    auto& buf = stage_[static_cast<size_t>(slot)];
    size_t bytes = std::max<size_t>(n, 1) * sizeof(float);
    if (!buf || buf->size() < bytes) {
      buf.reset();
      buf = allocate(bytes, MemCategory::kWorkspace);
    }
    return static_cast<float*>(static_cast<CpuBuffer*>(buf.get())->data());
  }
  // t as f32 input: its own memory, or a widened copy in staging slot `slot`.
  float* in(const Tensor& t, int slot) {
    if (t.dtype == DType::f32) return f(t);
    float* s = stage(slot, static_cast<size_t>(t.numel()));
    k_.copy(s, DType::f32, raw(t), t.dtype, t.numel());
    return s;
  }
  // Where a kernel writes output t: its own memory, or a staging slot (widened from t first
  // when the kernel reads it too); store() rounds a staged result back into t.
  float* out_(const Tensor& t, int slot, bool read) {
    if (t.dtype == DType::f32) return f(t);
    return read ? in(t, slot) : stage(slot, static_cast<size_t>(t.numel()));
  }
  void store(const Tensor& t, const float* staged) {
    if (t.dtype != DType::f32) k_.copy(raw(t), t.dtype, staged, DType::f32, t.numel());
  }
  // The same over elements [e0, e0 + n) of t, for ops staged piece by piece.
  float* in_range(const Tensor& t, int slot, int64_t e0, int64_t n) {
    if (t.dtype == DType::f32) return f(t) + e0;
    float* s = stage(slot, static_cast<size_t>(n));
    k_.copy(s, DType::f32, static_cast<char*>(raw(t)) + e0 * dtype_size(t.dtype), t.dtype, n);
    return s;
  }
  float* out_range(const Tensor& t, int slot, int64_t e0, int64_t n) {
    return t.dtype == DType::f32 ? f(t) + e0 : stage(slot, static_cast<size_t>(n));
  }
  void store_range(const Tensor& t, const float* staged, int64_t e0, int64_t n) {
    if (t.dtype != DType::f32)
      k_.copy(static_cast<char*>(raw(t)) + e0 * dtype_size(t.dtype), t.dtype, staged, DType::f32,
              n);
  }
  // Rows of `row_elems` per staged piece: about kStageElems elements, at least one row.
  static int64_t stage_rows(int64_t row_elems) {
    constexpr int64_t kStageElems = int64_t{1} << 24;  // 64 MiB of f32
    return std::max<int64_t>(1, kStageElems / std::max<int64_t>(row_elems, 1));
  }
  // grad_norm's pointer when the optimizer clips, else null.
  static const float* clip_norm(const Tensor& grad_norm, float max_grad_norm) {
    return max_grad_norm > 0.0f ? f(grad_norm) : nullptr;
  }
  // Index tensors are read on the host here (they are host memory) so a bad token is an error
  // rather than an out-of-bounds read.
  void check_indices(const char* op, const char* name, const Tensor& t, int64_t limit) const {
    const int32_t* p = static_cast<const int32_t*>(raw(t));
    int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i)
      if (p[i] < 0 || p[i] >= limit)
        fail(ErrorKind::kInvalidArgument,
             std::string(op) + ": " + name + "[" + std::to_string(i) + "] = " +
                 std::to_string(p[i]) + " is out of range [0, " + std::to_string(limit) + ")");
  }
  static void* raw(const Tensor& t) {
    return static_cast<char*>(static_cast<CpuBuffer*>(t.buffer.get())->data()) + t.offset;
  }
  static float* f(const Tensor& t) { return static_cast<float*>(raw(t)); }
  static int32_t* idx(const Tensor& t) { return static_cast<int32_t*>(raw(t)); }

  const Kernels& k_;
  DeviceInfo info_;
  std::shared_ptr<Buffer> ws_;
  std::array<std::shared_ptr<Buffer>, 4> stage_;
};

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  std::string unavailable_reason() const override { return ""; }
  std::vector<DeviceInfo> devices() const override { return {make_info(false), make_info(true)}; }
  std::unique_ptr<Device> open(int index) override {
    if (index != 0 && index != 1)
      fail(ErrorKind::kInvalidArgument,
           "cpu: device index " + std::to_string(index) +
               " out of range; cpu has 2 devices:\n  cpu:0  CPU (OpenBLAS + OpenMP)\n"
               "  cpu:1  CPU reference (single-threaded, fp64 accumulation)");
    return make_cpu_device(index == 1);
  }
};

}  // namespace
}  // namespace cpu

std::shared_ptr<Backend> make_cpu_backend() {
  return std::make_shared<cpu::CpuBackend>();
}

std::unique_ptr<Device> make_cpu_device(bool reference) {
  return std::make_unique<cpu::CpuDevice>(reference);
}

}  // namespace ct
