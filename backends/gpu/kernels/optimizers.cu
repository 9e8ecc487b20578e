// The fused optimizer steps of core/device.h: AdamW, SGD, Lion, block-wise 8-bit AdamW and
// Adafactor, fp32 arithmetic. Scalars that depend only on the step (bias corrections, Adafactor's
// rho and beta2_t) are computed on the host in double and passed in; the clipping factor is read
// on the device from grad_norm, never on the host. Adafactor's reductions run on reduce.cu's
// fixed trees and the column sums walk rows in order, so every step is deterministic.
#include <cmath>

#include "backends/gpu/kernels/common.h"
#include "backends/gpu/kernels/safe_math.h"

namespace ct::gpu {
namespace {

constexpr int kThreads = 256;

// min(1, max_grad_norm / (grad_norm[0] + 1e-6)), or 1 without clipping; 0 for an inf norm (no
// division by inf: IEEE's quotient), 1 for a NaN norm (the CPU's std::min), the division scaled
// for norms past 1e37.
__device__ __forceinline__ float clip_of(const float* grad_norm, float max_grad_norm) {
  if (!grad_norm || !(max_grad_norm > 0.0f)) return 1.0f;
  const float d = grad_norm[0] + 1e-6f;
  if (ct_isnan(d)) return 1.0f;
  if (ct_isinf(d)) return 0.0f;
  const float c =
      d > 1e37f ? (max_grad_norm * 0.0009765625f) / (d * 0.0009765625f) : max_grad_norm / d;
  return c < 1.0f ? c : 1.0f;
}

#define CT_GRID_STRIDE(i, n) CT_FOR_EACH_ELEMENT(i, n, kThreads)

struct AdamScalars {
  float lr, b1, b2, eps, wd, max_norm, bc1, bc2;
};

// Where the AdamW kernels store the updated parameter once more: a 16-bit copy (F16, BF16, the
// rounding of convert()), or nowhere.
struct NoCopy {
  static __device__ __forceinline__ void store(void*, std::int64_t, float) {}
};

// Element i of param, grad, m, v: the update both AdamW kernels make, with s's lr, wd, bc1, bc2;
// the parameter also stored into param16 as an element H.
template <typename H>
__device__ __forceinline__ void adamw_element(float* param, const float* grad, float* m, float* v,
                                              void* param16, std::int64_t i, float clip,
                                              const AdamScalars& s) {
  const float g = grad[i] * clip;
  const float mi = s.b1 * m[i] + (1.0f - s.b1) * g;
  const float v0 = v[i];
  const float vi = s.b2 * v0 + (1.0f - s.b2) * g * g;
  m[i] = mi;
  v[i] = vi;
  float p = param[i];
  p -= s.lr * s.wd * p;
  p -= ct_adam_update(mi, vi, v0, g, s.lr, s.b2, s.bc1, s.bc2, s.eps);
  param[i] = p;
  H::store(param16, i, p);
}

// param, grad, m, v (n); param16 (n) of H, unused for NoCopy.
template <int WARP, typename H>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    adamw_kernel(float* param, const float* grad, float* m, float* v, void* param16,
                 const float* grad_norm, std::int64_t n, AdamScalars s) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const float clip = clip_of(grad_norm, s.max_norm);
  CT_GRID_STRIDE(i, n) adamw_element<H>(param, grad, m, v, param16, i, clip, s);
}

// The ranges of adamw_groups laid end to end: element j of the concatenation (j < total) lies
// in the last range r with first[r] <= j, at param index j + shift[r]. Unused slots have
// first = total (never chosen).
struct AdamRangeTable {
  std::int64_t first[kAdamMaxRanges], shift[kAdamMaxRanges];
  float wd[kAdamMaxRanges];
};

// param, grad, m, v (N, the ranges within it); param16 (N) of H, unused for NoCopy; schedule
// (4): lr, step, bc1, bc2 (AdamWSchedule).
template <int WARP, typename H>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    adamw_groups_kernel(float* param, const float* grad, float* m, float* v, void* param16,
                        const float* grad_norm, const float* schedule, std::int64_t total,
                        AdamRangeTable table, AdamScalars s) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const float clip = clip_of(grad_norm, s.max_norm);
  s.lr = schedule[0];
  s.bc1 = schedule[2];
  s.bc2 = schedule[3];
  CT_GRID_STRIDE(j, total) {
    // Compares against kernel arguments, a loop of constant length (unrolled by the compiler).
    std::int64_t shift = table.shift[0];
    float wd = table.wd[0];
    for (int r = 1; r < kAdamMaxRanges; ++r) {
      if (j >= table.first[r]) {
        shift = table.shift[r];
        wd = table.wd[r];
      }
    }
    AdamScalars e = s;
    e.wd = wd;
    adamw_element<H>(param, grad, m, v, param16, j + shift, clip, e);
  }
}

