// Inverted dropout with the counter-based mask of core/device.h: element i is kept when
// (Philox4x32-10(seed, stream) word i) >> 8 >= threshold. Philox is written out here for the
// device (core/philox.h is the host's copy of the same function; the conformance suite checks
// that both give the same masks). Elementwise: results do not depend on the grid or warp size.
#include "backends/gpu/kernels/common.h"

namespace ct::gpu {
namespace {

constexpr int kThreads = 256;

// Word `word` (0..3) of Philox4x32-10 block (counter lo, counter hi, stream lo, stream hi) under
// key (k0, k1): ten rounds of the two 32x32->64 multiplies, the key bumped by the Weyl constants.
__device__ __forceinline__ std::uint32_t philox_word(std::uint64_t block, std::uint32_t s0,
                                                     std::uint32_t s1, std::uint32_t k0,
                                                     std::uint32_t k1, int word) {
  std::uint32_t c0 = static_cast<std::uint32_t>(block);
  std::uint32_t c1 = static_cast<std::uint32_t>(block >> 32);
  std::uint32_t c2 = s0, c3 = s1;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(0xD2511F53u) * c0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(0xCD9E8D57u) * c2;
    const std::uint32_t n0 = static_cast<std::uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const std::uint32_t n2 = static_cast<std::uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<std::uint32_t>(p1);
    c3 = static_cast<std::uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return word == 0 ? c0 : word == 1 ? c1 : word == 2 ? c2 : c3;
}

// out, x (n) of element E; out may be x: out[i] = keep(i) ? x[i] * scale : 0.
template <int WARP, typename E>
__global__ void CT_LAUNCH_BOUNDS(kThreads)
    dropout_kernel(void* out, const void* x, std::int64_t n, std::uint32_t k0, std::uint32_t k1,
                   std::uint32_t s0, std::uint32_t s1, std::uint32_t threshold, float scale) {
  CT_CHECK_LAUNCH_BOUNDS(kThreads);
  CT_FOR_EACH_ELEMENT(i, n, kThreads) {
    const std::uint64_t u = static_cast<std::uint64_t>(i);
    const std::uint32_t w = philox_word(u >> 2, s0, s1, k0, k1, static_cast<int>(u & 3u));
    const float v = E::load(x, i);
    E::store(out, i, (w >> 8) >= threshold ? v * scale : 0.0f);
  }
}

}  // namespace

void dropout(const Ctx& cx, void* out, const void* x, Elem e, std::int64_t n,
             const DropoutBits& m) {
  if (n <= 0) return;
  const dim3 grid(grid_for(cx, n, kThreads));
  const auto k0 = static_cast<std::uint32_t>(m.seed), k1 = static_cast<std::uint32_t>(m.seed >> 32);
  const auto s0 = static_cast<std::uint32_t>(m.stream),
             s1 = static_cast<std::uint32_t>(m.stream >> 32);
  with_warp(cx.warp, [&](auto w) {
    constexpr int W = decltype(w)::value;
    with_elem(e, [&](auto el) {
      using E = decltype(el);
      launch<W>(CT_KERNEL(dropout_kernel<W, E>), grid, dim3(kThreads), 0, stream_of(cx), out, x, n,
                k0, k1, s0, s1, m.threshold, m.scale);
    });
  });
}

}  // namespace ct::gpu
