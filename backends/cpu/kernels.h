// The CPU kernels behind both CPU devices: raw pointers and sizes, no validation (the device
// checks every argument before calling in). Two implementations share this table:
// cpu::ref (backends/cpu/reference/*.cpp, the oracle) and cpu::fast (backends/cpu/fast/*.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/cpu/isa.h"
#include "core/device.h"
#include "core/dtype.h"

namespace ct::cpu {

// Scratch memory owned by the device and accounted as MemCategory::kWorkspace. The pointer is
// valid until the next get(); kernels take one block and split it.
class Workspace {
 public:
  virtual ~Workspace() = default;
  virtual void* get(size_t bytes) = 0;  // 64-byte aligned
};

// c = alpha * op(a) @ op(b) + beta * c (+ bias), for `batch` matrices.
struct MatmulArgs {
  float* c = nullptr;           // [batch, M, N]
  const float* a = nullptr;     // [batch?, M, K], or [batch?, K, M] with trans_a
  const float* b = nullptr;     // [batch?, K, N], or [batch?, N, K] with trans_b
  const float* bias = nullptr;  // [N] or null
  int64_t batch = 1, M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  bool a_batched = false, b_batched = false;  // false: one matrix broadcast over the batch
  float alpha = 1.0f, beta = 0.0f;            // beta == 0: c is not read (BLAS semantics)
};

// The same for bf16 a, b (and c when c_bf16), one (M,N) product; for oneDNN's bf16 matmul.
struct MatmulBf16Args {
  void* c = nullptr;            // (M,N) f32, or bf16 when c_bf16
  const uint16_t* a = nullptr;  // (M,K) or (K,M) with trans_a
  const uint16_t* b = nullptr;  // (K,N) or (N,K) with trans_b
  const float* bias = nullptr;  // (N) or null
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false, c_bf16 = false;
  float alpha = 1.0f, beta = 0.0f;
};

struct Kernels {
  void (*fill)(void* p, DType dt, int64_t n, float value);
  void (*copy)(void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n);
  void (*add)(float* out, const float* a, const float* b, int64_t n);
  void (*accumulate)(float* dst, const float* src, int64_t n);
  void (*scale)(float* t, float s, int64_t n);

  void (*embedding_forward)(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                            int64_t B, int64_t T, int64_t C);
  void (*embedding_backward)(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                             int64_t B, int64_t T, int64_t C);

  void (*layernorm_forward)(float* out, float* mean, float* rstd, const float* x, const float* w,
                            const float* b, int64_t N, int64_t C, float eps);
  void (*layernorm_backward)(Workspace& ws, float* dx, float* dw, float* db, const float* dout,
                             const float* x, const float* w, const float* mean, const float* rstd,
                             int64_t N, int64_t C);

  void (*rmsnorm_forward)(float* out, float* rstd, const float* x, const float* w, int64_t N,
                          int64_t C, float eps);
  void (*rmsnorm_backward)(Workspace& ws, float* dx, float* dw, const float* dout, const float* x,
                           const float* w, const float* rstd, int64_t N, int64_t C);

  void (*matmul)(Workspace& ws, const MatmulArgs& m);
  void (*bias_backward)(float* dbias, const float* dout, int64_t M, int64_t N);

  // Attention: qkv rows [C + 2 NKV hs] (q | k | v), hs = C / NH; query head h reads key/value
  // head h / (NH / NKV) (grouped-query attention; NKV = NH is multi-head attention).
  void (*attention_forward)(Workspace& ws, float* out, float* att, const float* qkv, int64_t B,
                            int64_t T, int64_t C, int64_t NH, int64_t NKV);
  void (*attention_backward)(Workspace& ws, float* dqkv, const float* dout, const float* qkv,
                             const float* att, int64_t B, int64_t T, int64_t C, int64_t NH,
                             int64_t NKV);
  void (*flash_attention_forward)(Workspace& ws, float* out, float* lse, const float* qkv,
                                  int64_t B, int64_t T, int64_t C, int64_t NH, int64_t NKV);
  void (*flash_attention_backward)(Workspace& ws, float* dqkv, const float* dout, const float* qkv,
                                   const float* out, const float* lse, int64_t B, int64_t T,
                                   int64_t C, int64_t NH, int64_t NKV);

  void (*gelu_forward)(float* out, const float* x, int64_t n);
  void (*gelu_backward)(float* dx, const float* x, const float* dout, int64_t n);
  void (*swiglu_forward)(float* out, const float* gu, int64_t N, int64_t F);
  void (*swiglu_backward)(float* dgu, const float* gu, const float* dout, int64_t N, int64_t F);
  void (*rope)(float* out, const float* x, const float* cos, const float* sin, int64_t B, int64_t T,
               int64_t W, int64_t D, int64_t rot_heads, bool inverse);
  void (*dropout)(float* out, const float* x, int64_t n, const DropoutMask& mask);