// param, grad (n); buf (n) or nullptr without momentum.
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    sgd_kernel(float* param, const float* grad, float* buf, const float* grad_norm, std::int64_t n,
               SgdArgs h) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const float clip = clip_of(grad_norm, h.max_grad_norm);
  CT_GRID_STRIDE(i, n) {
    const float p = param[i];
    float g = grad[i] * clip + h.weight_decay * p;
    if (h.momentum != 0.0f) {
      const float b = h.step == 1 ? g : h.momentum * buf[i] + (1.0f - h.dampening) * g;
      buf[i] = b;
      g = h.nesterov ? g + h.momentum * b : b;
    }
    param[i] = p - h.lr * g;
  }
}

// param, grad, m (n).
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    lion_kernel(float* param, const float* grad, float* m, const float* grad_norm, std::int64_t n,
                LionArgs h) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const float clip = clip_of(grad_norm, h.max_grad_norm);
  CT_GRID_STRIDE(i, n) {
    const float g = grad[i] * clip;
    const float c = h.beta1 * m[i] + (1.0f - h.beta1) * g;
    const float sign = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
    const float p = param[i] * (1.0f - h.lr * h.weight_decay);
    param[i] = p - h.lr * sign;
    m[i] = h.beta2 * m[i] + (1.0f - h.beta2) * g;
  }
}

// nearest(code, x): the index minimising |code[i] - x|, the lower one on a tie (code sorted).
__device__ __forceinline__ std::uint8_t nearest(const float* code, float x) {
  int lo = 0;
  for (int step = 128; step > 0; step >>= 1) lo += (code[lo + step - 1] < x) ? step : 0;
  if (lo == 256) return 255;
  if (lo == 0) return 0;
  return static_cast<std::uint8_t>((x - code[lo - 1] <= code[lo] - x) ? lo - 1 : lo);
}

// Block b updates elements [256 b, min(n, 256 b + 256)): param, grad (n) f32; m_q, v_q (n) u8;
// m_absmax, v_absmax (blocks); qmap_signed, qmap_unsigned (256).
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    adamw_8bit_kernel(float* param, const float* grad, std::uint8_t* m_q, std::uint8_t* v_q,
                      float* m_absmax, float* v_absmax, const float* qmap_signed,
                      const float* qmap_unsigned, const float* grad_norm, std::int64_t n,
                      AdamScalars s) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_SHARED(float, qs, 256);
  CT_SHARED(float, qu, 256);
  CT_SHARED(float, red, kThreads);
  const int t = threadIdx.x;
  qs[t] = qmap_signed[t];
  qu[t] = qmap_unsigned[t];
  __syncthreads();
  const std::int64_t blk = blockIdx.x;
  const std::int64_t i = blk * kThreads + t;
  const bool live = i < n;
  const float clip = clip_of(grad_norm, s.max_norm);
  float mi = 0.0f, vi = 0.0f;
  if (live) {
    const float g = grad[i] * clip;
    mi = s.b1 * (qs[m_q[i]] * m_absmax[blk]) + (1.0f - s.b1) * g;
    const float v0 = qu[v_q[i]] * v_absmax[blk];
    vi = s.b2 * v0 + (1.0f - s.b2) * g * g;
    float p = param[i];
    p -= s.lr * s.wd * p;
    p -= ct_adam_update(mi, vi, v0, g, s.lr, s.b2, s.bc1, s.bc2, s.eps);
    param[i] = p;
  }
  const float mmax = block_max<WARP, kThreads>(live ? fabsf(mi) : 0.0f, red);
  const float vmax = block_max<WARP, kThreads>(live ? vi : 0.0f, red);
  if (t == 0) {
    m_absmax[blk] = mmax;
    v_absmax[blk] = vmax;
  }
  if (live) {
    m_q[i] = nearest(qs, mmax > 0.0f ? mi / mmax : 0.0f);
    v_q[i] = nearest(qu, vmax > 0.0f ? vi / vmax : 0.0f);
  }
}

