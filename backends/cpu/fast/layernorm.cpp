// Fast layer normalisation: rows in parallel; dw/db from fixed row chunks reduced in order.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cpu/fast/vec_math.h"
#include "backends/cpu/kernels.h"

namespace ct::cpu::fast::CT_CPU_ISA {

namespace {

// One row: on, xn are (C); w, b are (C); mean, rstd are the row's statistics
inline void layernorm_row(float* on, float* mean, float* rstd, const float* xn, const float* w,
                          const float* b, int64_t C, float eps) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < C; ++i) s += xn[i];
  float m = s / static_cast<float>(C);
  float v = 0.0f;
#pragma omp simd reduction(+ : v)
  for (int64_t i = 0; i < C; ++i) v += (xn[i] - m) * (xn[i] - m);
  if (!std::isfinite(m) || !std::isfinite(v)) {
    // |x| past ~1e19: the sum or the squares overflow fp32. The row in fp64, as the reference
    // (an inf or NaN x gives NaN there too).
    double sd = 0.0, vd = 0.0;
    for (int64_t i = 0; i < C; ++i) sd += xn[i];
    const double md = sd / static_cast<double>(C);
    for (int64_t i = 0; i < C; ++i) vd += (xn[i] - md) * (xn[i] - md);
    const double rd = 1.0 / std::sqrt(vd / static_cast<double>(C) + eps);
    for (int64_t i = 0; i < C; ++i) on[i] = static_cast<float>((xn[i] - md) * rd * w[i] + b[i]);
    *mean = static_cast<float>(md);
    *rstd = static_cast<float>(rd);
    return;
  }
  float r = 1.0f / std::sqrt(v / static_cast<float>(C) + eps);
#pragma omp simd
  for (int64_t i = 0; i < C; ++i) on[i] = (xn[i] - m) * r * w[i] + b[i];
  *mean = m;
  *rstd = r;
}

}  // namespace

// out, x are (N,C); w, b are (C); mean, rstd are (N)
void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (N * C > (1 << 14))
  for (int64_t n = 0; n < N; ++n)
    layernorm_row(out + n * C, mean + n, rstd + n, x + n * C, w, b, C, eps);
}

// A row of C floats per thread, 32-byte aligned, for the bf16 kernels below: a row widened or
// computed in f32 there is in L1 when it is read again.
namespace {
float* row_buffer(int64_t C) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < C + 8) buf.resize(static_cast<size_t>(C + 8));
  const auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((32 - addr % 32) % 32) / sizeof(float);
}
}  // namespace

// residual, out, x, r are (N,C); w, b are (C); mean, rstd are (N)
// Row by row, so the sum is normalised while it is still in cache.
void residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd,
                                const float* x, const float* r, const float* w, const float* b,
                                int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (N * C > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    float* rn = residual + n * C;
    const float *xn = x + n * C, *dn = r + n * C;
#pragma omp simd
    for (int64_t i = 0; i < C; ++i) rn[i] = xn[i] + dn[i];
    layernorm_row(out + n * C, mean + n, rstd + n, rn, w, b, C, eps);
  }
}

// The same with r and out bf16 (out rounded to nearest even): each row of the layernorm is
// computed in f32 in a row buffer and rounded from there, so residual, mean, rstd and out are
// the bits of residual_layernorm_forward on the widened r, rounded. One pass over the 16-bit
// tensors instead of the device's pieces (r widened into scratch, out rounded from it).
void residual_layernorm_forward_bf16(float* residual, uint16_t* out, float* mean, float* rstd,
                                     const float* x, const uint16_t* r, const float* w,
                                     const float* b, int64_t N, int64_t C, float eps) {
#pragma omp parallel if (N * C > (1 << 14))
  {
    float* on = row_buffer(C);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float* rn = residual + n * C;
      const float* xn = x + n * C;
      const uint16_t* dn = r + n * C;
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) rn[i] = xn[i] + bf16_to_f32(dn[i]);
      layernorm_row(on, mean + n, rstd + n, rn, w, b, C, eps);
      round_bf16(out + n * C, on, C);
    }
  }
}

