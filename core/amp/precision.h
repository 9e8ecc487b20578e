// The precision policy: one table, shared by every backend, of which tensors are kept in which
// element type under --fp16 / --bf16 (see also the dtype table in core/device.h).
//
//   tensor                                     fp32    fp16 / bf16 run
//   master weights, gradients, optimizer       f32     f32
//   weight copies read by matmuls              -       h (refreshed after every optimizer step)
//   residual stream (encoded, residual2/3)     f32     f32
//   layernorm outputs (ln1, ln2, lnf)          f32     h
//   layernorm mean / rstd                      f32     f32
//   qkv, att (probabilities), atty, attproj    f32     h
//   fch, fch_gelu, fcproj                      f32     h
//   logits (and dlogits, in place)             f32     h
//   per-token losses, loss                     f32     f32
//   activation gradients feeding matmuls       f32     h
//   linear-layer biases                        f32     f32 (master); a matmul with a 16-bit
//                                                      output adds them rounded to its dtype
//   accumulation in GEMM, layernorm statistics, softmax, loss, optimizer: always fp32.
// fp16 needs dynamic loss scaling (core/amp/loss_scaler.h); bf16 has fp32's exponent range and
// needs none.
#pragma once

#include <string>

#include "core/dtype.h"

namespace ct {

enum class Precision { kFp32, kFp16, kBf16 };

struct PrecisionPolicy {
  Precision precision = Precision::kFp32;
  DType compute = DType::f32;      // weight copies and matmul inputs
  DType activations = DType::f32;  // the "h" rows of the table above
  bool loss_scaling = false;

  static PrecisionPolicy make(Precision p) {
    PrecisionPolicy pp;
    pp.precision = p;
    DType h = p == Precision::kFp16 ? DType::f16 : p == Precision::kBf16 ? DType::bf16 : DType::f32;
    pp.compute = h;
    pp.activations = h;
    pp.loss_scaling = p == Precision::kFp16;
    return pp;
  }
  bool mixed() const { return precision != Precision::kFp32; }
  std::string name() const {
    return precision == Precision::kFp16 ? "fp16" : precision == Precision::kBf16 ? "bf16" : "fp32";
  }
};

}  // namespace ct
