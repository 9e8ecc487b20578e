// SwiGLU (Llama's MLP activation) forward and backward over gu [N, 2F] = (gate, up); all tensors
// f32 or all the same 16-bit type (fp32 arithmetic, rounded to nearest even on store). Rows run
// in chunks that fit one binding. Shader: swiglu.comp.
#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {

struct SwigluFwdPush {
  uint32_t n, F, oo, og;
};
CT_VK_PUSH_SIZE(SwigluFwdPush, swiglu_fwd);
CT_VK_PUSH_MEMBER(SwigluFwdPush, swiglu_fwd, n);
CT_VK_PUSH_MEMBER(SwigluFwdPush, swiglu_fwd, F);
CT_VK_PUSH_MEMBER(SwigluFwdPush, swiglu_fwd, oo);
CT_VK_PUSH_MEMBER(SwigluFwdPush, swiglu_fwd, og);
CT_VK_PUSH_SIZE(SwigluFwdPush, swiglu_fwd_f16);
CT_VK_PUSH_SIZE(SwigluFwdPush, swiglu_fwd_bf16);

struct SwigluBwdPush {
  uint32_t n, F, odg, og, odo;
};
CT_VK_PUSH_SIZE(SwigluBwdPush, swiglu_bwd);
CT_VK_PUSH_MEMBER(SwigluBwdPush, swiglu_bwd, n);
CT_VK_PUSH_MEMBER(SwigluBwdPush, swiglu_bwd, F);
CT_VK_PUSH_MEMBER(SwigluBwdPush, swiglu_bwd, odg);
CT_VK_PUSH_MEMBER(SwigluBwdPush, swiglu_bwd, og);
CT_VK_PUSH_MEMBER(SwigluBwdPush, swiglu_bwd, odo);
CT_VK_PUSH_SIZE(SwigluBwdPush, swiglu_bwd_f16);
CT_VK_PUSH_SIZE(SwigluBwdPush, swiglu_bwd_bf16);

namespace {
// Rows per dispatch so that [rows, 2F] fits one binding.
int64_t swiglu_rows(const VulkanDevice& d, int64_t F) {
  return std::max<int64_t>(1, d.max_elems(4) / std::max<int64_t>(2 * F, 1));
}
}  // namespace

void VulkanDevice::swiglu_forward_kernel(const Tensor& out, const Tensor& gu) {
  const int64_t F = out.shape[-1], N = F ? out.numel() / F : 0;
  const int64_t rows = swiglu_rows(*this, F);
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t nr = std::min(rows, N - r0);
    Bound bo = bind(out, r0 * F, nr * F), bg = bind(gu, r0 * 2 * F, nr * 2 * F);
    auto g = grid(nr * F, 256);
    dispatch(h_variant(gu.dtype, ShaderId::swiglu_fwd, ShaderId::swiglu_fwd_f16,
                       ShaderId::swiglu_fwd_bf16),
             {bo, bg}, SwigluFwdPush{u32(nr * F), u32(F), bo.first, bg.first}, g[0], g[1]);
  }
}

void VulkanDevice::swiglu_backward_kernel(const Tensor& dgu, const Tensor& gu, const Tensor& dout) {
  const int64_t F = dout.shape[-1], N = F ? dout.numel() / F : 0;
  const int64_t rows = swiglu_rows(*this, F);
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t nr = std::min(rows, N - r0);
    Bound bd = bind(dgu, r0 * 2 * F, nr * 2 * F), bg = bind(gu, r0 * 2 * F, nr * 2 * F),
          bo = bind(dout, r0 * F, nr * F);
    auto g = grid(nr * F, 256);
    dispatch(h_variant(gu.dtype, ShaderId::swiglu_bwd, ShaderId::swiglu_bwd_f16,
                       ShaderId::swiglu_bwd_bf16),
             {bd, bg, bo}, SwigluBwdPush{u32(nr * F), u32(F), bd.first, bg.first, bo.first}, g[0],
             g[1]);
  }
}

}  // namespace ct::vk
