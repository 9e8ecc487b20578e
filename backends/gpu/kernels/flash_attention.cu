// Fused causal multi-head self-attention (core/device.h flash_attention_*), forward and backward,
// with grouped-query attention. qkv rows [C3], C3 = C + 2 NKV hs, hold q (NH heads of
// hs = C / NH) | k (NKV heads) | v (NKV heads); query head h reads key/value head h / G,
// G = NH / NKV (NKV = NH: plain multi-head attention). out, dout [B,T,C]; lse [B,NH,T] f32. All
// of q, k, v, out, dout, dqkv of one element type E; fp32 arithmetic. The forward may take the
// last Tq rows only (sampling's key/value cache): out [B,Tq,C] and lse [B,NH,Tq] hold positions
// T - Tq .. T - 1, row i position T - Tq + i; its blocks are those holding such positions, each
// at the offset and with the sums it has in the whole window's forward (the same bits).
//
// One thread per query row (forward, backward dq) or key row (backward dk, dv), 64 rows of one
// (b, h) a block (of one (b, j), j a key/value head, for dk, dv); the other side streams through
// shared memory in tiles of kTile rows, so the T x T probabilities exist nowhere. Each thread
// walks its keys (queries) in order (for dk, dv: the G query heads of the group in order, and
// the queries of each in order), so every output has one owner and a fixed order: no atomics,
// the same bits at every warp size.
//   forward:   online softmax: m = running max of s = scale q.k, l = sum exp(s - m),
//              o = sum exp(s - m) v, rescaled by exp(m_old - m_new) when m grows;
//              out = o / l, lse = m + log l.
//   backward:  D_t = dout_t . out_t (saved in the workspace), p = exp(s - lse_t),
//              ds = p (dout_t . v_u - D_t) scale;  dq_t = sum_u ds k_u  (query kernel);
//              dk_u = sum_h sum_t ds q_t, dv_u = sum_h sum_t p dout_t over the query heads h
//              of u's key/value head  (key kernel, after it).
// Registers: a few arrays of HS floats per thread, HS the head size rounded up to 16, 64 or 128
// (zero-padded, so the padding adds nothing).
#include "backends/gpu/kernels/common.h"
#include "backends/gpu/kernels/safe_math.h"

