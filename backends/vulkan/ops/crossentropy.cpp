// Fused log-softmax + NLL forward and backward, and both in one pass in place (the training
// step's), fp32 arithmetic; logits (and dlogits, the same dtype) may be f16/bf16, losses are
// f32; rows of Vp elements, V classes then padding (valid < Vp: a push constant, the same
// pipelines). Shader: crossentropy.comp.
#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {

struct CrossEntropyPush {
  uint32_t N, V, Vp;
  float dloss;
  uint32_t oo, ox, ot;
};
CT_VK_PUSH_SIZE(CrossEntropyPush, crossentropy_fwd);
CT_VK_PUSH_MEMBER(CrossEntropyPush, crossentropy_fwd, N);
CT_VK_PUSH_MEMBER(CrossEntropyPush, crossentropy_fwd, V);
CT_VK_PUSH_MEMBER(CrossEntropyPush, crossentropy_fwd, Vp);
CT_VK_PUSH_MEMBER(CrossEntropyPush, crossentropy_fwd, dloss);
CT_VK_PUSH_MEMBER(CrossEntropyPush, crossentropy_fwd, oo);
CT_VK_PUSH_MEMBER(CrossEntropyPush, crossentropy_fwd, ox);
CT_VK_PUSH_MEMBER(CrossEntropyPush, crossentropy_fwd, ot);
static_assert(refl::crossentropy_bwd::kPushSize == refl::crossentropy_fwd::kPushSize);
CT_VK_PUSH_SIZE(CrossEntropyPush, crossentropy_fwd_f16);
CT_VK_PUSH_SIZE(CrossEntropyPush, crossentropy_fwd_bf16);
CT_VK_PUSH_SIZE(CrossEntropyPush, crossentropy_bwd_f16);
CT_VK_PUSH_SIZE(CrossEntropyPush, crossentropy_bwd_bf16);
CT_VK_PUSH_SIZE(CrossEntropyPush, crossentropy_fused);
CT_VK_PUSH_SIZE(CrossEntropyPush, crossentropy_fused_f16);
CT_VK_PUSH_SIZE(CrossEntropyPush, crossentropy_fused_bf16);

namespace {
// Rows N and row length Vp of logits [N,Vp], or of [Vp] as one row (core/device.h).
std::pair<int64_t, int64_t> rows_of(const Tensor& logits) {
  int64_t Vp = logits.shape[-1];
  return {logits.numel() / std::max<int64_t>(Vp, 1), Vp};
}
}  // namespace

void VulkanDevice::crossentropy_rows(ShaderId id, const Tensor& out, bool out_rows_of_vp,
                                     const Tensor& logits, const Tensor& targets, int64_t valid,
                                     float dloss) {
  auto [N, Vp] = rows_of(logits);
  int64_t rows = std::max<int64_t>(1, max_elems(4) / Vp);
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    int64_t nr = std::min(rows, N - r0);
    // out may be logits itself (dlogits in place): each element is read before its own
    // invocation writes it.
    Bound bo = out_rows_of_vp ? bind(out, r0 * Vp, nr * Vp) : bind(out, r0, nr);
    Bound bx = bind(logits, r0 * Vp, nr * Vp), bt = bind(targets, r0, nr);
    // VEC: 16-byte chunks of 8 elements (crossentropy.comp), when every row of the logits (and
    // of the gradient, where it is a tensor of its own) starts 16-byte aligned in its binding.
    const size_t esize = dtype_size(logits.dtype);
    auto rows_aligned = [&](const Bound& b) {
      return b.offset % 16 == 0 && (b.first * esize) % 16 == 0 && Vp % 8 == 0 &&
             (Vp * static_cast<int64_t>(esize)) % 16 == 0;
    };
    PipelineSpec spec;
    spec.n = 1;
    spec.v[0] = rows_aligned(bx) && (!out_rows_of_vp || rows_aligned(bo)) ? 1u : 0u;
    auto g = grid(nr, 1);
    dispatch(id, &spec, {bo, bx, bt},
             CrossEntropyPush{u32(nr), u32(valid), u32(Vp), dloss, bo.first, bx.first, bt.first},
             g[0], g[1]);
  }
}

void VulkanDevice::crossentropy_forward_kernel(const Tensor& losses, const Tensor& logits,
                                               const Tensor& targets, int64_t valid) {
  crossentropy_rows(h_variant(logits.dtype, ShaderId::crossentropy_fwd,
                              ShaderId::crossentropy_fwd_f16, ShaderId::crossentropy_fwd_bf16),
                    losses, false, logits, targets, valid, 0.0f);
}

void VulkanDevice::crossentropy_backward_kernel(const Tensor& dlogits, const Tensor& logits,
                                                const Tensor& targets, int64_t valid, float dloss) {
  crossentropy_rows(h_variant(logits.dtype, ShaderId::crossentropy_bwd,
                              ShaderId::crossentropy_bwd_f16, ShaderId::crossentropy_bwd_bf16),
                    dlogits, true, logits, targets, valid, dloss);
}

void VulkanDevice::crossentropy_forward_backward_kernel(const Tensor& losses, const Tensor& logits,
                                                        const Tensor& targets, int64_t valid,
                                                        float dloss) {
  crossentropy_rows(h_variant(logits.dtype, ShaderId::crossentropy_fused,
                              ShaderId::crossentropy_fused_f16, ShaderId::crossentropy_fused_bf16),
                    losses, false, logits, targets, valid, dloss);
}

}  // namespace ct::vk
