// Fast GELU (tanh form). With AVX-512 the loops are written with intrinsics: the portable loop's
// tanh = 1 - 2 / (exp(2u) + 1) compiles to a vector division, whose throughput (one per ~10-16
// cycles) bounds the whole loop; here the reciprocal is rcp14 plus one Newton step (relative
// error ~1e-8), which makes the loop about as fast as memory. Without AVX-512, the portable loop.
#include <algorithm>

#include "backends/cpu/fast/vec_math.h"
#include "backends/cpu/kernels.h"

#if defined(__AVX512F__)
#include "backends/cpu/fast/attention_kernels.h"  // exp16
#endif

CT_FAST_WIDE_VECTORS

namespace ct::cpu::fast::CT_CPU_ISA {

namespace {
constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kA = 0.044715f;
constexpr int64_t kParallelMin = 1 << 14;
// Beyond |x| = 10, tanh(...) is +-1 in f32; clamping keeps x^3 from overflowing into 0 * inf.
inline float clamp10(float x) {
  return x > 10.0f ? 10.0f : (x < -10.0f ? -10.0f : x);
}

#if !defined(__AVX512F__)
// Elements per span of the portable loops (a stack buffer's worth).
constexpr int64_t kSpan = 256;

// th[i] = tanh(kS (c + kA c^3)), c = clamp10(x(i)), for i < n <= kSpan: the exps in one vector
// loop, the division in another. As one loop the chain from load to store was ~90 cycles of
// latency over ~45 instructions, more than the out-of-order window overlaps: ~3 cycles an
// element on Zen 3. Two loops of half the chain each overlap twice as many elements; the bits
// are fast_tanh's (|2u| < 87.32, inside fast_exp_in_range's domain).
template <class X>
inline void tanh_args(float* th, X x, int64_t n) {
  float e[kSpan];
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float c = clamp10(x(i));
    e[i] = fast_exp_in_range(2.0f * (kS * (c + kA * c * c * c)));
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) th[i] = 1.0f - 2.0f / (e[i] + 1.0f);
}

// body(i0, len, th) for spans of kSpan elements, th their tanh_args; spans in parallel.
template <class X, class Body>
void for_spans(int64_t n, X x, Body body) {
  const int64_t spans = (n + kSpan - 1) / kSpan;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t sp = 0; sp < spans; ++sp) {
    const int64_t i0 = sp * kSpan, len = std::min(kSpan, n - i0);
    float th[kSpan];
    tanh_args(
        th, [&](int64_t i) { return x(i0 + i); }, len);
    body(i0, len, th);
  }
}

// body(i0, len, xs, th) for spans of kSpan elements in parallel, with two span-sized buffers:
// the bf16 kernels widen a span into xs, compute in f32 and round it back in one go (the
// conversions as whole vectors; element by element inside the arithmetic they cost ~1 cycle an
// element).
template <class Body>
void for_bf16_spans(int64_t n, Body body) {
  const int64_t spans = (n + kSpan - 1) / kSpan;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t sp = 0; sp < spans; ++sp) {
    float xs[kSpan], th[kSpan];
    body(sp * kSpan, std::min(kSpan, n - sp * kSpan), xs, th);
  }
}
#endif

#if defined(__AVX512F__)
constexpr int64_t kChunk = 4096;  // elements per OpenMP work item (a multiple of 16)

// clamp10 on 16 lanes; a NaN lane stays NaN (min/max return their second operand on NaN).
inline __m512 clamp10_16(__m512 x) {
  __m512 hi = _mm512_set1_ps(10.0f), lo = _mm512_set1_ps(-10.0f);
  return _mm512_mask_max_ps(lo, 0xFFFF, lo, _mm512_mask_min_ps(hi, 0xFFFF, hi, x));
}

// tanh(kS * (c + kA c^3)) for |c| <= 10: 1 - 2 / (exp(2u) + 1), 2u <= 87.3 so exp stays finite.
inline __m512 tanh_arg16(__m512 c) {
  __m512 c2 = _mm512_mul_ps(c, c);
  __m512 u = _mm512_mul_ps(_mm512_mul_ps(c, _mm512_set1_ps(2.0f * kS)),
                           _mm512_fmadd_ps(c2, _mm512_set1_ps(kA), _mm512_set1_ps(1.0f)));
  __m512 d = _mm512_add_ps(attn::exp16(u), _mm512_set1_ps(1.0f));
  __m512 r =
      _mm512_maskz_rcp14_ps(0xFFFF, d);  // GCC 12: the unmasked form trips -Wmaybe-uninitialized
  r = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));  // Newton: r (2 - d r)
  return _mm512_fnmadd_ps(_mm512_set1_ps(2.0f), r, _mm512_set1_ps(1.0f));
}