namespace ct::gpu {
namespace {

constexpr int kRows = 64;  // query (or key) rows a block, one per thread
constexpr int kTile = 32;  // key (or query) rows staged in shared memory at a time

struct FDims {
  std::int64_t T;
  std::int64_t Tq;  // rows of out and lse: positions T - Tq .. T - 1 (the forward's; else T)
  std::int64_t C, NH, NKV, hs;
  std::int64_t C3;  // C + 2 NKV hs, the row of qkv
  std::int64_t G;   // NH / NKV query heads a key/value head
  float scale;
};

// Where key / value head j starts in a row of qkv.
__device__ __forceinline__ std::int64_t k_col(const FDims& d, std::int64_t j) {
  return d.C + j * d.hs;
}
__device__ __forceinline__ std::int64_t v_col(const FDims& d, std::int64_t j) {
  return d.C + (d.NKV + j) * d.hs;
}

// Block (x, y): rows kRows (x + x0) .. of head y = b heads + h, over `heads` heads (NH query
// heads, or NKV key/value heads for the key kernel); x0 the first block launched (first_block).
struct Row {
  std::int64_t b, h, r;  // batch, head, this thread's row
  std::int64_t first;    // the block's first row
  std::int64_t last;     // and its last (< T)
};
__device__ __forceinline__ Row row_of(const FDims& d, std::int64_t heads, std::int64_t x0 = 0) {
  Row w;
  w.b = blockIdx.y / heads;
  w.h = blockIdx.y % heads;
  w.first = (static_cast<std::int64_t>(blockIdx.x) + x0) * kRows;
  w.r = w.first + threadIdx.x;
  w.last = w.first + kRows - 1 < d.T - 1 ? w.first + kRows - 1 : d.T - 1;
  return w;
}

// dst[0 .. HS) (=) the hs elements at src + at (zeros after them).
template <typename E, int HS>
__device__ __forceinline__ void load_row(float (&dst)[HS], const void* src, std::int64_t at,
                                         std::int64_t hs) {
  for (int i = 0; i < HS; ++i) dst[i] = i < hs ? E::load(src, at + i) : 0.0f;
}

// Stages rows r0 .. r0 + kTile of a [.., row_stride] tensor's head slice (element offset `at`
// of row 0) into tile[kTile][HS] as f32; rows at or past T and columns past hs are zero.
template <typename E, int HS>
__device__ __forceinline__ void stage(float* tile, const void* src, std::int64_t at,
                                      std::int64_t row_stride, std::int64_t r0, const FDims& d) {
  for (int idx = threadIdx.x; idx < kTile * HS; idx += kRows) {
    const int rr = idx / HS, i = idx % HS;
    const std::int64_t r = r0 + rr;
    tile[idx] = r < d.T && i < d.hs ? E::load(src, at + r * row_stride + i) : 0.0f;
  }
}

// The first block holding a row of out: that of position T - Tq (0 when Tq = T).
__host__ __device__ __forceinline__ std::int64_t first_block(std::int64_t T, std::int64_t Tq) {
  return (T - Tq) / kRows;
}

// out (B, Tq, C), lse (B, NH, Tq) f32, qkv (B, T, C3). Blocks over (b, h) query heads, those of
// positions T - Tq .. T - 1; a thread whose position comes before T - Tq only stages.
template <int WARP, typename E, int HS>
__global__ void CT_LAUNCH_BOUNDS(kRows)
    flash_forward_kernel(void* out, float* lse, const void* qkv, FDims d) {
  CT_CHECK_LAUNCH_BOUNDS(kRows);
  CT_SHARED(float, ks, kTile* HS);
  CT_SHARED(float, vs, kTile* HS);
  const std::int64_t p0 = d.T - d.Tq;  // the position of out's row 0
  const Row w = row_of(d, d.NH, first_block(d.T, d.Tq));
  const std::int64_t C3 = d.C3, j = w.h / d.G;
  const std::int64_t row0 = w.b * d.T * C3, base = row0 + w.h * d.hs;
  const bool live = w.r >= p0 && w.r < d.T;
  float q[HS], o[HS];
  if (live) load_row<E, HS>(q, qkv, base + w.r * C3, d.hs);
  for (int i = 0; i < HS; ++i) o[i] = 0.0f;
  float m = -kFltMax, l = 0.0f;  // finite start: the first key takes the s > m branch
  for (std::int64_t u0 = 0; u0 <= w.last; u0 += kTile) {
    stage<E, HS>(ks, qkv, row0 + k_col(d, j), C3, u0, d);
    stage<E, HS>(vs, qkv, row0 + v_col(d, j), C3, u0, d);
    __syncthreads();
    for (int uu = 0; live && uu < kTile && u0 + uu <= w.r; ++uu) {
      const float* k = ks + uu * HS;
      const float* v = vs + uu * HS;
      float dot = 0.0f;
      for (int i = 0; i < HS; ++i) dot += q[i] * k[i];
      const float s = dot * d.scale;
      if (s > m) {
        const float corr = ct_exp_le0(m - s);  // 0 for the first key
        l = l * corr + 1.0f;
        for (int i = 0; i < HS; ++i) o[i] = o[i] * corr + v[i];
        m = s;
      } else {
        const float p = ct_exp_le0(s - m);
        l += p;
        for (int i = 0; i < HS; ++i) o[i] += p * v[i];
      }
    }
    __syncthreads();
  }
  if (!live) return;
  const float inv = 1.0f / l;
  const std::int64_t i = w.r - p0;  // out's row
  const std::int64_t o0 = (w.b * d.Tq + i) * d.C + w.h * d.hs;
  for (int c = 0; c < HS && c < d.hs; ++c) E::store(out, o0 + c, o[c] * inv);
  lse[(w.b * d.NH + w.h) * d.Tq + i] = m + logf(l);
}

// Per query row: D (B, NH, T) f32 into the workspace, and dq into the q columns of dqkv
// (B, T, C3). Blocks over (b, h) query heads.
template <int WARP, typename E, int HS>
__global__ void CT_LAUNCH_BOUNDS(kRows)
    flash_backward_query_kernel(void* dqkv, float* Dsave, const void* dout, const void* out,
                                const void* qkv, const float* lse, FDims d) {
  CT_CHECK_LAUNCH_BOUNDS(kRows);
  CT_SHARED(float, ks, kTile* HS);
  CT_SHARED(float, vs, kTile* HS);
  const Row w = row_of(d, d.NH);
  const std::int64_t C3 = d.C3, j = w.h / d.G;
  const std::int64_t row0 = w.b * d.T * C3, base = row0 + w.h * d.hs;
  const std::int64_t row = (w.b * d.NH + w.h) * d.T + w.r;
  const bool live = w.r < d.T;
  float q[HS], g[HS], dq[HS];
  float D = 0.0f, l = 0.0f;
  if (live) {
    const std::int64_t o0 = (w.b * d.T + w.r) * d.C + w.h * d.hs;
    load_row<E, HS>(q, qkv, base + w.r * C3, d.hs);
    load_row<E, HS>(g, dout, o0, d.hs);
    for (int i = 0; i < HS && i < d.hs; ++i) D += g[i] * E::load(out, o0 + i);
    Dsave[row] = D;
    l = lse[row];
  }
  for (int i = 0; i < HS; ++i) dq[i] = 0.0f;
  for (std::int64_t u0 = 0; u0 <= w.last; u0 += kTile) {
    stage<E, HS>(ks, qkv, row0 + k_col(d, j), C3, u0, d);
    stage<E, HS>(vs, qkv, row0 + v_col(d, j), C3, u0, d);
    __syncthreads();
    for (int uu = 0; live && uu < kTile && u0 + uu <= w.r; ++uu) {
      const float* k = ks + uu * HS;
      const float* v = vs + uu * HS;
      float dot = 0.0f, dp = 0.0f;
      for (int i = 0; i < HS; ++i) dot += q[i] * k[i];
      for (int i = 0; i < HS; ++i) dp += g[i] * v[i];
      const float p = ct_exp_le0(dot * d.scale - l);
      const float ds = p * (dp - D) * d.scale;
      for (int i = 0; i < HS; ++i) dq[i] += ds * k[i];
    }
    __syncthreads();
  }
  if (!live) return;
  for (int i = 0; i < HS && i < d.hs; ++i) E::store(dqkv, base + w.r * C3 + i, dq[i]);
}

// Per key row u of key/value head j: dk, dv into the k and v columns of dqkv (B, T, C3), from
// the query heads h = j G .. j G + G - 1 in order and, for each, the queries t >= u in order,
// into one accumulator (the G partial sums are never split, so no other block writes them).
// Blocks over (b, j) key/value heads. Reads the D that flash_backward_query_kernel saved.
template <int WARP, typename E, int HS>
__global__ void CT_LAUNCH_BOUNDS(kRows)
    flash_backward_key_kernel(void* dqkv, const float* Dsave, const void* dout, const void* qkv,
                              const float* lse, FDims d) {
  CT_CHECK_LAUNCH_BOUNDS(kRows);
  CT_SHARED(float, qs, kTile* HS);
  CT_SHARED(float, gs, kTile* HS);
  CT_SHARED(float, ls, kTile);
  CT_SHARED(float, Ds, kTile);
  const Row w = row_of(d, d.NKV);
  const std::int64_t C3 = d.C3, j = w.h, row0 = w.b * d.T * C3;
  const bool live = w.r < d.T;
  float k[HS], v[HS], dk[HS], dv[HS];
  if (live) {
    load_row<E, HS>(k, qkv, row0 + w.r * C3 + k_col(d, j), d.hs);
    load_row<E, HS>(v, qkv, row0 + w.r * C3 + v_col(d, j), d.hs);
  }
  for (int i = 0; i < HS; ++i) dk[i] = 0.0f, dv[i] = 0.0f;
  for (std::int64_t h = j * d.G; h < (j + 1) * d.G; ++h) {
    const std::int64_t hrow = (w.b * d.NH + h) * d.T;
    for (std::int64_t t0 = w.first; t0 < d.T; t0 += kTile) {
      stage<E, HS>(qs, qkv, row0 + h * d.hs, C3, t0, d);
      stage<E, HS>(gs, dout, w.b * d.T * d.C + h * d.hs, d.C, t0, d);
      if (threadIdx.x < kTile) {
        const std::int64_t t = t0 + threadIdx.x;
        ls[threadIdx.x] = t < d.T ? lse[hrow + t] : 0.0f;
        Ds[threadIdx.x] = t < d.T ? Dsave[hrow + t] : 0.0f;
      }
      __syncthreads();
      for (int tt = 0; live && tt < kTile && t0 + tt < d.T; ++tt) {
        if (t0 + tt < w.r) continue;
        const float* q = qs + tt * HS;
        const float* g = gs + tt * HS;
        float dot = 0.0f, dp = 0.0f;
        for (int i = 0; i < HS; ++i) dot += q[i] * k[i];
        for (int i = 0; i < HS; ++i) dp += g[i] * v[i];
        const float p = ct_exp_le0(dot * d.scale - ls[tt]);
        const float ds = p * (dp - Ds[tt]) * d.scale;
        for (int i = 0; i < HS; ++i) {
          dv[i] += p * g[i];
          dk[i] += ds * q[i];
        }
      }
      __syncthreads();
    }
  }
  if (!live) return;
  for (int i = 0; i < HS && i < d.hs; ++i) {
    E::store(dqkv, row0 + w.r * C3 + k_col(d, j) + i, dk[i]);
    E::store(dqkv, row0 + w.r * C3 + v_col(d, j) + i, dv[i]);
  }
}

FDims fdims_of(std::int64_t T, std::int64_t Tq, std::int64_t C, std::int64_t NH, std::int64_t NKV) {
  const std::int64_t hs = C / NH;
  return FDims{
      T, Tq, C, NH, NKV, hs, C + 2 * NKV * hs, NH / NKV, 1.0f / sqrtf(static_cast<float>(hs))};
}

// Calls fn(std::integral_constant<int, HS>) for the head size's bucket.
template <typename Fn>
void with_head_size(std::int64_t hs, Fn&& fn) {
  if (hs <= 16)
    fn(std::integral_constant<int, 16>{});
  else if (hs <= 64)
    fn(std::integral_constant<int, 64>{});
  else if (hs <= kFlashMaxHeadSize)
    fn(std::integral_constant<int, kFlashMaxHeadSize>{});
  else
    throw std::invalid_argument("flash attention: head size " + std::to_string(hs) +
                                " exceeds the kernel's limit of " +
                                std::to_string(kFlashMaxHeadSize));
}

// Blocks of kRows rows over B x heads heads (NH query heads or NKV key/value heads): those
// from first_block(T, Tq) (the forward of the last Tq rows; Tq = T: all of them).
dim3 grid_of(std::int64_t B, std::int64_t T, std::int64_t heads, std::int64_t Tq) {
  return dim3(static_cast<unsigned>((T + kRows - 1) / kRows - first_block(T, Tq)),
              static_cast<unsigned>(B * heads));
}

}  // namespace

void flash_attention_forward(const Ctx& cx, void* out, float* lse, const void* qkv, Elem e,
                             std::int64_t B, std::int64_t T, std::int64_t Tq, std::int64_t C,
                             std::int64_t NH, std::int64_t NKV) {
  if (B * Tq * C <= 0) return;
  const FDims d = fdims_of(T, Tq, C, NH, NKV);
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_elem(e, [&](auto el) {
      using E = decltype(el);
      with_head_size(d.hs, [&](auto hsz) {
        constexpr int HS = decltype(hsz)::value;
        launch<W>(CT_KERNEL(flash_forward_kernel<W, E, HS>), grid_of(B, T, NH, Tq), dim3(kRows), 0,
                  stream_of(cx), out, lse, qkv, d);
      });
    });
  });
}

