// Rotary position embedding (Hugging Face's rotate-half form), f32 or 16-bit x/out (one element
// type), f32 cos/sin tables, fp32 arithmetic. One thread per rotated pair (or copied element), so
// out may be x.
#include "backends/gpu/kernels/common.h"

namespace ct::gpu {
namespace {

constexpr int kThreads = 256;

// x, out (B*T, W) of element E; cos, sin (T, D/2). Index i runs over the B*T*W/2 work items of
// a position: items [0, rot_heads*D/2) are the rotated pairs (head h = k / (D/2), i = k % (D/2)),
// the rest copy two elements each of the unrotated tail (W - rot_heads*D is even: D is).
template <int WARP, typename E>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    rope_kernel(void* out, const void* x, const float* cos, const float* sin, std::int64_t n,
                std::int64_t T, std::int64_t W, std::int64_t D, std::int64_t rot_heads,
                float sign) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  const std::int64_t per = W / 2, half = D / 2;
  CT_FOR_EACH_ELEMENT(i, n, kThreads) {
    const std::int64_t bt = i / per, k = i - bt * per, t = bt % T;
    const std::int64_t row = bt * W;
    if (k < rot_heads * half) {
      const std::int64_t h = k / half, j = k - h * half;
      const std::int64_t i1 = row + h * D + j, i2 = i1 + half;
      const float a = E::load(x, i1), b = E::load(x, i2);
      const float c = cos[t * half + j], s = sign * sin[t * half + j];
      E::store(out, i1, a * c - b * s);
      E::store(out, i2, b * c + a * s);
    } else {
      const std::int64_t e = row + rot_heads * D + 2 * (k - rot_heads * half);
      E::store(out, e, E::load(x, e));
      E::store(out, e + 1, E::load(x, e + 1));
    }
  }
}

}  // namespace

void rope(const Ctx& cx, void* out, const void* x, Elem e, const float* cos, const float* sin,
          std::int64_t B, std::int64_t T, std::int64_t W, std::int64_t D, std::int64_t rot_heads,
          bool inverse) {
  const std::int64_t n = B * T * (W / 2);
  if (n <= 0) return;
  const dim3 grid(grid_for(cx, n, kThreads));
  with_warp(cx.warp, [&](auto w) {
    constexpr int W_ = decltype(w)::value;
    with_elem(e, [&](auto el) {
      using E = decltype(el);
      launch<W_>(CT_KERNEL(rope_kernel<W_, E>), grid, dim3(kThreads), 0, stream_of(cx), out, x, cos,
                 sin, n, T, W, D, rot_heads, inverse ? -1.0f : 1.0f);
    });
  });
}

}  // namespace ct::gpu
