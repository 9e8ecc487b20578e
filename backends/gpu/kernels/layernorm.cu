// Layer normalisation over the last dimension: rows of up to 4,096 elements 32 lanes a row (8 a
// block), longer ones one block a row, for the statistics and dx; the weight and bias gradients
// are column sums over rows, taken in two fixed passes (rows in chunks of kChunk, then the
// chunks in order) so that no float atomics are needed and the result depends on N and C only.
#include "backends/gpu/kernels/common.h"
#include "backends/gpu/kernels/safe_math.h"

namespace ct::gpu {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kChunk = 64;  // rows per partial of dw / db

// The block's row n: out (C) of element O at row offset n C; *mean, *rstd; xn (C); w, b (C).
template <int WARP, typename O>
__device__ __forceinline__ void layernorm_row(void* out, float* mean, float* rstd, const float* xn,
                                              const float* w, const float* b, std::int64_t n,
                                              std::int64_t C, float eps, float* smem) {
  // The row is used as x * sc: sc = 1 (the arithmetic of before) unless the sum or the sum of
  // squares overflowed (|x| past ~1e19); then sc, a power of two, brings max |x| into [1, 4)
  // and both sums are taken again. Block-uniform: the reduced values decide.
  float sc = 1.0f, m = 0.0f, var = 0.0f;
  for (int pass = 0; pass < 2; ++pass) {
    float s = 0.0f;
    for (std::int64_t i = threadIdx.x; i < C; i += kThreads) s += xn[i] * sc;
    m = block_sum<WARP, kThreads>(s, smem) / static_cast<float>(C);
    float v = 0.0f;
    for (std::int64_t i = threadIdx.x; i < C; i += kThreads)
      v += (xn[i] * sc - m) * (xn[i] * sc - m);
    var = block_sum<WARP, kThreads>(v, smem) / static_cast<float>(C);
    if (pass == 1 || (ct_isfinite(m) && ct_isfinite(var))) break;
    float a = 0.0f;
    for (std::int64_t i = threadIdx.x; i < C; i += kThreads) a = fmaxf(a, fabsf(xn[i]));
    a = block_max<WARP, kThreads>(a, smem);
    if (!ct_isfinite(a)) break;  // an inf or NaN x: the sums stay inf / NaN
    sc = ct_downscale(a);
  }
  const float r = ct_isinf(var) ? 0.0f : 1.0f / sqrtf(var + eps * sc * sc);  // rstd of x sc
  for (std::int64_t i = threadIdx.x; i < C; i += kThreads)
    O::store(out, n * C + i, (xn[i] * sc - m) * r * w[i] + b[i]);
  if (threadIdx.x == 0) {
    *mean = m / sc;
    *rstd = r * sc;
  }
}

// ---- rows of at most kRowMax elements: 32 lanes a row --------------------------------------
// One block normalises kRowsPerBlock rows, each by 32 consecutive threads (half a wave-64 warp,
// a whole warp-32 one): lane l sums elements l, l + 32, ... of its row in that order (reads
// coalesced; each pass reads the row again, from the cache), then the 32 lanes' sums combine by
// butterflies of width 32 (xor 16, 8, 4, 2, 1: each pair adds the same two values, so every lane
// ends with the same bits: row32_sum in common.h). No barriers; the same order at every warp
// size and on every target. Rows longer than kRowMax keep the block form below (chosen by C
// alone, so a row's bits do not depend on how many rows a call has).
static_assert(kThreads == 256, "the row kernels' blocks: common.h's for_row_slices");
constexpr std::int64_t kRowMax = 4096;

// Row n of xn (C elements) normalised into out's row n, its mean and rstd by lane 0:
// layernorm_row's arithmetic (the overflow rescaling included) with the sums in the order
// above. `live`: the row exists (every lane of the 32 takes part in the butterflies either way).
template <typename O>
__device__ __forceinline__ void layernorm_row32(void* out, float* mean, float* rstd,
                                                const float* xn, const float* w, const float* b,
                                                std::int64_t n, int C, float eps, bool live,
                                                int lane) {
  const int end = live ? C : 0;
  // The butterflies are collectives of the warp: a wave of 64 holds two rows, so the second
  // pass (rows whose sums overflowed) runs while any row of the warp needs it, and a row that
  // does not keeps its first pass's m and var.
  float sc = 1.0f, m = 0.0f, var = 0.0f;
  bool done = false;
  for (int pass = 0; pass < 2; ++pass) {
    float s = 0.0f;
    for (int i = lane; i < end; i += kRowLanes) s += xn[i] * sc;
    const float mp = row32_sum(s) / static_cast<float>(C);
    float v = 0.0f;
    for (int i = lane; i < end; i += kRowLanes) v += (xn[i] * sc - mp) * (xn[i] * sc - mp);
    const float vp = row32_sum(v) / static_cast<float>(C);
    if (!done) m = mp, var = vp;
    if (pass == 1) break;
    done = ct_isfinite(m) && ct_isfinite(var);
    if (!ct_any(!done)) break;
    float a = 0.0f;
    for (int i = lane; i < end; i += kRowLanes) a = fmaxf(a, fabsf(xn[i]));
    a = row32_max(a);
    if (!done && !ct_isfinite(a)) done = true;  // an inf or NaN x: the sums stay inf / NaN
    if (!done) sc = ct_downscale(a);
  }
  const float r = ct_isinf(var) ? 0.0f : 1.0f / sqrtf(var + eps * sc * sc);  // rstd of x sc
  for (int i = lane; i < end; i += kRowLanes)
    O::store(out, n * C + i, (xn[i] * sc - m) * r * w[i] + b[i]);
  if (live && lane == 0) {
    *mean = m / sc;
    *rstd = r * sc;
  }
}

// layernorm_forward_kernel (RESIDUAL false) and residual_layernorm_forward_kernel (true) for
// C <= kRowMax: rows blockIdx.x * kRowsPerBlock + threadIdx.x / 32 of N. The residual's lane
// reads back only the elements it wrote.
template <int WARP, typename O, bool RESIDUAL>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    layernorm_forward_rows_kernel(float* residual, void* out, float* mean, float* rstd,
                                  const float* x, const void* r, const float* w, const float* b,
                                  std::int64_t N, int C, float eps) {
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
  layernorm_row32<O>(out, mean + n, rstd + n, xn, w, b, n, C, eps, live, lane);
}

// layernorm_backward_dx_kernel for C <= kRowMax, rows as above.
template <int WARP, typename D>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    layernorm_backward_dx_rows_kernel(float* dx, const void* dout, const float* x, const float* w,
                                      const float* mean, const float* rstd, std::int64_t N, int C) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const int lane = static_cast<int>(threadIdx.x) % kRowLanes;
  const std::int64_t n =
      static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kRowLanes;
  const bool live = n < N;
  const int end = live ? C : 0;
  const float m = live ? mean[n] : 0.0f, r = live ? rstd[n] : 0.0f;
  const float* xn = x + (live ? n : 0) * C;
  float a = 0.0f, bsum = 0.0f;
  for (int i = lane; i < end; i += kRowLanes) {
    const float xhat = (xn[i] - m) * r;
    const float dxhat = D::load(dout, n * C + i) * w[i];
    a += dxhat;
    bsum += dxhat * xhat;
  }
  const float dmean = row32_sum(a) / static_cast<float>(C);
  const float dnmean = row32_sum(bsum) / static_cast<float>(C);
  for (int i = lane; i < end; i += kRowLanes) {
    const float xhat = (xn[i] - m) * r;
    const float dxhat = D::load(dout, n * C + i) * w[i];
    dx[n * C + i] += r * (dxhat - dmean - xhat * dnmean);
  }
}

