// Fused log-softmax + NLL forward and backward, fp32 arithmetic; logits (and dlogits, the same
// dtype) may be f16/bf16, losses are f32. Shader: crossentropy.comp.
#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {

struct CrossEntropyPush {
  uint32_t N, V;
  float dloss;
  uint32_t oo, ox, ot;
};
CT_VK_PUSH_SIZE(CrossEntropyPush, crossentropy_fwd);
CT_VK_PUSH_MEMBER(CrossEntropyPush, crossentropy_fwd, N);
CT_VK_PUSH_MEMBER(CrossEntropyPush, crossentropy_fwd, V);
CT_VK_PUSH_MEMBER(CrossEntropyPush, crossentropy_fwd, dloss);
CT_VK_PUSH_MEMBER(CrossEntropyPush, crossentropy_fwd, oo);
CT_VK_PUSH_MEMBER(CrossEntropyPush, crossentropy_fwd, ox);
CT_VK_PUSH_MEMBER(CrossEntropyPush, crossentropy_fwd, ot);
static_assert(refl::crossentropy_bwd::kPushSize == refl::crossentropy_fwd::kPushSize);
CT_VK_PUSH_SIZE(CrossEntropyPush, crossentropy_fwd_f16);
CT_VK_PUSH_SIZE(CrossEntropyPush, crossentropy_fwd_bf16);
CT_VK_PUSH_SIZE(CrossEntropyPush, crossentropy_bwd_f16);
CT_VK_PUSH_SIZE(CrossEntropyPush, crossentropy_bwd_bf16);

namespace {
std::pair<int64_t, int64_t> check_ce(const VulkanDevice& dev, const char* op, const Tensor& logits,
                                     const Tensor& targets) {
  require_flt(dev, logits, OpKind::kCrossEntropy, op, "logits");
  require_dtype(targets, DType::i32, op, "targets");
  CT_REQUIRE(logits.ndim() >= 2, std::string(op) + ": logits must be [N, V]");
  int64_t V = logits.shape[-1], N = logits.numel() / std::max<int64_t>(V, 1);
  require_numel(targets, N, op, "targets");
  return {N, V};
}
}  // namespace

void VulkanDevice::crossentropy_forward(const Tensor& losses, const Tensor& logits,
                                        const Tensor& targets) {
  auto [N, V] = check_ce(*this, "crossentropy_forward", logits, targets);
  require_f32(losses, "crossentropy_forward", "losses");
  require_numel(losses, N, "crossentropy_forward", "losses");
  int64_t rows = std::max<int64_t>(1, max_elems(4) / V);
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    int64_t nr = std::min(rows, N - r0);
    Bound bl = bind(losses, r0, nr), bx = bind(logits, r0 * V, nr * V), bt = bind(targets, r0, nr);
    auto g = grid(nr, 1);
    dispatch(h_variant(logits.dtype, ShaderId::crossentropy_fwd, ShaderId::crossentropy_fwd_f16,
                       ShaderId::crossentropy_fwd_bf16),
             {bl, bx, bt},
             CrossEntropyPush{u32(nr), u32(V), 0.0f, bl.first, bx.first, bt.first}, g[0], g[1]);
  }
}

void VulkanDevice::crossentropy_backward(const Tensor& dlogits, const Tensor& logits,
                                         const Tensor& targets, float dloss) {
  auto [N, V] = check_ce(*this, "crossentropy_backward", logits, targets);
  require_flt(*this, dlogits, OpKind::kCrossEntropy, "crossentropy_backward", "dlogits");
  require_same_dtype(dlogits, logits, "crossentropy_backward", "dlogits", "logits");
  require_numel(dlogits, N * V, "crossentropy_backward", "dlogits");
  int64_t rows = std::max<int64_t>(1, max_elems(4) / V);
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    int64_t nr = std::min(rows, N - r0);
    // dlogits may be logits itself: each element is read before its own invocation writes it.
    Bound bd = bind(dlogits, r0 * V, nr * V), bx = bind(logits, r0 * V, nr * V),
          bt = bind(targets, r0, nr);
    auto g = grid(nr, 1);
    dispatch(h_variant(logits.dtype, ShaderId::crossentropy_bwd, ShaderId::crossentropy_bwd_f16,
                       ShaderId::crossentropy_bwd_bf16),
             {bd, bx, bt},
             CrossEntropyPush{u32(nr), u32(V), dloss, bd.first, bx.first, bt.first}, g[0], g[1]);
  }
}

}  // namespace ct::vk
