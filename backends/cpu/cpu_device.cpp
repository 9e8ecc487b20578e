// The CPU devices: host buffers with accounting, argument checks for every op, and dispatch to
// the fast (OpenBLAS + OpenMP) or the reference kernel table. Ops run eagerly on the calling
// thread, so flush() and synchronize() have nothing to do.
#include <cblas.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <new>
#include <tuple>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/openblas_core.h"
#include "backends/cpu/system_info.h"
#include "core/error.h"

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
  CpuBuffer(Device& device, size_t size, MemCategory category, void* data,
            MemoryTracker& tracker)
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
  i.name = reference ? "CPU reference (single-threaded, fp64 accumulation)"
                     : "CPU (OpenBLAS + OpenMP)";
  i.driver = reference ? "built in" : std::string(openblas_get_config());
  i.memory_bytes = total_memory_bytes();
  i.memory_budget_bytes = available_memory_bytes();
  i.max_allocation_bytes = i.memory_bytes;
  i.max_buffer_range_bytes = i.memory_bytes;
  i.dtypes = {DType::f32, DType::f16, DType::bf16, DType::i32};
  i.extra = {{"processor", cpu_model_name()},
             {"threads", std::to_string(reference ? 1 : cpu_threads())},
             {"isa", cpu_isa_flags()},
             {"blas", reference ? std::string("none (plain loops)")
                                : fast::f32_matmul_library()},
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
      : k_(reference ? reference_kernels() : fast_kernels()),
        info_(make_info(reference)) {}

  const DeviceInfo& info() const override { return info_; }

  // f32 everywhere; f16/bf16 where core/device.h's mixed-precision table allows them. 16-bit
  // tensors are widened to f32 in workspace, computed in f32 and rounded back when stored.
  bool supports(OpKind op, DType dtype) const override {
    if (op == OpKind::kFill || op == OpKind::kCopy || dtype == DType::f32) return true;
    if (op == OpKind::kAdamW8bit && dtype == DType::u8) return true;
    if (!is_h(dtype)) return false;
    switch (op) {
      case OpKind::kAdd: case OpKind::kMatmul: case OpKind::kLayerNorm: case OpKind::kBiasGrad:
      case OpKind::kAttention: case OpKind::kGelu: case OpKind::kCrossEntropy:
        return true;
      default:
        return false;
    }
  }

  std::shared_ptr<Buffer> allocate(size_t bytes, MemCategory category) override {
    size_t rounded = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    int64_t limit = info_.memory_bytes;
    if (static_cast<int64_t>(rounded) > free_memory_fast_bytes()) {
      int64_t avail = available_memory_bytes();
      if (static_cast<int64_t>(rounded) > avail || static_cast<int64_t>(rounded) > limit)
        fail(ErrorKind::kOutOfMemory,
             "cpu: cannot allocate " + mib(static_cast<int64_t>(bytes)) + " of " +
                 mem_category_name(category) + ": " + mib(avail) + " available of " +
                 mib(limit) + " host memory");
    }
    void* p = allocate_host(rounded);
    if (!p)
      fail(ErrorKind::kOutOfMemory, "cpu: aligned_alloc of " + mib(static_cast<int64_t>(bytes)) +
                                        " failed; " + mib(available_memory_bytes()) +
                                        " available of " + mib(limit));
    tracker_.on_alloc(category, bytes);
    return std::make_shared<CpuBuffer>(*this, bytes, category, p, tracker_);
  }

  void upload(const Tensor& dst, const void* host, size_t bytes) override {
    check_host_copy("upload", dst, bytes);
    if (bytes) std::memcpy(raw(dst), host, bytes);
  }
  void download(void* host, const Tensor& src, size_t bytes) override {
    check_host_copy("download", src, bytes);
    if (bytes) std::memcpy(host, raw(src), bytes);
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

  // -- elementwise ----------------------------------------------------------------------------
  void fill(const Tensor& t, float value) override {
    mine("fill", "t", t);
    k_.fill(raw(t), t.dtype, t.numel(), value);
  }
  void copy(const Tensor& dst, const Tensor& src) override {
    mine("copy", "dst", dst);
    mine("copy", "src", src);
    CT_REQUIRE(dst.numel() == src.numel(), "copy: dst " + dst.describe() + " and src " +
                                               src.describe() + " differ in element count");
    // Any dtype pair converts through f32; only a same-dtype copy may overlap its source.
    CT_REQUIRE(dst.dtype == src.dtype || !overlaps(dst, src),
               "copy: a converting copy must not overlap its source" + shapes({&dst, &src}));
    if (dst.nbytes() && raw(dst) == raw(src) && dst.dtype == src.dtype) return;
    k_.copy(raw(dst), dst.dtype, raw(src), src.dtype, dst.numel());
  }
  void add(const Tensor& out, const Tensor& a, const Tensor& b) override {
    f32("add", "out", out);
    f32("add", "a", a);
    flt("add", "b", b);
    same_numel("add", out, a);
    same_numel("add", out, b);
    k_.add(f(out), f(a), in(b, 0), out.numel());
  }
  void accumulate(const Tensor& dst, const Tensor& src) override {
    f32("accumulate", "dst", dst);
    f32("accumulate", "src", src);
    same_numel("accumulate", dst, src);
    k_.accumulate(f(dst), f(src), dst.numel());
  }
  void scale(const Tensor& t, float s) override {
    f32("scale", "t", t);
    k_.scale(f(t), s, t.numel());
  }

  // -- transformer ops -------------------------------------------------------------------------
  void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                         const Tensor& wpe) override {
    const char* op = "embedding_forward";
    f32(op, "out", out);
    i32(op, "tokens", tokens);
    f32(op, "wte", wte);
    f32(op, "wpe", wpe);
    CT_REQUIRE(out.ndim() == 3 && tokens.ndim() == 2 && wte.ndim() == 2 && wpe.ndim() == 2,
               std::string(op) + ": expected out [B,T,C], tokens [B,T], wte [V,C], wpe [maxT,C]" +
                   shapes({&out, &tokens, &wte, &wpe}));
    int64_t B = out.shape[0], T = out.shape[1], C = out.shape[2];
    CT_REQUIRE(tokens.shape[0] == B && tokens.shape[1] == T && wte.shape[1] == C &&
                   wpe.shape[1] == C && wpe.shape[0] >= T,
               std::string(op) + ": shape mismatch" + shapes({&out, &tokens, &wte, &wpe}));
    check_indices(op, "tokens", tokens, wte.shape[0]);
    k_.embedding_forward(f(out), idx(tokens), f(wte), f(wpe), B, T, C);
  }
  void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens) override {
    const char* op = "embedding_backward";
    f32(op, "dwte", dwte);
    f32(op, "dwpe", dwpe);
    f32(op, "dout", dout);
    i32(op, "tokens", tokens);
    CT_REQUIRE(dout.ndim() == 3 && tokens.ndim() == 2 && dwte.ndim() == 2 && dwpe.ndim() == 2,
               std::string(op) + ": expected dout [B,T,C], tokens [B,T], dwte [V,C], dwpe [maxT,C]" +
                   shapes({&dwte, &dwpe, &dout, &tokens}));
    int64_t B = dout.shape[0], T = dout.shape[1], C = dout.shape[2];
    CT_REQUIRE(tokens.shape[0] == B && tokens.shape[1] == T && dwte.shape[1] == C &&
                   dwpe.shape[1] == C && dwpe.shape[0] >= T,
               std::string(op) + ": shape mismatch" + shapes({&dwte, &dwpe, &dout, &tokens}));
    check_indices(op, "tokens", tokens, dwte.shape[0]);
    k_.embedding_backward(f(dwte), f(dwpe), f(dout), idx(tokens), B, T, C);
  }

  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         const Tensor& x, const Tensor& w, const Tensor& b, float eps) override {
    const char* op = "layernorm_forward";
    for (auto [n, t] : {std::pair{"mean", &mean}, {"rstd", &rstd}, {"x", &x}, {"w", &w},
                        {"b", &b}})
      f32(op, n, *t);
    flt(op, "out", out);
    CT_REQUIRE(x.ndim() >= 1, std::string(op) + ": x must have a last dimension");
    int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
    CT_REQUIRE(out.shape == x.shape && w.numel() == C && b.numel() == C && mean.numel() == N &&
                   rstd.numel() == N,
               std::string(op) + ": expected x, out [N,C], w, b [C], mean, rstd [N]" +
                   shapes({&out, &mean, &rstd, &x, &w, &b}));
    float* o = out_(out, 0, false);
    k_.layernorm_forward(o, f(mean), f(rstd), f(x), f(w), f(b), N, C, eps);
    store(out, o);
  }
  void layernorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db,
                          const Tensor& dout, const Tensor& x, const Tensor& w,
                          const Tensor& mean, const Tensor& rstd) override {
    const char* op = "layernorm_backward";
    for (auto [n, t] : {std::pair{"dx", &dx}, {"dw", &dw}, {"db", &db}, {"x", &x}, {"w", &w},
                        {"mean", &mean}, {"rstd", &rstd}})
      f32(op, n, *t);
    flt(op, "dout", dout);
    CT_REQUIRE(x.ndim() >= 1, std::string(op) + ": x must have a last dimension");
    int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
    CT_REQUIRE(dx.shape == x.shape && dout.shape == x.shape && w.numel() == C &&
                   dw.numel() == C && db.numel() == C && mean.numel() == N && rstd.numel() == N,
               std::string(op) + ": expected dx, dout, x [N,C], dw, db, w [C], mean, rstd [N]" +
                   shapes({&dx, &dw, &db, &dout, &x, &w, &mean, &rstd}));
    k_.layernorm_backward(*this, f(dx), f(dw), f(db), in(dout, 0), f(x), f(w), f(mean), f(rstd),
                          N, C);
  }

  void matmul(const Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
              float alpha, float beta, const Tensor* bias) override {
    const char* op = "matmul";
    flt(op, "c", c);
    flt(op, "a", a);
    flt(op, "b", b);
    std::string desc = shapes({&c, &a, &b}) + (trans_a ? " trans_a" : "") +
                       (trans_b ? " trans_b" : "");
    CT_REQUIRE(c.ndim() >= 2 && a.ndim() >= 2 && b.ndim() >= 2,
               std::string(op) + ": operands must be at least 2-D" + desc);
    MatmulArgs m;
    m.M = c.shape[-2];
    m.N = c.shape[-1];
    m.batch = c.numel() / std::max<int64_t>(m.M * m.N, 1);
    int64_t am = trans_a ? a.shape[-1] : a.shape[-2], ak = trans_a ? a.shape[-2] : a.shape[-1];
    int64_t bk = trans_b ? b.shape[-1] : b.shape[-2], bn = trans_b ? b.shape[-2] : b.shape[-1];
    m.K = ak;
    CT_REQUIRE(am == m.M && bn == m.N && ak == bk,
               std::string(op) + ": inner or outer dimensions do not match" + desc);
    CT_REQUIRE(a.dtype == b.dtype && (c.dtype == DType::f32 || c.dtype == a.dtype),
               std::string(op) + ": a and b must share a dtype, and c be f32 or that dtype" + desc);
    CT_REQUIRE(!overlaps(c, a) && !overlaps(c, b),
               std::string(op) + ": c must not overlap a or b" + desc);
    m.a_batched = batch_matches(op, a, c, desc);
    m.b_batched = batch_matches(op, b, c, desc);
    if (bias) {
      f32(op, "bias", *bias);
      CT_REQUIRE(bias->numel() == m.N,
                 std::string(op) + ": bias must be [N]" + desc + " bias " + bias->describe());
      m.bias = f(*bias);
    }
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
  void bias_backward(const Tensor& dbias, const Tensor& dout) override {
    f32("bias_backward", "dbias", dbias);
    flt("bias_backward", "dout", dout);
    CT_REQUIRE(dout.ndim() >= 1 && dbias.numel() == dout.shape[-1],
               "bias_backward: expected dout [M,N], dbias [N]" + shapes({&dbias, &dout}));
    int64_t N = dout.shape[-1];
    k_.bias_backward(f(dbias), in(dout, 0), N ? dout.numel() / N : 0, N);
  }

  void attention_forward(const Tensor& out, const Tensor& att, const Tensor& qkv,
                         int n_head) override {
    const char* op = "attention_forward";
    flt(op, "out", out);
    flt(op, "att", att);
    flt(op, "qkv", qkv);
    same_dtype(op, {&out, &att, &qkv});
    auto [B, T, C] = attention_dims(op, out, att, qkv, n_head);
    // 16-bit: one batch element at a time, so the f32 staging holds [NH,T,T] rather than the
    // whole att (gpt2-medium at 4 x 1024: 64 MiB instead of 256 MiB per slot).
    const int64_t nb = out.dtype == DType::f32 ? B : 1;
    for (int64_t b0 = 0; b0 < B; b0 += nb) {
      const int64_t oe = b0 * T * C, ae = b0 * n_head * T * T, qe = b0 * T * 3 * C;
      float* o = out_range(out, 0, oe, nb * T * C);
      float* a = out_range(att, 1, ae, nb * n_head * T * T);
      k_.attention_forward(*this, o, a, in_range(qkv, 2, qe, nb * T * 3 * C), nb, T, C, n_head);
      store_range(out, o, oe, nb * T * C);
      store_range(att, a, ae, nb * n_head * T * T);
    }
  }
  void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                          const Tensor& att, int n_head) override {
    const char* op = "attention_backward";
    flt(op, "dqkv", dqkv);
    flt(op, "dout", dout);
    flt(op, "qkv", qkv);
    flt(op, "att", att);
    same_dtype(op, {&dqkv, &dout, &qkv, &att});
    CT_REQUIRE(dqkv.shape == qkv.shape, std::string(op) + ": dqkv must have the shape of qkv" +
                                            shapes({&dqkv, &qkv}));
    auto [B, T, C] = attention_dims(op, dout, att, qkv, n_head);
    const int64_t nb = dqkv.dtype == DType::f32 ? B : 1;  // as in attention_forward
    for (int64_t b0 = 0; b0 < B; b0 += nb) {
      const int64_t oe = b0 * T * C, ae = b0 * n_head * T * T, qe = b0 * T * 3 * C;
      float* d = out_range(dqkv, 0, qe, nb * T * 3 * C);
      k_.attention_backward(*this, d, in_range(dout, 1, oe, nb * T * C),
                            in_range(qkv, 2, qe, nb * T * 3 * C),
                            in_range(att, 3, ae, nb * n_head * T * T), nb, T, C, n_head);
      store_range(dqkv, d, qe, nb * T * 3 * C);
    }
  }

  void gelu_forward(const Tensor& out, const Tensor& x) override {
    flt("gelu_forward", "out", out);
    flt("gelu_forward", "x", x);
    same_dtype("gelu_forward", {&out, &x});
    same_numel("gelu_forward", out, x);
    float* o = out_(out, 0, false);
    k_.gelu_forward(o, in(x, 1), x.numel());
    store(out, o);
  }
  void gelu_backward(const Tensor& dx, const Tensor& x, const Tensor& dout) override {
    flt("gelu_backward", "dx", dx);
    flt("gelu_backward", "x", x);
    flt("gelu_backward", "dout", dout);
    same_dtype("gelu_backward", {&dx, &x, &dout});
    same_numel("gelu_backward", dx, x);
    same_numel("gelu_backward", dx, dout);
    float* d = out_(dx, 0, false);
    k_.gelu_backward(d, in(x, 1), in(dout, 2), x.numel());
    store(dx, d);
  }

  void crossentropy_forward(const Tensor& losses, const Tensor& logits,
                            const Tensor& targets) override {
    const char* op = "crossentropy_forward";
    f32(op, "losses", losses);
    flt(op, "logits", logits);
    i32(op, "targets", targets);
    auto [N, V] = crossentropy_dims(op, logits, targets);
    CT_REQUIRE(losses.numel() == N, std::string(op) + ": losses must be [N]" +
                                        shapes({&losses, &logits, &targets}));
    // 16-bit logits: widened stage_rows(V) rows at a time (GPT-2's [B*T, 50257] would need
    // 0.8 GB of f32 staging at 4 x 1024 in one piece).
    const int64_t rows = logits.dtype == DType::f32 ? N : stage_rows(V);
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
      const int64_t nr = std::min(rows, N - r0);
      k_.crossentropy_forward(f(losses) + r0, in_range(logits, 0, r0 * V, nr * V),
                              idx(targets) + r0, nr, V);
    }
  }
  void crossentropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                             float dloss) override {
    const char* op = "crossentropy_backward";
    flt(op, "dlogits", dlogits);
    flt(op, "logits", logits);
    i32(op, "targets", targets);
    same_dtype(op, {&dlogits, &logits});
    auto [N, V] = crossentropy_dims(op, logits, targets);
    CT_REQUIRE(dlogits.shape == logits.shape, std::string(op) + ": dlogits must match logits" +
                                                  shapes({&dlogits, &logits}));
    CT_REQUIRE(raw(dlogits) == raw(logits) || !overlaps(dlogits, logits),
               std::string(op) + ": dlogits may alias logits exactly but not partially");
    // In place with 16 bits: one staging copy serves as both (the kernel allows aliasing).
    // 16-bit: in row chunks, as in crossentropy_forward.
    const bool same = raw(dlogits) == raw(logits);
    const int64_t rows = logits.dtype == DType::f32 ? N : stage_rows(V);
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
      const int64_t nr = std::min(rows, N - r0), e0 = r0 * V;
      const float* l = in_range(logits, 0, e0, nr * V);
      float* d = same ? const_cast<float*>(l) : out_range(dlogits, 1, e0, nr * V);
      k_.crossentropy_backward(d, l, idx(targets) + r0, nr, V, dloss);
      store_range(dlogits, d, e0, nr * V);
    }
  }

  // -- reductions and optimizer ----------------------------------------------------------------
  void sum(const Tensor& out, const Tensor& x, float s) override {
    f32("sum", "out", out);
    f32("sum", "x", x);
    CT_REQUIRE(out.numel() == 1, "sum: out must be [1]" + shapes({&out, &x}));
    k_.sum(f(out), f(x), x.numel(), s);
  }
  void norm(const Tensor& out, const Tensor& x) override {
    f32("norm", "out", out);
    f32("norm", "x", x);
    CT_REQUIRE(out.numel() == 1, "norm: out must be [1]" + shapes({&out, &x}));
    k_.norm(f(out), f(x), x.numel());
  }
  void check_finite(const Tensor& flag, const Tensor& x) override {
    i32("check_finite", "flag", flag);
    f32("check_finite", "x", x);
    CT_REQUIRE(flag.numel() == 1, "check_finite: flag must be [1] i32" + shapes({&flag, &x}));
    k_.check_finite(idx(flag), f(x), x.numel());
  }
  void unscale_check(const Tensor& x, const Tensor& flag, float inv_scale) override {
    f32("unscale_check", "x", x);
    i32("unscale_check", "flag", flag);
    CT_REQUIRE(flag.numel() == 1, "unscale_check: flag must be [1] i32" + shapes({&flag, &x}));
    k_.unscale_check(f(x), idx(flag), inv_scale, x.numel());
  }
  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
             const Tensor& grad_norm, const AdamWHyper& hp) override {
    const char* op = "adamw";
    f32(op, "param", param);
    f32(op, "grad", grad);
    f32(op, "m", m);
    f32(op, "v", v);
    same_numel(op, param, grad);
    same_numel(op, param, m);
    same_numel(op, param, v);
    const float* gn = nullptr;
    if (hp.max_grad_norm > 0.0f) {
      f32(op, "grad_norm", grad_norm);
      CT_REQUIRE(grad_norm.numel() == 1, "adamw: grad_norm must be [1] when clipping");
      gn = f(grad_norm);
    }
    CT_REQUIRE(hp.step >= 1, "adamw: step must be >= 1 (got " + std::to_string(hp.step) + ")");
    k_.adamw(f(param), f(grad), f(m), f(v), gn, param.numel(), hp);
  }

  // -- optimizers (backends/cpu/*/optimizers.cpp) ---------------------------------------------
  void sgd(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
           const Tensor& grad_norm, const SgdHyper& hp) override {
    const char* op = "sgd";
    f32(op, "param", param);
    f32(op, "grad", grad);
    same_numel(op, param, grad);
    float* buf = nullptr;
    if (hp.momentum != 0.0f) {
      f32(op, "momentum_buf", momentum_buf);
      same_numel(op, param, momentum_buf);
      buf = f(momentum_buf);
    }
    CT_REQUIRE(!hp.nesterov || (hp.momentum > 0.0f && hp.dampening == 0.0f),
               "sgd: nesterov needs momentum > 0 and dampening 0");
    CT_REQUIRE(hp.step >= 1, "sgd: step must be >= 1");
    k_.sgd(f(param), f(grad), buf, clip_norm(op, grad_norm, hp.max_grad_norm), param.numel(), hp);
  }
  void lion(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& grad_norm,
            const LionHyper& hp) override {
    const char* op = "lion";
    f32(op, "param", param);
    f32(op, "grad", grad);
    f32(op, "m", m);
    same_numel(op, param, grad);
    same_numel(op, param, m);
    k_.lion(f(param), f(grad), f(m), clip_norm(op, grad_norm, hp.max_grad_norm), param.numel(), hp);
  }
  void adamw_8bit(const Tensor& param, const Tensor& grad, const Tensor& m_q, const Tensor& v_q,
                  const Tensor& m_absmax, const Tensor& v_absmax, const Tensor& qmap_signed,
                  const Tensor& qmap_unsigned, const Tensor& grad_norm,
                  const AdamWHyper& hp) override {
    const char* op = "adamw_8bit";
    for (auto [n, t] : {std::pair{"param", &param}, {"grad", &grad}, {"m_absmax", &m_absmax},
                        {"v_absmax", &v_absmax}, {"qmap_signed", &qmap_signed},
                        {"qmap_unsigned", &qmap_unsigned}})
      f32(op, n, *t);
    u8(op, "m_q", m_q);
    u8(op, "v_q", v_q);
    same_numel(op, param, grad);
    same_numel(op, param, m_q);
    same_numel(op, param, v_q);
    const int64_t nb = quant_blocks(param.numel());
    CT_REQUIRE(m_absmax.numel() == nb && v_absmax.numel() == nb &&
                   qmap_signed.numel() == 256 && qmap_unsigned.numel() == 256,
               std::string(op) + ": expected m_absmax, v_absmax [" + std::to_string(nb) +
                   "] and qmaps [256]" + shapes({&m_absmax, &v_absmax, &qmap_signed, &qmap_unsigned}));
    CT_REQUIRE(hp.step >= 1, "adamw_8bit: step must be >= 1");
    k_.adamw_8bit(f(param), f(grad), static_cast<uint8_t*>(raw(m_q)),
                  static_cast<uint8_t*>(raw(v_q)), f(m_absmax), f(v_absmax), f(qmap_signed),
                  f(qmap_unsigned), clip_norm(op, grad_norm, hp.max_grad_norm), param.numel(), hp);
  }
  void adafactor(const Tensor& param, const Tensor& grad, const Tensor& row, const Tensor& col,
                 const Tensor& v, const Tensor& exp_avg, const Tensor& grad_norm,
                 const AdafactorHyper& hp) override {
    const char* op = "adafactor";
    f32(op, "param", param);
    f32(op, "grad", grad);
    same_numel(op, param, grad);
    CT_REQUIRE(param.numel() > 0, "adafactor: param is empty");
    CT_REQUIRE(hp.step >= 1, "adafactor: step must be >= 1");
    const bool factored = param.ndim() >= 2;
    const int64_t C = factored ? param.shape[-1] : param.numel(), R = param.numel() / C;
    if (factored) {
      f32(op, "row", row);
      f32(op, "col", col);
      CT_REQUIRE(row.numel() == R && col.numel() == C && !v.defined(),
                 "adafactor: a rank >= 2 param [R,C] takes row [R], col [C] and no v" +
                     shapes({&param, &row, &col}));
    } else {
      f32(op, "v", v);
      same_numel(op, param, v);
      CT_REQUIRE(!row.defined() && !col.defined(), "adafactor: a 1-D param takes v, not row/col");
    }
    float* ea = nullptr;
    if (hp.beta1 > 0.0f) {
      f32(op, "exp_avg", exp_avg);
      same_numel(op, param, exp_avg);
      ea = f(exp_avg);
    }
    k_.adafactor(f(param), f(grad), factored ? f(row) : nullptr, factored ? f(col) : nullptr,
                 factored ? nullptr : f(v), ea, clip_norm(op, grad_norm, hp.max_grad_norm), R, C,
                 hp);
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

  static std::string shapes(std::initializer_list<const Tensor*> ts) {
    std::string s = " (got";
    bool first = true;
    for (const Tensor* t : ts) {
      s += (first ? " " : ", ") + t->describe();
      first = false;
    }
    return s + ")";
  }

  void mine(const char* op, const char* name, const Tensor& t) const {
    CT_REQUIRE(t.defined(), std::string(op) + ": " + name + " is undefined");
    CT_REQUIRE(&t.buffer->device() == this,
               std::string(op) + ": " + name + " lives on another device (" +
                   t.buffer->device().info().id() + ", this is " + info_.id() + ")");
    CT_REQUIRE(t.is_contiguous(),
               std::string(op) + ": " + name + " must be contiguous: " + t.describe());
    CT_REQUIRE(t.offset + t.nbytes() <= t.buffer->size(),
               std::string(op) + ": " + name + " " + t.describe() + " exceeds its buffer of " +
                   std::to_string(t.buffer->size()) + " bytes");
  }
  static bool is_h(DType d) { return d == DType::f16 || d == DType::bf16; }
  // An f32-only argument: a 16-bit tensor here is an unsupported op/dtype, anything else wrong.
  void f32(const char* op, const char* name, const Tensor& t) const {
    mine(op, name, t);
    if (is_h(t.dtype))
      fail(ErrorKind::kUnsupported, std::string(op) + ": " + name + " must be f32 here, got " +
                                        t.describe() + " (ask supports() first)");
    CT_REQUIRE(t.dtype == DType::f32, std::string(op) + ": " + name + " must be f32, got " +
                                          t.describe());
  }
  // An argument that may be f32, f16 or bf16 (core/device.h's mixed-precision table).
  void flt(const char* op, const char* name, const Tensor& t) const {
    mine(op, name, t);
    CT_REQUIRE(t.dtype == DType::f32 || is_h(t.dtype),
               std::string(op) + ": " + name + " must be f32, f16 or bf16, got " + t.describe());
  }
  static void same_dtype(const char* op, std::initializer_list<const Tensor*> ts) {
    for (const Tensor* t : ts)
      CT_REQUIRE(t->dtype == (*ts.begin())->dtype,
                 std::string(op) + ": these tensors must share one dtype" + shapes(ts));
  }

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
      k_.copy(static_cast<char*>(raw(t)) + e0 * dtype_size(t.dtype), t.dtype, staged, DType::f32, n);
  }
  // Rows of `row_elems` per staged piece: about kStageElems elements, at least one row.
  static int64_t stage_rows(int64_t row_elems) {
    constexpr int64_t kStageElems = int64_t{1} << 24;  // 64 MiB of f32
    return std::max<int64_t>(1, kStageElems / std::max<int64_t>(row_elems, 1));
  }
  void u8(const char* op, const char* name, const Tensor& t) const {
    mine(op, name, t);
    CT_REQUIRE(t.dtype == DType::u8,
               std::string(op) + ": " + name + " must be u8, got " + t.describe());
  }
  // grad_norm's pointer when clipping, else null.
  const float* clip_norm(const char* op, const Tensor& grad_norm, float max_grad_norm) const {
    if (!(max_grad_norm > 0.0f)) return nullptr;
    f32(op, "grad_norm", grad_norm);
    CT_REQUIRE(grad_norm.numel() == 1, std::string(op) + ": grad_norm must be [1] when clipping");
    return f(grad_norm);
  }
  void i32(const char* op, const char* name, const Tensor& t) const {
    mine(op, name, t);
    CT_REQUIRE(t.dtype == DType::i32,
               std::string(op) + ": " + name + " must be i32, got " + t.describe());
  }
  static void same_numel(const char* op, const Tensor& a, const Tensor& b) {
    CT_REQUIRE(a.numel() == b.numel(), std::string(op) + ": element counts differ" +
                                           shapes({&a, &b}));
  }
  static bool overlaps(const Tensor& a, const Tensor& b) {
    if (a.buffer != b.buffer) return false;
    return a.offset < b.offset + b.nbytes() && b.offset < a.offset + a.nbytes();
  }
  // Whether x ([..., r, c]) carries c's batch dims (true) or is one matrix broadcast (false).
  static bool batch_matches(const char* op, const Tensor& x, const Tensor& c,
                            const std::string& desc) {
    if (x.ndim() == 2) return false;
    bool same = x.ndim() == c.ndim();
    for (int i = 0; same && i < c.ndim() - 2; ++i) same = x.shape[i] == c.shape[i];
    CT_REQUIRE(same, std::string(op) + ": batch dimensions of an operand must match c's or the "
                                       "operand must be 2-D" + desc);
    return true;
  }
  static std::tuple<int64_t, int64_t, int64_t> attention_dims(const char* op, const Tensor& out,
                                                              const Tensor& att,
                                                              const Tensor& qkv, int n_head) {
    std::string desc = shapes({&out, &att, &qkv}) + " n_head " + std::to_string(n_head);
    CT_REQUIRE(out.ndim() == 3 && qkv.ndim() == 3 && att.ndim() == 4,
               std::string(op) + ": expected out [B,T,C], att [B,NH,T,T], qkv [B,T,3C]" + desc);
    int64_t B = out.shape[0], T = out.shape[1], C = out.shape[2];
    CT_REQUIRE(n_head > 0 && C % n_head == 0,
               std::string(op) + ": C must be a multiple of n_head" + desc);
    CT_REQUIRE(qkv.shape[0] == B && qkv.shape[1] == T && qkv.shape[2] == 3 * C &&
                   att.shape[0] == B && att.shape[1] == n_head && att.shape[2] == T &&
                   att.shape[3] == T,
               std::string(op) + ": shape mismatch" + desc);
    return {B, T, C};
  }
  std::pair<int64_t, int64_t> crossentropy_dims(const char* op, const Tensor& logits,
                                                const Tensor& targets) const {
    CT_REQUIRE(logits.ndim() >= 1, std::string(op) + ": logits must be [N,V]");
    int64_t V = logits.shape[-1], N = V ? logits.numel() / V : 0;
    CT_REQUIRE(targets.numel() == N, std::string(op) + ": expected logits [N,V], targets [N]" +
                                         shapes({&logits, &targets}));
    check_indices(op, "targets", targets, V);
    return {N, V};
  }
  // Index tensors are read on the host here (they are host memory) so a bad token is an error
  // rather than an out-of-bounds read.
  void check_indices(const char* op, const char* name, const Tensor& t, int64_t limit) const {
    const int32_t* p = static_cast<const int32_t*>(raw(t));
    int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i)
      if (p[i] < 0 || p[i] >= limit)
        fail(ErrorKind::kInvalidArgument, std::string(op) + ": " + name + "[" +
                                              std::to_string(i) + "] = " + std::to_string(p[i]) +
                                              " is out of range [0, " + std::to_string(limit) +
                                              ")");
  }
  void check_host_copy(const char* op, const Tensor& t, size_t bytes) const {
    mine(op, "tensor", t);
    CT_REQUIRE(bytes <= t.nbytes(), std::string(op) + ": " + std::to_string(bytes) +
                                        " bytes do not fit " + t.describe());
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

std::shared_ptr<Backend> make_cpu_backend() { return std::make_shared<cpu::CpuBackend>(); }

std::unique_ptr<Device> make_cpu_device(bool reference) {
  return std::make_unique<cpu::CpuDevice>(reference);
}

}  // namespace ct
