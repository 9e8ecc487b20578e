// The CPU devices: host buffers with accounting, and each op's kernel dispatched to the fast
// (OpenBLAS + OpenMP) or the reference kernel table (core/op_checks.cpp checks the arguments).
// Ops run eagerly on the calling thread, so flush() and synchronize() have nothing to do.
#include <cblas.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/op_profile.h"
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

// The arithmetic of products with 16-bit operands on the fast device, chosen per CPU by a
// measured rule (CT_CPU_BF16_MATMUL=widened or native overrides it; native only where there is
// a native kernel):
//   native: oneDNN's bf16 matmul (f32 accumulation) where the CPU has AVX512_BF16 or AMX: tiny
//     4x256 trained at 8,071 tokens/s in bf16 against 4,003 in fp32 (2.0x) on the 2-core Xeon
//     VM with AVX512_BF16 (bench/README.md, 2026-11-22).
//   widened: everywhere else, and always for f16: the operands widened to f32 (exact) and the
//     f32 product. On the Zen 3 EPYC without AVX-512 there is no native kernel to weigh against
//     it: oneDNN 2.6 creates no bf16 matmul there (gemm_bench: "could not create a primitive
//     descriptor") and Debian's OpenBLAS 0.3.21 is built without sbgemm. Widened, the products
//     themselves run at the f32 speed (tiny's GEMMs in `bench --report`: 126-137 GFLOP/s bf16,
//     129-144 f32); the whole --bf16 step, with GELU, bias gradients, flash attention, the
//     fused norms and the loss on 16 bits without staging: 0.94x fp32 on tiny 4x256 (609 vs
//     648 tokens/s, medians of 4 alternated runs, load ~6; 0.58x before the staging changes)
//     and 0.97x on gpt2 1x1024 with 2 layers (237 vs 245, 2 runs each, load ~5), with 3 % and
//     8 % more CPU time per run (start-up included): what is left is the widening of product
//     operands and the rounding of their results, which only a kernel that widens while it packs
//     (sbgemm) would remove. perf, tiny 4x256, 10 steps, load ~8, with the operands kept between
//     products (kept_slot): 12.2 s of samples in bf16, 11.6 s in fp32; of the difference, the
//     conversions ('copy') 0.36 s, flash attention's widening of its heads 0.15 s, and OpenBLAS
//     threads yielding (sched_yield) while they wait for each other in the weight-gradient
//     products 0.34 s (7 ms in fp32: a loaded machine's), against 0.3 s less page clearing at
//     start-up. (That was 2026-11-22. Since then the packing GEMM below widens while it packs,
//     and flash attention widens its heads while it packs its tiles, with no separate pass:
//     `bench --report` of 2026-11-28, tiny 4x256 16 steps, gives bf16 2,270 against fp32 2,339
//     tokens/s, and three alternated 24-step runs 1.07x, 0.98x, 0.99x: within the noise.)
// A product the native kernel declines (a batch with its own b per matrix, alpha with a bias)
// is widened; --profile counts the paths taken.
bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::string(v) == value;
}

bool native_bf16_chosen() {
  const char* v = std::getenv("CT_CPU_BF16_MATMUL");
  if (v && std::string(v) == "widened") return false;
  return fast::matmul_bf16_available();
}

// Products with a 16-bit operand that the native kernel does not take go to the packing GEMM
// (fast/gemm_packed.cpp: the operands widened as they are packed, c rounded in its epilogue)
// at the kernel levels that have it (AVX2 + FMA + F16C), unless CT_CPU_PACKED_GEMM=0; else,
// and for products with N or K past kPackedGemmMaxNK (8192: a language model's head), the
// operands are widened into f32 copies for sgemm. The faster of the two per product, measured
// on the 2-core Zen 3 EPYC on the products of --bf16 training, tiny 4 x 256 and gpt2 1 x 1024
// (device_gemm_bench --shapes tiny|gpt2 --dtypes bf16 --compare --cpu-time, OMP_NUM_THREADS=1,
// GFLOP/s packed vs widened, 2026-11-28):
//   forward, c bf16 (+ bias):  tiny 92-94 vs 87-91; gpt2 90-91 vs 89-90
//   dx, c bf16:                tiny 92-94 vs 90-91; gpt2 90-91 vs 89-90
//   dW, c f32 += (beta 1):     tiny 90-93 vs 91-93; gpt2 90-92 vs 90-93 (a tie, run to run)
//   gpt2's head, N or K 50304: forward 89.4 vs 90.8, dx 88.6 vs 90.8 packed vs widened (with
//     the limit lifted), and widened the forward's copy of wte serves dx too (kept_slot)
// and with both threads under load the packing GEMM, whose threads never wait for each other,
// is further ahead (device_gemm_bench without --cpu-time at load 2-4: widened 0.57-1.0x).
bool packed_gemm_on(bool reference) {
  return !reference && active_isa().level >= IsaLevel::kAvx2 && !env_is("CT_CPU_PACKED_GEMM", "0");
}

std::string widened_how(bool reference) {
  if (!packed_gemm_on(reference)) return "operands widened to f32, exact";
  return "operands widened to f32, exact: by the own packing GEMM as it packs them where N, K <= " +
         std::to_string(kPackedGemmMaxNK) +
         " (the linear layers), into copies for OpenBLAS sgemm past that (a vocabulary-sized "
         "head), per product the faster of the two on the Zen 3 EPYC where it was measured; a "
         "product of one row (sampling's one-token forward) reads b in place at any size";
}

