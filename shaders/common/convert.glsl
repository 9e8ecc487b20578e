// fp32 <-> fp16 / bf16 by bit arithmetic, identical to core/dtype.h (round to nearest even;
// NaN stays NaN; f16 overflow to inf, subnormals kept), so every device rounds the same way.

uint ct_f32_to_bf16(float f) {
  const uint u = floatBitsToUint(f);
  const uint r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r;
}
float ct_bf16_to_f32(uint h) { return uintBitsToFloat(h << 16); }

uint ct_f32_to_f16(float f) {
  const uint u = floatBitsToUint(f);
  const uint sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  // Every case computed, one selected (no branches): subnormal or zero -- an fp32 add does the
  // rounding (as on the CPU) --, normal, overflow to inf, NaN.
  const uint sub = floatBitsToUint(uintBitsToFloat(a) + 0.5) - 0x3f000000u;
  const uint nor = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  const uint h = a < 0x38800000u ? sub : a < 0x477ff000u ? nor : 0x7c00u;
  return sign | (a > 0x7f800000u ? 0x7e00u : h);
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
