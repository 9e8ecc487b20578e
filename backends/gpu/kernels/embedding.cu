// Token + position embedding, forward and backward. The backward adds each (b,t) contribution
// with one float add, in (b,t) order, as core/device.h fixes: a thread owns one channel of a set
// of dwte rows and walks the positions in order, so no two threads touch the same element and no
// atomics are needed.
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

// dwte (V, C) += dout (B*T, C) scattered by token. Block (x, p) owns columns kThreads x .. and
// the rows v with v mod P == p (P = gridDim.y): thread c walks bt = 0 .. BT-1 in order and adds
// the rows it owns, so every element gets its contributions in (b,t) order, whatever P is.
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    embedding_backward_wte_kernel(float* dwte, const float* dout, const std::int32_t* tokens,
                                  std::int64_t BT, std::int64_t C) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= C) return;
  const std::int64_t P = gridDim.y, p = blockIdx.y;
  for (std::int64_t bt = 0; bt < BT; ++bt) {
    const std::int64_t v = tokens[bt];
    if (v % P == p) dwte[v * C + c] += dout[bt * C + c];
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

void embedding_backward(const Ctx& cx, float* dwte, float* dwpe, const float* dout,
                        const std::int32_t* tokens, std::int64_t B, std::int64_t T,
                        std::int64_t C) {
  if (B * T * C <= 0) return;
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    // Enough row partitions to give every multiprocessor a few blocks (one on the SIMT runtime's
    // few host threads is plenty); each partition reads all tokens but adds only its rows.
    const std::int64_t col_blocks = (C + kThreads - 1) / kThreads;
    std::int64_t parts =
        std::int64_t{cx.multiprocessors > 0 ? cx.multiprocessors : 1} * 4 / col_blocks;
    parts = parts < 1 ? 1 : parts > 64 ? 64 : parts;
    launch<W>(CT_KERNEL(embedding_backward_wte_kernel<W>),
              dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(parts)), dim3(kThreads),
              0, stream_of(cx), dwte, dout, tokens, B * T, C);
    if (dwpe != nullptr)  // null: no position table
      launch<W>(CT_KERNEL(embedding_backward_wpe_kernel<W>), dim3(grid_for(cx, T * C, kThreads)),
                dim3(kThreads), 0, stream_of(cx), dwpe, dout, B, T, C);
  });
}

}  // namespace ct::gpu
