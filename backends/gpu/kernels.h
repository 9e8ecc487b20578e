// Launchers of the kernels under backends/gpu/kernels, one block per file: the whole op set of
// core/device.h for CUDA, HIP and the CPU SIMT runtime. Plain C++ (no GPU types), so the device
// class (backends/gpu/gpu_device.cpp) is compiled by the host compiler on every target.
//
// Every launcher enqueues on cx.stream and returns without waiting; it takes the warp size of the
// device it runs on (cx.warp, 32 or 64). Pointers are device pointers; a tensor that may be f32
// or 16-bit comes with its Elem. Shapes are as core/device.h describes the op, and every tensor
// is contiguous. A launcher that needs scratch memory says how much (`*_workspace`): the caller
// hands that many bytes (or more), 256-byte aligned, that stay untouched until the work is done.
// Deterministic: results depend on the shapes only, never on the warp size, the device or timing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace ct::gpu {

enum class Elem : int { kF32, kF16, kBF16 };
inline std::size_t elem_size(Elem e) {
  return e == Elem::kF32 ? 4 : 2;
}

// Where and how to launch.
struct Ctx {
  int warp = 32;  // 32 or 64
  void* stream =
      nullptr;  // cudaStream_t, hipStream_t, or the ct::simt::Runtime* (nullptr: default)
  int multiprocessors = 1;  // SMs / CUs: grid sizing of reductions may depend on it only where the
                            // result does not
  // The own GEMM takes 16-bit inputs through the matrix tile (backends/gpu/kernels/mma.h): set
  // where the device has matrix cores (sm_80+, gfx90a, gfx94x); on the SIMT runtime it runs the
  // tile's scalar form, which gives the scalar kernel's bits.
  bool matrix_tiles = false;
  // fp32 products may take TF32 inputs (Device::set_allow_tf32, crosstrain train --tf32): the
  // tile flash attention then takes f32 at warp 32 (flash_attention_tc.cu).
  bool tf32 = false;
  // Split-k of the own tensor-core GEMM (gemm_tc.cu) for products with too few block tiles to
  // fill the device: 0 chooses from `multiprocessors` (CUDA, HIP: a property of the GPU, so a
  // product's bits depend on its shape and the device only); n >= 1 takes n k ranges (as many as
  // the product has 32-deep slices where that is fewer; 1: never). The SIMT runtime sets 1 (its
  // multiprocessors is the host-thread count, which must not change bits); CT_GPU_SPLITK=n sets n
  // on every target (gpu/runtime.h; tests, benchmarks).
  int splitk = 0;
};

// --- elementwise.cu ------------------------------------------------------------------------
// dst[i] (=) the `width`-byte pattern (1, 2 or 4 bytes), i in [0, n).
void fill_pattern(const Ctx& cx, void* dst, std::int64_t n, int width, std::uint32_t pattern);
// dst (=) src converted (round to nearest even), n elements; dst and src do not overlap.
void convert(const Ctx& cx, void* dst, Elem dst_elem, const void* src, Elem src_elem,
             std::int64_t n);
// out (=) a + b; out, a f32; b f32 or 16-bit. out may be a or b (elementwise in place).
void add(const Ctx& cx, float* out, const float* a, const void* b, Elem b_elem, std::int64_t n);
// dst (+=) src, f32.
void accumulate(const Ctx& cx, float* dst, const float* src, std::int64_t n);
// t (=) t * s, f32.
void scale(const Ctx& cx, float* t, float s, std::int64_t n);

// --- gelu.cu -------------------------------------------------------------------------------
// out (=) gelu(x); dx (=) dout * gelu'(x). All tensors of one Elem; out may be x.
void gelu_forward(const Ctx& cx, void* out, const void* x, Elem e, std::int64_t n);
void gelu_backward(const Ctx& cx, void* dx, const void* x, const void* dout, Elem e,
                   std::int64_t n);

// --- dropout.cu ----------------------------------------------------------------------------
// core/device.h's dropout mask, as plain integers.
struct DropoutBits {
  std::uint64_t seed = 0, stream = 0;
  std::uint32_t threshold = 0;
  float scale = 1.0f;
};
// out[i] (=) keep(i) ? x[i] * scale : 0 with keep(i) = (Philox(seed, stream) word i >> 8) >=
// threshold. out, x (n) of one Elem; out may be x.
void dropout(const Ctx& cx, void* out, const void* x, Elem e, std::int64_t n, const DropoutBits& m);

