// cuBLASLt, loaded at run time: GEMMs with fp16/bf16 inputs on tensor cores (fp32 accumulation),
// fp32 ones in fp32 or, with CT_TF32=1 (crosstrain train --tf32), TF32; the bias epilogue;
// batches with strides. The plugin loads without it: describe() then says why the project's own
// kernel runs instead.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "backends/gpu/kernels.h"

namespace ct::cuda {

class Cublaslt {
 public:
  explicit Cublaslt(bool tf32);
  ~Cublaslt();
  Cublaslt(const Cublaslt&) = delete;
  Cublaslt& operator=(const Cublaslt&) = delete;

  // Enqueues the product on `stream` and returns true, or returns false (nothing enqueued) where
  // cuBLASLt is missing or has no algorithm for these arguments.
  bool gemm(const gpu::GemmArgs& g, cudaStream_t stream);
  bool tf32() const { return tf32_; }
  std::string describe() const;

 private:
  struct Lib;
  std::unique_ptr<Lib> lib_;
  bool tf32_;
  std::string why_;  // why cuBLASLt is not used ("" when it is)
};

}  // namespace ct::cuda
