// Inverted dropout; x and out f32 or both the same 16-bit type (scaled in fp32, rounded to
// nearest even on store). Shader: dropout.comp. Chunks keep the element numbering of the whole
// tensor (the shader's base), so the mask does not depend on how the tensor is split.
#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {

struct DropoutPush {
  uint32_t n, oo, ox, base_lo, base_hi, k0, k1, s0, s1, threshold;
  float scale;
};
CT_VK_PUSH_SIZE(DropoutPush, dropout);
CT_VK_PUSH_MEMBER(DropoutPush, dropout, n);
CT_VK_PUSH_MEMBER(DropoutPush, dropout, oo);
CT_VK_PUSH_MEMBER(DropoutPush, dropout, ox);
CT_VK_PUSH_MEMBER(DropoutPush, dropout, base_lo);
CT_VK_PUSH_MEMBER(DropoutPush, dropout, threshold);
CT_VK_PUSH_MEMBER(DropoutPush, dropout, scale);
CT_VK_PUSH_SIZE(DropoutPush, dropout_f16);
CT_VK_PUSH_SIZE(DropoutPush, dropout_bf16);

void VulkanDevice::dropout_kernel(const Tensor& out, const Tensor& x, const DropoutMask& mask) {
  for_each_chunk(*this, out.numel(), 4, [&](int64_t s, int64_t n) {
    Bound bo = bind(out, s, n), bx = bind(x, s, n);
    auto g = grid(n, 256);
    const auto base = static_cast<uint64_t>(s);
    dispatch(h_variant(x.dtype, ShaderId::dropout, ShaderId::dropout_f16, ShaderId::dropout_bf16),
             {bo, bx},
             DropoutPush{u32(n), bo.first, bx.first, static_cast<uint32_t>(base),
                         static_cast<uint32_t>(base >> 32), static_cast<uint32_t>(mask.seed),
                         static_cast<uint32_t>(mask.seed >> 32), static_cast<uint32_t>(mask.stream),
                         static_cast<uint32_t>(mask.stream >> 32), mask.threshold, mask.scale},
             g[0], g[1]);
  });
}

}  // namespace ct::vk