// out (N, C) of element O; mean, rstd (N); x (N, C); w, b (C). Block n normalises row n.
template <int WARP, typename O>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    layernorm_forward_kernel(void* out, float* mean, float* rstd, const float* x, const float* w,
                             const float* b, std::int64_t C, float eps) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_SHARED(float, smem, kThreads);
  const std::int64_t n = blockIdx.x;
  layernorm_row<WARP, O>(out, mean + n, rstd + n, x + n * C, w, b, n, C, eps, smem);
}

// residual (N, C) = x + r, r (N, C) of element O; then out (N, C) of element O, mean, rstd (N)
// the layernorm of residual. Block n handles row n; each thread reads back only the elements of
// residual it wrote, so no barrier is needed between the add and the statistics.
template <int WARP, typename O>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    residual_layernorm_forward_kernel(float* residual, void* out, float* mean, float* rstd,
                                      const float* x, const void* r, const float* w, const float* b,
                                      std::int64_t C, float eps) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_SHARED(float, smem, kThreads);
  const std::int64_t n = blockIdx.x;
  float* rn = residual + n * C;
  for (std::int64_t i = threadIdx.x; i < C; i += kThreads)
    rn[i] = x[n * C + i] + O::load(r, n * C + i);
  layernorm_row<WARP, O>(out, mean + n, rstd + n, rn, w, b, n, C, eps, smem);
}

