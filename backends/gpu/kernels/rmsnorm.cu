// RMS normalisation over the last dimension (Llama's RMSNorm): rows of up to 4,096 elements 32
// lanes a row (8 a block), longer ones one block a row, for the statistic and dx; the weight
// gradient is a column sum over rows in two fixed passes (rows in chunks of kChunk, then the
// chunks in order): no float atomics, a result that depends on N and C only. The same structure
// as layernorm.cu.
#include "backends/gpu/kernels/common.h"
#include "backends/gpu/kernels/safe_math.h"

namespace ct::gpu {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kChunk = 64;  // rows per partial of dw

// The block's row n: out (C) of element O at row offset n C, = (x * rstd) * w; *rstd; xn (C);
// w (C).
template <int WARP, typename O>
__device__ __forceinline__ void rmsnorm_row(void* out, float* rstd, const float* xn, const float* w,
                                            std::int64_t n, std::int64_t C, float eps,
                                            float* smem) {
  float ss = 0.0f;
  for (std::int64_t i = threadIdx.x; i < C; i += kThreads) ss += xn[i] * xn[i];
  float ms = block_sum<WARP, kThreads>(ss, smem) / static_cast<float>(C);
  // The row is used as x * sc: sc = 1 (the arithmetic of before) unless the squares overflowed
  // (|x| past ~1e19); then sc, a power of two, brings max |x| into [1, 4) and the sum is taken
  // again. Block-uniform: ms is the reduced value.
  float sc = 1.0f;
  if (!ct_isfinite(ms)) {
    float a = 0.0f;
    for (std::int64_t i = threadIdx.x; i < C; i += kThreads) a = fmaxf(a, fabsf(xn[i]));
    a = block_max<WARP, kThreads>(a, smem);
    if (ct_isfinite(a)) {  // an inf x keeps ms = inf: rstd 0, as PyTorch's rsqrt(inf)
      sc = ct_downscale(a);
      ss = 0.0f;
      for (std::int64_t i = threadIdx.x; i < C; i += kThreads) ss += (xn[i] * sc) * (xn[i] * sc);
      ms = block_sum<WARP, kThreads>(ss, smem) / static_cast<float>(C);
    }
  }
  const float r = ct_isinf(ms) ? 0.0f : 1.0f / sqrtf(ms + eps * sc * sc);  // rstd of x sc
  for (std::int64_t i = threadIdx.x; i < C; i += kThreads)
    O::store(out, n * C + i, (xn[i] * sc) * r * w[i]);
  if (threadIdx.x == 0) *rstd = r * sc;
}

// ---- rows of at most kRowMax elements: 32 lanes a row (layernorm.cu's form) ------------------
// One block normalises kRowsPerBlock rows, each by 32 consecutive threads: lane l sums the
// squares of elements l, l + 32, ... in that order (each pass reads the row again, from the
// cache), then row32_sum's butterflies. No barriers; the same order at every warp size and on
// every target. Longer rows keep the block form below (chosen by C alone).
static_assert(kThreads == 256, "the row kernels' blocks: common.h's for_row_slices");
constexpr std::int64_t kRowMax = 4096;

// Row n of xn (C elements) into out's row n, its rstd by lane 0: rmsnorm_row's arithmetic (the
// overflow rescaling included). `live`: the row exists (every lane takes part in the sums).
template <typename O>
__device__ __forceinline__ void rmsnorm_row32(void* out, float* rstd, const float* xn,
                                              const float* w, std::int64_t n, int C, float eps,
                                              bool live, int lane) {
  const int end = live ? C : 0;
  float ss = 0.0f;
  for (int i = lane; i < end; i += kRowLanes) ss += xn[i] * xn[i];
  float ms = row32_sum(ss) / static_cast<float>(C);
  // The butterflies are collectives of the warp: a wave of 64 holds two rows, so the second
  // pass runs while any row of the warp needs it, and only those rows take its result.
  float sc = 1.0f;
  const bool need = !ct_isfinite(ms);  // the 32 lanes agree: ms is the reduced value
  if (ct_any(need)) {
    float a = 0.0f;
    for (int i = lane; i < end; i += kRowLanes) a = fmaxf(a, fabsf(xn[i]));
    a = row32_max(a);
    // an inf x keeps ms = inf: rstd 0, as PyTorch's rsqrt(inf)
    const bool rescale = need && ct_isfinite(a);
    const float s2 = rescale ? ct_downscale(a) : 1.0f;
    ss = 0.0f;
    for (int i = lane; i < end; i += kRowLanes) ss += (xn[i] * s2) * (xn[i] * s2);
    const float ms2 = row32_sum(ss) / static_cast<float>(C);
    if (rescale) sc = s2, ms = ms2;
  }
  const float r = ct_isinf(ms) ? 0.0f : 1.0f / sqrtf(ms + eps * sc * sc);  // rstd of x sc
  for (int i = lane; i < end; i += kRowLanes) O::store(out, n * C + i, (xn[i] * sc) * r * w[i]);
  if (live && lane == 0) *rstd = r * sc;
}

// rmsnorm_forward_kernel (RESIDUAL false) and residual_rmsnorm_forward_kernel (true) for
// C <= kRowMax: rows blockIdx.x * kRowsPerBlock + threadIdx.x / 32 of N.
template <int WARP, typename O, bool RESIDUAL>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    rmsnorm_forward_rows_kernel(float* residual, void* out, float* rstd, const float* x,
                                const void* r, const float* w, std::int64_t N, int C, float eps) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const int lane = static_cast<int>(threadIdx.x) % kRowLanes;
  const std::int64_t n =
      static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kRowLanes;
  const bool live = n < N;
  const float* xn = x + (live ? n : 0) * C;
  if (RESIDUAL) {
    float* rn = residual + (live ? n : 0) * C;
    if (live) row32_add<O>(rn, xn, r, n * C, C, lane);
    xn = rn;
  }
  rmsnorm_row32<O>(out, rstd + n, xn, w, n, C, eps, live, lane);
}

