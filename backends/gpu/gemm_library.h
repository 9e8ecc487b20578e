// The vendor GEMM library of a native GPU target, behind one small interface: cuBLASLt in the
// CUDA plugin (backends/cuda/cublaslt.cpp), rocBLAS in the HIP plugin (backends/hip/rocblas.cpp).
// backends/gpu includes neither library's header: the runtime of native_runtime.cpp calls
// make_gemm_library(), which the plugin it is linked into defines.
#pragma once

#include <memory>
#include <string>

#include "backends/gpu/kernels.h"

namespace ct::gpu {

class GemmLibrary {
 public:
  virtual ~GemmLibrary() = default;
  // Enqueues c = alpha op(a) op(b) + beta c (+ bias, + g's GELU epilogue) on `stream` (the
  // target's native stream, cudaStream_t or hipStream_t) and returns true, or returns false with
  // nothing enqueued where the library is missing or has no algorithm for these arguments (a
  // library without GELU epilogues refuses every g that asks for one): the caller then runs the
  // project's own kernel.
  virtual bool gemm(const GemmArgs& g, void* stream) = 0;
  // True where the library adds g's bias only in the output's type (cuBLASLt has no kernels for
  // an f32 bias with a 16-bit output; PyTorch's autocast and llm.c add a 16-bit bias there too):
  // the caller then sets g.bias_lowp, the bias rounded to g.c_elem -- exactly the bias the op's
  // contract adds to a 16-bit output (core/device.h), so the library's result is the own kernels'.
  virtual bool bias_in_output_type(const GemmArgs& g) const {
    (void)g;
    return false;
  }
  // fp32 products with TF32 inputs from now on, where the library has them (Device::
  // set_allow_tf32 on a device whose DeviceInfo::tf32 is set); a no-op elsewhere.
  virtual void set_tf32(bool on) { (void)on; }
  // One line for `crosstrain devices`: the library and its version, or why the own kernel runs.
  virtual std::string describe() const = 0;
};

// The plugin's library (loaded at run time; a library that is not installed gives an object
// whose gemm() returns false and whose describe() says why).
std::unique_ptr<GemmLibrary> make_gemm_library();

}  // namespace ct::gpu
