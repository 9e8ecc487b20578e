// Fast elementwise ops: OpenMP over contiguous chunks, vector loops.
#include <omp.h>

#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "backends/cpu/fast/vec_math.h"
#include "backends/cpu/kernels.h"

namespace ct::cpu::fast::CT_CPU_ISA {

namespace {
constexpr int64_t kParallelMin = 1 << 15;  // below this, threads cost more than they save

// bytes of d set to byte. Past 4 MiB (beyond what the caches keep for the next op) one
// contiguous piece per thread, written with non-temporal stores: a vector loop's ordinary
// stores first read each line (read-for-ownership), about twice the memory traffic.
void set_bytes(char* d, int byte, size_t bytes) {
#if defined(__SSE2__)
  if (bytes >= (size_t{4} << 20)) {
    const int64_t parts = omp_get_max_threads();
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < parts; ++p) {
      char* b = d + bytes * static_cast<size_t>(p) / static_cast<size_t>(parts);
      char* e = d + bytes * static_cast<size_t>(p + 1) / static_cast<size_t>(parts);
      char* a = std::min(
          e, reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(b) + 31) & ~uintptr_t{31}));
      std::memset(b, byte, static_cast<size_t>(a - b));
      const __m128i v = _mm_set1_epi8(static_cast<char>(byte));
      for (; a + 32 <= e; a += 32) {
        _mm_stream_si128(reinterpret_cast<__m128i*>(a), v);
        _mm_stream_si128(reinterpret_cast<__m128i*>(a + 16), v);
      }
      std::memset(a, byte, static_cast<size_t>(e - a));
      _mm_sfence();
    }
    return;
  }
#endif
  std::memset(d, byte, bytes);
}
}  // namespace

// p is (n) of dtype dt
void fill(void* p, DType dt, int64_t n, float value) {
  // One element in the target type, replicated; set_bytes when its bytes are all alike (zero).
  unsigned char pattern[4] = {};
  write_from_f32(pattern, dt, 0, value);
  const size_t es = dtype_size(dt);
  if (std::all_of(pattern, pattern + es, [&](unsigned char b) { return b == pattern[0]; })) {
    set_bytes(static_cast<char*>(p), pattern[0], static_cast<size_t>(n) * es);
    return;
  }
  if (dt == DType::f32) {
    float* f = static_cast<float*>(p);
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) f[i] = value;
    return;
  }
  if (es == 2) {
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
  constexpr int64_t kPiece = 1 << 14;  // elements per work item of the bf16 conversions
  if (src_dt == DType::f32 && dst_dt == DType::bf16) {
    const float* s = static_cast<const float*>(src);
    uint16_t* d = static_cast<uint16_t*>(dst);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; i += kPiece) round_bf16(d + i, s + i, std::min(kPiece, n - i));
  } else if (src_dt == DType::bf16 && dst_dt == DType::f32) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    float* d = static_cast<float*>(dst);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; i += kPiece) widen_bf16(d + i, s + i, std::min(kPiece, n - i));
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