  void (*crossentropy_forward)(float* losses, const float* logits, const int32_t* targets,
                               int64_t N, int64_t V);
  void (*crossentropy_backward)(float* dlogits, const float* logits, const int32_t* targets,
                                int64_t N, int64_t V, float dloss);

  void (*sum)(float* out, const float* x, int64_t n, float scale);
  void (*norm)(float* out, const float* x, int64_t n);
  void (*check_finite)(int32_t* flag, const float* x, int64_t n);
  void (*unscale_check)(float* x, int32_t* flag, float inv_scale, int64_t n);
  void (*adamw)(float* param, const float* grad, float* m, float* v, const float* grad_norm,
                int64_t n, const AdamWHyper& hp);
  // Optimizers (core/device.h's contracts; backends/cpu/*/optimizers.cpp). grad_norm is null
  // when not clipping; buf is null without momentum; row/col null for an unfactored Adafactor
  // tensor (then v, n = R * C), v null for a factored one; exp_avg null without beta1.
  void (*sgd)(float* param, const float* grad, float* buf, const float* grad_norm, int64_t n,
              const SgdHyper& hp);
  void (*lion)(float* param, const float* grad, float* m, const float* grad_norm, int64_t n,
               const LionHyper& hp);
  void (*adamw_8bit)(float* param, const float* grad, uint8_t* m_q, uint8_t* v_q, float* m_absmax,
                     float* v_absmax, const float* qmap_signed, const float* qmap_unsigned,
                     const float* grad_norm, int64_t n, const AdamWHyper& hp);
  void (*adafactor)(float* param, const float* grad, float* row, float* col, float* v,
                    float* exp_avg, const float* grad_norm, int64_t R, int64_t C,
                    const AdafactorHyper& hp);
  // Optional (null in the reference): a native bf16 matmul. Returns false when it cannot take
  // the call (library missing, CPU without bf16 instructions, unsupported case); the device
  // then widens to f32 and uses matmul().
  bool (*matmul_bf16)(const MatmulBf16Args& m);
};

// Declares one family's functions in a namespace (ref or fast), so both sides keep one list.
#define CT_CPU_DECLARE_KERNELS                                                                     \
  void fill(void* p, DType dt, int64_t n, float value);                                            \
  void copy(void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n);                    \
  void add(float* out, const float* a, const float* b, int64_t n);                                 \
  void accumulate(float* dst, const float* src, int64_t n);                                        \
  void scale(float* t, float s, int64_t n);                                                        \
  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,    \
                         int64_t B, int64_t T, int64_t C);                                         \
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,      \
                          int64_t B, int64_t T, int64_t C);                                        \
  void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,     \
                         const float* b, int64_t N, int64_t C, float eps);                         \
  void layernorm_backward(Workspace& ws, float* dx, float* dw, float* db, const float* dout,       \
                          const float* x, const float* w, const float* mean, const float* rstd,    \
                          int64_t N, int64_t C);                                                   \
  void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N,         \
                       int64_t C, float eps);                                                      \
  void rmsnorm_backward(Workspace& ws, float* dx, float* dw, const float* dout, const float* x,    \
                        const float* w, const float* rstd, int64_t N, int64_t C);                  \
  void matmul(Workspace& ws, const MatmulArgs& m);                                                 \
  void bias_backward(float* dbias, const float* dout, int64_t M, int64_t N);                       \
  void attention_forward(Workspace& ws, float* out, float* att, const float* qkv, int64_t B,       \
                         int64_t T, int64_t C, int64_t NH, int64_t NKV);                           \
  void attention_backward(Workspace& ws, float* dqkv, const float* dout, const float* qkv,         \
                          const float* att, int64_t B, int64_t T, int64_t C, int64_t NH,           \
                          int64_t NKV);                                                            \
  void flash_attention_forward(Workspace& ws, float* out, float* lse, const float* qkv, int64_t B, \
                               int64_t T, int64_t C, int64_t NH, int64_t NKV);                     \
  void flash_attention_backward(Workspace& ws, float* dqkv, const float* dout, const float* qkv,   \
                                const float* out, const float* lse, int64_t B, int64_t T,          \
                                int64_t C, int64_t NH, int64_t NKV);                               \
  void gelu_forward(float* out, const float* x, int64_t n);                                        \
  void gelu_backward(float* dx, const float* x, const float* dout, int64_t n);                     \
  void swiglu_forward(float* out, const float* gu, int64_t N, int64_t F);                          \
  void swiglu_backward(float* dgu, const float* gu, const float* dout, int64_t N, int64_t F);      \
  void rope(float* out, const float* x, const float* cos, const float* sin, int64_t B, int64_t T,  \
            int64_t W, int64_t D, int64_t rot_heads, bool inverse);                                \
  void dropout(float* out, const float* x, int64_t n, const DropoutMask& mask);                    \
  void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t N, \
                            int64_t V);                                                            \
  void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,          \
                             int64_t N, int64_t V, float dloss);                                   \
  void sum(float* out, const float* x, int64_t n, float scale);                                    \
  void norm(float* out, const float* x, int64_t n);                                                \
  void check_finite(int32_t* flag, const float* x, int64_t n);                                     \
  void unscale_check(float* x, int32_t* flag, float inv_scale, int64_t n);                         \
  void adamw(float* param, const float* grad, float* m, float* v, const float* grad_norm,          \
             int64_t n, const AdamWHyper& hp);                                                     \
  void sgd(float* param, const float* grad, float* buf, const float* grad_norm, int64_t n,         \
           const SgdHyper& hp);                                                                    \
  void lion(float* param, const float* grad, float* m, const float* grad_norm, int64_t n,          \
            const LionHyper& hp);                                                                  \
  void adamw_8bit(float* param, const float* grad, uint8_t* m_q, uint8_t* v_q, float* m_absmax,    \
                  float* v_absmax, const float* qmap_signed, const float* qmap_unsigned,           \
                  const float* grad_norm, int64_t n, const AdamWHyper& hp);                        \
  void adafactor(float* param, const float* grad, float* row, float* col, float* v,                \
                 float* exp_avg, const float* grad_norm, int64_t R, int64_t C,                     \
                 const AdafactorHyper& hp);

