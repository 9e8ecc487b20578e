// Elementwise ops: fill, dtype conversion, add, accumulate, scale. Grid-stride loops over n
// elements with 64-bit indices; every element is independent, so results do not depend on the
// grid or the warp size.
#include "backends/gpu/kernels/common.h"

namespace ct::gpu {
namespace {

constexpr int kThreads = 256;

// dst is (n) elements of `width` bytes (1, 2 or 4): dst[i] = pattern.
template <int WARP, typename T>
__global__ void CT_LAUNCH_BOUNDS(kThreads) fill_kernel(T* dst, std::int64_t n, T pattern) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_FOR_EACH_ELEMENT(i, n, kThreads)
  dst[i] = pattern;
}

// dst (n, element D) = src (n, element S) converted through fp32.
template <int WARP, typename D, typename S>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    convert_kernel(void* dst, const void* src, std::int64_t n) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_FOR_EACH_ELEMENT(i, n, kThreads)
  D::store(dst, i, S::load(src, i));
}

// out, a (n) f32; b (n, element B): out = a + b.
template <int WARP, typename B>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    add_kernel(float* out, const float* a, const void* b, std::int64_t n) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_FOR_EACH_ELEMENT(i, n, kThreads)
  out[i] = a[i] + B::load(b, i);
}

// dst, src (n) f32: dst += src.
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    accumulate_kernel(float* dst, const float* src, std::int64_t n) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_FOR_EACH_ELEMENT(i, n, kThreads)
  dst[i] += src[i];
}

// t (n) f32: t *= s.
template <int WARP>
__global__ void CT_LAUNCH_BOUNDS(kThreads) scale_kernel(float* t, float s, std::int64_t n) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_FOR_EACH_ELEMENT(i, n, kThreads)
  t[i] *= s;
}

}  // namespace

void fill_pattern(const Ctx& cx, void* dst, std::int64_t n, int width, std::uint32_t pattern) {
  if (n <= 0) return;
  const dim3 grid(grid_for(cx, n, kThreads));
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    if (width == 4)
      launch<W>(CT_KERNEL(fill_kernel<W, std::uint32_t>), grid, dim3(kThreads), 0, stream_of(cx),
                static_cast<std::uint32_t*>(dst), n, pattern);
    else if (width == 2)
      launch<W>(CT_KERNEL(fill_kernel<W, std::uint16_t>), grid, dim3(kThreads), 0, stream_of(cx),
                static_cast<std::uint16_t*>(dst), n, static_cast<std::uint16_t>(pattern));
    else if (width == 1)
      launch<W>(CT_KERNEL(fill_kernel<W, std::uint8_t>), grid, dim3(kThreads), 0, stream_of(cx),
                static_cast<std::uint8_t*>(dst), n, static_cast<std::uint8_t>(pattern));
    else
      throw std::invalid_argument("fill_pattern: width must be 1, 2 or 4 bytes");
  });
}

void convert(const Ctx& cx, void* dst, Elem dst_elem, const void* src, Elem src_elem,
             std::int64_t n) {
  if (n <= 0) return;
  const dim3 grid(grid_for(cx, n, kThreads));
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_elem(dst_elem, [&](auto d) {
      using D = decltype(d);
      with_elem(src_elem, [&](auto s) {
        using S = decltype(s);
        launch<W>(CT_KERNEL(convert_kernel<W, D, S>), grid, dim3(kThreads), 0, stream_of(cx), dst,
                  src, n);
      });
    });
  });
}

void add(const Ctx& cx, float* out, const float* a, const void* b, Elem b_elem, std::int64_t n) {
  if (n <= 0) return;
  const dim3 grid(grid_for(cx, n, kThreads));
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_elem(b_elem, [&](auto e) {
      using B = decltype(e);
      launch<W>(CT_KERNEL(add_kernel<W, B>), grid, dim3(kThreads), 0, stream_of(cx), out, a, b, n);
    });
  });
}

void accumulate(const Ctx& cx, float* dst, const float* src, std::int64_t n) {
  if (n <= 0) return;
  const dim3 grid(grid_for(cx, n, kThreads));
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    launch<W>(CT_KERNEL(accumulate_kernel<W>), grid, dim3(kThreads), 0, stream_of(cx), dst, src, n);
  });
}

void scale(const Ctx& cx, float* t, float s, std::int64_t n) {
  if (n <= 0) return;
  const dim3 grid(grid_for(cx, n, kThreads));
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    launch<W>(CT_KERNEL(scale_kernel<W>), grid, dim3(kThreads), 0, stream_of(cx), t, s, n);
  });
}

}  // namespace ct::gpu