// rmsnorm_backward_dx_kernel for C <= kRowMax, rows as above.
template <int WARP, typename D>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    rmsnorm_backward_dx_rows_kernel(float* dx, const void* dout, const float* x, const float* w,
                                    const float* rstd, std::int64_t N, int C) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const int lane = static_cast<int>(threadIdx.x) % kRowLanes;
  const std::int64_t n =
      static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kRowLanes;
  const bool live = n < N;
  const int end = live ? C : 0;
  const float r = live ? rstd[n] : 0.0f;
  const float* xn = x + (live ? n : 0) * C;
  float a = 0.0f;
  for (int i = lane; i < end; i += kRowLanes) a += D::load(dout, n * C + i) * w[i] * (xn[i] * r);
  const float dnmean = row32_sum(a) / static_cast<float>(C);
  for (int i = lane; i < end; i += kRowLanes) {
    const float xhat = xn[i] * r;
    dx[n * C + i] += r * (D::load(dout, n * C + i) * w[i] - xhat * dnmean);
  }
}

// out (N, C) of element O = (x * rstd) * w; rstd (N); x (N, C); w (C). Block n normalises row n.
template <int WARP, typename O>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    rmsnorm_forward_kernel(void* out, float* rstd, const float* x, const float* w, std::int64_t C,
                           float eps) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_SHARED(float, smem, kThreads);
  const std::int64_t n = blockIdx.x;
  rmsnorm_row<WARP, O>(out, rstd + n, x + n * C, w, n, C, eps, smem);
}

// residual (N, C) = x + r, r (N, C) of element O; then out (N, C) of element O and rstd (N) the
// RMSNorm of residual. Block n handles row n; each thread reads back only the elements of
// residual it wrote, so no barrier is needed between the add and the statistic.
template <int WARP, typename O>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    residual_rmsnorm_forward_kernel(float* residual, void* out, float* rstd, const float* x,
                                    const void* r, const float* w, std::int64_t C, float eps) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_SHARED(float, smem, kThreads);
  const std::int64_t n = blockIdx.x;
  float* rn = residual + n * C;
  for (std::int64_t i = threadIdx.x; i < C; i += kThreads)
    rn[i] = x[n * C + i] + O::load(r, n * C + i);
  rmsnorm_row<WARP, O>(out, rstd + n, rn, w, n, C, eps, smem);
}