namespace {

// dout's row n as f32: the row itself, or widened from bf16 into buf.
inline const float* dout_row(const float* dout, int64_t n, int64_t C, float*) {
  return dout + n * C;
}
inline const float* dout_row(const uint16_t* dout, int64_t n, int64_t C, float* buf) {
  widen_bf16(buf, dout + n * C, C);
  return buf;
}

// dx, dout, x are (N,C); dw, db, w are (C); mean, rstd are (N); dout f32 or bf16 (each row
// widened into a row buffer as it is reached, then the f32 arithmetic: the same bits)
// Rows are cut into chunks whose count depends on N only; each chunk sums its dw/db partials
// into the workspace (2C floats per chunk), which are then added in chunk order: the result is
// the same run to run and for any thread count.
template <typename T>
void layernorm_backward_rows(Workspace& ws, float* dx, float* dw, float* db, const T* dout,
                             const float* x, const float* w, const float* mean, const float* rstd,
                             int64_t N, int64_t C) {
  if (N == 0 || C == 0) return;
  int64_t rows = std::max<int64_t>(16, (N + 255) / 256);
  int64_t nchunks = (N + rows - 1) / rows;
  float* part = static_cast<float*>(ws.get(static_cast<size_t>(nchunks * 2 * C) * sizeof(float)));
#pragma omp parallel for schedule(static) if (N * C > (1 << 14))
  for (int64_t ch = 0; ch < nchunks; ++ch) {
    float* pdw = part + ch * 2 * C;
    float* pdb = pdw + C;
    for (int64_t i = 0; i < 2 * C; ++i) pdw[i] = 0.0f;
    int64_t n1 = std::min(N, (ch + 1) * rows);
    float* buf = sizeof(T) == sizeof(float) ? nullptr : row_buffer(C);
    for (int64_t n = ch * rows; n < n1; ++n) {
      const float* dn = dout_row(dout, n, C, buf);
      const float* xn = x + n * C;
      float m = mean[n], s = rstd[n];
      float dmean = 0.0f, dnorm = 0.0f;
#pragma omp simd reduction(+ : dmean, dnorm)
      for (int64_t i = 0; i < C; ++i) {
        float xhat = (xn[i] - m) * s;
        float dxhat = dn[i] * w[i];
        dmean += dxhat;
        dnorm += dxhat * xhat;
      }
      dmean /= static_cast<float>(C);
      dnorm /= static_cast<float>(C);
      float* dxn = dx + n * C;
#pragma omp simd
      for (int64_t i = 0; i < C; ++i) {
        float xhat = (xn[i] - m) * s;
        float dxhat = dn[i] * w[i];
        pdw[i] += dn[i] * xhat;
        pdb[i] += dn[i];
        dxn[i] += s * (dxhat - dmean - xhat * dnorm);
      }
    }
  }
  // On the calling thread: a few hundred KiB at most (64 chunks x 2C), and one OpenMP barrier
  // fewer per call, which matters when another process holds a core.
#pragma omp simd
  for (int64_t i = 0; i < C; ++i) {
    float sw = 0.0f, sb = 0.0f;
    for (int64_t ch = 0; ch < nchunks; ++ch) {
      sw += part[ch * 2 * C + i];
      sb += part[ch * 2 * C + C + i];
    }
    dw[i] += sw;
    db[i] += sb;
  }
}

}  // namespace

void layernorm_backward(Workspace& ws, float* dx, float* dw, float* db, const float* dout,
                        const float* x, const float* w, const float* mean, const float* rstd,
                        int64_t N, int64_t C) {
  layernorm_backward_rows(ws, dx, dw, db, dout, x, w, mean, rstd, N, C);
}
void layernorm_backward_bf16(Workspace& ws, float* dx, float* dw, float* db, const uint16_t* dout,
                             const float* x, const float* w, const float* mean, const float* rstd,
                             int64_t N, int64_t C) {
  layernorm_backward_rows(ws, dx, dw, db, dout, x, w, mean, rstd, N, C);
}

}  // namespace ct::cpu::fast::CT_CPU_ISA
