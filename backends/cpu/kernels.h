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

// c = alpha * op(a) @ op(b) + beta * c (+ bias), for `batch` matrices. c is f32 here; c_dtype
// is the dtype the device stores it in afterwards: a 16-bit one adds the bias rounded to that
// dtype (core/device.h's matmul contract).
struct MatmulArgs {
  float* c = nullptr;           // [batch, M, N]
  const float* a = nullptr;     // [batch?, M, K], or [batch?, K, M] with trans_a
  const float* b = nullptr;     // [batch?, K, N], or [batch?, N, K] with trans_b
  const float* bias = nullptr;  // [N] or null
  DType c_dtype = DType::f32;   // f32, f16 or bf16
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
  const float* bias = nullptr;  // (N) or null; added rounded to bf16 when c_bf16
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false, c_bf16 = false;
  float alpha = 1.0f, beta = 0.0f;
};

// A product whose a, b, c are each f32, bf16 or f16 (c row-major (M,N), a (M,K) or (K,M) with
// trans_a, b (K,N) or (N,K) with trans_b; bias (N) f32, added rounded to c's type): the fast
// levels' own packing GEMM (fast/gemm_packed.cpp), which widens 16-bit operands as it packs them.
// matmul_packed declines products of several rows whose N or K is larger (a vocabulary-sized
// head): the device widens their operands into f32 copies for sgemm, the faster there
// (cpu_device.cpp). A product of one row it takes at any size, reading b in place (run_row); the
// f32 matmul sends its one-row products there too.
inline constexpr int64_t kPackedGemmMaxNK = 8192;
struct MatmulPackedArgs {
  void* c = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  const float* bias = nullptr;
  DType c_dtype = DType::f32, a_dtype = DType::f32, b_dtype = DType::f32;
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
};

// The fields a single-product kernel's arguments (MatmulBf16Args, MatmulPackedArgs) share with
// m: a batch of row-major a against one b (the callers checked) as one tall product.
template <class Args>
Args one_product(const MatmulArgs& m) {
  Args x;
  x.bias = m.bias;
  x.M = m.batch * m.M;
  x.N = m.N;
  x.K = m.K;
  x.trans_a = m.trans_a;
  x.trans_b = m.trans_b;
  x.alpha = m.alpha;
  x.beta = m.beta;
  return x;
}

// Kernels on bf16 tensors that read and write the 16 bits directly, widening in registers or
// in per-thread scratch while the data is in cache: each gives the bits of its f32 kernel on the
// widened inputs, rounded to nearest even where it stores bf16 (the device's staged path) in one
// pass and one OpenMP region. The fast tables have them; the reference's slots are null and the
// device stages instead.
//   gelu_*_bf16: fast/gelu.cpp; bias_backward_bf16: fast/matmul.cpp;
//   residual_layernorm_forward_bf16 (r, out bf16), layernorm_backward_bf16 (dout bf16):
//   fast/layernorm.cpp;
//   flash_attention_*_bf16: fast/flash_attention.cpp (out, dqkv, dout, qkv bf16; lse f32).
#define CT_CPU_BF16_KERNELS(X)                                                                  \
  X(gelu_forward_bf16, (uint16_t * out, const uint16_t* x, int64_t n))                          \
  X(gelu_backward_bf16, (uint16_t * dx, const uint16_t* x, const uint16_t* dout, int64_t n))    \
  X(bias_backward_bf16, (float* dbias, const uint16_t* dout, int64_t M, int64_t N))             \
  X(residual_layernorm_forward_bf16,                                                            \
    (float* res, uint16_t* out, float* mean, float* rstd, const float* x, const uint16_t* r,    \
     const float* w, const float* b, int64_t N, int64_t C, float eps))                          \
  X(layernorm_backward_bf16,                                                                    \
    (Workspace & ws, float* dx, float* dw, float* db, const uint16_t* dout, const float* x,     \
     const float* w, const float* mean, const float* rstd, int64_t N, int64_t C))               \
  X(flash_attention_forward_bf16,                                                               \
    (Workspace & ws, uint16_t * out, float* lse, const uint16_t* qkv, int64_t B, int64_t T,     \
     int64_t Tq, int64_t C, int64_t NH, int64_t NKV))                                           \
  X(flash_attention_backward_bf16, (Workspace & ws, uint16_t * dqkv, const uint16_t* dout,      \
                                    const uint16_t* qkv, const uint16_t* out, const float* lse, \
                                    int64_t B, int64_t T, int64_t C, int64_t NH, int64_t NKV))