// dx (N, C) += rstd (dxhat - xhat mean(dxhat xhat)), xhat = x rstd, dxhat = dout w; dout (N, C)
// of element D. Block n handles row n.
template <int WARP, typename D>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    rmsnorm_backward_dx_kernel(float* dx, const void* dout, const float* x, const float* w,
                               const float* rstd, std::int64_t C) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_SHARED(float, smem, kThreads);
  const std::int64_t n = blockIdx.x;
  const float r = rstd[n];
  float a = 0.0f;
  for (std::int64_t i = threadIdx.x; i < C; i += kThreads)
    a += D::load(dout, n * C + i) * w[i] * (x[n * C + i] * r);
  const float dnmean = block_sum<WARP, kThreads>(a, smem) / static_cast<float>(C);
  for (std::int64_t i = threadIdx.x; i < C; i += kThreads) {
    const float xhat = x[n * C + i] * r;
    dx[n * C + i] += r * (D::load(dout, n * C + i) * w[i] - xhat * dnmean);
  }
}

// partial (chunks, C): for chunk k = blockIdx.y, the sum over its rows of dout xhat, rows in
// order. Thread c of the grid's x handles column c.
template <int WARP, typename D>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    rmsnorm_backward_partial_kernel(float* partial, const void* dout, const float* x,
                                    const float* rstd, std::int64_t N, std::int64_t C) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= C) return;
  const std::int64_t k = blockIdx.y;
  const std::int64_t end = (k + 1) * kChunk < N ? (k + 1) * kChunk : N;
  float dw = 0.0f;
  for (std::int64_t n = k * kChunk; n < end; ++n)
    dw += D::load(dout, n * C + c) * (x[n * C + c] * rstd[n]);
  partial[k * C + c] = dw;
}

// dw (C) += the partials (chunks, C), each column's chunks summed by common.h's column_sum.
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kColumnSumThreads)
    rmsnorm_backward_sum_kernel(float* dw, const float* partial, std::int64_t chunks,
                                std::int64_t C) {
  CT_CHECK_LAUNCH_BOUNDS(kColumnSumThreads);
  CT_SHARED(float, smem, kColumnSumThreads);
  const float sw = column_sum(partial, C, chunks, C, smem);
  const std::int64_t c = column_sum_col();
  if (threadIdx.x < kColumnSumCols && c < C) dw[c] += sw;
}

std::int64_t chunks_of(std::int64_t N) {
  return (N + kChunk - 1) / kChunk;
}

}  // namespace

namespace {
// The rows kernels (C <= kRowMax): rows in launches of at most 65535 blocks.
template <bool RESIDUAL>
void rmsnorm_forward_rows(const Ctx& cx, float* residual, void* out, Elem elem, float* rstd,
                          const float* x, const void* r, const float* w, std::int64_t N,
                          std::int64_t C, float eps) {
  const std::int64_t esz = static_cast<std::int64_t>(elem_size(elem));
  for_row_slices(N, [&](std::int64_t row, std::int64_t rows, unsigned blocks) {
    with_warp(cx.warp, [&](auto wp) {
      constexpr int W = decltype(wp)::value;
      with_elem(elem, [&](auto el) {
        using O = decltype(el);
        launch<W>(CT_KERNEL(rmsnorm_forward_rows_kernel<W, O, RESIDUAL>), dim3(blocks),
                  dim3(kThreads), 0, stream_of(cx), RESIDUAL ? residual + row * C : nullptr,
                  static_cast<char*>(out) + row * C * esz, rstd + row, x + row * C,
                  RESIDUAL ? static_cast<const char*>(r) + row * C * esz : nullptr, w, rows,
                  static_cast<int>(C), eps);
      });
    });
  });
}
}  // namespace

void rmsnorm_forward(const Ctx& cx, void* out, Elem out_elem, float* rstd, const float* x,
                     const float* w, std::int64_t N, std::int64_t C, float eps) {
  if (C <= kRowMax) {
    rmsnorm_forward_rows<false>(cx, nullptr, out, out_elem, rstd, x, nullptr, w, N, C, eps);
    return;
  }
  for (std::int64_t row = 0; row < N; row += 65535) {  // gridDim.y/z-free: rows in slices
    const std::int64_t rows = N - row < 65535 ? N - row : 65535;
    with_warp(cx.warp, [&](auto wp) {
      constexpr int W = decltype(wp)::value;
      with_elem(out_elem, [&](auto el) {
        using O = decltype(el);
        launch<W>(
            CT_KERNEL(rmsnorm_forward_kernel<W, O>), dim3(static_cast<unsigned>(rows)),
            dim3(kThreads), 0, stream_of(cx),
            static_cast<char*>(out) + row * C * static_cast<std::int64_t>(elem_size(out_elem)),
            rstd + row, x + row * C, w, C, eps);
      });
    });
  }
}