namespace ref {
CT_CPU_DECLARE_KERNELS
}  // namespace ref
namespace fast {
// The fast kernels (backends/cpu/fast/*.cpp) are compiled once per instruction-set level
// (CMakeLists.txt), each copy into its own namespace, named by the compile definition CT_CPU_ISA:
// fast::x86_64_v2 (SSE4.2, POPCNT), fast::avx2 (x86-64-v3: AVX2, FMA, F16C, BMI2) and
// fast::avx512_bf16 (x86-64-v4 with AVX512_BF16 and AVX512_VNNI). kernel_tables.cpp picks one
// table at run time (backends/cpu/isa.h). Inline functions of fast/*.h live in the same
// namespaces, so no level calls another level's copy.
namespace x86_64_v2 {
CT_CPU_DECLARE_KERNELS
}  // namespace x86_64_v2
namespace avx2 {
CT_CPU_DECLARE_KERNELS
}  // namespace avx2
namespace avx512_bf16 {
CT_CPU_DECLARE_KERNELS
}  // namespace avx512_bf16

// Shared by the levels, compiled once (onednn_matmul.cpp): oneDNN picks its own kernels.
bool matmul_bf16(const MatmulBf16Args& m);
const char* bf16_matmul_library();  // what runs matmul_bf16 ("oneDNN 2.6 ...") or why nothing does
// oneDNN's f32 matmul, c = alpha a op(b) + beta c (+ bias) with row-major a (see
// onednn_matmul.cpp); false when it does not take the call (then c is untouched).
bool matmul_f32_onednn(float* c, const float* a, const float* b, const float* bias, int64_t M,
                       int64_t N, int64_t K, bool trans_b, float alpha, float beta);
bool onednn_f32_available();
const char*
f32_matmul_library();  // the f32 GEMM libraries and which products take which, for `devices`
}  // namespace fast

// The tables, in declaration order of Kernels. fast_kernels() is the level chosen at run time
// (isa.h: the best the CPU supports, or CT_CPU_ISA's), fast_kernels(level) a given one.
const Kernels& reference_kernels();
const Kernels& fast_kernels();
const Kernels& fast_kernels(IsaLevel level);

// Shared scalar helpers (same formula on both sides).

// The gradient clipping factor of every optimizer op: min(1, max / (norm + 1e-6)).
inline double clip_factor(float max_grad_norm, const float* grad_norm) {
  if (!(max_grad_norm > 0.0f) || !grad_norm) return 1.0;
  double c = static_cast<double>(max_grad_norm) / (static_cast<double>(grad_norm[0]) + 1e-6);
  return c < 1.0 ? c : 1.0;
}

// nearest(code, x) of the 8-bit optimizer contract: the index minimising |code[i] - x|, the
// lower index on a tie; code[256] sorted ascending. Binary search, then the two neighbours.
// Branch-free (eight conditional adds), since the comparisons are unpredictable.
inline uint8_t quantize_nearest(const float* code, float x) {
  int lo = 0;  // becomes the number of codes < x: the first index with code[i] >= x
  for (int step = 128; step > 0; step >>= 1) lo += (code[lo + step - 1] < x) ? step : 0;
  if (lo == 256) return 255;
  if (lo == 0) return 0;
  return static_cast<uint8_t>((x - code[lo - 1] <= code[lo] - x) ? lo - 1 : lo);
}
// read_as_f32 / write_from_f32 (integers saturate): core/dtype.h.

}  // namespace ct::cpu
