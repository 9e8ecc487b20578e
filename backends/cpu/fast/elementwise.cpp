// Fast elementwise ops: OpenMP over contiguous chunks, vector loops.
#include <cstring>

#include "backends/cpu/kernels.h"

namespace ct::cpu::fast::CT_CPU_ISA {

namespace {
constexpr int64_t kParallelMin = 1 << 15;  // below this, threads cost more than they save
}

// p is (n) of dtype dt
void fill(void* p, DType dt, int64_t n, float value) {
  if (dt == DType::f32) {
    float* f = static_cast<float*>(p);
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) f[i] = value;
    return;
  }
  // One element in the target type, replicated.
  unsigned char pattern[4];
  write_from_f32(pattern, dt, 0, value);
  size_t es = dtype_size(dt);
  if (es == 1) {
    std::memset(p, pattern[0], static_cast<size_t>(n));
  } else if (es == 2) {
    uint16_t v;
    std::memcpy(&v, pattern, 2);
    uint16_t* h = static_cast<uint16_t*>(p);
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) h[i] = v;
  } else {
    uint32_t v;
    std::memcpy(&v, pattern, 4);
    uint32_t* w = static_cast<uint32_t*>(p);
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) w[i] = v;
  }
}

// dst, src are (n)
void copy(void* dst, DType dst_dt, const void* src, DType src_dt, int64_t n) {
  if (dst_dt == src_dt) {
    size_t bytes = static_cast<size_t>(n) * dtype_size(dst_dt);
    const char* s = static_cast<const char*>(src);
    char* d = static_cast<char*>(dst);
    if ((d < s + bytes && s < d + bytes) || bytes < (1u << 20)) {
      std::memmove(d, s, bytes);
      return;
    }
    constexpr size_t kChunk = 1 << 18;
    int64_t chunks = static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      size_t off = static_cast<size_t>(c) * kChunk;
      std::memcpy(d + off, s + off, std::min(kChunk, bytes - off));
    }
    return;
  }
  if (src_dt == DType::f32 && dst_dt == DType::bf16) {
    const float* s = static_cast<const float*>(src);
    uint16_t* d = static_cast<uint16_t*>(dst);
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
  } else if (src_dt == DType::bf16 && dst_dt == DType::f32) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    float* d = static_cast<float*>(dst);
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
  } else if (src_dt == DType::f32 && dst_dt == DType::f16) {
    const float* s = static_cast<const float*>(src);
    uint16_t* d = static_cast<uint16_t*>(dst);
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(s[i]);
  } else if (src_dt == DType::f16 && dst_dt == DType::f32) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    float* d = static_cast<float*>(dst);
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) d[i] = f16_to_f32(s[i]);
  } else {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) write_from_f32(dst, dst_dt, i, read_as_f32(src, src_dt, i));
  }
}

// out, a, b are (n)
void add(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// dst, src are (n)
void accumulate(float* dst, const float* src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// t is (n)
void scale(float* t, float s, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) t[i] *= s;
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
