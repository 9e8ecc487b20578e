// sum, norm (global L2) and check_finite. Shader: reduce.comp.
// Sums are deterministic: the split into workgroup segments depends only on the element count.
#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {

struct PartialPush {
  uint32_t n, ox, seg, square, op;
};
CT_VK_PUSH_SIZE(PartialPush, reduce_partial);
CT_VK_PUSH_MEMBER(PartialPush, reduce_partial, n);
CT_VK_PUSH_MEMBER(PartialPush, reduce_partial, ox);
CT_VK_PUSH_MEMBER(PartialPush, reduce_partial, seg);
CT_VK_PUSH_MEMBER(PartialPush, reduce_partial, square);
CT_VK_PUSH_MEMBER(PartialPush, reduce_partial, op);

struct FinalPush {
  uint32_t count, op, oo;
  float scale;
  uint32_t do_sqrt;
};
CT_VK_PUSH_SIZE(FinalPush, reduce_final);
CT_VK_PUSH_MEMBER(FinalPush, reduce_final, count);
CT_VK_PUSH_MEMBER(FinalPush, reduce_final, op);
CT_VK_PUSH_MEMBER(FinalPush, reduce_final, oo);
CT_VK_PUSH_MEMBER(FinalPush, reduce_final, scale);
CT_VK_PUSH_MEMBER(FinalPush, reduce_final, do_sqrt);

struct FinitePush {
  uint32_t n, ox, of;
};
CT_VK_PUSH_SIZE(FinitePush, check_finite);
CT_VK_PUSH_MEMBER(FinitePush, check_finite, n);
CT_VK_PUSH_MEMBER(FinitePush, check_finite, ox);
CT_VK_PUSH_MEMBER(FinitePush, check_finite, of);

namespace {
constexpr int64_t kMaxGroups = 512;  // workgroups per chunk in the first pass

int64_t groups_for(int64_t n) {
  return std::clamp<int64_t>((n + 4095) / 4096, 1, kMaxGroups);
}

void reduce(VulkanDevice& d, const Tensor& out, const Tensor& x, float scale, bool square) {
  int64_t n = x.numel();
  int64_t chunk = d.max_elems(4);
  int64_t total = 0;
  for (int64_t s = 0; s < n; s += chunk) total += groups_for(std::min(chunk, n - s));
  Tensor partial = d.workspace({std::max<int64_t>(total, 1)}, DType::f32);
  Bound bp = d.bind(partial);
  int64_t at = 0;
  for (int64_t s = 0; s < n; s += chunk) {
    int64_t c = std::min(chunk, n - s), g = groups_for(c);
    int64_t seg = (c + g - 1) / g;
    Bound bx = d.bind(x, s, c);
    d.dispatch(ShaderId::reduce_partial, {bp, bx},
               PartialPush{u32(c), bx.first, u32(seg), square ? 1u : 0u, u32(bp.first + at)},
               u32(g), 1);
    at += g;
  }
  Bound bo = d.bind(out);
  d.dispatch(ShaderId::reduce_final, {bo, bp},
             FinalPush{u32(total), bp.first, bo.first, scale, square ? 1u : 0u}, 1, 1);
}
}  // namespace

void VulkanDevice::sum_kernel(const Tensor& out, const Tensor& x, float scale) {
  reduce(*this, out, x, scale, false);
}

void VulkanDevice::norm_kernel(const Tensor& out, const Tensor& x) {
  reduce(*this, out, x, 1.0f, true);
}

struct UnscalePush {
  uint32_t n, ox, of;
  float inv_scale;
};
CT_VK_PUSH_SIZE(UnscalePush, unscale_check);
CT_VK_PUSH_MEMBER(UnscalePush, unscale_check, inv_scale);

// One pass instead of the default scale() + check_finite().
void VulkanDevice::unscale_check_kernel(const Tensor& x, const Tensor& flag, float inv_scale) {
  Bound bf = bind(flag);
  for_each_chunk(*this, x.numel(), 4, [&](int64_t s, int64_t n) {
    Bound bx = bind(x, s, n);
    auto g = grid(n, 256);
    dispatch(ShaderId::unscale_check, {bf, bx}, UnscalePush{u32(n), bx.first, bf.first, inv_scale},
             g[0], g[1]);
  });
}

void VulkanDevice::check_finite_kernel(const Tensor& flag, const Tensor& x) {
  Bound bf = bind(flag);
  for_each_chunk(*this, x.numel(), 4, [&](int64_t s, int64_t n) {
    Bound bx = bind(x, s, n);
    auto g = grid(n, 256);
    dispatch(ShaderId::check_finite, {bf, bx}, FinitePush{u32(n), bx.first, bf.first}, g[0], g[1]);
  });
}

}  // namespace ct::vk
