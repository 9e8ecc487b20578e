// SwiGLU (Llama's MLP activation), forward and backward, f32 or 16-bit tensors (all of one
// element type); fp32 arithmetic. One thread per (gate, up) pair, so dgu may be gu.
#include "backends/gpu/kernels/common.h"
#include "backends/gpu/kernels/safe_math.h"

namespace ct::gpu {
namespace {

constexpr int kThreads = 256;

// out (N, F) of element E (=) silu(gate) * up; gu (N, 2F): gate = gu[:, :F], up = gu[:, F:].
template <int WARP, typename E>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    swiglu_forward_kernel(void* out, const void* gu, std::int64_t n, std::int64_t F) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_FOR_EACH_ELEMENT(i, n, kThreads) {  // i over the N * F pairs
    const std::int64_t row = i / F, col = i - row * F;
    const float g = E::load(gu, row * 2 * F + col), u = E::load(gu, row * 2 * F + F + col);
    E::store(out, i, ct_silu(g) * u);  // safe_math.h: exp(-g) never overflows
  }
}

// dgu (N, 2F) (=) (dout up s (1 + g (1 - s)), dout g s), s = sigmoid(gate); dout (N, F).
template <int WARP, typename E>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    swiglu_backward_kernel(void* dgu, const void* gu, const void* dout, std::int64_t n,
                           std::int64_t F) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_FOR_EACH_ELEMENT(i, n, kThreads) {
    const std::int64_t row = i / F, col = i - row * F;
    const std::int64_t ig = row * 2 * F + col, iu = ig + F;
    const float g = E::load(gu, ig), u = E::load(gu, iu), d = E::load(dout, i);
    const float s = ct_sigmoid(g);
    E::store(dgu, ig, d * u * s * (1.0f + g * (1.0f - s)));
    E::store(dgu, iu, d * g * s);
  }
}

}  // namespace

void swiglu_forward(const Ctx& cx, void* out, const void* gu, Elem e, std::int64_t N,
                    std::int64_t F) {
  const std::int64_t n = N * F;
  if (n <= 0) return;
  const dim3 grid(grid_for(cx, n, kThreads));
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_elem(e, [&](auto el) {
      using E = decltype(el);
      launch<W>(CT_KERNEL(swiglu_forward_kernel<W, E>), grid, dim3(kThreads), 0, stream_of(cx), out,
                gu, n, F);
    });
  });
}

void swiglu_backward(const Ctx& cx, void* dgu, const void* gu, const void* dout, Elem e,
                     std::int64_t N, std::int64_t F) {
  const std::int64_t n = N * F;
  if (n <= 0) return;
  const dim3 grid(grid_for(cx, n, kThreads));
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_elem(e, [&](auto el) {
      using E = decltype(el);
      launch<W>(CT_KERNEL(swiglu_backward_kernel<W, E>), grid, dim3(kThreads), 0, stream_of(cx),
                dgu, gu, dout, n, F);
    });
  });
}

}  // namespace ct::gpu
