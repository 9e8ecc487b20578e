// One fused AdamW step with optional global-norm clipping, and adamw_groups (its ranges one
// dispatch each, lr and bias corrections read from the schedule), each optionally storing the
// 16-bit copy of the parameters too (the _f16 / _bf16 variants). Shader: adamw.comp.
#include <cmath>

#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {

struct AdamWPush {
  uint32_t n, op, og, om, ov, onorm;
  float lr, beta1, beta2, eps, wd, bc1, bc2, max_norm;
  uint32_t oh;
};
CT_VK_PUSH_SIZE(AdamWPush, adamw);
CT_VK_PUSH_MEMBER(AdamWPush, adamw, n);
CT_VK_PUSH_MEMBER(AdamWPush, adamw, op);
CT_VK_PUSH_MEMBER(AdamWPush, adamw, og);
CT_VK_PUSH_MEMBER(AdamWPush, adamw, om);
CT_VK_PUSH_MEMBER(AdamWPush, adamw, ov);
CT_VK_PUSH_MEMBER(AdamWPush, adamw, onorm);
CT_VK_PUSH_MEMBER(AdamWPush, adamw, lr);
CT_VK_PUSH_MEMBER(AdamWPush, adamw, beta1);
CT_VK_PUSH_MEMBER(AdamWPush, adamw, beta2);
CT_VK_PUSH_MEMBER(AdamWPush, adamw, eps);
CT_VK_PUSH_MEMBER(AdamWPush, adamw, wd);
CT_VK_PUSH_MEMBER(AdamWPush, adamw, bc1);
CT_VK_PUSH_MEMBER(AdamWPush, adamw, bc2);
CT_VK_PUSH_MEMBER(AdamWPush, adamw, max_norm);
CT_VK_PUSH_MEMBER(AdamWPush, adamw, oh);

void VulkanDevice::adamw_kernel(const Tensor& param, const Tensor& grad, const Tensor& m,
                                const Tensor& v, const Tensor& grad_norm, const AdamWHyper& hp,
                                const Tensor& param16) {
  int64_t n = param.numel();
  bool clip = hp.max_grad_norm > 0.0f;
  double t = static_cast<double>(hp.step);
  float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(hp.beta1), t));
  float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(hp.beta2), t));
  Bound bn = clip ? bind(grad_norm) : Bound{};
  const bool copy = param16.defined();
  const ShaderId id =
      copy ? h_variant(param16.dtype, ShaderId::adamw, ShaderId::adamw_f16, ShaderId::adamw_bf16)
           : ShaderId::adamw;
  for_each_chunk(*this, n, 4, [&](int64_t s, int64_t c) {
    Bound bp = bind(param, s, c), bg = bind(grad, s, c), bm = bind(m, s, c), bv = bind(v, s, c);
    Bound bnorm = clip ? bn : bg;  // unread without clipping; any valid binding will do
    Bound bh = copy ? bind(param16, s, c) : Bound{};
    AdamWPush p{u32(c),
                bp.first,
                bg.first,
                bm.first,
                bv.first,
                clip ? bnorm.first : 0u,
                hp.lr,
                hp.beta1,
                hp.beta2,
                hp.eps,
                hp.weight_decay,
                bc1,
                bc2,
                clip ? hp.max_grad_norm : 0.0f,
                bh.first};
    auto g = grid(c, 256);
    if (copy)
      dispatch(id, {bp, bg, bm, bv, bnorm, bh}, p, g[0], g[1]);
    else
      dispatch(id, {bp, bg, bm, bv, bnorm}, p, g[0], g[1]);
  });
}

struct AdamWGroupsPush {
  uint32_t n, op, og, om, ov, onorm, osched;
  float beta1, beta2, eps, wd, max_norm;
  uint32_t oh;
};
CT_VK_PUSH_SIZE(AdamWGroupsPush, adamw_groups);
CT_VK_PUSH_MEMBER(AdamWGroupsPush, adamw_groups, n);
CT_VK_PUSH_MEMBER(AdamWGroupsPush, adamw_groups, op);
CT_VK_PUSH_MEMBER(AdamWGroupsPush, adamw_groups, og);
CT_VK_PUSH_MEMBER(AdamWGroupsPush, adamw_groups, om);
CT_VK_PUSH_MEMBER(AdamWGroupsPush, adamw_groups, ov);
CT_VK_PUSH_MEMBER(AdamWGroupsPush, adamw_groups, onorm);
CT_VK_PUSH_MEMBER(AdamWGroupsPush, adamw_groups, osched);
CT_VK_PUSH_MEMBER(AdamWGroupsPush, adamw_groups, beta1);
CT_VK_PUSH_MEMBER(AdamWGroupsPush, adamw_groups, beta2);
CT_VK_PUSH_MEMBER(AdamWGroupsPush, adamw_groups, eps);
CT_VK_PUSH_MEMBER(AdamWGroupsPush, adamw_groups, wd);
CT_VK_PUSH_MEMBER(AdamWGroupsPush, adamw_groups, max_norm);
CT_VK_PUSH_MEMBER(AdamWGroupsPush, adamw_groups, oh);

void VulkanDevice::adamw_groups_kernel(const Tensor& param, const Tensor& grad, const Tensor& m,
                                       const Tensor& v, const Tensor& grad_norm,
                                       const Tensor& schedule, const AdamWGroups& groups,
                                       const AdamWHyper& hp, const Tensor& param16) {
  const bool clip = hp.max_grad_norm > 0.0f;
  const Bound bn = clip ? bind(grad_norm) : Bound{}, bs = bind(schedule);
  const bool copy = param16.defined();
  const ShaderId id = copy ? h_variant(param16.dtype, ShaderId::adamw_groups,
                                       ShaderId::adamw_groups_f16, ShaderId::adamw_groups_bf16)
                           : ShaderId::adamw_groups;
  for (int r = 0; r < groups.count; ++r) {
    const AdamWGroups::Range& range = groups.ranges[r];
    for_each_chunk(*this, range.len, 4, [&](int64_t s, int64_t c) {
      const int64_t at = range.begin + s;
      Bound bp = bind(param, at, c), bg = bind(grad, at, c), bm = bind(m, at, c),
            bv = bind(v, at, c);
      Bound bnorm = clip ? bn : bg;  // unread without clipping; any valid binding will do
      Bound bh = copy ? bind(param16, at, c) : Bound{};
      AdamWGroupsPush p{u32(c),
                        bp.first,
                        bg.first,
                        bm.first,
                        bv.first,
                        clip ? bnorm.first : 0u,
                        bs.first,
                        hp.beta1,
                        hp.beta2,
                        hp.eps,
                        range.decay ? hp.weight_decay : 0.0f,
                        clip ? hp.max_grad_norm : 0.0f,
                        bh.first};
      auto g = grid(c, 256);
      if (copy)
        dispatch(id, {bp, bg, bm, bv, bnorm, bs, bh}, p, g[0], g[1]);
      else
        dispatch(id, {bp, bg, bm, bv, bnorm, bs}, p, g[0], g[1]);
    });
  }
}

}  // namespace ct::vk