// --- embedding.cu --------------------------------------------------------------------------
// out [B,T,C] f32 (=) wte[tokens[b,t]] + wpe[t]; tokens [B,T] i32 (in range: not checked here);
// wte and wpe of one Elem (widened, added in fp32).
void embedding_forward(const Ctx& cx, float* out, const std::int32_t* tokens, const void* wte,
                       const void* wpe, Elem e, std::int64_t B, std::int64_t T, std::int64_t C);
// dwte [V,C] (+=) dout scattered by token, each row's contributions added in (b,t) order;
// dwpe [maxT,C] (+=) dout summed over b in order of b (rows t < T only). workspace:
// embedding_backward_workspace bytes (the positions of each partition of the rows).
std::size_t embedding_backward_workspace(const Ctx& cx, std::int64_t B, std::int64_t T,
                                         std::int64_t C);
void embedding_backward(const Ctx& cx, float* dwte, float* dwpe, const float* dout,
                        const std::int32_t* tokens, std::int64_t B, std::int64_t T, std::int64_t C,
                        void* workspace);

// --- layernorm.cu --------------------------------------------------------------------------
// out [N,C] (out_elem) (=) (x - mean) * rstd * w + b; mean, rstd [N] saved. x, w, b f32.
void layernorm_forward(const Ctx& cx, void* out, Elem out_elem, float* mean, float* rstd,
                       const float* x, const float* w, const float* b, std::int64_t N,
                       std::int64_t C, float eps);
// residual [N,C] f32 (=) x + r; then out, mean, rstd as layernorm_forward of residual. r and out
// of one Elem.
void residual_layernorm_forward(const Ctx& cx, float* residual, void* out, Elem elem, float* mean,
                                float* rstd, const float* x, const void* r, const float* w,
                                const float* b, std::int64_t N, std::int64_t C, float eps);
// dx [N,C] (+=), dw [C] (+=), db [C] (+=) from dout [N,C] (dout_elem) and the saved x, w, mean,
// rstd. dw and db are summed over rows by a fixed tree (workspace).
std::size_t layernorm_backward_workspace(std::int64_t N, std::int64_t C);
void layernorm_backward(const Ctx& cx, float* dx, float* dw, float* db, const void* dout,
                        Elem dout_elem, const float* x, const float* w, const float* mean,
                        const float* rstd, std::int64_t N, std::int64_t C, void* workspace);

// --- swiglu.cu -----------------------------------------------------------------------------
// out [N,F] (=) silu(gu[:, :F]) * gu[:, F:]; dgu [N,2F] (=) its gradient from dout [N,F]. All
// tensors of one Elem; dgu may be gu.
void swiglu_forward(const Ctx& cx, void* out, const void* gu, Elem e, std::int64_t N,
                    std::int64_t F);
void swiglu_backward(const Ctx& cx, void* dgu, const void* gu, const void* dout, Elem e,
                     std::int64_t N, std::int64_t F);

// --- rope.cu -------------------------------------------------------------------------------
// out, x [B,T,W] (one Elem): the first rot_heads heads of D rotated by (cos, sin) [T, D/2] f32
// in the rotate-half form (by the opposite angle when inverse), the rest copied; out may be x.
void rope(const Ctx& cx, void* out, const void* x, Elem e, const float* cos, const float* sin,
          std::int64_t B, std::int64_t T, std::int64_t W, std::int64_t D, std::int64_t rot_heads,
          bool inverse);

// --- rmsnorm.cu ----------------------------------------------------------------------------
// out [N,C] (out_elem) (=) (x * rstd) * w, rstd = 1 / sqrt(mean(x^2) + eps) [N] saved; x, w f32.
void rmsnorm_forward(const Ctx& cx, void* out, Elem out_elem, float* rstd, const float* x,
                     const float* w, std::int64_t N, std::int64_t C, float eps);
// dx [N,C] (+=), dw [C] (+=) from dout [N,C] (dout_elem) and the saved x, w, rstd; dw summed
// over rows by a fixed tree (workspace).
// residual [N,C] f32 (=) x + r; then out, rstd as rmsnorm_forward of residual. r and out of one
// Elem.
void residual_rmsnorm_forward(const Ctx& cx, float* residual, void* out, Elem elem, float* rstd,
                              const float* x, const void* r, const float* w, std::int64_t N,
                              std::int64_t C, float eps);
std::size_t rmsnorm_backward_workspace(std::int64_t N, std::int64_t C);
void rmsnorm_backward(const Ctx& cx, float* dx, float* dw, const void* dout, Elem dout_elem,
                      const float* x, const float* w, const float* rstd, std::int64_t N,
                      std::int64_t C, void* workspace);

