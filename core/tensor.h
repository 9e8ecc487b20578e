// Shape, strides and Tensor: a typed view (offset + shape + strides) into a device Buffer.
// A Tensor holds no host pointer; its data lives wherever its Buffer's device keeps it.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace ct {

class Buffer;

inline constexpr int kMaxDims = 5;

struct Shape {
  int ndim = 0;
  std::array<int64_t, kMaxDims> d{};

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);

  int64_t operator[](int i) const { return d[i < 0 ? ndim + i : i]; }
  int64_t& operator[](int i) { return d[i < 0 ? ndim + i : i]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;  // "[2, 3, 4]"
};

// Element strides (not bytes) of a row-major contiguous tensor of this shape.
Shape contiguous_strides(const Shape& s);

struct Tensor {
  std::shared_ptr<Buffer> buffer;
  size_t offset = 0;  // bytes from the start of the buffer to element [0, ..., 0]
  DType dtype = DType::f32;
  Shape shape;
  Shape strides;  // in elements

  bool defined() const { return buffer != nullptr; }
  int ndim() const { return shape.ndim; }
  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;

  // A contiguous view of the same elements with another shape (numel must match).
  Tensor reshape(const Shape& s) const;
  // Element range [start, start+count) of a contiguous tensor, viewed with shape `s`.
  Tensor slice_flat(int64_t start, const Shape& s) const;
  // Index the first dimension: t[i] has shape shape[1:].
  Tensor operator[](int64_t i) const;
  std::string describe() const;  // "f32[2, 3] @+offset"
};

}  // namespace ct
