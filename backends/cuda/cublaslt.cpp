// cuBLASLt through dlopen: the handful of entry points used, typed from the header, resolved
// from libcublasLt.so.13 (or .so.12), version checked.
//
// Row-major c [M, N] = op(a) op(b) is column-major c^T [N, M] = op(b)^T op(a)^T: cuBLASLt gets
// b as its A and a as its B with the same transpose flags, and the bias epilogue's per-row
// vector of the column-major result is our per-column bias [N].
//
// The GELU epilogues (GemmArgs::gelu_out / gelu_pre): GELU_AUX_BIAS writes gelu(product + bias)
// to D and the pre-activation to its auxiliary matrix, so D is our gelu_out and the auxiliary
// matrix our c; DGELU reads the pre-activation from the auxiliary matrix (our gelu_pre) and
// writes product * gelu'(pre) to D, our c. The auxiliary matrix has c's layout (ld N) and type.
#include "backends/cuda/cublaslt.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"

namespace ct::cuda {

// One product's descriptors and the algorithm the heuristic chose for it, made on the first call
// with its key and reused (no heuristic query per call; the same algorithm on every run, so
// results repeat bit for bit on one GPU). ok == false: cuBLASLt has no algorithm for it.
struct Plan {
  bool ok = false;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
};
// What the plan depends on: types, compute type, transposes, sizes, batch strides, the bias's
// type (-1: none), beta != 0, the alignment of each operand (its address and batch stride), the
// GELU epilogue (0 none, 1 forward, 2 backward) and its auxiliary matrix's alignment.
using PlanKey = std::array<int64_t, 20>;

struct Cublaslt::Lib {
  std::map<PlanKey, Plan> plans;
  void* handle = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = std::size_t{32} << 20;
  std::size_t version = 0;
#define CT_LT_FN(name) decltype(&::name) name = nullptr
  CT_LT_FN(cublasLtGetVersion);
  CT_LT_FN(cublasLtCreate);
  CT_LT_FN(cublasLtDestroy);
  CT_LT_FN(cublasLtMatmulDescCreate);
  CT_LT_FN(cublasLtMatmulDescDestroy);
  CT_LT_FN(cublasLtMatmulDescSetAttribute);
  CT_LT_FN(cublasLtMatrixLayoutCreate);
  CT_LT_FN(cublasLtMatrixLayoutDestroy);
  CT_LT_FN(cublasLtMatrixLayoutSetAttribute);
  CT_LT_FN(cublasLtMatmulPreferenceCreate);
  CT_LT_FN(cublasLtMatmulPreferenceDestroy);
  CT_LT_FN(cublasLtMatmulPreferenceSetAttribute);
  CT_LT_FN(cublasLtMatmulAlgoGetHeuristic);
  CT_LT_FN(cublasLtMatmul);
#undef CT_LT_FN
  void destroy(Plan& p) {
    if (p.lc) cublasLtMatrixLayoutDestroy(p.lc);
    if (p.lb) cublasLtMatrixLayoutDestroy(p.lb);
    if (p.la) cublasLtMatrixLayoutDestroy(p.la);
    if (p.op) cublasLtMatmulDescDestroy(p.op);
    p = Plan{};
  }
};

namespace {

template <typename F>
bool resolve(void* h, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(h, name));
  return *fn != nullptr;
}

cudaDataType_t data_type(gpu::Elem e) {
  switch (e) {
    case gpu::Elem::kF16:
      return CUDA_R_16F;
    case gpu::Elem::kBF16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

std::int64_t elem_bytes(gpu::Elem e) {
  return e == gpu::Elem::kF16 || e == gpu::Elem::kBF16 ? 2 : 4;
}

// The largest power of two up to 256 dividing the address and the batch stride in bytes: what
// every matrix of the batch is aligned to (cuBLASLt's MIN_ALIGNMENT preferences).
std::int64_t alignment(const void* p, std::int64_t stride_bytes) {
  const auto bits = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)) |
                    static_cast<std::uint64_t>(stride_bytes) | 256u;
  return static_cast<std::int64_t>(bits & (~bits + 1));
}

}  // namespace