// --- matmul.cu -----------------------------------------------------------------------------
// For each batch element z in [0, batch):
//   c_z [M,N] (=) alpha * op(a_z) @ op(b_z) + beta * c_z (+ bias [N] broadcast over rows)
// a_z = a + z * stride_a elements (stride 0: one matrix for the whole batch), likewise b and c.
// op(a) [M,K]: a stored [M,K], or [K,M] with trans_a; op(b) [K,N]: b stored [K,N], or [N,K] with
// trans_b. a and b share ab_elem; c is f32 or ab_elem; bias f32 or nullptr, added as c_elem
// holds it (a 16-bit c: rounded to nearest even first; core/device.h's matmul contract). fp32
// accumulation in a fixed order over k. beta == 0 never reads c (NaN there does not propagate).
struct GemmArgs {
  void* c = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  const float* bias = nullptr;
  Elem c_elem = Elem::kF32, ab_elem = Elem::kF32;
  std::int64_t batch = 1, M = 0, N = 0, K = 0;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // in elements
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  // The bias rounded to c_elem (nearest even), set by the runtime only for a vendor library that
  // adds nothing but a bias of the output's type (GemmLibrary::bias_in_output_type): the same
  // values the contract adds. The own kernels read `bias` and round it themselves.
  const void* bias_lowp = nullptr;
  // The GELU epilogues (core/device.h matmul_bias_gelu / matmul_gelu_backward), at most one set,
  // both of c_elem with c's shape and strides, neither with beta != 0:
  //   gelu_out: c (=) the product as above, then gelu_out (=) gelu(c as stored);
  //   gelu_pre: c (=) gelu_backward(gelu_pre, the product as c would store it).
  // The own kernels give the bits of gemm() then gelu.cu's kernel (gelu_math.h).
  void* gelu_out = nullptr;
  const void* gelu_pre = nullptr;
  // Device memory for the own kernels' split-k partial products: scratch(scratch_owner, bytes)
  // returns `bytes`, valid for work enqueued before the next call (the device's stream-ordered
  // scratch). nullptr: the own kernels do not split k.
  void* (*scratch)(void* owner, std::size_t bytes) = nullptr;
  void* scratch_owner = nullptr;
};
// The project's own GEMM: gemm_tc below where it takes g, else matmul.cu's tiled kernels (16-bit
// inputs through the 64 x 64 matrix-tile kernel where the device runs tiles, else the scalar one).
void gemm(const Ctx& cx, const GemmArgs& g);
// Which of the own kernels gemm() runs for g and, for the general ones, why not gemm_tc: the path
// --profile names ("gemm_tc_kernel (gemm_tc.cu, 128x128 tiles)", "gemm_tile_kernel (...): a's rows
// are not 16-byte aligned ...", "gemm_kernel (...)").
std::string gemm_path(const Ctx& cx, const GemmArgs& g);
// --- gemm_tc.cu ----------------------------------------------------------------------------
// The same GEMM on the matrix tile in 128 x 128 block tiles (mma.sync + ldmatrix on sm_80+, MFMA
// on gfx90a/gfx94x, the runtime's collectives on SIMT, the tile's scalar form elsewhere), for what
// it takes: a device with matrix tiles, a and b of F16 or BF16 whose rows are 16-byte aligned (each
// pointer, leading dimension and batch stride). gemm_tc_refusal: nullptr when it takes g, else
// why not (a static string); gemm_tc throws std::invalid_argument with that reason.
const char* gemm_tc_refusal(const Ctx& cx, const GemmArgs& g);
void gemm_tc(const Ctx& cx, const GemmArgs& g);
// The k ranges gemm_tc splits g into (1: none): see Ctx::splitk and gemm_tc.cu.
int gemm_tc_splits(const Ctx& cx, const GemmArgs& g);
// dbias [N] (+=) column sums of dout [M,N] (dout_elem), by a fixed tree over rows (workspace).
std::size_t bias_backward_workspace(std::int64_t M, std::int64_t N);
void bias_backward(const Ctx& cx, float* dbias, const void* dout, Elem dout_elem, std::int64_t M,
                   std::int64_t N, void* workspace);

// --- attention.cu --------------------------------------------------------------------------
// Causal self-attention, scale 1/sqrt(hs), hs = C / NH, with NKV key/value heads (dividing NH;
// NKV = NH: plain multi-head attention), query head h reading key/value head h / (NH / NKV).
// qkv [B,T,C3], C3 = C + 2 NKV hs: q (NH heads) | k (NKV heads) | v (NKV heads); out [B,T,C],
// att [B,NH,T,T] (=) probabilities, zero above the diagonal; all of Elem e.
void attention_forward(const Ctx& cx, void* out, void* att, const void* qkv, Elem e, std::int64_t B,
                       std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t NKV);
