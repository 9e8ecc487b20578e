// Rotary position embedding (rotate-half form), forward and backward (the opposite angle), x/out
// f32 or 16-bit, cos/sin tables f32. Positions run in chunks that fit one binding.
// Shader: rope.comp.
#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {

struct RopePush {
  uint32_t n, T, W, D, rot_heads, bt0;
  float sign;
  uint32_t oo, ox, oc, os;
};
CT_VK_PUSH_SIZE(RopePush, rope);
CT_VK_PUSH_MEMBER(RopePush, rope, n);
CT_VK_PUSH_MEMBER(RopePush, rope, T);
CT_VK_PUSH_MEMBER(RopePush, rope, W);
CT_VK_PUSH_MEMBER(RopePush, rope, D);
CT_VK_PUSH_MEMBER(RopePush, rope, rot_heads);
CT_VK_PUSH_MEMBER(RopePush, rope, bt0);
CT_VK_PUSH_MEMBER(RopePush, rope, sign);
CT_VK_PUSH_MEMBER(RopePush, rope, oo);
CT_VK_PUSH_MEMBER(RopePush, rope, ox);
CT_VK_PUSH_MEMBER(RopePush, rope, oc);
CT_VK_PUSH_MEMBER(RopePush, rope, os);
CT_VK_PUSH_SIZE(RopePush, rope_f16);
CT_VK_PUSH_SIZE(RopePush, rope_bf16);

void VulkanDevice::rope_kernel(const Tensor& out, const Tensor& x, const Tensor& cos,
                               const Tensor& sin, int64_t head_dim, int64_t rot_heads,
                               bool inverse) {
  const int64_t T = x.shape[1], W = x.shape[2], rows_all = x.shape[0] * T;
  if (rows_all == 0 || W == 0) return;
  const int64_t rows = std::max<int64_t>(1, max_elems(4) / W);
  Bound bc = bind(cos), bs = bind(sin);
  for (int64_t r0 = 0; r0 < rows_all; r0 += rows) {
    const int64_t nr = std::min(rows, rows_all - r0);
    Bound bo = bind(out, r0 * W, nr * W), bx = bind(x, r0 * W, nr * W);
    const int64_t n = nr * (W / 2);
    auto g = grid(n, 256);
    dispatch(h_variant(x.dtype, ShaderId::rope, ShaderId::rope_f16, ShaderId::rope_bf16),
             {bo, bx, bc, bs},
             RopePush{u32(n), u32(T), u32(W), u32(head_dim), u32(rot_heads), u32(r0 % T),
                      inverse ? -1.0f : 1.0f, bo.first, bx.first, bc.first, bs.first},
             g[0], g[1]);
  }
}

}  // namespace ct::vk
