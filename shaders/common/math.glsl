// Transcendentals whose extremes are decided here, not by the driver's built-ins. The Vulkan
// spec leaves exp/log/sqrt/inversesqrt at inf, at 0 or past overflow, and division by a value
// outside [2^-126, 2^126], undefined, and GPU compilers may assume no inf or NaN exists (NVIDIA's
// driver made GELU's backward NaN at x = 1e30 where lavapipe, whose built-ins follow IEEE, gave
// 1). So: the built-ins only ever see arguments whose results are finite normal-range floats
// (or NaN, which passes through), special values are tested by their bits (never folded away),
// and everything outside is decided explicitly. For ordinary arguments these helpers call the
// same built-ins as before, in the same order: the results on a conforming driver are unchanged.
//
// CT_STRICT_MATH (test-only variants, backends/vulkan/CMakeLists.txt ct_vk_shader_hs): exp, log,
// sqrt, inversesqrt and tanh are replaced, in these helpers and in the including shader, by
// versions that return NaN wherever a driver's implementation could misbehave (exp past
// overflow or of a non-finite argument, log/inversesqrt of 0, inf or a subnormal, sqrt of inf,
// tanh through the overflow-prone (e^2x - 1) / (e^2x + 1)). Tests run the extreme-value cases
// through those variants (CROSSTRAIN_VK_STRICT_MATH=1, ctest ops_vulkan_strict_math): a result
// that depended on IEEE behaviour of a built-in shows up as NaN even on lavapipe.
#ifndef CT_COMMON_MATH_GLSL
#define CT_COMMON_MATH_GLSL

const float CT_FLT_MAX = 3.402823466e38;

bool ct_isfinite(float x) { return (floatBitsToUint(x) & 0x7fffffffu) < 0x7f800000u; }
bool ct_isnan(float x) { return (floatBitsToUint(x) & 0x7fffffffu) > 0x7f800000u; }
bool ct_isinf(float x) { return (floatBitsToUint(x) & 0x7fffffffu) == 0x7f800000u; }
float ct_nan() { return uintBitsToFloat(0x7fc00000u); }
float ct_inf() { return uintBitsToFloat(0x7f800000u); }

#ifdef CT_STRICT_MATH
float ct_strict_exp(float x) { return x >= -110.0 && x <= 88.0 ? exp(x) : ct_nan(); }
float ct_strict_log(float x) { return x >= 1.17549435e-38 && x <= CT_FLT_MAX ? log(x) : ct_nan(); }
float ct_strict_sqrt(float x) { return x >= 0.0 && x <= CT_FLT_MAX ? sqrt(x) : ct_nan(); }
float ct_strict_inversesqrt(float x) {
  return x >= 1.17549435e-38 && x <= CT_FLT_MAX ? inversesqrt(x) : ct_nan();
}
float ct_strict_tanh(float x) {
  float e = ct_strict_exp(2.0 * x);
  return (e - 1.0) / (e + 1.0);
}
#define exp ct_strict_exp
#define log ct_strict_log
#define sqrt ct_strict_sqrt
#define inversesqrt ct_strict_inversesqrt
#define tanh ct_strict_tanh
#endif


// The helpers below are defined after the CT_STRICT_MATH replacements: their own calls are
// checked too.

// +0 or -0 with the sign of x, by bits (x * 0.0 may be folded to +0 by a compiler).
float ct_signed_zero(float x) { return uintBitsToFloat(floatBitsToUint(x) & 0x80000000u); }

// exp(x) for x <= 0 (callers pass x <= 0 up to rounding): 0 for x < -104, where fp32's exp is 0
// anyway (e^-104 < 2^-150), -inf included; NaN stays NaN. The built-in only sees [-104, ~0].
float ct_exp_le0(float x) { return x < -104.0 ? 0.0 : exp(x); }

