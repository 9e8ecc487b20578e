// Fused causal multi-head self-attention (core/device.h flash_attention_*), forward and backward,
// with grouped-query attention. qkv rows [C3], C3 = C + 2 NKV hs, hold q (NH heads of
// hs = C / NH) | k (NKV heads) | v (NKV heads); query head h reads key/value head h / G,
// G = NH / NKV (NKV = NH: plain multi-head attention). out, dout [B,T,C]; lse [B,NH,T] f32. All
// of q, k, v, out, dout, dqkv of one element type E; fp32 arithmetic. The forward may take the
// last Tq rows only (sampling's key/value cache): out [B,Tq,C] and lse [B,NH,Tq] hold positions
// T - Tq .. T - 1, row i position T - Tq + i; its blocks are those holding such positions, each
// at the offset and with the sums it has in the whole window's forward (the same bits).
//
// L threads per query row (forward, backward dq) or key row (backward dk, dv; L below), 64 rows
// of one (b, h) a block (of one (b, j), j a key/value head, for dk, dv); the other side streams
// through shared memory in tiles of kTile rows, so the T x T probabilities exist nowhere. Each
// thread walks its keys (queries) in order (for dk, dv: the G query heads of the group in order,
// and the queries of each in order), so every output has one owner and a fixed order: no atomics,
// the same bits at every warp size.
//   forward:   online softmax: m = running max of s = scale q.k, l = sum exp(s - m),
//              o = sum exp(s - m) v, rescaled by exp(m_old - m_new) once a key tile (its
//              scores first); out = o / l, lse = m + log l.
//   backward:  D_t = dout_t . out_t (saved in the workspace), p = exp(s - lse_t),
//              ds = p (dout_t . v_u - D_t) scale;  dq_t = sum_u ds k_u  (query kernel);
//              dk_u = sum_h sum_t ds q_t, dv_u = sum_h sum_t p dout_t over the query heads h
//              of u's key/value head  (key kernel, after it).
// A row's head elements are split over L = kLanes<HS> consecutive threads (L = HS / 32 from
// head size 64 on, 1 below; 32 elements a thread at most), in chunks of 4: thread `sub` of a row
// holds chunks sub, sub + L, ... (elements 4 (sub + L c) + e), reads them from the staged tiles
// 16 bytes a load (the L threads of a row read L neighbouring chunks: no bank conflicts), and a
// dot product is the L partial sums combined by an xor butterfly (row_lanes_sum: each pair adds
// the same two values, so the L threads hold the same bits). So a thread's arrays (forward q, o;
// query kernel q, dout, dq; key kernel k, v, dk, dv) stay in registers: with one thread a row the
// key kernel spilled 564 bytes a thread at head size 64 (ptxas sm_90), 3.4-3.9 KB at 128. The
// loops over the other side run to the warp's last row, so the shuffles see every lane; each row
// then skips the keys (queries) its causal mask excludes. HS is the head size rounded up to 16,
// 64 or 128 (zero-padded, so the padding adds nothing).
#include "backends/gpu/kernels/common.h"
#include "backends/gpu/kernels/safe_math.h"