Cublaslt::Cublaslt() : lib_(std::make_unique<Lib>()) {
  Lib& l = *lib_;
  // The dynamic linker's search first, then CUDA's own folders: a bundle (scripts/bundle.sh)
  // finds the toolkit's cuBLASLt without LD_LIBRARY_PATH.
  std::vector<std::string> dirs = {""};
  if (const char* home = std::getenv("CUDA_HOME"); home && *home)
    dirs.push_back(std::string(home) + "/lib64/");
  dirs.push_back("/usr/local/cuda/lib64/");
  for (const std::string& dir : dirs) {
    for (const char* so : {"libcublasLt.so.13", "libcublasLt.so.12"}) {
      l.handle = dlopen((dir + so).c_str(), RTLD_NOW | RTLD_LOCAL);
      if (l.handle) break;
    }
    if (l.handle) break;
  }
  if (!l.handle) {
    why_ =
        "libcublasLt.so.13 / .so.12 not found (searched: the library path, $CUDA_HOME/lib64, "
        "/usr/local/cuda/lib64)";
    return;
  }
  bool ok = true;
#define CT_LT_RESOLVE(name) ok = ok && resolve(l.handle, #name, &l.name)
  CT_LT_RESOLVE(cublasLtGetVersion);
  CT_LT_RESOLVE(cublasLtCreate);
  CT_LT_RESOLVE(cublasLtDestroy);
  CT_LT_RESOLVE(cublasLtMatmulDescCreate);
  CT_LT_RESOLVE(cublasLtMatmulDescDestroy);
  CT_LT_RESOLVE(cublasLtMatmulDescSetAttribute);
  CT_LT_RESOLVE(cublasLtMatrixLayoutCreate);
  CT_LT_RESOLVE(cublasLtMatrixLayoutDestroy);
  CT_LT_RESOLVE(cublasLtMatrixLayoutSetAttribute);
  CT_LT_RESOLVE(cublasLtMatmulPreferenceCreate);
  CT_LT_RESOLVE(cublasLtMatmulPreferenceDestroy);
  CT_LT_RESOLVE(cublasLtMatmulPreferenceSetAttribute);
  CT_LT_RESOLVE(cublasLtMatmulAlgoGetHeuristic);
  CT_LT_RESOLVE(cublasLtMatmul);
#undef CT_LT_RESOLVE
  if (!ok) {
    why_ = std::string("libcublasLt lacks an entry point: ") + dlerror();
    return;
  }
  l.version = l.cublasLtGetVersion();
  if (l.version < 120000) {
    why_ = "libcublasLt " + std::to_string(l.version) + " is older than 12.0";
    return;
  }
  if (l.cublasLtCreate(&l.lt) != CUBLAS_STATUS_SUCCESS) {
    why_ = "cublasLtCreate failed";
    l.lt = nullptr;
    return;
  }
  if (cudaMalloc(&l.workspace, l.workspace_bytes) != cudaSuccess) {
    cudaGetLastError();
    l.workspace = nullptr;
    l.workspace_bytes = 0;
  }
}

Cublaslt::~Cublaslt() {
  Lib& l = *lib_;
  for (auto& [key, plan] : l.plans) l.destroy(plan);
  if (l.workspace) cudaFree(l.workspace);
  if (l.lt) l.cublasLtDestroy(l.lt);
  // the library stays loaded: cuBLASLt keeps process-wide state until exit
}

std::string Cublaslt::describe() const {
  if (!why_.empty()) return "own tiled kernel (cuBLASLt unavailable: " + why_ + ")";
  return "cuBLASLt " + std::to_string(lib_->version) + (tf32_ ? " (fp32 products in TF32)" : "") +
         "; own kernel where it has no algorithm";
}

bool Cublaslt::bias_in_output_type(const gpu::GemmArgs& g) const {
  return g.bias && g.c_elem != gpu::Elem::kF32;
}

