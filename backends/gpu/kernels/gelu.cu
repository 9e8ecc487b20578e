// GELU, tanh form, forward and backward, f32 or 16-bit tensors (all of one element type); fp32
// arithmetic. Elementwise: results do not depend on the grid or the warp size.
#include "backends/gpu/kernels/common.h"
#include "backends/gpu/kernels/gelu_math.h"

namespace ct::gpu {
namespace {

constexpr int kThreads = 256;

// out, x (n) of element E: out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <int WARP, typename E>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    gelu_forward_kernel(void* out, const void* x, std::int64_t n) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_FOR_EACH_ELEMENT(i, n, kThreads) E::store(out, i, gelu_value(E::load(x, i)));
}

// dx, x, dout (n) of element E: dx = dout * gelu'(x).
template <int WARP, typename E>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    gelu_backward_kernel(void* dx, const void* x, const void* dout, std::int64_t n) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_FOR_EACH_ELEMENT(i, n, kThreads) {
    E::store(dx, i, gelu_grad(E::load(x, i), E::load(dout, i)));
  }
}

}  // namespace

void gelu_forward(const Ctx& cx, void* out, const void* x, Elem e, std::int64_t n) {
  if (n <= 0) return;
  const dim3 grid(grid_for(cx, n, kThreads));
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_elem(e, [&](auto el) {
      using E = decltype(el);
      launch<W>(CT_KERNEL(gelu_forward_kernel<W, E>), grid, dim3(kThreads), 0, stream_of(cx), out,
                x, n);
    });
  });
}

void gelu_backward(const Ctx& cx, void* dx, const void* x, const void* dout, Elem e,
                   std::int64_t n) {
  if (n <= 0) return;
  const dim3 grid(grid_for(cx, n, kThreads));
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_elem(e, [&](auto el) {
      using E = decltype(el);
      launch<W>(CT_KERNEL(gelu_backward_kernel<W, E>), grid, dim3(kThreads), 0, stream_of(cx), dx,
                x, dout, n);
    });
  });
}

}  // namespace ct::gpu