namespace ct::gpu {
namespace {

constexpr int kRows = 64;  // query (or key) rows a block
constexpr int kTile = 32;  // key (or query) rows staged in shared memory at a time

template <int HS>
constexpr int kLanes = HS >= 64 ? HS / 32 : 1;  // threads a row
template <int HS>
constexpr int kEl = HS / kLanes<HS>;  // elements a thread
template <int HS>
constexpr int kThreads = kRows* kLanes<HS>;  // threads a block

struct alignas(16) F4 {
  float v[4];
};

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
// This thread is lane `sub` of row r; its warp's rows are warp_first .. warp_last (< T, or
// warp_last < warp_first where the warp has none).
struct Row {
  std::int64_t b, h, r;  // batch, head, this thread's row
  int sub;               // which of the row's L threads
  std::int64_t first;    // the block's first row
  std::int64_t last;     // and its last (< T)
  std::int64_t warp_first, warp_last;
};
template <int WARP, int HS>
__device__ __forceinline__ Row row_of(const FDims& d, std::int64_t heads, std::int64_t x0 = 0) {
  constexpr int L = kLanes<HS>;
  Row w;
  w.b = blockIdx.y / heads;
  w.h = blockIdx.y % heads;
  w.first = (static_cast<std::int64_t>(blockIdx.x) + x0) * kRows;
  w.r = w.first + threadIdx.x / L;
  w.sub = static_cast<int>(threadIdx.x % L);
  w.last = w.first + kRows - 1 < d.T - 1 ? w.first + kRows - 1 : d.T - 1;
  const std::int64_t wf = w.first + static_cast<std::int64_t>(threadIdx.x / WARP) * (WARP / L);
  w.warp_first = wf;
  w.warp_last = wf + WARP / L - 1 < d.T - 1 ? wf + WARP / L - 1 : d.T - 1;
  return w;
}

// The thread's k-th element of a row (k < kEl<HS>).
template <int HS>
__device__ __forceinline__ int elem(int sub, int k) {
  return 4 * (sub + kLanes<HS> * (k / 4)) + k % 4;
}

// dst[k] (=) element elem(sub, k) of the hs at src + at (zeros past hs).
template <typename E, int HS>
__device__ __forceinline__ void load_row(float (&dst)[kEl<HS>], const void* src, std::int64_t at,
                                         std::int64_t hs, int sub) {
  for (int k = 0; k < kEl<HS>; ++k) {
    const int i = elem<HS>(sub, k);
    dst[k] = i < hs ? E::load(src, at + i) : 0.0f;
  }
}

// The hs elements at dst + at (=) src[k] * f, element elem(sub, k) of the row (those past hs
// skipped). f = 1 stores the values as they are.
template <typename E, int HS>
__device__ __forceinline__ void store_row(void* dst, std::int64_t at, const float (&src)[kEl<HS>],
                                          float f, std::int64_t hs, int sub) {
  for (int k = 0; k < kEl<HS>; ++k) {
    const int i = elem<HS>(sub, k);
    if (i < hs) E::store(dst, at + i, src[k] * f);
  }
}

// Stages rows r0 .. r0 + kTile of a [.., row_stride] tensor's head slice (element offset `at`
// of row 0) into tile[kTile][HS] as f32; rows at or past T and columns past hs are zero.
template <typename E, int HS>
__device__ __forceinline__ void stage(F4* tile4, const void* src, std::int64_t at,
                                      std::int64_t row_stride, std::int64_t r0, const FDims& d) {
  float* tile = tile4[0].v;
  for (int idx = threadIdx.x; idx < kTile * HS; idx += kThreads<HS>) {
    const int rr = idx / HS, i = idx % HS;
    const std::int64_t r = r0 + rr;
    tile[idx] = r < d.T && i < d.hs ? E::load(src, at + r * row_stride + i) : 0.0f;
  }
}

// This thread's part of a . (row uu of tile4): four running sums, one for each position e of a
// chunk, each over the chunks in order, then (s0 + s1) + (s2 + s3) -- four chains a quarter as
// long as one, so the multiply-adds of a dot product wait a quarter as long for each other.
template <int HS>
__device__ __forceinline__ float part_dot(const float (&a)[kEl<HS>], const F4* tile4, int uu,
                                          int sub) {
  const F4* row = tile4 + uu * (HS / 4);
  float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int c = 0; c < kEl<HS> / 4; ++c) {
    const F4 x = row[sub + kLanes<HS> * c];
    for (int e = 0; e < 4; ++e) s[e] += a[4 * c + e] * x.v[e];
  }
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// acc[k] += f * (row uu of tile4)'s elements of this thread.
template <int HS>
__device__ __forceinline__ void part_axpy(float (&acc)[kEl<HS>], float f, const F4* tile4, int uu,
                                          int sub) {
  const F4* row = tile4 + uu * (HS / 4);
  for (int c = 0; c < kEl<HS> / 4; ++c) {
    const F4 x = row[sub + kLanes<HS> * c];
    for (int e = 0; e < 4; ++e) acc[4 * c + e] += f * x.v[e];
  }
}

// The sum of v over the row's L threads (xor butterfly; every one of them ends with the same
// bits). Every thread of the warp calls it.
template <int HS>
__device__ __forceinline__ float row_lanes_sum(float v) {
  for (int m = kLanes<HS> / 2; m >= 1; m /= 2) v += ct_shfl_xor(v, m, kLanes<HS>);
  return v;
}

// The first block holding a row of out: that of position T - Tq (0 when Tq = T).
__host__ __device__ __forceinline__ std::int64_t first_block(std::int64_t T, std::int64_t Tq) {
  return (T - Tq) / kRows;
}

// out (B, Tq, C), lse (B, NH, Tq) f32, qkv (B, T, C3). Blocks over (b, h) query heads, those of
// positions T - Tq .. T - 1; a thread whose position comes before T - Tq only stages and
// shuffles.
template <int WARP, typename E, int HS>
__global__ void CT_LAUNCH_BOUNDS(kThreads<HS>)
    flash_forward_kernel(void* out, float* lse, const void* qkv, FDims d) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads<HS>);
  CT_SHARED(F4, ks, kTile * HS / 4);
  CT_SHARED(F4, vs, kTile * HS / 4);
  CT_SHARED(float, ss, kRows* kTile);  // the rows' scores of a key tile
  constexpr int EL = kEl<HS>;
  const std::int64_t p0 = d.T - d.Tq;  // the position of out's row 0
  const Row w = row_of<WARP, HS>(d, d.NH, first_block(d.T, d.Tq));
  const std::int64_t C3 = d.C3, j = w.h / d.G;
  const std::int64_t row0 = w.b * d.T * C3, base = row0 + w.h * d.hs;
  const bool live = w.r >= p0 && w.r < d.T;
  float q[EL], o[EL];
  for (int k = 0; k < EL; ++k) q[k] = 0.0f, o[k] = 0.0f;
  if (live) load_row<E, HS>(q, qkv, base + w.r * C3, d.hs, w.sub);
  // FlashAttention-2's order within a key tile: the tile's scores first (kept in shared memory,
  // a row's by its lane 0), the row's running max m over them once, o and l rescaled once, then
  // p = exp(s - m) and o += p v key by key -- no branch on "a new maximum" per key, which the
  // rows of a warp took at different keys (both sides ran).
  const int rr = static_cast<int>(w.r - w.first);  // the row in the block
  float m = -kFltMax, l = 0.0f;  // finite start: exp(m - m') is 0, not NaN, at the first key
  for (std::int64_t u0 = 0; u0 <= w.last; u0 += kTile) {
    stage<E, HS>(ks, qkv, row0 + k_col(d, j), C3, u0, d);
    stage<E, HS>(vs, qkv, row0 + v_col(d, j), C3, u0, d);
    __syncthreads();
    // the warp's keys of the tile: those up to its last row (the same for all its threads)
    const int n = w.warp_last - u0 + 1 < kTile ? static_cast<int>(w.warp_last - u0 + 1) : kTile;
    float mt = m;
    for (int uu = 0; uu < n; ++uu) {
      const float sc = row_lanes_sum<HS>(part_dot<HS>(q, ks, uu, w.sub)) * d.scale;
      if (live && u0 + uu <= w.r) mt = fmaxf(mt, sc);
      if (w.sub == 0) ss[rr * kTile + uu] = sc;
    }
    ct_syncwarp();  // the row's scores, for its other lanes
    if (live && u0 <= w.r) {
      const float corr = ct_exp_le0(m - mt);  // 0 at the first tile, 1 if the max stayed
      l *= corr;
      for (int k = 0; k < EL; ++k) o[k] *= corr;
      m = mt;
      for (int uu = 0; uu < n && u0 + uu <= w.r; ++uu) {
        const float p = ct_exp_le0(ss[rr * kTile + uu] - m);
        l += p;
        part_axpy<HS>(o, p, vs, uu, w.sub);
      }
    }
    __syncthreads();
  }
  if (!live) return;
  const float inv = 1.0f / l;
  const std::int64_t i = w.r - p0;  // out's row
  const std::int64_t o0 = (w.b * d.Tq + i) * d.C + w.h * d.hs;
  store_row<E, HS>(out, o0, o, inv, d.hs, w.sub);
  if (w.sub == 0) lse[(w.b * d.NH + w.h) * d.Tq + i] = m + logf(l);
}

