// rocBLAS through dlopen. Debian ships no rocBLAS headers, so the few entry points used are
// declared here with the types of rocBLAS's C API (rocblas-types.h, rocblas-functions.h):
// handles are opaque pointers, enums plain ints with the values rocBLAS fixes.
//
// Row-major c [M, N] = op(a) op(b) is column-major c^T = op(b)^T op(a)^T: rocBLAS gets b as its
// A and a as its B with the same transpose flags (as the cuBLASLt path does).
#include "backends/hip/rocblas.h"

#include <dlfcn.h>

#include <cstdint>
#include <string>

#include "core/error.h"

namespace ct::hip {
namespace {

using rocblas_handle = void*;
using rocblas_status = int;  // rocblas_status_success = 0
using rocblas_int = std::int32_t;
using rocblas_stride = std::int64_t;
constexpr int kOpNone = 111, kOpTranspose = 112;    // rocblas_operation
constexpr int kF16 = 150, kF32 = 151, kBF16 = 168;  // rocblas_datatype
constexpr int kAlgoStandard = 0;                    // rocblas_gemm_algo

using CreateFn = rocblas_status (*)(rocblas_handle*);
using DestroyFn = rocblas_status (*)(rocblas_handle);
using SetStreamFn = rocblas_status (*)(rocblas_handle, hipStream_t);
using VersionFn = rocblas_status (*)(char*, std::size_t);
using GemmFn = rocblas_status (*)(rocblas_handle, int, int, rocblas_int, rocblas_int, rocblas_int,
                                  const void*, const void*, int, rocblas_int, rocblas_stride,
                                  const void*, int, rocblas_int, rocblas_stride, const void*,
                                  const void*, int, rocblas_int, rocblas_stride, void*, int,
                                  rocblas_int, rocblas_stride, rocblas_int, int, int, std::int32_t,
                                  std::uint32_t);

int type_of(gpu::Elem e) {
  return e == gpu::Elem::kF16 ? kF16 : e == gpu::Elem::kBF16 ? kBF16 : kF32;
}

}  // namespace

struct Rocblas::Lib {
  void* so = nullptr;
  rocblas_handle handle = nullptr;
  std::string version;
  CreateFn create = nullptr;
  DestroyFn destroy = nullptr;
  SetStreamFn set_stream = nullptr;
  VersionFn get_version = nullptr;
  GemmFn gemm = nullptr;
};

Rocblas::Rocblas() : lib_(std::make_unique<Lib>()) {
  Lib& l = *lib_;
  for (const char* name : {"librocblas.so.4", "librocblas.so.3", "librocblas.so.0"}) {
    l.so = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (l.so) break;
  }
  if (!l.so) {
    why_ = "librocblas.so.4 / .3 / .0 not found";
    return;
  }
  l.create = reinterpret_cast<CreateFn>(dlsym(l.so, "rocblas_create_handle"));
  l.destroy = reinterpret_cast<DestroyFn>(dlsym(l.so, "rocblas_destroy_handle"));
  l.set_stream = reinterpret_cast<SetStreamFn>(dlsym(l.so, "rocblas_set_stream"));
  l.get_version = reinterpret_cast<VersionFn>(dlsym(l.so, "rocblas_get_version_string"));
  l.gemm = reinterpret_cast<GemmFn>(dlsym(l.so, "rocblas_gemm_strided_batched_ex"));
  if (!l.create || !l.destroy || !l.set_stream || !l.get_version || !l.gemm) {
    why_ = "librocblas lacks an entry point this plugin uses";
    return;
  }
  char v[128] = {};
  if (l.get_version(v, sizeof v) == 0) l.version = v;
  // rocblas_gemm_ex with bf16 and the flags argument exist since rocBLAS 3.
  if (l.version.empty() || l.version[0] < '3' || l.version[1] != '.') {
    why_ = "rocBLAS " + (l.version.empty() ? std::string("of unknown version") : l.version) +
           " is older than 3.0";
    return;
  }
  if (l.create(&l.handle) != 0) {
    why_ = "rocblas_create_handle failed";
    l.handle = nullptr;
  }
}

Rocblas::~Rocblas() {
  if (lib_->handle) lib_->destroy(lib_->handle);
}

std::string Rocblas::describe() const {
  if (!why_.empty()) return "own tiled kernel (rocBLAS unavailable: " + why_ + ")";
  return "rocBLAS " + lib_->version + " (own kernel for products with a bias)";
}

bool Rocblas::gemm(const gpu::GemmArgs& g, void* stream_ptr) {
  const auto stream = static_cast<hipStream_t>(stream_ptr);
  Lib& l = *lib_;
  if (!why_.empty() || !l.handle || g.bias || g.gelu_out || g.gelu_pre || g.K == 0) return false;
  if (g.M > INT32_MAX || g.N > INT32_MAX || g.K > INT32_MAX || g.batch > INT32_MAX) return false;
  if (l.set_stream(l.handle, stream) != 0) return false;
  const int ta = g.trans_b ? kOpTranspose : kOpNone, tb = g.trans_a ? kOpTranspose : kOpNone;
  const rocblas_int lda = static_cast<rocblas_int>(g.trans_b ? g.K : g.N);
  const rocblas_int ldb = static_cast<rocblas_int>(g.trans_a ? g.M : g.K);
  const rocblas_int ldc = static_cast<rocblas_int>(g.N);
  const float alpha = g.alpha, beta = g.beta;
  const int ab = type_of(g.ab_elem), ct = type_of(g.c_elem);
  const rocblas_status s =
      l.gemm(l.handle, ta, tb, static_cast<rocblas_int>(g.N), static_cast<rocblas_int>(g.M),
             static_cast<rocblas_int>(g.K), &alpha, g.b, ab, lda, g.stride_b, g.a, ab, ldb,
             g.stride_a, &beta, g.c, ct, ldc, g.stride_c, g.c, ct, ldc, g.stride_c,
             static_cast<rocblas_int>(g.batch), kF32, kAlgoStandard, 0, 0);
  if (s != 0)
    fail(ErrorKind::kDevice, "rocblas_gemm_strided_batched_ex failed (status " + std::to_string(s) +
                                 ") for " + std::to_string(g.M) + "x" + std::to_string(g.N) + "x" +
                                 std::to_string(g.K));
  return true;
}

}  // namespace ct::hip

namespace ct::gpu {
std::unique_ptr<GemmLibrary> make_gemm_library() {
  return std::make_unique<hip::Rocblas>();
}
}  // namespace ct::gpu
