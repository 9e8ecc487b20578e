// The tanh GELU and its backward, one copy for gelu.comp and the GEMM epilogues
// (matmul.comp, matmul_coopmat.comp, matmul_splitk.comp), so that a fused matmul_bias_gelu /
// matmul_gelu_backward gives the unfused ops' bits: the same float operations in the same order.
// Include after common/math.glsl (CT_STRICT_MATH's replacements apply here too).
//
// With z = kScale (c + 0.044715 c^3) and t = exp(-2|z|) in [0, 1]:
//   1 + tanh z = 2 / (1 + t) for z >= 0, 2 t / (1 + t) for z < 0;  sech^2 z = 4 t / (1 + t)^2.
// No 1 + tanh z cancellation (gelu(-7) is -4e-14 in f32, not 0), no inf/inf for large |z|.
// c is v clamped to [-20, 20]: past |v| = 7e12, v^3 overflows (and inf * 0 became NaN in the
// backward on NVIDIA's driver); from |v| = 20 on, |z| > 300 and t = 0, so gelu(v) = v or -0 and
// gelu'(v) = 1 or 0 as with the exact v (gelu(-11) is already -0 in fp32). For |v| <= 20 c = v:
// the results are those of the unclamped formula. NaN or inf v: the clamp may give anything in
// [-20, 20]; v itself carries NaN / inf into every branch. For z < 0 the result is q * t, formed
// by ct_mul_exp() (common/math.glsl) without t underflowing first.
#ifndef CT_COMMON_GELU_GLSL
#define CT_COMMON_GELU_GLSL

const float CT_GELU_SCALE = 0.7978845608028654;  // sqrt(2/pi)

// backward false: gelu(v) = 0.5 v (1 + tanh z);
// backward true:   d gelu'(v) = d (0.5 (1 + tanh z) + 0.5 v sech^2 z kScale (1 + 3 * 0.044715 v^2)).
// One function for both, so that a shader choosing the direction at run time (the GEMM
// epilogues) compiles the shared work -- z, t, u and the ct_mul_exp() -- once; each direction's
// float operations are the same either way, and a constant `backward` folds the other away.
float ct_gelu_dir(float v, float d, bool backward) {
  float c = clamp(v, -20.0, 20.0);
  float z = CT_GELU_SCALE * (c + 0.044715 * c * c * c);
  float e = -2.0 * abs(z);  // log t, >= -610
  float t = ct_exp_le0(e);
  float u = 1.0 / (1.0 + t);
  if (z >= 0.0) {
    if (!backward) return v * u;
    // d u (1 + 2 kScale u v t (1 + 3 * 0.044715 v^2)); v t first, so that once t is 0 this is
    // d u (an inf v gives NaN, as fp64's 0.5 v sech^2 z)
    float w = v * t;
    return d * u * (1.0 + 2.0 * CT_GELU_SCALE * u * (w + 3.0 * 0.044715 * (w * c) * c));
  }
  float q = v * u;  // forward: the result over t
  if (backward) {
    if (e < -200.0) {
      // t < 1e-87: t v^3 dout is below the smallest bf16 subnormal for any finite dout; NaN for
      // v = -inf (as fp64's 0.5 v sech^2 z) or a NaN dout. (Not d * v * 0.0: compilers may fold
      // x * 0.0 to 0.0 without SignedZeroInfNanPreserve.)
      return !ct_isfinite(v) || ct_isnan(d) ? ct_nan() : ct_signed_zero(d);  // +0 * d
    }
    // t d u (1 + 2 kScale u v (1 + 3 * 0.044715 v^2)); |z| <= 100 here: |v| < 13, c = v
    float p = 2.0 * c * CT_GELU_SCALE * (1.0 + 3.0 * 0.044715 * c * c);
    q = d * u * (1.0 + p * u);
  }
  return ct_mul_exp(q, e);
}

float ct_gelu(float v) { return ct_gelu_dir(v, 0.0, false); }
float ct_gelu_backward(float v, float d) { return ct_gelu_dir(v, d, true); }

#endif  // CT_COMMON_GELU_GLSL
