// Reference elementwise ops: fill, copy (with dtype conversion), add, accumulate, scale.
#include <cstring>

#include "backends/cpu/kernels.h"

namespace ct::cpu::ref {

// p is (n) of dtype dt
void fill(void* p, DType dt, int64_t n, float value) {
  for (int64_t i = 0; i < n; ++i) write_from_f32(p, dt, i, value);
}

// dst, src are (n); converted through f32 unless the dtypes match
void copy(void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n) {
  if (dst_dt == src_dt) {
    std::memmove(dst, src, static_cast<size_t>(n) * dtype_size(dst_dt));
    return;
  }
  for (int64_t i = 0; i < n; ++i) write_from_f32(dst, dst_dt, i, read_as_f32(src, src_dt, i));
}

// out, a, b are (n)
void add(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// dst, src are (n)
void accumulate(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// t is (n)
void scale(float* t, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) t[i] *= s;
}

}  // namespace ct::cpu::ref
