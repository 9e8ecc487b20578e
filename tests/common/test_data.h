// Seeded test inputs and device read-back shared by every test suite. Each suite passes its own
// Philox stream so its inputs stay what they were when its tolerances were measured.
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/philox.h"

namespace ct::testdata {

// n normal values (times `scale`), a pure function of (seed, stream).
inline std::vector<float> randn(size_t n, uint64_t seed, float scale, uint64_t stream) {
  Philox p(seed, stream);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * p.normal(i);
  return v;
}
// n values uniform in [lo, hi).
inline std::vector<float> uniform(size_t n, uint64_t seed, float lo, float hi, uint64_t stream) {
  Philox p(seed, stream);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * p.uniform(i);
  return v;
}
// n integers in [0, hi).
inline std::vector<int32_t> randint(size_t n, uint64_t seed, int32_t hi, uint64_t stream) {
  Philox p(seed, stream);
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(p.u32(i) % static_cast<uint32_t>(hi));
  return v;
}
// The elements of `t` (waits for the device), read as T.
template <class T>
std::vector<T> download_as(Device& d, const Tensor& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  d.download(v.data(), t, v.size() * sizeof(T));
  return v;
}

}  // namespace ct::testdata
