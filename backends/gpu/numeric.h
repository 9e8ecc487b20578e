// Element types and conversions for kernels under backends/gpu/kernels, on every target (CUDA,
// HIP, SIMT). 16-bit tensors are held as raw uint16_t and converted in software with exactly the
// rules of core/dtype.h (round to nearest even, NaN stays NaN, f16 subnormals kept), so every
// target stores the same bits as the CPU reference. All arithmetic is fp32.
//
// A kernel that takes "f32 or 16-bit" tensors is a template over one of the element tags below:
//   template <int WARP, typename E> __global__ void k(const void* x, ...) {
//     float v = E::load(x, i);  E::store(out, i, v); }
#pragma once

#include <cstdint>
#include <cstring>

#include "backends/gpu/portability.h"

#if defined(CT_GPU_SIMT)
#include <cmath>
#endif

namespace ct::gpu {

__host__ __device__ __forceinline__ std::uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
__host__ __device__ __forceinline__ float bits_f32(std::uint32_t u) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

__host__ __device__ __forceinline__ std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
__host__ __device__ __forceinline__ float bf16_to_f32(std::uint16_t h) {
  return bits_f32(static_cast<std::uint32_t>(h) << 16);
}
__host__ __device__ __forceinline__ std::uint16_t f32_to_f16(float f) {
  std::uint32_t u = f32_bits(f);
  std::uint32_t sign = (u >> 16) & 0x8000u;
  std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (a < 0x38800000u) {
    float r = bits_f32(a) + 0.5f;
    return static_cast<std::uint16_t>(sign | (f32_bits(r) - 0x3f000000u));
  }
  std::uint32_t mant_odd = (a >> 13) & 1u;
  a += 0xc8000fffu + mant_odd;
  return static_cast<std::uint16_t>(sign | (a >> 13));
}
__host__ __device__ __forceinline__ float f16_to_f32(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    float m = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -m : m;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Whether v is neither inf nor NaN, from its bits (the same on every target, fast-math or not).
__host__ __device__ __forceinline__ bool ct_isfinite(float v) {
  return (f32_bits(v) & 0x7f800000u) != 0x7f800000u;
}

// 16 bytes read or written as one access (LDG.128 / global_load_dwordx4; a copy on the SIMT
// runtime); p 16-byte aligned. The memory-bound kernels' loads: a thread with one 2-byte load in
// flight keeps an eighth of the bytes in flight that a 16-byte load does.
struct alignas(16) Bytes16 {
  std::uint32_t w[4];
};
__device__ __forceinline__ Bytes16 ct_load16(const void* p) {
  Bytes16 b;
#if defined(CT_GPU_SIMT)
  std::memcpy(&b, p, sizeof b);
#else
  const uint4 q = *static_cast<const uint4*>(p);
  b.w[0] = q.x, b.w[1] = q.y, b.w[2] = q.z, b.w[3] = q.w;
#endif
  return b;
}
__device__ __forceinline__ void ct_store16(void* p, const Bytes16& b) {
#if defined(CT_GPU_SIMT)
  std::memcpy(p, &b, sizeof b);
#else
  *static_cast<uint4*>(p) = make_uint4(b.w[0], b.w[1], b.w[2], b.w[3]);
#endif
}

// Element tags: how a kernel reads and writes one element of a tensor of that type, and
// rounded(v): v as such an element holds it, widened back (load(store(v)) without the memory).
// load8 / store8: elements [i, i + 8) by 16-byte accesses (two for f32), the same values as
// eight load / store calls; element i's address must be 16-byte aligned.
struct F32 {
  using Storage = float;
  static __host__ __device__ __forceinline__ float rounded(float v) { return v; }
  static __device__ __forceinline__ float load(const void* p, std::int64_t i) {
    return static_cast<const float*>(p)[i];
  }
  static __device__ __forceinline__ void store(void* p, std::int64_t i, float v) {
    static_cast<float*>(p)[i] = v;
  }
  static __device__ __forceinline__ void load8(const void* p, std::int64_t i, float* v) {
    for (int h = 0; h < 2; ++h) {
      const Bytes16 b = ct_load16(static_cast<const float*>(p) + i + 4 * h);
      for (int k = 0; k < 4; ++k) v[4 * h + k] = bits_f32(b.w[k]);
    }
  }
  static __device__ __forceinline__ void store8(void* p, std::int64_t i, const float* v) {
    for (int h = 0; h < 2; ++h) {
      Bytes16 b;
      for (int k = 0; k < 4; ++k) b.w[k] = f32_bits(v[4 * h + k]);
      ct_store16(static_cast<float*>(p) + i + 4 * h, b);
    }
  }
};
// The 16-bit tags, one pattern for both: T supplies widen(bits) and narrow(value).
template <typename T>
struct Half16 {
  using Storage = std::uint16_t;
  static __host__ __device__ __forceinline__ float rounded(float v) {
    return T::widen(T::narrow(v));
  }
  static __device__ __forceinline__ float load(const void* p, std::int64_t i) {
    return T::widen(static_cast<const std::uint16_t*>(p)[i]);
  }
  static __device__ __forceinline__ void store(void* p, std::int64_t i, float v) {
    static_cast<std::uint16_t*>(p)[i] = T::narrow(v);
  }
  static __device__ __forceinline__ void load8(const void* p, std::int64_t i, float* v) {
    const Bytes16 b = ct_load16(static_cast<const std::uint16_t*>(p) + i);
    for (int k = 0; k < 4; ++k) {  // little-endian: element 2k in the low half of word k
      v[2 * k] = T::widen(static_cast<std::uint16_t>(b.w[k] & 0xffffu));
      v[2 * k + 1] = T::widen(static_cast<std::uint16_t>(b.w[k] >> 16));
    }
  }
  static __device__ __forceinline__ void store8(void* p, std::int64_t i, const float* v) {
    Bytes16 b;
    for (int k = 0; k < 4; ++k)
      b.w[k] = static_cast<std::uint32_t>(T::narrow(v[2 * k])) |
               (static_cast<std::uint32_t>(T::narrow(v[2 * k + 1])) << 16);
    ct_store16(static_cast<std::uint16_t*>(p) + i, b);
  }
};
struct F16 : Half16<F16> {
  static __host__ __device__ __forceinline__ float widen(std::uint16_t h) { return f16_to_f32(h); }
  static __host__ __device__ __forceinline__ std::uint16_t narrow(float v) { return f32_to_f16(v); }
};
struct BF16 : Half16<BF16> {
  static __host__ __device__ __forceinline__ float widen(std::uint16_t h) { return bf16_to_f32(h); }
  static __host__ __device__ __forceinline__ std::uint16_t narrow(float v) {
    return f32_to_bf16(v);
  }
};

}  // namespace ct::gpu

// Math the kernels may call, with the same names on every target (CUDA's device library, HIP's,
// and <cmath> for SIMT): expf, logf, tanhf, sqrtf, fabsf, fmaxf, fminf, powf, and ct_rsqrtf.
#if defined(CT_GPU_SIMT)
// <cmath> brings the global C names (glibc's libm) in.
inline float ct_rsqrtf(float x) {
  return 1.0f / std::sqrt(x);
}
#else
__device__ __forceinline__ float ct_rsqrtf(float x) {
  return 1.0f / sqrtf(x);  // not rsqrtf: its approximation differs between vendors
}
#endif