// ---- Adafactor ---------------------------------------------------------------------------------
struct AfScalars {
  float clip_max, eps1, eps2, b2t, rho, clip_threshold, beta1, wd;
  bool scale_parameter;
  std::int64_t R, C, n;
};

// Block r: row[r] = b2t row[r] + (1 - b2t) mean_c(g^2 + eps1); grad (R, C).
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    af_row_kernel(float* row, const float* grad, const float* grad_norm, AfScalars s) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_SHARED(float, red, kThreads);
  const std::int64_t r = blockIdx.x;
  const float clip = clip_of(grad_norm, s.clip_max);
  float acc = 0.0f;
  for (std::int64_t c = threadIdx.x; c < s.C; c += kThreads) {
    const float g = grad[r * s.C + c] * clip;
    acc += g * g + s.eps1;
  }
  acc = block_sum<WARP, kThreads>(acc, red);
  if (threadIdx.x == 0) row[r] = s.b2t * row[r] + (1.0f - s.b2t) * (acc / static_cast<float>(s.C));
}

// Thread c: col[c] = b2t col[c] + (1 - b2t) mean_r(g^2 + eps1), rows in order.
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    af_col_kernel(float* col, const float* grad, const float* grad_norm, AfScalars s) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= s.C) return;
  const float clip = clip_of(grad_norm, s.clip_max);
  float acc = 0.0f;
  for (std::int64_t r = 0; r < s.R; ++r) {
    const float g = grad[r * s.C + c] * clip;
    acc += g * g + s.eps1;
  }
  col[c] = s.b2t * col[c] + (1.0f - s.b2t) * (acc / static_cast<float>(s.R));
}

// u (R, C) = g / sqrt(row[r] / row_mean) / sqrt(col[c]); scal[1] = row_mean.
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    af_u_factored_kernel(float* u, const float* grad, const float* row, const float* col,
                         const float* scal, const float* grad_norm, AfScalars s) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const float clip = clip_of(grad_norm, s.clip_max);
  const float row_mean = scal[1];
  CT_GRID_STRIDE(i, s.n) {
    const std::int64_t r = i / s.C, c = i - r * s.C;
    u[i] = grad[i] * clip / sqrtf(row[r] / row_mean) / sqrtf(col[c]);
  }
}

// v (n) = b2t v + (1 - b2t)(g^2 + eps1); u = g / sqrt(v).
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    af_u_plain_kernel(float* u, float* v, const float* grad, const float* grad_norm, AfScalars s) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const float clip = clip_of(grad_norm, s.clip_max);
  CT_GRID_STRIDE(i, s.n) {
    const float g = grad[i] * clip;
    const float vi = s.b2t * v[i] + (1.0f - s.b2t) * (g * g + s.eps1);
    v[i] = vi;
    u[i] = g / sqrtf(vi);
  }
}

