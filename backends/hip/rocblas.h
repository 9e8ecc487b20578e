// rocBLAS, loaded at run time where it is installed (Debian 12 has none; ROCm installs do):
// strided-batched GEMMs with f16/bf16/f32 inputs and fp32 accumulation. The plugin loads
// without it: describe() says why the project's own kernel runs instead. The HIP plugin's
// gpu::GemmLibrary (backends/gpu/gemm_library.h).
#pragma once

#include <hip/hip_runtime_api.h>

#include <memory>
#include <string>

#include "backends/gpu/gemm_library.h"

namespace ct::hip {

class Rocblas final : public gpu::GemmLibrary {
 public:
  Rocblas();
  ~Rocblas() override;
  Rocblas(const Rocblas&) = delete;
  Rocblas& operator=(const Rocblas&) = delete;

  // Enqueues the product on `stream` and returns true, or returns false (nothing enqueued) where
  // rocBLAS is missing or cannot do it (a bias or a GELU: rocBLAS has no epilogue; the own kernel
  // fuses them).
  bool gemm(const gpu::GemmArgs& g, void* stream) override;
  std::string describe() const override;

 private:
  struct Lib;
  std::unique_ptr<Lib> lib_;
  std::string why_;
};

}  // namespace ct::hip