std::size_t flash_attention_backward_workspace(std::int64_t B, std::int64_t T, std::int64_t NH) {
  return static_cast<std::size_t>(B * NH * T) * sizeof(float);
}

void flash_attention_backward(const Ctx& cx, void* dqkv, const void* dout, const void* qkv,
                              const void* out, const float* lse, Elem e, std::int64_t B,
                              std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t NKV,
                              void* workspace) {
  if (B * T * C <= 0) return;
  const FDims d = fdims_of(T, T, C, NH, NKV);
  auto* D = static_cast<float*>(workspace);
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_elem(e, [&](auto el) {
      using E = decltype(el);
      with_head_size(d.hs, [&](auto hsz) {
        constexpr int HS = decltype(hsz)::value;
        launch<W>(CT_KERNEL(flash_backward_query_kernel<W, E, HS>), grid_of(B, T, NH, T),
                  dim3(kRows), 0, stream_of(cx), dqkv, D, dout, out, qkv, lse, d);
        launch<W>(CT_KERNEL(flash_backward_key_kernel<W, E, HS>), grid_of(B, T, NKV, T),
                  dim3(kRows), 0, stream_of(cx), dqkv, static_cast<const float*>(D), dout, qkv, lse,
                  d);
      });
    });
  });
}

}  // namespace ct::gpu