// Per query row: D (B, NH, T) f32 into the workspace, and dq into the q columns of dqkv
// (B, T, C3). Blocks over (b, h) query heads.
template <int WARP, typename E, int HS>
__global__ void CT_LAUNCH_BOUNDS(kThreads<HS>)
    flash_backward_query_kernel(void* dqkv, float* Dsave, const void* dout, const void* out,
                                const void* qkv, const float* lse, FDims d) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads<HS>);
  CT_SHARED(F4, ks, kTile * HS / 4);
  CT_SHARED(F4, vs, kTile * HS / 4);
  constexpr int EL = kEl<HS>;
  const Row w = row_of<WARP, HS>(d, d.NH);
  const std::int64_t C3 = d.C3, j = w.h / d.G;
  const std::int64_t row0 = w.b * d.T * C3, base = row0 + w.h * d.hs;
  const std::int64_t row = (w.b * d.NH + w.h) * d.T + w.r;
  const bool live = w.r < d.T;
  float q[EL], g[EL], dq[EL];
  for (int k = 0; k < EL; ++k) q[k] = 0.0f, g[k] = 0.0f, dq[k] = 0.0f;
  float D = 0.0f, l = 0.0f;
  if (live) {
    const std::int64_t o0 = (w.b * d.T + w.r) * d.C + w.h * d.hs;
    load_row<E, HS>(q, qkv, base + w.r * C3, d.hs, w.sub);
    load_row<E, HS>(g, dout, o0, d.hs, w.sub);
    for (int k = 0; k < EL; ++k) {
      const int c = elem<HS>(w.sub, k);
      if (c < d.hs) D += g[k] * E::load(out, o0 + c);
    }
    l = lse[row];
  }
  D = row_lanes_sum<HS>(D);
  if (live && w.sub == 0) Dsave[row] = D;
  for (std::int64_t u0 = 0; u0 <= w.last; u0 += kTile) {
    stage<E, HS>(ks, qkv, row0 + k_col(d, j), C3, u0, d);
    stage<E, HS>(vs, qkv, row0 + v_col(d, j), C3, u0, d);
    __syncthreads();
    for (int uu = 0; uu < kTile && u0 + uu <= w.warp_last; ++uu) {
      const float dot = row_lanes_sum<HS>(part_dot<HS>(q, ks, uu, w.sub));
      const float dp = row_lanes_sum<HS>(part_dot<HS>(g, vs, uu, w.sub));
      if (!live || u0 + uu > w.r) continue;
      const float p = ct_exp_le0(dot * d.scale - l);
      const float ds = p * (dp - D) * d.scale;
      part_axpy<HS>(dq, ds, ks, uu, w.sub);
    }
    __syncthreads();
  }
  if (!live) return;
  store_row<E, HS>(dqkv, base + w.r * C3, dq, 1.0f, d.hs, w.sub);
}

