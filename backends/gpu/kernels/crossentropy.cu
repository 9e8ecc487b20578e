// Fused log-softmax + negative log-likelihood, forward and backward, one block per row; logits
// f32 or 16-bit, statistics in fp32 by the fixed block trees of common.h (the same at every warp
// size). The backward reads a row's statistics before it writes, so dlogits may be logits.
// Rows are Vp wide: classes [0, V), then padding [V, Vp) whose values the forward never uses
// and the backward writes as 0 (core/device.h). The training step's kernel does both in place,
// reading a row twice (online statistics, then the gradient) where the two kernels read it
// three times.
#include <initializer_list>

#include "backends/gpu/kernels/common.h"
#include "backends/gpu/kernels/safe_math.h"

namespace ct::gpu {
namespace {

constexpr int kThreads = 256;

// A row is walked in chunks of kVec consecutive elements, chunk c by thread c % kThreads, in
// the order c, c + kThreads, ...; every kernel below takes the same chunks, so its statistics
// have the same bits whichever of the two ways it reads them. VEC: the row's first element is
// 16-byte aligned and the row Vp wide with Vp a multiple of kVec (every gpt2 / Llama row: the
// vocabulary padded to 128), so a chunk is one 16-byte load (two for f32) -- on a GPU a thread
// with one 2-byte load in flight at a time leaves most of the memory's bandwidth unused (the
// online statistics below branch on each element, so the compiler cannot hoist the next load).
// Otherwise element by element.
constexpr int kVec = 8;

// Chunk i0 .. i0 + kVec of row `base` of x into v: elements past `end` are not read (0 in v),
// except that VEC reads the whole chunk (within the row's Vp).
template <typename E, bool VEC>
__device__ __forceinline__ void load_chunk(const void* x, std::int64_t base, std::int64_t i0,
                                           std::int64_t end, float* v) {
  if constexpr (VEC) {
    E::load8(x, base + i0, v);
  } else {
    for (int k = 0; k < kVec; ++k) v[k] = i0 + k < end ? E::load(x, base + i0 + k) : 0.0f;
  }
}
// v into chunk i0 .. i0 + kVec of row `base`, elements from `end` on not written (VEC: none).
template <typename E, bool VEC>
__device__ __forceinline__ void store_chunk(void* x, std::int64_t base, std::int64_t i0,
                                            std::int64_t end, const float* v) {
  if constexpr (VEC) {
    E::store8(x, base + i0, v);
  } else {
    for (int k = 0; k < kVec; ++k)
      if (i0 + k < end) E::store(x, base + i0 + k, v[k]);
  }
}

// Row max and log(sum(exp(x - max))) of x (V classes of a row at `base`) of element E in one
// read: each thread keeps the running max of its chunks and the sum of exp(x - running max),
// rescaled once a chunk (by exp(m - m'), 1 when the max did not grow); the block merges the
// threads' pairs at the block max. Every thread gets them. A NaN x makes the sum NaN; -inf
// logits add exp(-inf) = 0.
// One chunk's step of the online statistics: m, s over the chunk's first n elements of v.
template <bool FULL>
__device__ __forceinline__ void stats_step(float& m, float& s, const float* v, int n) {
  float mc = m;
  for (int k = 0; k < kVec; ++k)
    if (FULL || k < n) mc = fmaxf(mc, v[k]);
  float add = 0.0f;
  for (int k = 0; k < kVec; ++k)
    if (FULL || k < n) add += ct_exp_le0(v[k] - mc);
  s = s * ct_exp_le0(m - mc) + add;
  m = mc;
}

// Row max and log(sum(exp(x - max))) of x (V classes of a row at `base`) of element E in one
// read: each thread keeps the running max of its chunks and the sum of exp(x - running max),
// rescaled once a chunk (by exp(m - m'), 1 when the max did not grow); the block merges the
// threads' pairs at the block max. Every thread gets them. A NaN x makes the sum NaN; -inf
// logits add exp(-inf) = 0.
template <int WARP, typename E, bool VEC>
__device__ __forceinline__ void row_stats(const void* x, std::int64_t base, std::int64_t V,
                                          float* smem, float* maxval, float* logsum) {
  float m = -kFltMax, s = 0.0f;  // finite start: m - m' is never inf - inf
  for (std::int64_t i0 = threadIdx.x * std::int64_t(kVec); i0 < V; i0 += kThreads * kVec) {
    float v[kVec];
    load_chunk<E, VEC>(x, base, i0, V, v);
    if (i0 + kVec <= V)
      stats_step<true>(m, s, v, kVec);  // the same arithmetic, without the bounds
    else
      stats_step<false>(m, s, v, static_cast<int>(V - i0));
  }
  const float mb = block_max<WARP, kThreads>(m, smem);
  s = block_sum<WARP, kThreads>(s * ct_exp_le0(m - mb), smem);
  *maxval = mb;
  *logsum = logf(s);
}

// The gradient of chunk i0: dloss * (softmax - onehot(target)) over the classes, 0 past them
// (element k is class i0 + k; offsets within the chunk in 32 bits).
__device__ __forceinline__ void chunk_gradient(float* g, const float* v, std::int64_t i0,
                                               std::int64_t V, std::int64_t target, float m,
                                               float ls, float dloss) {
  const int n = V - i0 < kVec ? static_cast<int>(V - i0) : kVec;  // classes in the chunk
  const std::int64_t td = target - i0;
  const int t = td >= 0 && td < kVec ? static_cast<int>(td) : -1;
  for (int k = 0; k < kVec; ++k) {
    const float p = ct_exp_le0(v[k] - m - ls);
    g[k] = k < n ? dloss * (p - (k == t ? 1.0f : 0.0f)) : 0.0f;
  }
}

// losses (N) f32; logits (N, Vp) of element E; targets (N) i32. Block n handles row n.
template <int WARP, typename E, bool VEC>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    crossentropy_forward_kernel(float* losses, const void* logits, const std::int32_t* targets,
                                std::int64_t V, std::int64_t Vp) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_SHARED(float, smem, kThreads);
  const std::int64_t n = blockIdx.x;
  const std::int64_t base = n * Vp;
  float m, ls;
  row_stats<WARP, E, VEC>(logits, base, V, smem, &m, &ls);
  // log z + (max - x[target]): the small log z is not rounded against a large max first.
  if (threadIdx.x == 0) losses[n] = ls + (m - E::load(logits, base + targets[n]));
}

// The gradient pass of crossentropy_backward (LOSS false) and crossentropy_forward_backward
// (LOSS true: losses (N) f32, and dlogits is logits, in place), block n on row n: dlogits (N, Vp) =
// dloss * (softmax(logits) - onehot(target)) over [0, V), 0 over [V, Vp); logits (N, Vp) of element
// E, targets (N) i32. dlogits may be logits: each chunk is read before it is written, by its one
// thread, after the statistics' last read. The fused kernel's losses are
// crossentropy_forward_kernel's, and its dlogits the backward's, bit for bit (the same statistics
// and arithmetic); it reads a row twice (the statistics, then the gradient) where the two kernels
// read it three times.
template <int WARP, typename E, bool VEC, bool LOSS>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    crossentropy_gradient_kernel(float* losses, void* dlogits, const void* logits,
                                 const std::int32_t* targets, std::int64_t V, std::int64_t Vp,
                                 float dloss) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_SHARED(float, smem, kThreads);
  const std::int64_t n = blockIdx.x;
  const std::int64_t base = n * Vp;
  float m, ls;
  row_stats<WARP, E, VEC>(logits, base, V, smem, &m, &ls);
  const std::int64_t target = targets[n];
  for (std::int64_t i0 = threadIdx.x * std::int64_t(kVec); i0 < Vp; i0 += kThreads * kVec) {
    float v[kVec] = {}, g[kVec];
    if (i0 < V) load_chunk<E, VEC>(logits, base, i0, V, v);
    // The thread that owns the target's chunk reads it just before it overwrites it (constant
    // indices into v: a variable one would put the chunk in scratch memory on AMD GPUs).
    if (LOSS && target >= i0 && target < i0 + kVec) {
      float xt = 0.0f;
      for (int k = 0; k < kVec; ++k)
        if (i0 + k == target) xt = v[k];
      losses[n] = ls + (m - xt);
    }
    chunk_gradient(g, v, i0, V, target, m, ls, dloss);
    store_chunk<E, VEC>(dlogits, base, i0, Vp, g);
  }
}