// dx (N, C) += rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dout w; dout (N, C)
// of element D. Block n handles row n.
template <int WARP, typename D>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    layernorm_backward_dx_kernel(float* dx, const void* dout, const float* x, const float* w,
                                 const float* mean, const float* rstd, std::int64_t C) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_SHARED(float, smem, kThreads);
  const std::int64_t n = blockIdx.x;
  const float m = mean[n], r = rstd[n];
  float a = 0.0f, bsum = 0.0f;
  for (std::int64_t i = threadIdx.x; i < C; i += kThreads) {
    const float xhat = (x[n * C + i] - m) * r;
    const float dxhat = D::load(dout, n * C + i) * w[i];
    a += dxhat;
    bsum += dxhat * xhat;
  }
  const float dmean = block_sum<WARP, kThreads>(a, smem) / static_cast<float>(C);
  const float dnmean = block_sum<WARP, kThreads>(bsum, smem) / static_cast<float>(C);
  for (std::int64_t i = threadIdx.x; i < C; i += kThreads) {
    const float xhat = (x[n * C + i] - m) * r;
    const float dxhat = D::load(dout, n * C + i) * w[i];
    dx[n * C + i] += r * (dxhat - dmean - xhat * dnmean);
  }
}

// partial (chunks, 2, C): for chunk k = blockIdx.y, the sums over its rows of dout xhat (dw) and
// of dout (db), rows in order. Thread c of the grid's x handles column c.
template <int WARP, typename D>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    layernorm_backward_partial_kernel(float* partial, const void* dout, const float* x,
                                      const float* mean, const float* rstd, std::int64_t N,
                                      std::int64_t C) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= C) return;
  const std::int64_t k = blockIdx.y;
  const std::int64_t end = (k + 1) * kChunk < N ? (k + 1) * kChunk : N;
  float dw = 0.0f, db = 0.0f;
  for (std::int64_t n = k * kChunk; n < end; ++n) {
    const float d = D::load(dout, n * C + c);
    dw += d * ((x[n * C + c] - mean[n]) * rstd[n]);
    db += d;
  }
  partial[(k * 2) * C + c] = dw;
  partial[(k * 2 + 1) * C + c] = db;
}

// dw, db (C) += the partials (chunks, 2, C), each column's chunks summed by common.h's column_sum.
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kColumnSumThreads)
    layernorm_backward_sum_kernel(float* dw, float* db, const float* partial, std::int64_t chunks,
                                  std::int64_t C) {
  CT_CHECK_LAUNCH_BOUNDS(kColumnSumThreads);
  CT_SHARED(float, smem, kColumnSumThreads);
  const float sw = column_sum(partial, 2 * C, chunks, C, smem);
  const float sb = column_sum(partial + C, 2 * C, chunks, C, smem);
  const std::int64_t c = column_sum_col();
  if (threadIdx.x < kColumnSumCols && c < C) {
    dw[c] += sw;
    db[c] += sb;
  }
}

std::int64_t chunks_of(std::int64_t N) {
  return (N + kChunk - 1) / kChunk;
}

}  // namespace

namespace {
// The rows kernels (C <= kRowMax): rows in launches of at most 65535 blocks.
template <bool RESIDUAL>
void layernorm_forward_rows(const Ctx& cx, float* residual, void* out, Elem elem, float* mean,
                            float* rstd, const float* x, const void* r, const float* w,
                            const float* b, std::int64_t N, std::int64_t C, float eps) {
  const std::int64_t esz = static_cast<std::int64_t>(elem_size(elem));
  for_row_slices(N, [&](std::int64_t row, std::int64_t rows, unsigned blocks) {
    with_warp(cx.warp, [&](auto wp) {
      constexpr int W = decltype(wp)::value;
      with_elem(elem, [&](auto el) {
        using O = decltype(el);
        launch<W>(CT_KERNEL(layernorm_forward_rows_kernel<W, O, RESIDUAL>), dim3(blocks),
                  dim3(kThreads), 0, stream_of(cx), RESIDUAL ? residual + row * C : nullptr,
                  static_cast<char*>(out) + row * C * esz, mean + row, rstd + row, x + row * C,
                  RESIDUAL ? static_cast<const char*>(r) + row * C * esz : nullptr, w, b, rows,
                  static_cast<int>(C), eps);
      });
    });
  });
}
}  // namespace

