#include "core/tensor.h"

#include <sstream>

#include "core/device.h"
#include "core/error.h"

namespace ct {

Shape::Shape(std::initializer_list<int64_t> dims) {
  CT_CHECK(dims.size() <= kMaxDims, "too many dimensions");
  for (int64_t v : dims) d[ndim++] = v;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= d[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim != o.ndim) return false;
  for (int i = 0; i < ndim; ++i)
    if (d[i] != o.d[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << d[i];
  os << ']';
  return os.str();
}

Shape contiguous_strides(const Shape& s) {
  Shape st;
  st.ndim = s.ndim;
  int64_t acc = 1;
  for (int i = s.ndim - 1; i >= 0; --i) {
    st.d[i] = acc;
    acc *= s.d[i];
  }
  return st;
}

bool Tensor::is_contiguous() const {
  int64_t acc = 1;
  for (int i = shape.ndim - 1; i >= 0; --i) {
    if (shape.d[i] != 1 && strides.d[i] != acc) return false;
    acc *= shape.d[i];
  }
  return true;
}

Tensor Tensor::reshape(const Shape& s) const {
  CT_CHECK(is_contiguous(), "reshape of a non-contiguous tensor " + describe());
  CT_CHECK(s.numel() == numel(), "reshape " + shape.str() + " -> " + s.str());
  Tensor t = *this;
  t.shape = s;
  t.strides = contiguous_strides(s);
  return t;
}

Tensor Tensor::slice_flat(int64_t start, const Shape& s) const {
  CT_CHECK(is_contiguous(), "slice_flat of a non-contiguous tensor " + describe());
  CT_CHECK(
      start >= 0 && start + s.numel() <= numel(),
      "slice_flat out of range: " + std::to_string(start) + " + " + s.str() + " in " + describe());
  Tensor t = *this;
  t.offset += static_cast<size_t>(start) * dtype_size(dtype);
  t.shape = s;
  t.strides = contiguous_strides(s);
  return t;
}

Tensor Tensor::operator[](int64_t i) const {
  CT_CHECK(shape.ndim >= 1 && i >= 0 && i < shape.d[0], "index out of range on " + describe());
  Tensor t = *this;
  t.offset += static_cast<size_t>(i * strides.d[0]) * dtype_size(dtype);
  t.shape.ndim = shape.ndim - 1;
  t.strides.ndim = strides.ndim - 1;
  for (int k = 0; k + 1 < shape.ndim; ++k) {
    t.shape.d[k] = shape.d[k + 1];
    t.strides.d[k] = strides.d[k + 1];
  }
  return t;
}

std::string Tensor::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype) << shape.str() << " @+" << offset;
  return os.str();
}

}  // namespace ct