std::string bf16_matmul_row(bool reference) {
  if (reference) return "widened to f32 (f32 arithmetic in plain loops)";
  if (native_bf16_chosen())
    return std::string("bf16 arithmetic, f32 accumulation: ") + fast::bf16_matmul_library() +
           (packed_gemm_on(reference)
                ? "; a product of one row (sampling's one-token forward): f32 arithmetic, b read "
                  "in place (measured faster)"
                : "");
  std::string why = std::getenv("CT_CPU_BF16_MATMUL") &&
                            std::string(std::getenv("CT_CPU_BF16_MATMUL")) == "widened" &&
                            fast::matmul_bf16_available()
                        ? "CT_CPU_BF16_MATMUL=widened"
                        : std::string("native kernel: ") + fast::bf16_matmul_library();
  return "f32 arithmetic (" + widened_how(reference) + "; " + why + ")";
}

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
             {"bf16 matmul", bf16_matmul_row(reference)},
             {"f16 matmul", "f32 arithmetic (" + widened_how(reference) + ")"}};
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
        info_(make_info(reference)),
        parallel_(!reference),
        native_bf16_(!reference && k_.matmul_bf16 && native_bf16_chosen()),
        keep_widened_(!env_is("CT_CPU_KEEP_WIDENED", "0")),
        packed_(k_.matmul_packed && packed_gemm_on(reference)) {}

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

  // --profile: wall time per public op, its 16-bit staging, and the matmul paths (op_profile.h).
  void set_profiling(bool on) override { profile_.enable(on); }
  // Also where kept widened operands are dropped: before and after any op that does not declare
  // its writes (after too, for an op whose own kernels run a product and then write).
  void op_begin(const char* op) override {
    const bool declared = declares_writes(op);
    if (!declared) forget_widened();
    open_ops_.push_back(declared);
    profile_.begin(op);
  }
  void op_end() override {
    if (!open_ops_.empty()) {
      if (!open_ops_.back()) forget_widened();
      open_ops_.pop_back();
    }
    profile_.end();
  }
  std::string profile_report() override { return profile_.report(info_.id()); }

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
    if (b.dtype == DType::f32) return k_.add(f(out), f(a), f(b), out.numel());
    pieces(out.numel(), 1, 1, [&](int64_t e0, int64_t n, float* s, int64_t) {
      widen_to(s, b, e0, n);
      k_.add(f(out) + e0, f(a) + e0, s, n);
    });
  }
  void accumulate_kernel(const Tensor& dst, const Tensor& src) override {
    wrote(dst);
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
    if (out.dtype == DType::f32)
      return k_.layernorm_forward(f(out), f(mean), f(rstd), f(x), f(w), f(b), N, C, eps);
    pieces(N, C, 1, [&](int64_t r0, int64_t nr, float* s, int64_t) {
      k_.layernorm_forward(s, f(mean) + r0, f(rstd) + r0, f(x) + r0 * C, f(w), f(b), nr, C, eps);
      round_from(out, s, r0 * C, nr * C);
    });
  }
  void residual_layernorm_forward_kernel(const Tensor& residual, const Tensor& out,
                                         const Tensor& mean, const Tensor& rstd, const Tensor& x,
                                         const Tensor& r, const Tensor& w, const Tensor& b,
                                         float eps) override {
    int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
    if (r.dtype == DType::f32 && out.dtype == DType::f32)
      return k_.residual_layernorm_forward(f(residual), f(out), f(mean), f(rstd), f(x), f(r), f(w),
                                           f(b), N, C, eps);
    if (k_.residual_layernorm_forward_bf16 && r.dtype == DType::bf16 && out.dtype == DType::bf16)
      return k_.residual_layernorm_forward_bf16(f(residual), h(out), f(mean), f(rstd), f(x), h(r),
                                                f(w), f(b), N, C, eps);
    // 16-bit r or out: rows in pieces (the kernel is row by row)
    pieces(N, C, 2, [&](int64_t r0, int64_t nr, float* s, int64_t stride) {
      const int64_t e0 = r0 * C, n = nr * C;
      const float* rs = r.dtype == DType::f32 ? f(r) + e0 : (widen_to(s, r, e0, n), s);
      float* os = out.dtype == DType::f32 ? f(out) + e0 : s + stride;
      k_.residual_layernorm_forward(f(residual) + e0, os, f(mean) + r0, f(rstd) + r0, f(x) + e0, rs,
                                    f(w), f(b), nr, C, eps);
      if (out.dtype != DType::f32) round_from(out, os, e0, n);
    });
  }
  void layernorm_backward_kernel(const Tensor& dx, const Tensor& dw, const Tensor& db,
                                 const Tensor& dout, const Tensor& x, const Tensor& w,
                                 const Tensor& mean, const Tensor& rstd) override {
    int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
    if (k_.layernorm_backward_bf16 && dout.dtype == DType::bf16)
      return k_.layernorm_backward_bf16(*this, f(dx), f(dw), f(db), h(dout), f(x), f(w), f(mean),
                                        f(rstd), N, C);
    k_.layernorm_backward(*this, f(dx), f(dw), f(db), in(dout, 0), f(x), f(w), f(mean), f(rstd), N,
                          C);
  }

  void rmsnorm_forward_kernel(const Tensor& out, const Tensor& rstd, const Tensor& x,
                              const Tensor& w, float eps) override {
    int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
    if (out.dtype == DType::f32) return k_.rmsnorm_forward(f(out), f(rstd), f(x), f(w), N, C, eps);
    pieces(N, C, 1, [&](int64_t r0, int64_t nr, float* s, int64_t) {
      k_.rmsnorm_forward(s, f(rstd) + r0, f(x) + r0 * C, f(w), nr, C, eps);
      round_from(out, s, r0 * C, nr * C);
    });
  }
  void residual_rmsnorm_forward_kernel(const Tensor& residual, const Tensor& out,
                                       const Tensor& rstd, const Tensor& x, const Tensor& r,
                                       const Tensor& w, float eps) override {
    int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
    if (r.dtype == DType::f32 && out.dtype == DType::f32)
      return k_.residual_rmsnorm_forward(f(residual), f(out), f(rstd), f(x), f(r), f(w), N, C, eps);
    // 16-bit r or out: rows in pieces (the kernel is row by row)
    pieces(N, C, 2, [&](int64_t r0, int64_t nr, float* s, int64_t stride) {
      const int64_t e0 = r0 * C, n = nr * C;
      const float* rs = r.dtype == DType::f32 ? f(r) + e0 : (widen_to(s, r, e0, n), s);
      float* os = out.dtype == DType::f32 ? f(out) + e0 : s + stride;
      k_.residual_rmsnorm_forward(f(residual) + e0, os, f(rstd) + r0, f(x) + e0, rs, f(w), nr, C,
                                  eps);
      if (out.dtype != DType::f32) round_from(out, os, e0, n);
    });
  }
  void rmsnorm_backward_kernel(const Tensor& dx, const Tensor& dw, const Tensor& dout,
                               const Tensor& x, const Tensor& w, const Tensor& rstd) override {
    int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
    k_.rmsnorm_backward(*this, f(dx), f(dw), in(dout, 0), f(x), f(w), f(rstd), N, C);
  }

  void matmul_kernel(const Tensor& c, const Tensor& a, const Tensor& b, const MatmulDims& d,
                     bool trans_a, bool trans_b, float alpha, float beta,
                     const Tensor* bias) override {
    wrote(c);
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
    if (native_bf16_matmul(c, a, b, m)) {
      profile_.count_path("matmul bf16: native (" + std::string(fast::bf16_matmul_library()) + ")");
      return;
    }
    if (packed_matmul(c, a, b, m)) {
      if (profile_.enabled())
        profile_.count_path(std::string("matmul ") + dtype_name(a.dtype) +
                            ": own packing GEMM (widened while packed)");
      return;
    }
    if (is_h(a.dtype) && profile_.enabled())
      profile_.count_path(std::string("matmul ") + dtype_name(a.dtype) + ": widened to f32");
    const OperandSlots o = operand_slots(a, b);
    if (split_rows(c, a, b, m, o)) return;
    Widening w(*this);
    m.c = beta != 0.0f ? w.add(c, 0) : out_(c, 0, false);
    m.a = o.widen_a ? w.add(a, o.slot_a) : operand(a, o.slot_a);
    m.b = o.widen_b ? w.add(b, o.slot_b) : operand(b, o.slot_b);
    w.run();
    keep_widened(o, a, b);
    k_.matmul(*this, m);
    store(c, m.c);
  }
  void bias_backward_kernel(const Tensor& dbias, const Tensor& dout) override {
    wrote(dbias);
    int64_t N = dout.shape[-1], M = N ? dout.numel() / N : 0;
    if (k_.bias_backward_bf16 && dout.dtype == DType::bf16)
      return k_.bias_backward_bf16(f(dbias), h(dout), M, N);
    k_.bias_backward(f(dbias), in(dout, 0), M, N);
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
      if (out.dtype != DType::f32) {  // both rounded in one region
        const Conversion back[2] = {{static_cast<char*>(raw(out)) + oe * dtype_size(out.dtype),
                                     out.dtype, o, DType::f32, nb * T * C},
                                    {static_cast<char*>(raw(att)) + ae * dtype_size(att.dtype),
                                     att.dtype, a, DType::f32, nb * n_head * T * T}};
        convert_all(back, 2);
      }
    }
  }
  void attention_backward_kernel(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                 const Tensor& att, int n_head, int n_kv_head) override {
    const int64_t B = dout.shape[0], T = dout.shape[1], C = dout.shape[2], W = qkv.shape[2];
    const int64_t nb = dqkv.dtype == DType::f32 ? B : 1;  // as in attention_forward
    for (int64_t b0 = 0; b0 < B; b0 += nb) {
      const int64_t oe = b0 * T * C, ae = b0 * n_head * T * T, qe = b0 * T * W;
      float* d = out_range(dqkv, 0, qe, nb * T * W);
      Widening w(*this);
      const float* dy = w.add_range(dout, 1, oe, nb * T * C);
      const float* x = w.add_range(qkv, 2, qe, nb * T * W);
      const float* p = w.add_range(att, 3, ae, nb * n_head * T * T);
      w.run();
      k_.attention_backward(*this, d, dy, x, p, nb, T, C, n_head, n_kv_head);
      store_range(dqkv, d, qe, nb * T * W);
    }
  }

  void flash_attention_forward_kernel(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                      int n_head, int n_kv_head) override {
    const int64_t B = out.shape[0], Tq = out.shape[1], C = out.shape[2], T = qkv.shape[1];
    if (k_.flash_attention_forward_bf16 && out.dtype == DType::bf16 && qkv.dtype == DType::bf16)
      return k_.flash_attention_forward_bf16(*this, h(out), f(lse), h(qkv), B, T, Tq, C, n_head,
                                             n_kv_head);
    float* o = out_(out, 0, false);
    k_.flash_attention_forward(*this, o, f(lse), in(qkv, 1), B, T, Tq, C, n_head, n_kv_head);
    store(out, o);
  }
  void flash_attention_backward_kernel(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                       const Tensor& out, const Tensor& lse, int n_head,
                                       int n_kv_head) override {
    const int64_t B = dout.shape[0], T = dout.shape[1], C = dout.shape[2];
    if (k_.flash_attention_backward_bf16 && dqkv.dtype == DType::bf16 &&
        dout.dtype == DType::bf16 && qkv.dtype == DType::bf16 && out.dtype == DType::bf16)
      return k_.flash_attention_backward_bf16(*this, h(dqkv), h(dout), h(qkv), h(out), f(lse), B, T,
                                              C, n_head, n_kv_head);
    float* d = out_(dqkv, 0, false);
    Widening w(*this);
    const float* dy = w.add(dout, 1);
    const float* x = w.add(qkv, 2);
    const float* y = w.add(out, 3);
    w.run();
    k_.flash_attention_backward(*this, d, dy, x, y, f(lse), B, T, C, n_head, n_kv_head);
    store(dqkv, d);
  }

  void gelu_forward_kernel(const Tensor& out, const Tensor& x) override {
    wrote(out);  // matmul_bias_gelu's second output
    if (out.dtype == DType::f32 && x.dtype == DType::f32)
      return k_.gelu_forward(f(out), f(x), x.numel());
    if (k_.gelu_forward_bf16 && out.dtype == DType::bf16 && x.dtype == DType::bf16)
      return k_.gelu_forward_bf16(h(out), h(x), x.numel());
    pieces(x.numel(), 1, 2, [&](int64_t e0, int64_t n, float* s, int64_t stride) {
      const float* xs = x.dtype == DType::f32 ? f(x) + e0 : (widen_to(s, x, e0, n), s);
      float* os = out.dtype == DType::f32 ? f(out) + e0 : s + stride;
      k_.gelu_forward(os, xs, n);
      if (out.dtype != DType::f32) round_from(out, os, e0, n);
    });
  }
  void gelu_backward_kernel(const Tensor& dx, const Tensor& x, const Tensor& dout) override {
    wrote(dx);  // matmul_gelu_backward's epilogue
    if (dx.dtype == DType::f32 && x.dtype == DType::f32 && dout.dtype == DType::f32)
      return k_.gelu_backward(f(dx), f(x), f(dout), x.numel());
    if (k_.gelu_backward_bf16 && dx.dtype == DType::bf16 && x.dtype == DType::bf16 &&
        dout.dtype == DType::bf16)
      return k_.gelu_backward_bf16(h(dx), h(x), h(dout), x.numel());
    pieces(x.numel(), 1, 3, [&](int64_t e0, int64_t n, float* s, int64_t stride) {
      const float* xs = x.dtype == DType::f32 ? f(x) + e0 : (widen_to(s, x, e0, n), s);
      const float* ds =
          dout.dtype == DType::f32 ? f(dout) + e0 : (widen_to(s + stride, dout, e0, n), s + stride);
      float* os = dx.dtype == DType::f32 ? f(dx) + e0 : s + 2 * stride;
      k_.gelu_backward(os, xs, ds, n);
      if (dx.dtype != DType::f32) round_from(dx, os, e0, n);
    });
  }
  void swiglu_forward_kernel(const Tensor& out, const Tensor& gu) override {
    const int64_t F = out.shape[-1], N = F ? out.numel() / F : 0;
    float* o = out_(out, 0, false);
    k_.swiglu_forward(o, in(gu, 1), N, F);
    store(out, o);
  }
  void swiglu_backward_kernel(const Tensor& dgu, const Tensor& gu, const Tensor& dout) override {
    const int64_t F = dout.shape[-1], N = F ? dout.numel() / F : 0;
    Widening w(*this);
    const float* g = w.add(gu, 1);  // staged first: dgu may be gu
    const float* dy = w.add(dout, 2);
    w.run();
    float* d = out_(dgu, 0, false);
    k_.swiglu_backward(d, g, dy, N, F);
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
    wrote(losses);
    const int64_t Vp = logits.shape[-1], N = targets.numel();
    check_indices("crossentropy_forward", "targets", targets, valid);
    if (logits.dtype == DType::f32)
      return k_.crossentropy_forward(f(losses), f(logits), idx(targets), N, valid, Vp);
    // 16-bit logits: rows in pieces (the kernel is row by row), each widened in cache, rather
    // than a widened copy of all of them (GPT-2's [B*T, 50304]: 0.8 GB of f32 at 4 x 1024).
    pieces(N, Vp, 1, [&](int64_t r0, int64_t nr, float* s, int64_t) {
      widen_to(s, logits, r0 * Vp, nr * Vp);
      k_.crossentropy_forward(f(losses) + r0, s, idx(targets) + r0, nr, valid, Vp);
    });
  }
  void crossentropy_backward_kernel(const Tensor& dlogits, const Tensor& logits,
                                    const Tensor& targets, int64_t valid, float dloss) override {
    wrote(dlogits);
    const int64_t Vp = logits.shape[-1], N = targets.numel();
    check_indices("crossentropy_backward", "targets", targets, valid);
    if (logits.dtype == DType::f32 && dlogits.dtype == DType::f32)
      return k_.crossentropy_backward(f(dlogits), f(logits), idx(targets), N, valid, Vp, dloss);
    // 16-bit: rows in pieces, as in crossentropy_forward. In place, the piece's widened logits
    // become its dlogits (the kernel allows aliasing).
    const bool same = raw(dlogits) == raw(logits);
    pieces(N, Vp, 2, [&](int64_t r0, int64_t nr, float* s, int64_t stride) {
      const int64_t e0 = r0 * Vp, n = nr * Vp;
      const float* l =
          logits.dtype == DType::f32 ? f(logits) + e0 : (widen_to(s, logits, e0, n), s);
      float* d = same                          ? const_cast<float*>(l)
                 : dlogits.dtype == DType::f32 ? f(dlogits) + e0
                                               : s + stride;
      k_.crossentropy_backward(d, l, idx(targets) + r0, nr, valid, Vp, dloss);
      if (dlogits.dtype != DType::f32) round_from(dlogits, d, e0, n);
    });
  }
  void crossentropy_forward_backward_kernel(const Tensor& losses, const Tensor& logits,
                                            const Tensor& targets, int64_t valid,
                                            float dloss) override {
    wrote(losses);
    wrote(logits);  // becomes dlogits
    const int64_t Vp = logits.shape[-1], N = targets.numel();
    check_indices("crossentropy_forward_backward", "targets", targets, valid);
    if (logits.dtype == DType::f32)
      return k_.crossentropy_forward_backward(f(losses), f(logits), idx(targets), N, valid, Vp,
                                              dloss);
    // 16-bit: rows in pieces, each widened, computed in place and rounded back in cache.
    pieces(N, Vp, 1, [&](int64_t r0, int64_t nr, float* s, int64_t) {
      widen_to(s, logits, r0 * Vp, nr * Vp);
      k_.crossentropy_forward_backward(f(losses) + r0, s, idx(targets) + r0, nr, valid, Vp, dloss);
      round_from(logits, s, r0 * Vp, nr * Vp);
    });
  }

  // -- reductions and optimizer ----------------------------------------------------------------
  void sum_kernel(const Tensor& out, const Tensor& x, float s) override {
    wrote(out);
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
                    const Tensor& grad_norm, const AdamWHyper& hp, const Tensor& param16) override {
    k_.adamw(f(param), f(grad), f(m), f(v), clip_norm(grad_norm, hp.max_grad_norm), param.numel(),
             hp, param16.defined() ? raw(param16) : nullptr, param16.dtype);
  }
  // The ranges one after another through the adamw kernel, with lr and step from the schedule:
  // the same numbers as adamw on each range.
  void adamw_groups_kernel(const Tensor& param, const Tensor& grad, const Tensor& m,
                           const Tensor& v, const Tensor& grad_norm, const Tensor& schedule,
                           const AdamWGroups& groups, const AdamWHyper& hp,
                           const Tensor& param16) override {
    AdamWSchedule sched;
    std::memcpy(&sched, raw(schedule), sizeof sched);
    AdamWHyper h = hp;
    h.lr = sched.lr;
    h.step = static_cast<int64_t>(sched.step);
    for (int i = 0; i < groups.count; ++i) {
      const AdamWGroups::Range& r = groups.ranges[i];
      h.weight_decay = r.decay ? hp.weight_decay : 0.0f;
      void* p16 = param16.defined()
                      ? static_cast<char*>(raw(param16)) + r.begin * dtype_size(param16.dtype)
                      : nullptr;
      k_.adamw(f(param) + r.begin, f(grad) + r.begin, f(m) + r.begin, f(v) + r.begin,
               clip_norm(grad_norm, hp.max_grad_norm), r.len, h, p16, param16.dtype);
    }
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
  // Except a product of one row (sampling's one-token forward), which the packing GEMM's row
  // path runs faster, reading b once in place: gpt2 decode with --bf16 on the 2-core Zen 4
  // EPYC (AVX512_BF16, no AMX), 100 tokens, 2026-11-28: 44.4 tokens/s through oneDNN against
  // 62.8 on the row path (fp32: 47.1).
  bool native_bf16_matmul(const Tensor& c, const Tensor& a, const Tensor& b, MatmulArgs m) {
    if (!native_bf16_ || a.dtype != DType::bf16 || m.K == 0 || m.M == 0 || m.N == 0) return false;
    if (m.M == 1 && m.batch == 1 && packed_) return false;
    if (m.batch != 1 && !(m.a_batched && !m.trans_a && !m.b_batched)) return false;
    MatmulBf16Args x = one_product<MatmulBf16Args>(m);
    x.c = raw(c);
    x.c_bf16 = c.dtype == DType::bf16;
    x.a = static_cast<const uint16_t*>(raw(a));
    x.b = static_cast<const uint16_t*>(raw(b));
    return k_.matmul_bf16(x);
  }
  // A product with a 16-bit operand on the packing GEMM (fast/gemm_packed.cpp), which widens
  // while it packs and rounds c in its epilogue, instead of widened copies around sgemm.
  bool packed_matmul(const Tensor& c, const Tensor& a, const Tensor& b, const MatmulArgs& m) {
    if (!packed_ || !(is_h(a.dtype) || is_h(b.dtype))) return false;
    if (m.batch != 1 && !(m.a_batched && !m.trans_a && !m.b_batched)) return false;
    MatmulPackedArgs x = one_product<MatmulPackedArgs>(m);
    x.c = raw(c);
    x.a = raw(a);
    x.b = raw(b);
    x.c_dtype = c.dtype;
    x.a_dtype = a.dtype;
    x.b_dtype = b.dtype;
    return k_.matmul_packed(x);
  }

  // Widened operands kept between products (the notes and helpers after split_rows).
  struct Widened {
    const void* src = nullptr;
    DType dtype = DType::f32;
    int64_t n = 0;
  };
  struct OperandSlots {
    int slot_a, slot_b;     // where a and b (when 16-bit) are, or are widened to
    bool widen_a, widen_b;  // 16-bit and not kept: widen into the slot
  };

  // A product with 16-bit operands as one OpenMP region: the threads widen a share of b each,
  // meet once, then each widens its own rows of a (and of c when beta reads it), runs the f32
  // product of those rows on its own (OpenBLAS is single-threaded inside a parallel region) and
  // rounds them back into c. Widening, OpenBLAS's threaded product (which synchronises its
  // threads several times per call) and the rounding were four and more waits on the slowest
  // thread per product, which is what a loaded machine punishes. Each element of c is an f32
  // sum of the same products, but not always in the order of OpenBLAS's threaded product: some
  // differ from it in the last bit (tests/ops/cpu_half_kernels_test.cpp). Taken for batch 1 or a
  // row-major batch against a shared b, without trans_a (c's rows are then a's rows), and not where
  // oneDNN runs the f32 products (its stream is not shared between threads). (A weight gradient,
  // a^T b, split by blocks of a's columns saved ~2 % of a gpt2 --bf16 step's CPU time but moved
  // some tile-edge sums of OpenBLAS's threaded product by 1 ulp, so it stays one threaded product.)
  bool split_rows(const Tensor& c, const Tensor& a, const Tensor& b, const MatmulArgs& m,
                  const OperandSlots& o) {
    const int threads = parallel_ ? omp_get_max_threads() : 1;
    const int64_t rows = m.batch * m.M;
    if (threads < 2 || m.trans_a || fast::onednn_f32_available() || m.K == 0) return false;
    if (!is_h(a.dtype) && !is_h(b.dtype) && !is_h(c.dtype)) return false;  // f32: OpenBLAS's own
    if (!(m.batch == 1 || (m.a_batched && !m.b_batched))) return false;
    if (rows < int64_t{32} * threads) return false;  // too few rows to share
    const bool ha = is_h(a.dtype), hb = is_h(b.dtype), hc = is_h(c.dtype);
    float* as = !ha         ? f(a)
                : o.widen_a ? stage(o.slot_a, static_cast<size_t>(a.numel()))
                            : operand(a, o.slot_a);
    float* bs = !hb         ? f(b)
                : o.widen_b ? stage(o.slot_b, static_cast<size_t>(b.numel()))
                            : operand(b, o.slot_b);
    float* cs = hc ? stage(0, static_cast<size_t>(c.numel())) : f(c);
    // A 16-bit c adds the bias rounded to its dtype: rounded here, once, not by every thread.
    float* bias = nullptr;
    if (m.bias && hc) {
      bias = stage(3, static_cast<size_t>(m.N));
      for (int64_t j = 0; j < m.N; ++j) bias[j] = round_to(c.dtype, m.bias[j]);
    }
#pragma omp parallel num_threads(threads)
    {
      const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
      if (hb && o.widen_b) {
        const int64_t n = b.numel(), e0 = n * t / nt, e1 = n * (t + 1) / nt;
        widen_to(bs + e0, b, e0, e1 - e0);
#pragma omp barrier
      }
      // Row blocks in multiples of 8 (the kernels' row tiles), the last one takes the rest.
      const int64_t per = (rows / nt + 7) / 8 * 8;
      const int64_t r0 = std::min(rows, per * t),
                    r1 = t == nt - 1 ? rows : std::min(rows, r0 + per);
      if (r1 > r0) {
        if (ha && o.widen_a) widen_to(as + r0 * m.K, a, r0 * m.K, (r1 - r0) * m.K);
        if (hc && m.beta != 0.0f) widen_to(cs + r0 * m.N, c, r0 * m.N, (r1 - r0) * m.N);
        MatmulArgs p = m;
        p.batch = 1;
        p.M = r1 - r0;
        p.a = as + r0 * m.K;
        p.b = bs;
        p.c = cs + r0 * m.N;
        if (bias) p.bias = bias, p.c_dtype = DType::f32;  // already rounded
        k_.matmul(*this, p);
        if (hc) round_from(c, p.c, r0 * m.N, (r1 - r0) * m.N);
      }
    }
    keep_widened(o, a, b);  // every row of a was widened, by one thread or another
    return true;
  }

  // -- widened operands kept between products -----------------------------------------------
  // A 16-bit tensor is often the operand of two products in a row: the gradient of a linear
  // layer's output in its dx and dW products, dlogits in the tied head's two backward products,
  // and wte in the head's forward and first backward product (only the loss runs between). The
  // exact f32 copy of each operand a product widened stays in its staging slot (1 or 2) with a
  // note of the tensor it holds, and the next product reads it from there instead of widening
  // again. The note is dropped when anything may have written the tensor: at the start of every
  // op but those in declares_writes(), which drop the notes of what they write themselves
  // (wrote()); and when the slot is staged for anything else (stage()). The products read the
  // same f32 values as before, so the results are bitwise the same. CT_CPU_KEEP_WIDENED=0 widens
  // every operand every time (for comparisons).

  // The slot holding t's widened copy, or -1.
  int kept_slot(const Tensor& t) const {
    if (!keep_widened_ || !is_h(t.dtype)) return -1;
    for (int s : {1, 2}) {
      const Widened& w = widened_[static_cast<size_t>(s)];
      if (w.src == raw(t) && w.dtype == t.dtype && w.n == t.numel()) return s;
    }
    return -1;
  }
  OperandSlots operand_slots(const Tensor& a, const Tensor& b) {
    const int ka = kept_slot(a), kb = kept_slot(b);
    OperandSlots o;
    o.widen_a = is_h(a.dtype) && ka < 0;
    o.widen_b = is_h(b.dtype) && kb < 0;
    o.slot_a = ka >= 0 ? ka : (kb == 1 ? 2 : 1);  // never over b's kept copy
    o.slot_b = kb >= 0 ? kb : (o.slot_a == 2 ? 1 : 2);
    if (profile_.enabled() && (ka >= 0 || kb >= 0))
      profile_.count_path(std::string("matmul ") + dtype_name(a.dtype) +
                          ": widened operand kept from the previous product");
    return o;
  }
  // Where a product reads t that need not be widened: its own memory (f32) or its kept copy.
  float* operand(const Tensor& t, int slot) {
    if (!is_h(t.dtype)) return f(t);
    return static_cast<float*>(
        static_cast<CpuBuffer*>(stage_[static_cast<size_t>(slot)].get())->data());
  }
  // After a product: note the operands it widened (their slots are complete copies now).
  void keep_widened(const OperandSlots& o, const Tensor& a, const Tensor& b) {
    if (o.widen_a) widened_[static_cast<size_t>(o.slot_a)] = {raw(a), a.dtype, a.numel()};
    if (o.widen_b) widened_[static_cast<size_t>(o.slot_b)] = {raw(b), b.dtype, b.numel()};
  }
  // Ops that call wrote() on every tensor they write (the products, the bias gradient, the
  // loss and the loss sum): the notes of the others stay.
  static bool declares_writes(const char* op) {
    for (const char* name : {"matmul", "matmul_bias_gelu", "matmul_gelu_backward", "bias_backward",
                             "crossentropy_forward", "crossentropy_backward",
                             "crossentropy_forward_backward", "sum", "accumulate", "download"})
      if (std::strcmp(op, name) == 0) return true;
    return false;
  }
  // t is about to be written: drop the notes of kept copies whose tensor overlaps it.
  void wrote(const Tensor& t) {
    const char* lo = static_cast<const char*>(raw(t));
    const char* hi = lo + t.nbytes();
    for (Widened& w : widened_) {
      const char* wlo = static_cast<const char*>(w.src);
      if (w.src && wlo < hi && lo < wlo + w.n * static_cast<int64_t>(dtype_size(w.dtype))) w = {};
    }
  }
  void forget_widened() {
    widened_.fill({});
  }

  // -- 16-bit staging: f32 copies of 16-bit tensors in workspace slots ----------------------
  // Each conversion pass is an OpenMP region, and with every core busy a region's barrier can
  // wait a scheduler slice for a descheduled thread (libgomp spins, then sleeps): the 16-bit
  // path had 2-3 regions per op where f32 has one, and --bf16 ran at 0.58x fp32 (tiny 4x256,
  // 2 threads, load average 8-9; 0.99x with OMP_WAIT_POLICY=passive). So the inputs of one op
  // are widened together in one region (Widening), and elementwise and row-wise ops run on
  // pieces that are widened, computed and rounded back by the same thread (pieces()).
  float* stage(int slot, size_t n) {
    widened_[static_cast<size_t>(slot)] = {};  // whatever it held is being replaced
    auto& buf = stage_[static_cast<size_t>(slot)];
    size_t bytes = std::max<size_t>(n, 1) * sizeof(float);
    if (!buf || buf->size() < bytes) {
      buf.reset();
      buf = allocate(bytes, MemCategory::kWorkspace);
    }
    return static_cast<float*>(static_cast<CpuBuffer*>(buf.get())->data());
  }
  // The staging's conversions: k_.copy, timed for --profile.
  void convert(void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n) {
    if (!profile_.enabled()) return k_.copy(dst, dst_dt, src, src_dt, n);
    const auto t0 = std::chrono::steady_clock::now();
    k_.copy(dst, dst_dt, src, src_dt, n);
    profile_.add_staging(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  // t as f32 input: its own memory, or a widened copy in staging slot `slot`.
  float* in(const Tensor& t, int slot) {
    if (t.dtype == DType::f32) return f(t);
    float* s = stage(slot, static_cast<size_t>(t.numel()));
    convert(s, DType::f32, raw(t), t.dtype, t.numel());
    return s;
  }
  // Where a kernel writes output t: its own memory, or a staging slot (widened from t first
  // when the kernel reads it too); store() rounds a staged result back into t.
  float* out_(const Tensor& t, int slot, bool read) {
    if (t.dtype == DType::f32) return f(t);
    return read ? in(t, slot) : stage(slot, static_cast<size_t>(t.numel()));
  }
  void store(const Tensor& t, const float* staged) {
    if (t.dtype != DType::f32) convert(raw(t), t.dtype, staged, DType::f32, t.numel());
  }
  // The same over elements [e0, e0 + n) of t, for ops staged piece by piece.
  float* in_range(const Tensor& t, int slot, int64_t e0, int64_t n) {
    if (t.dtype == DType::f32) return f(t) + e0;
    float* s = stage(slot, static_cast<size_t>(n));
    convert(s, DType::f32, static_cast<char*>(raw(t)) + e0 * dtype_size(t.dtype), t.dtype, n);
    return s;
  }
  float* out_range(const Tensor& t, int slot, int64_t e0, int64_t n) {
    return t.dtype == DType::f32 ? f(t) + e0 : stage(slot, static_cast<size_t>(n));
  }
  void store_range(const Tensor& t, const float* staged, int64_t e0, int64_t n) {
    if (t.dtype != DType::f32)
      convert(static_cast<char*>(raw(t)) + e0 * dtype_size(t.dtype), t.dtype, staged, DType::f32,
              n);
  }
  // The 16-bit inputs of one op, widened together: add() returns where the kernel reads t (its
  // own memory when f32) and queues the widening; run() does them all in one region.
  struct Conversion {
    void* dst;
    DType dst_dt;
    const void* src;
    DType src_dt;
    int64_t n;
  };
  class Widening {
   public:
    explicit Widening(CpuDevice& d) : d_(d) {}
    float* add(const Tensor& t, int slot) { return add_range(t, slot, 0, t.numel()); }
    float* add_range(const Tensor& t, int slot, int64_t e0, int64_t n) {
      if (t.dtype == DType::f32) return f(t) + e0;
      float* s = d_.stage(slot, static_cast<size_t>(n));
      list_[count_++] = {s, DType::f32, static_cast<char*>(raw(t)) + e0 * dtype_size(t.dtype),
                         t.dtype, n};
      return s;
    }
    void run() { d_.convert_all(list_.data(), count_); }

   private:
    CpuDevice& d_;
    std::array<Conversion, 4> list_{};
    int count_ = 0;
  };
  // Pieces of kConvertChunk elements (k_.copy's own region stays off at that size, and nested
  // regions run on one thread anyway), all conversions in one parallel loop.
  void convert_all(const Conversion* list, int count) {
    static constexpr int64_t kConvertChunk = int64_t{1} << 15;
    int64_t chunks = 0, total = 0;
    for (int i = 0; i < count; ++i)
      chunks += (list[i].n + kConvertChunk - 1) / kConvertChunk, total += list[i].n;
    if (total == 0) return;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static) if (parallel_ && total > kConvertChunk)
    for (int64_t c = 0; c < chunks; ++c) {
      int64_t k = c;
      int i = 0;
      for (;; ++i) {
        const int64_t ci = (list[i].n + kConvertChunk - 1) / kConvertChunk;
        if (k < ci) break;
        k -= ci;
      }
      const Conversion& x = list[i];
      const int64_t e0 = k * kConvertChunk, n = std::min(kConvertChunk, x.n - e0);
      k_.copy(static_cast<char*>(x.dst) + e0 * dtype_size(x.dst_dt), x.dst_dt,
              static_cast<const char*>(x.src) + e0 * dtype_size(x.src_dt), x.src_dt, n);
    }
    if (profile_.enabled())
      profile_.add_staging(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }

  // An elementwise or row-wise op on 16-bit tensors in one region: body(r0, nr, scratch,
  // stride) for pieces of rows [r0, r0 + nr) of `row_elems` elements each (about kPieceElems
  // elements, at least one row), each on one thread with `buffers` f32 scratch buffers (buffer
  // i at scratch + i * stride). The body widens its inputs, runs the f32 kernel on the piece
  // (small enough that the kernel's own region stays off) and rounds its output back, while
  // the piece is in cache: one pass over the 16-bit data instead of three. 16,384 elements:
  // bf16 gelu over 1.5M elements took 3.6 ms in such pieces against 4.6 ms in pieces of 4,096
  // (one thread; each piece's kernel calls cost a nested region), f32 gelu itself 2.5 ms.
  template <typename Body>
  void pieces(int64_t rows, int64_t row_elems, int buffers, Body&& body) {
    static constexpr int64_t kPieceElems = 16384;
    const int64_t piece_rows = std::max<int64_t>(1, kPieceElems / std::max<int64_t>(row_elems, 1));
    const int64_t piece_elems = piece_rows * row_elems;
    const int64_t npieces = (rows + piece_rows - 1) / piece_rows;
    const int threads = parallel_ ? omp_get_max_threads() : 1;
    float* scratch = stage(
        kPieceSlot, static_cast<size_t>(threads) * static_cast<size_t>(buffers * piece_elems));
#pragma omp parallel for schedule(static) if (parallel_ && rows * row_elems > 4 * kPieceElems)
    for (int64_t p = 0; p < npieces; ++p) {
      const int me = std::min(omp_get_thread_num(), threads - 1);
      float* mine = scratch + static_cast<int64_t>(me) * buffers * piece_elems;
      const int64_t r0 = p * piece_rows;
      body(r0, std::min(piece_rows, rows - r0), mine, piece_elems);
    }
  }
  // Elements [e0, e0 + n) of 16-bit t widened into dst, or rounded from src into t.
  void widen_to(float* dst, const Tensor& t, int64_t e0, int64_t n) {
    k_.copy(dst, DType::f32, static_cast<const char*>(raw(t)) + e0 * dtype_size(t.dtype), t.dtype,
            n);
  }
  void round_from(const Tensor& t, const float* src, int64_t e0, int64_t n) {
    k_.copy(static_cast<char*>(raw(t)) + e0 * dtype_size(t.dtype), t.dtype, src, DType::f32, n);
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
  static float* f(const Tensor& t) {
    return static_cast<float*>(raw(t));
  }
  static uint16_t* h(const Tensor& t) {
    return static_cast<uint16_t*>(raw(t));
  }
  static int32_t* idx(const Tensor& t) {
    return static_cast<int32_t*>(raw(t));
  }

  const Kernels& k_;
  DeviceInfo info_;
  const bool parallel_;      // the staging's own loops: threaded on the fast device only
  const bool native_bf16_;   // bf16 products to k_.matmul_bf16 (native_bf16_chosen())
  const bool keep_widened_;  // products read kept widened operands (CT_CPU_KEEP_WIDENED=0: never)
  const bool packed_;        // 16-bit products to k_.matmul_packed (CT_CPU_PACKED_GEMM=0: never)
  OpProfile profile_;
  std::shared_ptr<Buffer> ws_;
  static constexpr int kPieceSlot = 4;  // pieces()' per-thread scratch
  std::array<std::shared_ptr<Buffer>, 5> stage_;
  std::array<Widened, 5> widened_{};  // per staging slot: the 16-bit tensor it holds widened
  std::vector<bool> open_ops_;        // per op begun and not ended: does it declare its writes
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