// Per key row u of key/value head j: dk, dv into the k and v columns of dqkv (B, T, C3), from
// the query heads h = j G .. j G + G - 1 in order and, for each, the queries t >= u in order,
// into one accumulator (the G partial sums are never split, so no other block writes them).
// Blocks over (b, j) key/value heads. Reads the D that flash_backward_query_kernel saved.
template <int WARP, typename E, int HS>
__global__ void CT_LAUNCH_BOUNDS(kThreads<HS>)
    flash_backward_key_kernel(void* dqkv, const float* Dsave, const void* dout, const void* qkv,
                              const float* lse, FDims d) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads<HS>);
  CT_SHARED(F4, qs, kTile * HS / 4);
  CT_SHARED(F4, gs, kTile * HS / 4);
  CT_SHARED(float, ls, kTile);
  CT_SHARED(float, Ds, kTile);
  constexpr int EL = kEl<HS>;
  const Row w = row_of<WARP, HS>(d, d.NKV);
  const std::int64_t C3 = d.C3, j = w.h, row0 = w.b * d.T * C3;
  const bool live = w.r < d.T;
  float k[EL], v[EL], dk[EL], dv[EL];
  for (int e = 0; e < EL; ++e) k[e] = 0.0f, v[e] = 0.0f, dk[e] = 0.0f, dv[e] = 0.0f;
  if (live) {
    load_row<E, HS>(k, qkv, row0 + w.r * C3 + k_col(d, j), d.hs, w.sub);
    load_row<E, HS>(v, qkv, row0 + w.r * C3 + v_col(d, j), d.hs, w.sub);
  }
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
      // queries before the warp's first row reach none of its rows
      const int tt0 = w.warp_first > t0 ? static_cast<int>(w.warp_first - t0) : 0;
      for (int tt = tt0; tt < kTile && t0 + tt < d.T; ++tt) {
        const float dot = row_lanes_sum<HS>(part_dot<HS>(k, qs, tt, w.sub));
        const float dp = row_lanes_sum<HS>(part_dot<HS>(v, gs, tt, w.sub));
        if (!live || t0 + tt < w.r) continue;
        const float p = ct_exp_le0(dot * d.scale - ls[tt]);
        const float ds = p * (dp - Ds[tt]) * d.scale;
        part_axpy<HS>(dv, p, gs, tt, w.sub);
        part_axpy<HS>(dk, ds, qs, tt, w.sub);
      }
      __syncthreads();
    }
  }
  if (!live) return;
  store_row<E, HS>(dqkv, row0 + w.r * C3 + k_col(d, j), dk, 1.0f, d.hs, w.sub);
  store_row<E, HS>(dqkv, row0 + w.r * C3 + v_col(d, j), dv, 1.0f, d.hs, w.sub);
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
        launch<W>(CT_KERNEL(flash_forward_kernel<W, E, HS>), grid_of(B, T, NH, Tq),
                  dim3(kThreads<HS>), 0, stream_of(cx), out, lse, qkv, d);
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
                  dim3(kThreads<HS>), 0, stream_of(cx), dqkv, D, dout, out, qkv, lse, d);
        launch<W>(CT_KERNEL(flash_backward_key_kernel<W, E, HS>), grid_of(B, T, NKV, T),
                  dim3(kThreads<HS>), 0, stream_of(cx), dqkv, static_cast<const float*>(D), dout,
                  qkv, lse, d);
      });
    });
  });
}

}  // namespace ct::gpu
