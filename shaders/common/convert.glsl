// fp32 <-> fp16 / bf16 by bit arithmetic, identical to core/dtype.h (round to nearest even;
// NaN stays NaN; f16 overflow to inf, subnormals kept), so every device rounds the same way.

uint ct_f32_to_bf16(float f) {
  uint u = floatBitsToUint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}
float ct_bf16_to_f32(uint h) { return uintBitsToFloat(h << 16); }

uint ct_f32_to_f16(float f) {
  uint u = floatBitsToUint(f);
  uint sign = (u >> 16) & 0x8000u;
  uint a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a < 0x38800000u) {
    // Subnormal or zero: an fp32 add does the rounding (as on the CPU).
    float r = uintBitsToFloat(a) + 0.5;
    return sign | (floatBitsToUint(r) - 0x3f000000u);
  }
  uint mant_odd = (a >> 13) & 1u;
  a += 0xc8000fffu + mant_odd;
  return sign | (a >> 13);
}
float ct_f16_to_f32(uint h) {
  uint sign = (h & 0x8000u) << 16;
  uint e = (h >> 10) & 0x1fu;
  uint mant = h & 0x3ffu;
  if (e == 0x1fu) return uintBitsToFloat(sign | 0x7f800000u | (mant << 13));
  if (e == 0u) {
    float m = float(mant) * (1.0 / 16777216.0);
    return sign != 0u ? -m : m;
  }
  return uintBitsToFloat(sign | ((e + 112u) << 23) | (mant << 13));
}
