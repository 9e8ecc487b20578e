// Token + position embedding, forward and backward. The backward adds each (b,t) contribution
// with one float add, in (b,t) order, as core/device.h fixes: a thread owns one channel of a set
// of dwte rows and walks the positions of those rows in order (listed by a first kernel), so no
// two threads touch the same element and no atomics are needed.
#include <cstdint>
#include <stdexcept>

#include "backends/gpu/kernels/common.h"

namespace ct::gpu {
namespace {

constexpr int kThreads = 256;

// out (B*T, C) f32 = wte[tokens[bt]] + wpe[bt mod T]; tokens (B*T) i32; wte (V, C) and
// wpe (maxT, C) of element E (widened exactly, added in fp32); wpe null: no position table.
template <int WARP, typename E>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    embedding_forward_kernel(float* out, const std::int32_t* tokens, const void* wte,
                             const void* wpe, std::int64_t BT, std::int64_t T, std::int64_t C) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const std::int64_t n = BT * C;
  CT_FOR_EACH_ELEMENT(i, n, kThreads) {
    const std::int64_t bt = i / C, c = i - bt * C;
    const float e = E::load(wte, static_cast<std::int64_t>(tokens[bt]) * C + c);
    out[i] = wpe == nullptr ? e : e + E::load(wpe, (bt % T) * C + c);
  }
}

// The token rows are split into P partitions (P a power of two, at most 64): partition p holds the
// rows v with v mod P == p. embedding_positions_kernel lists each partition's positions bt in
// order; embedding_backward_wte_kernel's block (x, p) owns columns kThreads x .. of partition p's
// rows, and thread c walks the list adding dout[bt][c] to dwte[tokens[bt]][c], so every element
// gets its contributions in (b,t) order, whatever P is. (A thread used to walk all BT positions
// testing each one's partition: O(BT) per thread instead of O(BT / P), with a 64-bit modulo a
// position.)

// list (P, BT) i32: row p the positions bt whose token is in partition p, in order; count (P).
// Block p (P = gridDim.x) takes the positions kThreads at a time: a position's place is the number
// of the partition's positions before it (the earlier rounds', the earlier warps' of this round
// from their ballots, the earlier lanes' of its warp).
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    embedding_positions_kernel(std::int32_t* list, std::int32_t* count, const std::int32_t* tokens,
                               std::int64_t BT) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  constexpr int kWarps = kThreads / WARP;
  CT_SHARED(int, wsum, kWarps);
  const std::uint32_t mask = gridDim.x - 1, p = blockIdx.x;
  const int lane = static_cast<int>(threadIdx.x) % WARP,
            warp = static_cast<int>(threadIdx.x) / WARP;
  std::int32_t* out = list + static_cast<std::int64_t>(p) * BT;
  std::int64_t n = 0;  // the partition's positions in earlier rounds (every thread alike)
  for (std::int64_t b0 = 0; b0 < BT; b0 += kThreads) {
    const std::int64_t bt = b0 + threadIdx.x;
    const bool own = bt < BT && (static_cast<std::uint32_t>(tokens[bt]) & mask) == p;
    const std::uint64_t m = ct_ballot(own);
    if (lane == 0) wsum[warp] = ct_popc64(m);
    __syncthreads();
    std::int64_t at = n + ct_popc64(m & ((std::uint64_t{1} << lane) - 1));
    for (int w = 0; w < warp; ++w) at += wsum[w];
    if (own) out[at] = static_cast<std::int32_t>(bt);
    for (int w = 0; w < kWarps; ++w) n += wsum[w];
    __syncthreads();  // every thread has read wsum before the next round writes it
  }
  if (threadIdx.x == 0) count[p] = static_cast<std::int32_t>(n);
}

// dwte (V, C) += dout (B*T, C) at the positions of partition p = blockIdx.y (list, count of
// embedding_positions_kernel), thread c of block x its column kThreads x + c.
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    embedding_backward_wte_kernel(float* __restrict__ dwte, const float* __restrict__ dout,
                                  const std::int32_t* __restrict__ tokens,
                                  const std::int32_t* __restrict__ list,
                                  const std::int32_t* __restrict__ count, std::int64_t BT,
                                  std::int64_t C) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= C) return;
  const std::int32_t* pos = list + static_cast<std::int64_t>(blockIdx.y) * BT;
  const std::int32_t n = count[blockIdx.y];
  float* const col = dwte + c;
  const float* const g = dout + c;
  for (std::int32_t i = 0; i < n; ++i) {
    const std::int64_t bt = pos[i];
    col[static_cast<std::int64_t>(tokens[bt]) * C] += g[bt * C];
  }
}

