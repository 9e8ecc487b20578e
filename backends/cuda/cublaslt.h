// cuBLASLt, loaded at run time: GEMMs with fp16/bf16 inputs on tensor cores (fp32 accumulation),
// fp32 ones in fp32 or, after set_tf32(true) (crosstrain train --tf32), TF32; the bias epilogue,
// and GELU_AUX_BIAS / DGELU for GemmArgs' GELU epilogues; batches with strides. The CUDA plugin's
// gpu::GemmLibrary (backends/gpu/gemm_library.h). The plugin loads without it: describe() then says
// why the project's own kernel runs instead.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "backends/gpu/gemm_library.h"

namespace ct::cuda {

class Cublaslt final : public gpu::GemmLibrary {
 public:
  Cublaslt();
  ~Cublaslt() override;
  Cublaslt(const Cublaslt&) = delete;
  Cublaslt& operator=(const Cublaslt&) = delete;

  // Enqueues the product on `stream` and returns true, or returns false (nothing enqueued) where
  // cuBLASLt is missing or has no algorithm for these arguments.
  bool gemm(const gpu::GemmArgs& g, void* stream) override;
  // A 16-bit output takes its bias in that type (cuBLASLt 13 on an H100 refused every f32-bias
  // product with a bf16 output: measured, 240 of 637 GEMMs of 4 gpt2 steps).
  bool bias_in_output_type(const gpu::GemmArgs& g) const override;
  void set_tf32(bool on) override { tf32_ = on; }
  std::string describe() const override;

 private:
  struct Lib;
  std::unique_ptr<Lib> lib_;
  bool tf32_ = false;
  std::string why_;  // why cuBLASLt is not used ("" when it is)
};

}  // namespace ct::cuda