bool Cublaslt::gemm(const gpu::GemmArgs& g, void* stream_ptr) {
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  Lib& l = *lib_;
  if (!why_.empty() || !l.lt) return false;
  if (g.M > INT32_MAX || g.N > INT32_MAX || g.K > INT32_MAX || g.K == 0) return false;
  // The auxiliary matrix: our c in the forward, gelu_pre in the backward (see the top).
  const int gelu = g.gelu_out ? 1 : g.gelu_pre ? 2 : 0;
  const void* aux = gelu == 1 ? g.c : g.gelu_pre;
  void* d_out = gelu == 1 ? g.gelu_out : g.c;
  if (gelu && (g.beta != 0.0f || g.N % 8 != 0)) return false;  // aux ld: a multiple of 8
  const cudaDataType_t ab = data_type(g.ab_elem), ct = data_type(g.c_elem);
  const cublasComputeType_t compute =
      g.ab_elem == gpu::Elem::kF32 && tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // The bias: f32 with an f32 output; with a 16-bit one only in that type (bias_in_output_type).
  const void* bias = g.bias;
  cudaDataType_t bias_type = CUDA_R_32F;
  if (g.bias && bias_in_output_type(g)) {
    if (!g.bias_lowp) return false;
    bias = g.bias_lowp;
    bias_type = ct;
  }
  const std::int64_t batched = g.batch > 1 ? 1 : 0;
  const PlanKey key = {static_cast<int64_t>(ab),
                       static_cast<int64_t>(ct),
                       static_cast<int64_t>(compute),
                       g.trans_a ? 1 : 0,
                       g.trans_b ? 1 : 0,
                       g.M,
                       g.N,
                       g.K,
                       g.batch,
                       batched * g.stride_a,
                       batched * g.stride_b,
                       batched * g.stride_c,
                       bias ? static_cast<int64_t>(bias_type) : -1,
                       g.beta != 0.0f ? 1 : 0,
                       alignment(g.a, batched * g.stride_a * elem_bytes(g.ab_elem)),
                       alignment(g.b, batched * g.stride_b * elem_bytes(g.ab_elem)),
                       alignment(d_out, batched * g.stride_c * elem_bytes(g.c_elem)),
                       bias ? alignment(bias, 0) : 0,
                       gelu,
                       gelu ? alignment(aux, batched * g.stride_c * elem_bytes(g.c_elem)) : 0};
  auto [it, fresh] = l.plans.try_emplace(key);
  Plan& p = it->second;
  if (fresh) {
    do {
      if (l.cublasLtMatmulDescCreate(&p.op, compute, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) break;
      // cuBLASLt's A is our b, its B our a (see the top of the file).
      const cublasOperation_t ta = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
      const cublasOperation_t tb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
      l.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
      l.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
      const cublasLtEpilogue_t epi =
          gelu == 2   ? CUBLASLT_EPILOGUE_DGELU
          : gelu == 1 ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
          : bias      ? CUBLASLT_EPILOGUE_BIAS
                      : CUBLASLT_EPILOGUE_DEFAULT;
      l.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
      if (gelu) {
        const int64_t ld = g.N, stride = batched * g.stride_c;
        l.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                         sizeof aux);
        l.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                         sizeof ld);
        if (g.batch > 1)
          l.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE,
                                           &stride, sizeof stride);
      }
      if (bias) {
        l.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                         sizeof bias);
        l.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                         sizeof bias_type);
      }
      // Column-major views: b stored [K, N] (or [N, K] transposed) is N x K (K x N) with ld N (K).
      const uint64_t b_rows = g.trans_b ? g.K : g.N, b_cols = g.trans_b ? g.N : g.K;
      const uint64_t a_rows = g.trans_a ? g.M : g.K, a_cols = g.trans_a ? g.K : g.M;
      if (l.cublasLtMatrixLayoutCreate(&p.la, ab, b_rows, b_cols, static_cast<int64_t>(b_rows)) !=
              CUBLAS_STATUS_SUCCESS ||
          l.cublasLtMatrixLayoutCreate(&p.lb, ab, a_rows, a_cols, static_cast<int64_t>(a_rows)) !=
              CUBLAS_STATUS_SUCCESS ||
          l.cublasLtMatrixLayoutCreate(&p.lc, ct, g.N, g.M, g.N) != CUBLAS_STATUS_SUCCESS)
        break;
      if (g.batch > 1) {
        const int32_t count = static_cast<int32_t>(g.batch);
        const int64_t sa = g.stride_b, sb = g.stride_a, sc = g.stride_c;
        for (auto [layout, stride] :
             {std::pair{p.la, sa}, std::pair{p.lb, sb}, std::pair{p.lc, sc}}) {
          l.cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                             sizeof count);
          l.cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                             &stride, sizeof stride);
        }
      }
      cublasLtMatmulPreference_t pref = nullptr;
      if (l.cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) break;
      l.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &l.workspace_bytes, sizeof l.workspace_bytes);
      // The operands' alignment (cuBLASLt otherwise assumes 256 bytes): A is our b, B our a.
      const uint32_t al_a = static_cast<uint32_t>(key[15]), al_b = static_cast<uint32_t>(key[14]),
                     al_c = static_cast<uint32_t>(key[16]);
      l.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                             &al_a, sizeof al_a);
      l.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                             &al_b, sizeof al_b);
      l.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                             &al_c, sizeof al_c);
      l.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                             &al_c, sizeof al_c);
      cublasLtMatmulHeuristicResult_t heur{};
      int found = 0;
      const bool got = l.cublasLtMatmulAlgoGetHeuristic(l.lt, p.op, p.la, p.lb, p.lc, p.lc, pref, 1,
                                                        &heur, &found) == CUBLAS_STATUS_SUCCESS &&
                       found > 0;
      l.cublasLtMatmulPreferenceDestroy(pref);
      if (!got) break;
      p.algo = heur.algo;
      p.ok = true;
    } while (false);
    if (!p.ok) {
      l.destroy(p);  // remembered as refused: no descriptors kept
      p.ok = false;
    }
  }
  if (!p.ok) return false;
  // The plan outlives this call's buffers: the bias's and the auxiliary matrix's addresses are
  // set each call.
  if (bias)
    l.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  if (gelu)
    l.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                     sizeof aux);
  const float alpha = g.alpha, beta = g.beta;
  const cublasStatus_t st =
      l.cublasLtMatmul(l.lt, p.op, &alpha, g.b, p.la, g.a, p.lb, &beta, d_out, p.lc, d_out, p.lc,
                       &p.algo, l.workspace, l.workspace_bytes, stream);
  if (st != CUBLAS_STATUS_SUCCESS && gelu) {
    // An epilogue the heuristic offered but the call rejects (checked before anything is
    // enqueued): remembered as refused, the own kernel runs it.
    l.destroy(p);
    return false;
  }
  if (st != CUBLAS_STATUS_SUCCESS)
    fail(ErrorKind::kDevice, "cublasLtMatmul failed for " + std::to_string(g.M) + "x" +
                                 std::to_string(g.N) + "x" + std::to_string(g.K));
  return true;
}

}  // namespace ct::cuda

namespace ct::gpu {
std::unique_ptr<GemmLibrary> make_gemm_library() {
  return std::make_unique<cuda::Cublaslt>();
}
}  // namespace ct::gpu
