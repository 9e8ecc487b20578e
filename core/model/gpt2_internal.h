// Helpers shared by the GPT-2 translation units (gpt2*.cpp); not part of the model's interface.
#pragma once

#include "core/device.h"
#include "core/tensor.h"

namespace ct::gpt2_detail {

// A contiguous view of the first shape.numel() elements of t.
inline Tensor view(const Tensor& t, const Shape& shape) {
  return t.slice_flat(0, shape);
}

// Fully connected layer in Conv1D layout:
//   out (=) inp @ w + b                 inp (N,C), w (C,OC), b (OC) f32, out (N,OC)
inline void linear_forward(Device& dev, const Tensor& out, const Tensor& inp, const Tensor& w,
                           const Tensor& b) {
  dev.matmul(out, inp, w, false, false, 1.0f, 0.0f, &b);
}

}  // namespace ct::gpt2_detail