// q * exp(e) for e <= 0, the product formed in the log domain where exp(e) alone would be
// subnormal (e <= -80), so that a result that is still a normal float (bf16 has f32's range)
// does not become 0; +-0 when the product is below fp32's range. Special q decided by bits:
// NaN -> NaN, +-inf -> +-inf while exp(e) > 0 and NaN (inf * 0) once it is 0, +-0 -> +-0.
float ct_mul_exp(float q, float e) {
  if (e > -80.0) return q * exp(e);
  if (ct_isnan(q) || ct_isnan(e)) return ct_nan();
  if (ct_isinf(q)) return e < -104.0 ? ct_nan() : q;
  if (abs(q) < 1.17549435e-38) return ct_signed_zero(q);  // below e^-80 * 2^-126: +-0
  return (q < 0.0 ? -1.0 : 1.0) * ct_exp_le0(log(abs(q)) + e);
}

// exp(-g) for g >= -80 (<= e^80): through ct_exp_le0 for g >= 0, so that exp never sees the
// -1e30 of a huge gate (a driver's range reduction need not survive it); the same value.
float ct_exp_neg_ge80(float g) { return g >= 0.0 ? ct_exp_le0(-g) : exp(-g); }
// sigmoid(g) without exp overflowing: 1 / (1 + exp(-g)) for g >= -80, where exp(-g) <= e^80
// (the formula used before, unchanged); below, exp(g) (1 + e^-80 rounds to 1 in fp32; 0 below
// -104). NaN stays NaN.
float ct_sigmoid(float g) { return g >= -80.0 ? 1.0 / (1.0 + ct_exp_neg_ge80(g)) : ct_exp_le0(g); }
// silu(g) = g sigmoid(g): g / (1 + exp(-g)) for g >= -80 (as before), g exp(g) below (-0 for
// g < -104, PyTorch's -1e30 / inf). NaN stays NaN; -inf gives NaN (-inf * 0), as in PyTorch.
float ct_silu(float g) {
  if (g >= -80.0) return g / (1.0 + ct_exp_neg_ge80(g));
  return ct_isinf(g) ? ct_nan() : g * ct_exp_le0(g);
}

// sqrt(x) for x >= 0 that may be +inf (a sum of squares that overflowed): inf, not a driver's
// x * inversesqrt(x) = inf * 0.
float ct_sqrt(float x) { return ct_isinf(x) ? x : sqrt(x); }

// A power of two s with a * s in [1, 4), for a finite a >= 1: scales a row whose sums of
// squares overflowed back into range without rounding (the norms' second pass).
float ct_downscale(float a) {
  int e = int((floatBitsToUint(a) >> 23) & 0xffu);  // biased exponent, <= 254
  return uintBitsToFloat(uint(max(254 - e, 1)) << 23);
}

// AdamW's lr * mhat / (sqrt(vhat) + eps), mhat = m / bc1, vhat = v / bc2, for the new moments m
// and v and the old v0 and the gradient g they came from. While v / bc2 is finite: that formula,
// unchanged. Past fp32's range (|g| beyond ~1e17; v itself may be inf): the same quotient with
// m, v0 and g scaled by a power of two k (max(sqrt(v0), |g|) k in [1, 4)), as the fp64 reference
// has it, never sqrt(inf) or a division by inf. v0 = +inf (an earlier overflow): 0 (m / inf);
// a non-finite m or a NaN v0: NaN.
float ct_adam_update(float m, float v, float v0, float g, float lr, float b2, float bc1, float bc2,
                     float eps) {
  float q = v / bc2;
  if (ct_isfinite(q)) return lr * (m / bc1) / (sqrt(q) + eps);
  if (!ct_isfinite(m) || ct_isnan(v0)) return ct_nan();
  if (ct_isinf(v0)) return 0.0;
  float k = ct_downscale(max(sqrt(v0), abs(g)));
  float gs = g * k;
  float t = b2 * ((v0 * k) * k) + (1.0 - b2) * gs * gs;
  return lr * ((m * k) / bc1) / (sqrt(t / bc2) + eps * k);
}

// The global-norm clipping factor min(1, max_norm / (norm + 1e-6)) without dividing by a value
// past 2^126: 0 for an inf norm (IEEE's max_norm / inf); NaN norm: 1 (the CPU's std::min).
float ct_clip_factor(float max_norm, float norm) {
  float d = norm + 1e-6;
  if (ct_isnan(d)) return 1.0;
  if (ct_isinf(d)) return 0.0;
  float c = d > 1e37 ? (max_norm * 0.0009765625) / (d * 0.0009765625) : max_norm / d;
  return min(1.0, c);
}

#endif  // CT_COMMON_MATH_GLSL