// dwpe (maxT, C), rows t < T: dwpe[t, c] += dout[b, t, c] for b = 0 .. B-1 in order.
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    embedding_backward_wpe_kernel(float* dwpe, const float* dout, std::int64_t B, std::int64_t T,
                                  std::int64_t C) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const std::int64_t n = T * C;
  CT_FOR_EACH_ELEMENT(i, n, kThreads) {
    float acc = dwpe[i];
    for (std::int64_t b = 0; b < B; ++b) acc += dout[b * n + i];
    dwpe[i] = acc;
  }
}

}  // namespace

void embedding_forward(const Ctx& cx, float* out, const std::int32_t* tokens, const void* wte,
                       const void* wpe, Elem e, std::int64_t B, std::int64_t T, std::int64_t C) {
  const std::int64_t n = B * T * C;
  if (n <= 0) return;
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_elem(e, [&](auto el) {
      using E = decltype(el);
      launch<W>(CT_KERNEL(embedding_forward_kernel<W, E>), dim3(grid_for(cx, n, kThreads)),
                dim3(kThreads), 0, stream_of(cx), out, tokens, wte, wpe, B * T, T, C);
    });
  });
}

namespace {
// The partitions of embedding_backward: enough to give every multiprocessor a few blocks (one
// on the SIMT runtime's few host threads is plenty), a power of two, at most 64, and fewer where
// the position lists (P BT int32) would pass 64 MiB.
std::int64_t embedding_parts(const Ctx& cx, std::int64_t BT, std::int64_t C) {
  const std::int64_t col_blocks = (C + kThreads - 1) / kThreads;
  const std::int64_t want =
      std::int64_t{cx.multiprocessors > 0 ? cx.multiprocessors : 1} * 4 / col_blocks;
  std::int64_t parts = 1;
  while (parts * 2 <= want && parts < 64 && parts * 2 * BT <= (std::int64_t{16} << 20)) parts *= 2;
  return parts;
}
}  // namespace

std::size_t embedding_backward_workspace(const Ctx& cx, std::int64_t B, std::int64_t T,
                                         std::int64_t C) {
  const std::int64_t BT = B * T, parts = embedding_parts(cx, BT, C);
  return static_cast<std::size_t>(parts * (BT + 1)) * sizeof(std::int32_t);
}

void embedding_backward(const Ctx& cx, float* dwte, float* dwpe, const float* dout,
                        const std::int32_t* tokens, std::int64_t B, std::int64_t T, std::int64_t C,
                        void* workspace) {
  if (B * T * C <= 0) return;
  const std::int64_t BT = B * T;
  if (BT > INT32_MAX) throw std::runtime_error("embedding_backward: more than 2^31 positions");
  const std::int64_t parts = embedding_parts(cx, BT, C), col_blocks = (C + kThreads - 1) / kThreads;
  auto* list = static_cast<std::int32_t*>(workspace);
  std::int32_t* count = list + parts * BT;
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    launch<W>(CT_KERNEL(embedding_positions_kernel<W>), dim3(static_cast<unsigned>(parts)),
              dim3(kThreads), 0, stream_of(cx), list, count, tokens, BT);
    launch<W>(CT_KERNEL(embedding_backward_wte_kernel<W>),
              dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(parts)), dim3(kThreads),
              0, stream_of(cx), dwte, dout, tokens, static_cast<const std::int32_t*>(list),
              static_cast<const std::int32_t*>(count), BT, C);
    if (dwpe != nullptr)  // null: no position table
      launch<W>(CT_KERNEL(embedding_backward_wpe_kernel<W>), dim3(grid_for(cx, T * C, kThreads)),
                dim3(kThreads), 0, stream_of(cx), dwpe, dout, B, T, C);
  });
}

}  // namespace ct::gpu