// dqkv [B,T,C3] (=) gradient from dout [B,T,C] and the saved qkv, att; all of Elem e. The
// workspace (dpre, per query head) does not depend on NKV.
std::size_t attention_backward_workspace(std::int64_t B, std::int64_t T, std::int64_t C,
                                         std::int64_t NH);
void attention_backward(const Ctx& cx, void* dqkv, const void* dout, const void* qkv,
                        const void* att, Elem e, std::int64_t B, std::int64_t T, std::int64_t C,
                        std::int64_t NH, std::int64_t NKV, void* workspace);

// --- flash_attention.cu ---------------------------------------------------------------------
// The fused causal attention of core/device.h, NKV key/value heads as in attention.cu: qkv
// [B,T,C3], C3 = C + 2 NKV (C / NH), out [B,T,C] (=), lse [B,NH,T] f32 (=); q, k, v, out, dout,
// dqkv of Elem e. The forward takes the last Tq rows (1 <= Tq <= T): out [B,Tq,C] and lse
// [B,NH,Tq] of positions T - Tq .. T - 1 (Tq = T: the whole window). Head size at most
// kFlashMaxHeadSize (else std::invalid_argument). The backward needs
// flash_attention_backward_workspace bytes (D per query head: not NKV's).
inline constexpr int kFlashMaxHeadSize = 128;
void flash_attention_forward(const Ctx& cx, void* out, float* lse, const void* qkv, Elem e,
                             std::int64_t B, std::int64_t T, std::int64_t Tq, std::int64_t C,
                             std::int64_t NH, std::int64_t NKV);
std::size_t flash_attention_backward_workspace(std::int64_t B, std::int64_t T, std::int64_t NH);
void flash_attention_backward(const Ctx& cx, void* dqkv, const void* dout, const void* qkv,
                              const void* out, const float* lse, Elem e, std::int64_t B,
                              std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t NKV,
                              void* workspace);

// --- flash_attention_tc.cu ------------------------------------------------------------------
// The same ops through the matrix tile (FlashAttention-2 on mma.sync / MFMA, the scalar form on
// other targets), for what the tile takes: a device with matrix tiles (cx.matrix_tiles), q, k, v
// of F16 or BF16, or of F32 under TF32 (cx.tf32) at warp 32 (mma.sync m16n8k8 .tf32, not on
// HIP), head size 64 or 128, and 16-byte aligned tensors among `staged` (qkv in the forward, qkv
// and dout in the backward). flash_attention_tc_refusal says why not ("" when it takes them);
// the callers run the general kernels above then. Same contract, workspace and determinism (not
// the same bits: P and dS go through the tile in the element type, or in TF32 for f32).
std::string flash_attention_tc_refusal(const Ctx& cx, Elem e, std::int64_t hs,
                                       std::initializer_list<const void*> staged);
void flash_attention_tc_forward(const Ctx& cx, void* out, float* lse, const void* qkv, Elem e,
                                std::int64_t B, std::int64_t T, std::int64_t Tq, std::int64_t C,
                                std::int64_t NH, std::int64_t NKV);
void flash_attention_tc_backward(const Ctx& cx, void* dqkv, const void* dout, const void* qkv,
                                 const void* out, const float* lse, Elem e, std::int64_t B,
                                 std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t NKV,
                                 void* workspace);

// --- crossentropy.cu -----------------------------------------------------------------------
// Rows of Vp elements: V classes, then Vp - V columns of padding (core/device.h).
// losses [N] (=) -log softmax(logits[n, :V])[targets[n]]; logits [N,Vp] (Elem e), targets [N] i32.
void crossentropy_forward(const Ctx& cx, float* losses, const void* logits, Elem e,
                          const std::int32_t* targets, std::int64_t N, std::int64_t V,
                          std::int64_t Vp);
// dlogits[:, :V] (=) dloss * (softmax(logits[:, :V]) - onehot(targets)), dlogits[:, V:] (=) 0,
// Elem e; dlogits may be logits.
void crossentropy_backward(const Ctx& cx, void* dlogits, const void* logits, Elem e,
                           const std::int32_t* targets, std::int64_t N, std::int64_t V,
                           std::int64_t Vp, float dloss);