// Whether rows of Vp elements of e starting at p all begin 16-byte aligned (the VEC kernels).
bool rows_vec_ok(const void* p, Elem e, std::int64_t Vp) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && Vp % kVec == 0 &&
         (Vp * static_cast<std::int64_t>(elem_size(e))) % 16 == 0;
}

// The launches of a call over N rows: slices of at most 65535 rows (grid x's limit on some
// targets); f(W, E, VEC, first row, rows, the rows' byte offset) for each, VEC where every
// pointer in `rows_of` gives aligned rows.
template <typename F>
void for_row_launches(const Ctx& cx, Elem e, std::int64_t N, std::int64_t Vp,
                      std::initializer_list<const void*> rows_of, F f) {
  bool vec = true;
  for (const void* p : rows_of) vec = vec && rows_vec_ok(p, e, Vp);
  const std::int64_t row_bytes = Vp * static_cast<std::int64_t>(elem_size(e));
  for (std::int64_t row = 0; row < N; row += 65535) {
    const std::int64_t rows = N - row < 65535 ? N - row : 65535;
    with_warp(cx.warp, [&](auto w) {
      with_elem(e, [&](auto el) {
        if (vec)
          f(w, el, std::true_type{}, row, static_cast<unsigned>(rows), row * row_bytes);
        else
          f(w, el, std::false_type{}, row, static_cast<unsigned>(rows), row * row_bytes);
      });
    });
  }
}

}  // namespace