void layernorm_forward(const Ctx& cx, void* out, Elem out_elem, float* mean, float* rstd,
                       const float* x, const float* w, const float* b, std::int64_t N,
                       std::int64_t C, float eps) {
  if (C <= kRowMax) {
    layernorm_forward_rows<false>(cx, nullptr, out, out_elem, mean, rstd, x, nullptr, w, b, N, C,
                                  eps);
    return;
  }
  for (std::int64_t row = 0; row < N; row += 65535) {  // gridDim.y/z-free: rows in slices
    const std::int64_t rows = N - row < 65535 ? N - row : 65535;
    with_warp(cx.warp, [&](auto wp) {
      constexpr int W = decltype(wp)::value;
      with_elem(out_elem, [&](auto el) {
        using O = decltype(el);
        launch<W>(
            CT_KERNEL(layernorm_forward_kernel<W, O>), dim3(static_cast<unsigned>(rows)),
            dim3(kThreads), 0, stream_of(cx),
            static_cast<char*>(out) + row * C * static_cast<std::int64_t>(elem_size(out_elem)),
            mean + row, rstd + row, x + row * C, w, b, C, eps);
      });
    });
  }
}

void residual_layernorm_forward(const Ctx& cx, float* residual, void* out, Elem elem, float* mean,
                                float* rstd, const float* x, const void* r, const float* w,
                                const float* b, std::int64_t N, std::int64_t C, float eps) {
  if (C <= kRowMax) {
    layernorm_forward_rows<true>(cx, residual, out, elem, mean, rstd, x, r, w, b, N, C, eps);
    return;
  }
  const std::int64_t esz = static_cast<std::int64_t>(elem_size(elem));
  for (std::int64_t row = 0; row < N; row += 65535) {  // gridDim.y/z-free: rows in slices
    const std::int64_t rows = N - row < 65535 ? N - row : 65535;
    with_warp(cx.warp, [&](auto wp) {
      constexpr int W = decltype(wp)::value;
      with_elem(elem, [&](auto el) {
        using O = decltype(el);
        launch<W>(CT_KERNEL(residual_layernorm_forward_kernel<W, O>),
                  dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream_of(cx),
                  residual + row * C, static_cast<char*>(out) + row * C * esz, mean + row,
                  rstd + row, x + row * C, static_cast<const char*>(r) + row * C * esz, w, b, C,
                  eps);
      });
    });
  }
}

std::size_t layernorm_backward_workspace(std::int64_t N, std::int64_t C) {
  return static_cast<std::size_t>(chunks_of(N) * 2 * C) * sizeof(float);
}

void layernorm_backward(const Ctx& cx, float* dx, float* dw, float* db, const void* dout,
                        Elem dout_elem, const float* x, const float* w, const float* mean,
                        const float* rstd, std::int64_t N, std::int64_t C, void* workspace) {
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
          launch<W>(CT_KERNEL(layernorm_backward_dx_rows_kernel<W, D>), dim3(blocks),
                    dim3(kThreads), 0, stream_of(cx), dx + row * C,
                    static_cast<const char*>(dout) + row * C * esz, x + row * C, w, mean + row,
                    rstd + row, rows, static_cast<int>(C));
        });
      for (std::int64_t row = 0; C > kRowMax && row < N; row += 65535) {
        const std::int64_t rows = N - row < 65535 ? N - row : 65535;
        launch<W>(CT_KERNEL(layernorm_backward_dx_kernel<W, D>), dim3(static_cast<unsigned>(rows)),
                  dim3(kThreads), 0, stream_of(cx), dx + row * C,
                  static_cast<const char*>(dout) + row * C * esz, x + row * C, w, mean + row,
                  rstd + row, C);
      }
      for (std::int64_t k = 0; k < chunks; k += 65535) {
        const std::int64_t ks = chunks - k < 65535 ? chunks - k : 65535;
        const std::int64_t row = k * kChunk;
        launch<W>(CT_KERNEL(layernorm_backward_partial_kernel<W, D>),
                  dim3(col_blocks, static_cast<unsigned>(ks)), dim3(kThreads), 0, stream_of(cx),
                  partial + k * 2 * C, static_cast<const char*>(dout) + row * C * esz, x + row * C,
                  mean + row, rstd + row, N - row, C);
      }
    });
    launch<W>(CT_KERNEL(layernorm_backward_sum_kernel<W>), dim3(column_sum_blocks(C)),
              dim3(kColumnSumThreads), 0, stream_of(cx), dw, db, partial, chunks, C);
  });
}

}  // namespace ct::gpu