template <class Body>
void for_chunks(int64_t n, Body body) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const int64_t end = std::min(n, (ch + 1) * kChunk);
    for (int64_t i = ch * kChunk; i < end; i += 16) {
      const int64_t left = end - i;
      body(i,
           left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u));
    }
  }
}
#endif
}  // namespace

// out, x are (n)
void gelu_forward(float* out, const float* x, int64_t n) {
#if defined(__AVX512F__)
  for_chunks(n, [&](int64_t i, __mmask16 m) {
    __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    __m512 th = tanh_arg16(clamp10_16(v));
    __m512 y = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), v),
                             _mm512_add_ps(th, _mm512_set1_ps(1.0f)));
    _mm512_mask_storeu_ps(out + i, m, y);
  });
#else
  for_spans(
      n, [&](int64_t i) { return x[i]; },
      [&](int64_t i0, int64_t len, const float* th) {
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) out[i0 + i] = 0.5f * x[i0 + i] * (1.0f + th[i]);
      });
#endif
}

// dx, x, dout are (n)
void gelu_backward(float* dx, const float* x, const float* dout, int64_t n) {
#if defined(__AVX512F__)
  for_chunks(n, [&](int64_t i, __mmask16 m) {
    __m512 c = clamp10_16(_mm512_maskz_loadu_ps(m, x + i));
    __m512 th = tanh_arg16(c);
    __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    // 0.5 (1 + th) + 0.5 c (1 - th^2) kS (1 + 3 kA c^2)
    __m512 slope = _mm512_fmadd_ps(_mm512_mul_ps(c, c), _mm512_set1_ps(3.0f * kA), one);
    __m512 sech2 = _mm512_fnmadd_ps(th, th, one);
    __m512 grad = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(half, c), sech2),
                                  _mm512_mul_ps(_mm512_set1_ps(kS), slope),
                                  _mm512_mul_ps(half, _mm512_add_ps(one, th)));
    _mm512_mask_storeu_ps(dx + i, m, _mm512_mul_ps(grad, _mm512_maskz_loadu_ps(m, dout + i)));
  });
#else
  for_spans(
      n, [&](int64_t i) { return x[i]; },
      [&](int64_t i0, int64_t len, const float* th) {
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) {
          float c = clamp10(x[i0 + i]);  // NaN passes through clamp10
          float t = th[i];
          float grad =
              0.5f * (1.0f + t) + 0.5f * c * (1.0f - t * t) * kS * (1.0f + 3.0f * kA * c * c);
          dx[i0 + i] = grad * dout[i0 + i];
        }
      });
#endif
}

// out, x are (n) bf16: widened, GELU in f32 (the portable formula), rounded to nearest even,
// all in registers. Beside gelu_forward on widened copies this saves two passes over the data:
// the device's bf16 path (cpu_device.cpp) calls it where the table has it.
void gelu_forward_bf16(uint16_t* out, const uint16_t* x, int64_t n) {
#if defined(__AVX512F__)
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float v = bf16_to_f32(x[i]), c = clamp10(v);
    out[i] = f32_to_bf16(0.5f * v * (1.0f + fast_tanh_in_range(kS * (c + kA * c * c * c))));
  }
#else
  for_bf16_spans(n, [&](int64_t i0, int64_t len, float* xs, float* th) {
    widen_bf16(xs, x + i0, len);
    tanh_args(
        th, [&](int64_t i) { return xs[i]; }, len);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) xs[i] = 0.5f * xs[i] * (1.0f + th[i]);
    round_bf16(out + i0, xs, len);
  });
#endif
}

// dx, x, dout are (n) bf16, as gelu_forward_bf16
void gelu_backward_bf16(uint16_t* dx, const uint16_t* x, const uint16_t* dout, int64_t n) {
#if defined(__AVX512F__)
#pragma omp parallel for simd schedule(static) if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float c = clamp10(bf16_to_f32(x[i]));
    float th = fast_tanh_in_range(kS * (c + kA * c * c * c));
    float grad = 0.5f * (1.0f + th) + 0.5f * c * (1.0f - th * th) * kS * (1.0f + 3.0f * kA * c * c);
    dx[i] = f32_to_bf16(grad * bf16_to_f32(dout[i]));
  }
#else
  for_bf16_spans(n, [&](int64_t i0, int64_t len, float* xs, float* th) {
    widen_bf16(xs, x + i0, len);
    tanh_args(
        th, [&](int64_t i) { return xs[i]; }, len);
    float ds[kSpan];
    widen_bf16(ds, dout + i0, len);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) {
      float c = clamp10(xs[i]), t = th[i];
      float grad = 0.5f * (1.0f + t) + 0.5f * c * (1.0f - t * t) * kS * (1.0f + 3.0f * kA * c * c);
      xs[i] = grad * ds[i];
    }
    round_bf16(dx + i0, xs, len);
  });
#endif
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