// One table of function pointers per family: a slot per line of kernels.def, by name.
struct Kernels {
#define CT_CPU_KERNEL(name, params) void(*name) params;
#include "backends/cpu/kernels.def"
  // Optional (null in the reference): a native bf16 matmul. Returns false when it cannot take
  // the call (library missing, CPU without bf16 instructions, unsupported case); the device
  // then widens to f32 and uses matmul().
  bool (*matmul_bf16)(const MatmulBf16Args& m);
  // Optional (null in the reference): the packing GEMM for 16-bit operands (MatmulPackedArgs);
  // false where the level has no kernel for it (below AVX2 + FMA + F16C).
  bool (*matmul_packed)(const MatmulPackedArgs& m);
  // Optional (null in the reference): CT_CPU_BF16_KERNELS below.
#define CT_CPU_KERNEL(name, params) void(*name) params;
  CT_CPU_BF16_KERNELS(CT_CPU_KERNEL)
#undef CT_CPU_KERNEL
};

// Each family's functions, declared from kernels.def in its namespace (ref, or fast::<level>).
namespace ref {
#define CT_CPU_KERNEL(name, params) void name params;
#include "backends/cpu/kernels.def"
}  // namespace ref
namespace fast {
// The fast kernels (backends/cpu/fast/*.cpp) are compiled once per instruction-set level
// (CMakeLists.txt), each copy into its own namespace, named by the compile definition CT_CPU_ISA:
// fast::x86_64_v2 (SSE4.2, POPCNT), fast::avx2 (x86-64-v3: AVX2, FMA, F16C, BMI2) and
// fast::avx512_bf16 (x86-64-v4 with AVX512_BF16 and AVX512_VNNI). kernel_tables.cpp picks one
// table at run time (backends/cpu/isa.h). Inline functions of fast/*.h live in the same
// namespaces, so no level calls another level's copy.
namespace x86_64_v2 {
#define CT_CPU_KERNEL(name, params) void name params;
#include "backends/cpu/kernels.def"
#define CT_CPU_KERNEL(name, params) void name params;
CT_CPU_BF16_KERNELS(CT_CPU_KERNEL)
#undef CT_CPU_KERNEL
bool matmul_packed(const MatmulPackedArgs& m);
}  // namespace x86_64_v2
namespace avx2 {
#define CT_CPU_KERNEL(name, params) void name params;
#include "backends/cpu/kernels.def"
#define CT_CPU_KERNEL(name, params) void name params;
CT_CPU_BF16_KERNELS(CT_CPU_KERNEL)
#undef CT_CPU_KERNEL
bool matmul_packed(const MatmulPackedArgs& m);
}  // namespace avx2
namespace avx512_bf16 {
#define CT_CPU_KERNEL(name, params) void name params;
#include "backends/cpu/kernels.def"
#define CT_CPU_KERNEL(name, params) void name params;
CT_CPU_BF16_KERNELS(CT_CPU_KERNEL)
#undef CT_CPU_KERNEL
bool matmul_packed(const MatmulPackedArgs& m);
}  // namespace avx512_bf16

// Shared by the levels, compiled once (onednn_matmul.cpp): oneDNN picks its own kernels.
bool matmul_bf16(const MatmulBf16Args& m);
bool matmul_bf16_available();       // matmul_bf16 takes calls (a CPU with bf16 instructions)
const char* bf16_matmul_library();  // what runs matmul_bf16 ("oneDNN 2.6 ...") or why nothing does
// oneDNN's f32 matmul, c = alpha a op(b) + beta c (+ bias) with row-major a (see
// onednn_matmul.cpp); false when it does not take the call (then c is untouched).
bool matmul_f32_onednn(float* c, const float* a, const float* b, const float* bias, int64_t M,
                       int64_t N, int64_t K, bool trans_b, float alpha, float beta);
bool onednn_f32_available();
const char*
f32_matmul_library();  // the f32 GEMM libraries and which products take which, for `devices`
}  // namespace fast

// The tables (kernel_tables.cpp). fast_kernels() is the level chosen at run time
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
