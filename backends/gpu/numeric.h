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

// Element tags: how a kernel reads and writes one element of a tensor of that type, and
// rounded(v): v as such an element holds it, widened back (load(store(v)) without the memory).
struct F32 {
  using Storage = float;
  static __host__ __device__ __forceinline__ float rounded(float v) { return v; }
  static __device__ __forceinline__ float load(const void* p, std::int64_t i) {
    return static_cast<const float*>(p)[i];
  }
  static __device__ __forceinline__ void store(void* p, std::int64_t i, float v) {
    static_cast<float*>(p)[i] = v;
  }
};
struct F16 {
  using Storage = std::uint16_t;
  static __host__ __device__ __forceinline__ float rounded(float v) {
    return f16_to_f32(f32_to_f16(v));
  }
  static __device__ __forceinline__ float load(const void* p, std::int64_t i) {
    return f16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
  }
  static __device__ __forceinline__ void store(void* p, std::int64_t i, float v) {
    static_cast<std::uint16_t*>(p)[i] = f32_to_f16(v);
  }
};
struct BF16 {
  using Storage = std::uint16_t;
  static __host__ __device__ __forceinline__ float rounded(float v) {
    return bf16_to_f32(f32_to_bf16(v));
  }
  static __device__ __forceinline__ float load(const void* p, std::int64_t i) {
    return bf16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
  }
  static __device__ __forceinline__ void store(void* p, std::int64_t i, float v) {
    static_cast<std::uint16_t*>(p)[i] = f32_to_bf16(v);
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