void crossentropy_forward(const Ctx& cx, float* losses, const void* logits, Elem e,
                          const std::int32_t* targets, std::int64_t N, std::int64_t V,
                          std::int64_t Vp) {
  for_row_launches(
      cx, e, N, Vp, {logits}, [&](auto w, auto el, auto vec, auto row, auto rows, auto off) {
        constexpr int W = decltype(w)::value;
        launch<W>(CT_KERNEL(crossentropy_forward_kernel<W, decltype(el), decltype(vec)::value>),
                  dim3(rows), dim3(kThreads), 0, stream_of(cx), losses + row,
                  static_cast<const char*>(logits) + off, targets + row, V, Vp);
      });
}

void crossentropy_backward(const Ctx& cx, void* dlogits, const void* logits, Elem e,
                           const std::int32_t* targets, std::int64_t N, std::int64_t V,
                           std::int64_t Vp, float dloss) {
  for_row_launches(
      cx, e, N, Vp, {dlogits, logits},
      [&](auto w, auto el, auto vec, auto row, auto rows, auto off) {
        constexpr int W = decltype(w)::value;
        launch<W>(
            CT_KERNEL(crossentropy_gradient_kernel<W, decltype(el), decltype(vec)::value, false>),
            dim3(rows), dim3(kThreads), 0, stream_of(cx), nullptr,
            static_cast<char*>(dlogits) + off, static_cast<const char*>(logits) + off,
            targets + row, V, Vp, dloss);
      });
}

void crossentropy_forward_backward(const Ctx& cx, float* losses, void* logits, Elem e,
                                   const std::int32_t* targets, std::int64_t N, std::int64_t V,
                                   std::int64_t Vp, float dloss) {
  for_row_launches(
      cx, e, N, Vp, {logits}, [&](auto w, auto el, auto vec, auto row, auto rows, auto off) {
        constexpr int W = decltype(w)::value;
        launch<W>(
            CT_KERNEL(crossentropy_gradient_kernel<W, decltype(el), decltype(vec)::value, true>),
            dim3(rows), dim3(kThreads), 0, stream_of(cx), losses + row,
            static_cast<char*>(logits) + off, static_cast<const char*>(logits) + off, targets + row,
            V, Vp, dloss);
      });
}

}  // namespace ct::gpu