void residual_rmsnorm_forward(const Ctx& cx, float* residual, void* out, Elem elem, float* rstd,
                              const float* x, const void* r, const float* w, std::int64_t N,
                              std::int64_t C, float eps) {
  if (C <= kRowMax) {
    rmsnorm_forward_rows<true>(cx, residual, out, elem, rstd, x, r, w, N, C, eps);
    return;
  }
  const std::int64_t esz = static_cast<std::int64_t>(elem_size(elem));
  for (std::int64_t row = 0; row < N; row += 65535) {  // gridDim.y/z-free: rows in slices
    const std::int64_t rows = N - row < 65535 ? N - row : 65535;
    with_warp(cx.warp, [&](auto wp) {
      constexpr int W = decltype(wp)::value;
      with_elem(elem, [&](auto el) {
        using O = decltype(el);
        launch<W>(CT_KERNEL(residual_rmsnorm_forward_kernel<W, O>),
                  dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream_of(cx),
                  residual + row * C, static_cast<char*>(out) + row * C * esz, rstd + row,
                  x + row * C, static_cast<const char*>(r) + row * C * esz, w, C, eps);
      });
    });
  }
}

std::size_t rmsnorm_backward_workspace(std::int64_t N, std::int64_t C) {
  return static_cast<std::size_t>(chunks_of(N) * C) * sizeof(float);
}

void rmsnorm_backward(const Ctx& cx, float* dx, float* dw, const void* dout, Elem dout_elem,
                      const float* x, const float* w, const float* rstd, std::int64_t N,
                      std::int64_t C, void* workspace) {
  if (N <= 0 || C <= 0) return;
  const std::int64_t esz = static_cast<std::int64_t>(elem_size(dout_elem));
  const std::int64_t chunks = chunks_of(N);
  auto* partial = static_cast<float*>(workspace);
  const unsigned col_blocks = static_cast<unsigned>((C + kThreads - 1) / kThreads);
  with_warp(cx.warp, [&](auto wp) {
    constexpr int W = decltype(wp)::value;
    with_elem(dout_elem, [&](auto el) {
      using D = decltype(el);
      if (C <= kRowMax)
        for_row_slices(N, [&](std::int64_t row, std::int64_t rows, unsigned blocks) {
          launch<W>(CT_KERNEL(rmsnorm_backward_dx_rows_kernel<W, D>), dim3(blocks), dim3(kThreads),
                    0, stream_of(cx), dx + row * C, static_cast<const char*>(dout) + row * C * esz,
                    x + row * C, w, rstd + row, rows, static_cast<int>(C));
        });
      for (std::int64_t row = 0; C > kRowMax && row < N; row += 65535) {
        const std::int64_t rows = N - row < 65535 ? N - row : 65535;
        launch<W>(CT_KERNEL(rmsnorm_backward_dx_kernel<W, D>), dim3(static_cast<unsigned>(rows)),
                  dim3(kThreads), 0, stream_of(cx), dx + row * C,
                  static_cast<const char*>(dout) + row * C * esz, x + row * C, w, rstd + row, C);
      }
      for (std::int64_t k = 0; k < chunks; k += 65535) {
        const std::int64_t ks = chunks - k < 65535 ? chunks - k : 65535;
        const std::int64_t row = k * kChunk;
        launch<W>(CT_KERNEL(rmsnorm_backward_partial_kernel<W, D>),
                  dim3(col_blocks, static_cast<unsigned>(ks)), dim3(kThreads), 0, stream_of(cx),
                  partial + k * C, static_cast<const char*>(dout) + row * C * esz, x + row * C,
                  rstd + row, N - row, C);
      }
    });
    launch<W>(CT_KERNEL(rmsnorm_backward_sum_kernel<W>), dim3(column_sum_blocks(C)),
              dim3(kColumnSumThreads), 0, stream_of(cx), dw, partial, chunks, C);
  });
}

}  // namespace ct::gpu