// Both in one kernel, in place: losses as crossentropy_forward, logits (=) their dlogits.
void crossentropy_forward_backward(const Ctx& cx, float* losses, void* logits, Elem e,
                                   const std::int32_t* targets, std::int64_t N, std::int64_t V,
                                   std::int64_t Vp, float dloss);

// --- reduce.cu -----------------------------------------------------------------------------
// out[0] = sum of x[0..n); deterministic: the reduction tree depends on n only, not on the warp
// size, the device or the number of host threads. partial needs reduce_sum_partials(n) floats.
int reduce_sum_partials(std::int64_t n);
void reduce_sum_f32(int warp, const float* x, float* partial, float* out, std::int64_t n,
                    void* stream);
// out[0] (=) scale * sum(x) / sqrt(sum(x^2)); x [n] f32. workspace: reduce_workspace(n) bytes.
std::size_t reduce_workspace(std::int64_t n);
void sum(const Ctx& cx, float* out, const float* x, std::int64_t n, float scale, void* workspace);
void norm(const Ctx& cx, float* out, const float* x, std::int64_t n, void* workspace);
// flag[0] |= any of x[0..n) is inf or NaN (never clears it).
void check_finite(const Ctx& cx, std::int32_t* flag, const float* x, std::int64_t n);
// x (=) x * inv_scale; flag[0] |= any x before or after scaling is inf or NaN.
void unscale_check(const Ctx& cx, float* x, std::int32_t* flag, float inv_scale, std::int64_t n);

// --- optimizers.cu -------------------------------------------------------------------------
// The fused steps of core/device.h, fp32; grad_norm is nullptr unless max_grad_norm > 0.
struct AdamArgs {
  float lr, beta1, beta2, eps, weight_decay, max_grad_norm;
  std::int64_t step;
};
// param16 (n, element e16: kF16 or kBF16) or nullptr: each updated parameter stored there too,
// rounded as convert() rounds.
void adamw(const Ctx& cx, float* param, const float* grad, float* m, float* v,
           const float* grad_norm, std::int64_t n, const AdamArgs& h, void* param16, Elem e16);
// adamw over `count` (<= kAdamMaxRanges) ascending, disjoint ranges in one launch (core/device.h
// adamw_groups): lr and the bias corrections read on the device from schedule [4] (AdamWSchedule:
// lr, step, bc1, bc2); h.lr, h.step are not read, and a range's decay is h.weight_decay or 0.
// param16 as adamw's (the ranges' elements only).
constexpr int kAdamMaxRanges = 8;
struct AdamRange {
  std::int64_t begin, len;
  bool decay;
};
void adamw_groups(const Ctx& cx, float* param, const float* grad, float* m, float* v,
                  const float* grad_norm, const float* schedule, const AdamRange* ranges, int count,
                  const AdamArgs& h, void* param16, Elem e16);
struct SgdArgs {
  float lr, momentum, dampening, weight_decay, max_grad_norm;
  bool nesterov;
  std::int64_t step;
};
// momentum_buf is nullptr when h.momentum == 0.
void sgd(const Ctx& cx, float* param, const float* grad, float* momentum_buf,
         const float* grad_norm, std::int64_t n, const SgdArgs& h);
struct LionArgs {
  float lr, beta1, beta2, weight_decay, max_grad_norm;
};
void lion(const Ctx& cx, float* param, const float* grad, float* m, const float* grad_norm,
          std::int64_t n, const LionArgs& h);
// Block-wise 8-bit AdamW (core/device.h adamw_8bit): blocks of 256, one thread block each.
void adamw_8bit(const Ctx& cx, float* param, const float* grad, std::uint8_t* m_q,
                std::uint8_t* v_q, float* m_absmax, float* v_absmax, const float* qmap_signed,
                const float* qmap_unsigned, const float* grad_norm, std::int64_t n,
                const AdamArgs& h);
struct AdafactorArgs {
  float lr, eps1, eps2, clip_threshold, decay_rate, beta1, weight_decay, max_grad_norm;
  bool relative_step, scale_parameter, warmup_init;
  std::int64_t step;
};
// Factored (rows R > 0): param, grad [R,C], row [R], col [C], v nullptr. Otherwise (R == 0):
// param, grad, v [C] and row, col nullptr. exp_avg nullptr unless beta1 > 0.
std::size_t adafactor_workspace(std::int64_t R, std::int64_t C);
void adafactor(const Ctx& cx, float* param, const float* grad, float* row, float* col, float* v,
               float* exp_avg, const float* grad_norm, std::int64_t R, std::int64_t C,
               const AdafactorArgs& h, void* workspace);

}  // namespace ct::gpu
