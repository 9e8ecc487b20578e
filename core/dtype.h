// Element types and the fp16/bf16 <-> fp32 conversions every backend must agree on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace ct {

enum class DType : uint8_t { f32, f16, bf16, i8, u8, i32 };
inline constexpr int kNumDTypes = 6;

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f16:
      return 2;
    case DType::bf16:
      return 2;
    case DType::i8:
      return 1;
    case DType::u8:
      return 1;
    case DType::i32:
      return 4;
  }
  return 0;
}

constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::i8:
      return "i8";
    case DType::u8:
      return "u8";
    case DType::i32:
      return "i32";
  }
  return "?";
}

constexpr bool dtype_is_float(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16;
}

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bf16: the top 16 bits of an fp32, rounded to nearest even; NaN stays a (quiet) NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  return bits_f32(static_cast<uint32_t>(h) << 16);
}

// IEEE binary16, round to nearest even, overflow to inf, subnormals kept.
inline uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (a < 0x38800000u) {                                               // subnormal or zero
    // Scale into the subnormal range with an fp32 add: the FPU does the rounding.
    float r = bits_f32(a) + 0.5f;
    return static_cast<uint16_t>(sign | (f32_bits(r) - 0x3f000000u));
  }
  uint32_t mant_odd = (a >> 13) & 1u;
  a += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  return static_cast<uint16_t>(sign | (a >> 13));
}
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    float m = static_cast<float>(mant) * (1.0f / 16777216.0f);  // mant * 2^-24
    return sign ? -m : m;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

// v as a tensor of float dtype dt holds it, widened back to f32: f16 and bf16 round to nearest
// even (f32_to_f16, f32_to_bf16), f32 keeps v.
inline float round_to(DType dt, float v) {
  if (dt == DType::f16) return f16_to_f32(f32_to_f16(v));
  if (dt == DType::bf16) return bf16_to_f32(f32_to_bf16(v));
  return v;
}

// Element i of p (of type dt) as f32, and v stored into it: floats round to nearest even;
inline float read_as_f32(const void* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::f16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::bf16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::i8:
      return static_cast<const int8_t*>(p)[i];
    case DType::u8:
      return static_cast<const uint8_t*>(p)[i];
    case DType::i32:
      return static_cast<float>(static_cast<const int32_t*>(p)[i]);
  }
  return 0.0f;
}

// Integers take the value truncated toward zero, saturated to the type's range (NaN -> 0).
template <typename I>
inline I saturate_int(float v, float lo, float hi) {
  if (!(v == v)) return 0;
  if (v <= lo) return static_cast<I>(lo);
  if (v >= hi) return static_cast<I>(hi);
  return static_cast<I>(v);
}

inline void write_from_f32(void* p, DType dt, int64_t i, float v) {
  switch (dt) {
    case DType::f32:
      static_cast<float*>(p)[i] = v;
      return;
    case DType::f16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
      return;
    case DType::bf16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
      return;
    case DType::i8:
      static_cast<int8_t*>(p)[i] = saturate_int<int8_t>(v, -128.f, 127.f);
      return;
    case DType::u8:
      static_cast<uint8_t*>(p)[i] = saturate_int<uint8_t>(v, 0.f, 255.f);
      return;
    case DType::i32:
      // 2147483520 is the largest float below 2^31.
      static_cast<int32_t*>(p)[i] = saturate_int<int32_t>(v, -2147483648.f, 2147483520.f);
      return;
  }
}

}  // namespace ct
