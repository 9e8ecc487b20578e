// Helpers shared by the GPT-2 translation units (gpt2*.cpp); not part of the model's interface.
#pragma once

#include "core/device.h"
#include "core/tensor.h"

namespace ct::gpt2_detail {

// A contiguous view of the first shape.numel() elements of t.
inline Tensor view(const Tensor& t, const Shape& shape) {
  return t.slice_flat(0, shape);
}

// Fully connected layer in Conv1D layout, and its backward:
//   out (=) inp @ w + b                 inp (N,C), w (C,OC), b (OC) f32, out (N,OC)
inline void linear_forward(Device& dev, const Tensor& out, const Tensor& inp, const Tensor& w,
                           const Tensor& b) {
  dev.matmul(out, inp, w, false, false, 1.0f, 0.0f, &b);
}
//   dinp (=) dout @ w^T;  dw (+=) inp^T @ dout;  db (+=) column sums of dbias_src (default dout)
// dout, inp and w share one dtype; dw and db are f32; dinp is f32 or that dtype. dbias_src lets
// the bias gradient read an f32 original of a 16-bit dout.
inline void linear_backward(Device& dev, const Tensor& dinp, const Tensor& dw, const Tensor& db,
                            const Tensor& dout, const Tensor& inp, const Tensor& w,
                            const Tensor* dbias_src = nullptr) {
  dev.matmul(dinp, dout, w, false, true);
  dev.matmul(dw, inp, dout, true, false, 1.0f, 1.0f);
  dev.bias_backward(db, dbias_src ? *dbias_src : dout);
}

}  // namespace ct::gpt2_detail