// param -= wd lr_t param; param -= U, U = u lr_t / max(1, RMS(u) / clip_threshold) (through
// exp_avg when beta1 > 0). scal[0] = |param| before the step, scal[2] = |u| (L2 norms).
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    af_apply_kernel(float* param, float* exp_avg, const float* u, const float* scal, AfScalars s) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const float sqrt_n = sqrtf(static_cast<float>(s.n));
  float scale = 1.0f;
  if (s.scale_parameter) scale = fmaxf(s.eps2, scal[0] / sqrt_n);
  const float lr_t = s.rho * scale;
  const float rms = scal[2] / sqrt_n;
  const float k = lr_t / fmaxf(1.0f, rms / s.clip_threshold);
  CT_GRID_STRIDE(i, s.n) {
    float upd = u[i] * k;
    if (exp_avg) {
      upd = s.beta1 * exp_avg[i] + (1.0f - s.beta1) * upd;
      exp_avg[i] = upd;
    }
    float p = param[i];
    p -= s.wd * lr_t * p;
    param[i] = p - upd;
  }
}

#undef CT_GRID_STRIDE

AdamScalars adam_scalars(const AdamArgs& h) {
  const double t = static_cast<double>(h.step);
  return AdamScalars{h.lr,
                     h.beta1,
                     h.beta2,
                     h.eps,
                     h.weight_decay,
                     h.max_grad_norm,
                     static_cast<float>(1.0 - std::pow(static_cast<double>(h.beta1), t)),
                     static_cast<float>(1.0 - std::pow(static_cast<double>(h.beta2), t))};
}

std::size_t align256(std::size_t b) {
  return (b + 255) / 256 * 256;
}

// fn(H{}): NoCopy without param16, else the tag of its element type.
template <typename Fn>
void with_copy(const void* param16, Elem e16, Fn&& fn) {
  if (!param16) return fn(NoCopy{});
  with_elem(e16, fn);
}

}  // namespace

void adamw(const Ctx& cx, float* param, const float* grad, float* m, float* v,
           const float* grad_norm, std::int64_t n, const AdamArgs& h, void* param16, Elem e16) {
  if (n <= 0) return;
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_copy(param16, e16, [&](auto tag) {
      using H = decltype(tag);
      launch<W>(CT_KERNEL(adamw_kernel<W, H>), dim3(grid_for(cx, n, kThreads)), dim3(kThreads), 0,
                stream_of(cx), param, grad, m, v, param16, grad_norm, n, adam_scalars(h));
    });
  });
}

void adamw_groups(const Ctx& cx, float* param, const float* grad, float* m, float* v,
                  const float* grad_norm, const float* schedule, const AdamRange* ranges, int count,
                  const AdamArgs& h, void* param16, Elem e16) {
  AdamRangeTable table;
  std::int64_t total = 0;
  for (int r = 0; r < count; ++r) {
    table.first[r] = total;
    table.shift[r] = ranges[r].begin - total;
    table.wd[r] = ranges[r].decay ? h.weight_decay : 0.0f;
    total += ranges[r].len;
  }
  for (int r = count; r < kAdamMaxRanges; ++r) {
    table.first[r] = total;
    table.shift[r] = 0;
    table.wd[r] = 0.0f;
  }
  if (total <= 0) return;
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_copy(param16, e16, [&](auto tag) {
      using H = decltype(tag);
      launch<W>(CT_KERNEL(adamw_groups_kernel<W, H>), dim3(grid_for(cx, total, kThreads)),
                dim3(kThreads), 0, stream_of(cx), param, grad, m, v, param16, grad_norm, schedule,
                total, table, adam_scalars(h));  // lr, bc1, bc2 replaced by the schedule's
    });
  });
}

void sgd(const Ctx& cx, float* param, const float* grad, float* momentum_buf,
         const float* grad_norm, std::int64_t n, const SgdArgs& h) {
  if (n <= 0) return;
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    launch<W>(CT_KERNEL(sgd_kernel<W>), dim3(grid_for(cx, n, kThreads)), dim3(kThreads), 0,
              stream_of(cx), param, grad, momentum_buf, grad_norm, n, h);
  });
}

