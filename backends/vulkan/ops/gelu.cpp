// GELU (tanh form) forward and backward; all tensors f32 or all the same 16-bit type (computed in
// fp32, rounded to nearest even on store). Shader: gelu.comp.
#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {

struct GeluFwdPush {
  uint32_t n, oo, ox;
};
CT_VK_PUSH_SIZE(GeluFwdPush, gelu_fwd);
CT_VK_PUSH_MEMBER(GeluFwdPush, gelu_fwd, n);
CT_VK_PUSH_MEMBER(GeluFwdPush, gelu_fwd, oo);
CT_VK_PUSH_MEMBER(GeluFwdPush, gelu_fwd, ox);
CT_VK_PUSH_SIZE(GeluFwdPush, gelu_fwd_f16);
CT_VK_PUSH_SIZE(GeluFwdPush, gelu_fwd_bf16);

struct GeluBwdPush {
  uint32_t n, odx, ox, odo;
};
CT_VK_PUSH_SIZE(GeluBwdPush, gelu_bwd);
CT_VK_PUSH_MEMBER(GeluBwdPush, gelu_bwd, n);
CT_VK_PUSH_MEMBER(GeluBwdPush, gelu_bwd, odx);
CT_VK_PUSH_MEMBER(GeluBwdPush, gelu_bwd, ox);
CT_VK_PUSH_MEMBER(GeluBwdPush, gelu_bwd, odo);
CT_VK_PUSH_SIZE(GeluBwdPush, gelu_bwd_f16);
CT_VK_PUSH_SIZE(GeluBwdPush, gelu_bwd_bf16);

void VulkanDevice::gelu_forward_kernel(const Tensor& out, const Tensor& x) {
  for_each_chunk(*this, out.numel(), 4, [&](int64_t s, int64_t n) {
    Bound bo = bind(out, s, n), bx = bind(x, s, n);
    auto g = grid(n, 256);
    dispatch(
        h_variant(x.dtype, ShaderId::gelu_fwd, ShaderId::gelu_fwd_f16, ShaderId::gelu_fwd_bf16),
        {bo, bx}, GeluFwdPush{u32(n), bo.first, bx.first}, g[0], g[1]);
  });
}

void VulkanDevice::gelu_backward_kernel(const Tensor& dx, const Tensor& x, const Tensor& dout) {
  for_each_chunk(*this, dx.numel(), 4, [&](int64_t s, int64_t n) {
    Bound bd = bind(dx, s, n), bx = bind(x, s, n), bo = bind(dout, s, n);
    auto g = grid(n, 256);
    dispatch(
        h_variant(x.dtype, ShaderId::gelu_bwd, ShaderId::gelu_bwd_f16, ShaderId::gelu_bwd_bf16),
        {bd, bx, bo}, GeluBwdPush{u32(n), bd.first, bx.first, bo.first}, g[0], g[1]);
  });
}

}  // namespace ct::vk