void lion(const Ctx& cx, float* param, const float* grad, float* m, const float* grad_norm,
          std::int64_t n, const LionArgs& h) {
  if (n <= 0) return;
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    launch<W>(CT_KERNEL(lion_kernel<W>), dim3(grid_for(cx, n, kThreads)), dim3(kThreads), 0,
              stream_of(cx), param, grad, m, grad_norm, n, h);
  });
}

void adamw_8bit(const Ctx& cx, float* param, const float* grad, std::uint8_t* m_q,
                std::uint8_t* v_q, float* m_absmax, float* v_absmax, const float* qmap_signed,
                const float* qmap_unsigned, const float* grad_norm, std::int64_t n,
                const AdamArgs& h) {
  if (n <= 0) return;
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;  // kQuantBlockSize == kThreads
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    launch<W>(CT_KERNEL(adamw_8bit_kernel<W>), dim3(static_cast<unsigned>(blocks)), dim3(kThreads),
              0, stream_of(cx), param, grad, m_q, v_q, m_absmax, v_absmax, qmap_signed,
              qmap_unsigned, grad_norm, n, adam_scalars(h));
  });
}

// Workspace: 4 scalars | reduction partials | u (n floats).
std::size_t adafactor_workspace(std::int64_t R, std::int64_t C) {
  const std::int64_t n = R > 0 ? R * C : C;
  return 256 + align256(reduce_workspace(n)) + static_cast<std::size_t>(n) * sizeof(float);
}

void adafactor(const Ctx& cx, float* param, const float* grad, float* row, float* col, float* v,
               float* exp_avg, const float* grad_norm, std::int64_t R, std::int64_t C,
               const AdafactorArgs& h, void* workspace) {
  const bool factored = R > 0;
  const std::int64_t n = factored ? R * C : C;
  if (n <= 0) return;
  auto* scal = static_cast<float*>(workspace);  // [0] |param|, [1] row mean, [2] |u|
  void* partial = static_cast<char*>(workspace) + 256;
  auto* u = reinterpret_cast<float*>(static_cast<char*>(partial) + align256(reduce_workspace(n)));
  const double t = static_cast<double>(h.step);
  double rho = h.lr;
  if (h.relative_step) rho = std::min(h.warmup_init ? 1e-6 * t : 1e-2, 1.0 / std::sqrt(t));
  AfScalars s{h.max_grad_norm,
              h.eps1,
              h.eps2,
              static_cast<float>(1.0 - std::pow(t, static_cast<double>(h.decay_rate))),
              static_cast<float>(rho),
              h.clip_threshold,
              h.beta1,
              h.weight_decay,
              h.scale_parameter,
              factored ? R : 1,
              C,
              n};
  const dim3 grid(grid_for(cx, n, kThreads));
  if (h.scale_parameter) norm(cx, scal + 0, param, n, partial);
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    if (factored) {
      launch<W>(CT_KERNEL(af_row_kernel<W>), dim3(static_cast<unsigned>(R)), dim3(kThreads), 0,
                stream_of(cx), row, grad, grad_norm, s);
      launch<W>(CT_KERNEL(af_col_kernel<W>),
                dim3(static_cast<unsigned>((C + kThreads - 1) / kThreads)), dim3(kThreads), 0,
                stream_of(cx), col, grad, grad_norm, s);
      sum(cx, scal + 1, row, R, 1.0f / static_cast<float>(R), partial);
      launch<W>(CT_KERNEL(af_u_factored_kernel<W>), grid, dim3(kThreads), 0, stream_of(cx), u, grad,
                static_cast<const float*>(row), static_cast<const float*>(col),
                static_cast<const float*>(scal), grad_norm, s);
    } else {
      launch<W>(CT_KERNEL(af_u_plain_kernel<W>), grid, dim3(kThreads), 0, stream_of(cx), u, v, grad,
                grad_norm, s);
    }
    norm(cx, scal + 2, u, n, partial);
    launch<W>(CT_KERNEL(af_apply_kernel<W>), grid, dim3(kThreads), 0, stream_of(cx), param, exp_avg,
              static_cast<const float*>(u), static_cast<const float*>(scal), s);
  });
}

}  // namespace ct::gpu
