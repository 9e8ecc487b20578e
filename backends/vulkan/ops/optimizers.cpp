// The fused low-memory optimizer steps of core/device.h: SGD, Lion, block-wise 8-bit AdamW and
// Adafactor. Shaders: sgd.comp, lion.comp, adamw_8bit.comp, adafactor.comp. fp32 arithmetic,
// no atomics; tensors beyond maxStorageBufferRange run in chunks (8-bit AdamW's on block
// boundaries).
#include <cmath>

#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {

struct SgdPush {
  uint32_t n, op, og, ob, onorm, has_buf, first_step, nesterov;
  float lr, momentum, dampening, wd, max_norm;
};
CT_VK_PUSH_SIZE(SgdPush, sgd);
CT_VK_PUSH_MEMBER(SgdPush, sgd, n);
CT_VK_PUSH_MEMBER(SgdPush, sgd, op);
CT_VK_PUSH_MEMBER(SgdPush, sgd, og);
CT_VK_PUSH_MEMBER(SgdPush, sgd, ob);
CT_VK_PUSH_MEMBER(SgdPush, sgd, onorm);
CT_VK_PUSH_MEMBER(SgdPush, sgd, has_buf);
CT_VK_PUSH_MEMBER(SgdPush, sgd, first_step);
CT_VK_PUSH_MEMBER(SgdPush, sgd, nesterov);
CT_VK_PUSH_MEMBER(SgdPush, sgd, lr);
CT_VK_PUSH_MEMBER(SgdPush, sgd, momentum);
CT_VK_PUSH_MEMBER(SgdPush, sgd, dampening);
CT_VK_PUSH_MEMBER(SgdPush, sgd, wd);
CT_VK_PUSH_MEMBER(SgdPush, sgd, max_norm);

struct LionPush {
  uint32_t n, op, og, om, onorm;
  float lr, beta1, beta2, wd, max_norm;
};
CT_VK_PUSH_SIZE(LionPush, lion);
CT_VK_PUSH_MEMBER(LionPush, lion, n);
CT_VK_PUSH_MEMBER(LionPush, lion, op);
CT_VK_PUSH_MEMBER(LionPush, lion, og);
CT_VK_PUSH_MEMBER(LionPush, lion, om);
CT_VK_PUSH_MEMBER(LionPush, lion, onorm);
CT_VK_PUSH_MEMBER(LionPush, lion, lr);
CT_VK_PUSH_MEMBER(LionPush, lion, beta1);
CT_VK_PUSH_MEMBER(LionPush, lion, beta2);
CT_VK_PUSH_MEMBER(LionPush, lion, wd);
CT_VK_PUSH_MEMBER(LionPush, lion, max_norm);

struct AdamW8Push {
  uint32_t n, op, og, omq, ovq, oma, ova, oqs, oqu, onorm;
  float lr, beta1, beta2, eps, wd, bc1, bc2, max_norm;
};
CT_VK_PUSH_SIZE(AdamW8Push, adamw_8bit);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, n);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, op);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, og);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, omq);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, ovq);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, oma);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, ova);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, oqs);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, oqu);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, onorm);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, lr);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, beta1);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, beta2);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, eps);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, wd);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, bc1);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, bc2);
CT_VK_PUSH_MEMBER(AdamW8Push, adamw_8bit, max_norm);

struct AdafactorPush {
  uint32_t n, R, C, s0, nparts, o0, o1, o2, o3, o4, onorm, flags;
  float b2t, eps1, max_norm, rho, eps2, clip_threshold, beta1, wd, inv_sqrt_n;
};
#define CT_AF_PUSH(v)                                  \
  CT_VK_PUSH_SIZE(AdafactorPush, v);                   \
  CT_VK_PUSH_MEMBER(AdafactorPush, v, n);              \
  CT_VK_PUSH_MEMBER(AdafactorPush, v, R);              \
  CT_VK_PUSH_MEMBER(AdafactorPush, v, C);              \
  CT_VK_PUSH_MEMBER(AdafactorPush, v, s0);             \
  CT_VK_PUSH_MEMBER(AdafactorPush, v, nparts);         \
  CT_VK_PUSH_MEMBER(AdafactorPush, v, o0);             \
  CT_VK_PUSH_MEMBER(AdafactorPush, v, o4);             \
  CT_VK_PUSH_MEMBER(AdafactorPush, v, onorm);          \
  CT_VK_PUSH_MEMBER(AdafactorPush, v, flags);          \
  CT_VK_PUSH_MEMBER(AdafactorPush, v, b2t);            \
  CT_VK_PUSH_MEMBER(AdafactorPush, v, clip_threshold); \
  CT_VK_PUSH_MEMBER(AdafactorPush, v, inv_sqrt_n)
CT_AF_PUSH(adafactor_row);
CT_AF_PUSH(adafactor_colp);
CT_AF_PUSH(adafactor_col);
CT_AF_PUSH(adafactor_u);
CT_AF_PUSH(adafactor_apply);
#undef CT_AF_PUSH

void VulkanDevice::sgd_kernel(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                              const Tensor& grad_norm, const SgdHyper& hp) {
  int64_t n = param.numel();
  bool has_buf = hp.momentum != 0.0f;
  bool clip = hp.max_grad_norm > 0.0f;
  Bound bn = clip ? bind(grad_norm) : Bound{};
  for_each_chunk(*this, n, 4, [&](int64_t s, int64_t c) {
    Bound bp = bind(param, s, c), bg = bind(grad, s, c);
    Bound bb = has_buf ? bind(momentum_buf, s, c) : bp;  // unused without momentum
    Bound bnorm = clip ? bn : bg;                        // unread without clipping
    SgdPush p{u32(c),
              bp.first,
              bg.first,
              bb.first,
              clip ? bnorm.first : 0u,
              has_buf ? 1u : 0u,
              hp.step == 1 ? 1u : 0u,
              hp.nesterov ? 1u : 0u,
              hp.lr,
              hp.momentum,
              hp.dampening,
              hp.weight_decay,
              clip ? hp.max_grad_norm : 0.0f};
    auto g = grid(c, 256);
    dispatch(ShaderId::sgd, {bp, bg, bb, bnorm}, p, g[0], g[1]);
  });
}

void VulkanDevice::lion_kernel(const Tensor& param, const Tensor& grad, const Tensor& m,
                               const Tensor& grad_norm, const LionHyper& hp) {
  int64_t n = param.numel();
  bool clip = hp.max_grad_norm > 0.0f;
  Bound bn = clip ? bind(grad_norm) : Bound{};
  for_each_chunk(*this, n, 4, [&](int64_t s, int64_t c) {
    Bound bp = bind(param, s, c), bg = bind(grad, s, c), bm = bind(m, s, c);
    Bound bnorm = clip ? bn : bg;
    LionPush p{u32(c), bp.first, bg.first, bm.first,        clip ? bnorm.first : 0u,
               hp.lr,  hp.beta1, hp.beta2, hp.weight_decay, clip ? hp.max_grad_norm : 0.0f};
    auto g = grid(c, 256);
    dispatch(ShaderId::lion, {bp, bg, bm, bnorm}, p, g[0], g[1]);
  });
}

void VulkanDevice::adamw_8bit_kernel(const Tensor& param, const Tensor& grad, const Tensor& m_q,
                                     const Tensor& v_q, const Tensor& m_absmax,
                                     const Tensor& v_absmax, const Tensor& qmap_signed,
                                     const Tensor& qmap_unsigned, const Tensor& grad_norm,
                                     const AdamWHyper& hp) {
  int64_t n = param.numel();
  if (n == 0) return;
  if (!supports(OpKind::kAdamW8bit, DType::f32))
    fail(ErrorKind::kUnsupported, "adamw_8bit: this Vulkan device lacks 8-bit storage");
  bool clip = hp.max_grad_norm > 0.0f;
  double t = static_cast<double>(hp.step);
  float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(hp.beta1), t));
  float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(hp.beta2), t));
  Bound bn = clip ? bind(grad_norm) : Bound{};
  Bound bqs = bind(qmap_signed), bqu = bind(qmap_unsigned);
  // Chunks of whole blocks, each f32 binding within maxStorageBufferRange.
  int64_t chunk = max_elems(4) / kQuantBlockSize * kQuantBlockSize;
  CT_CHECK(chunk > 0, "adamw_8bit: maxStorageBufferRange below one block");
  for (int64_t s = 0; s < n; s += chunk) {
    int64_t c = std::min(chunk, n - s), b0 = s / kQuantBlockSize, bc = quant_blocks(c);
    Bound bp = bind(param, s, c), bg = bind(grad, s, c), bmq = bind(m_q, s, c),
          bvq = bind(v_q, s, c), bma = bind(m_absmax, b0, bc), bva = bind(v_absmax, b0, bc);
    Bound bnorm = clip ? bn : bg;
    AdamW8Push p{u32(c),
                 bp.first,
                 bg.first,
                 bmq.first,
                 bvq.first,
                 bma.first,
                 bva.first,
                 bqs.first,
                 bqu.first,
                 clip ? bnorm.first : 0u,
                 hp.lr,
                 hp.beta1,
                 hp.beta2,
                 hp.eps,
                 hp.weight_decay,
                 bc1,
                 bc2,
                 clip ? hp.max_grad_norm : 0.0f};
    auto g = grid(static_cast<uint64_t>(bc) * kQuantBlockSize, kQuantBlockSize);
    dispatch(ShaderId::adamw_8bit, {bp, bg, bmq, bvq, bma, bva, bqs, bqu, bnorm}, p, g[0], g[1]);
  }
}

void VulkanDevice::adafactor_kernel(const Tensor& param, const Tensor& grad, const Tensor& row,
                                    const Tensor& col, const Tensor& v, const Tensor& exp_avg,
                                    const Tensor& grad_norm, const AdafactorHyper& hp) {
  const int64_t n = param.numel();
  const bool factored = param.ndim() >= 2;
  const int64_t C = factored ? param.shape[-1] : n, R = n / C;
  const bool ea = hp.beta1 > 0.0f;
  const bool clip = hp.max_grad_norm > 0.0f;

  const double t = static_cast<double>(hp.step);
  double rho = hp.lr;
  if (hp.relative_step) rho = std::min(hp.warmup_init ? 1e-6 * t : 1e-2, 1.0 / std::sqrt(t));
  AdafactorPush base{};
  base.R = u32(R), base.C = u32(C);
  base.flags = (factored ? 1u : 0u) | (ea ? 2u : 0u) | (hp.scale_parameter ? 4u : 0u);
  base.b2t = static_cast<float>(1.0 - std::pow(t, static_cast<double>(hp.decay_rate)));
  base.eps1 = hp.eps1, base.max_norm = clip ? hp.max_grad_norm : 0.0f;
  base.rho = static_cast<float>(rho), base.eps2 = hp.eps2;
  base.clip_threshold = hp.clip_threshold, base.beta1 = hp.beta1, base.wd = hp.weight_decay;
  base.inv_sqrt_n = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  Bound bn = clip ? bind(grad_norm) : Bound{};
  auto norm_or = [&](const Bound& fallback) { return clip ? bn : fallback; };
  if (clip) base.onorm = bn.first;

  // RMS(param) before the step (reduce.comp: deterministic).
  Tensor pnorm = workspace({1}, DType::f32);
  if (hp.scale_parameter) norm(pnorm, param);

  Tensor rowsum;
  if (factored) {
    CT_REQUIRE(C <= max_elems(4), "adafactor: rows of " + std::to_string(C) +
                                      " elements exceed one storage-buffer binding");
    const int64_t rpc = std::min<int64_t>(R, max_elems(4) / C);  // rows per chunk
    const int64_t nparts = (R + rpc - 1) / rpc;
    Tensor part = workspace({nparts * C}, DType::f32);
    CT_REQUIRE(nparts * C <= max_elems(4), "adafactor: column partials exceed one binding");
    Bound bpart = bind(part);
    for (int64_t k = 0; k < nparts; ++k) {
      const int64_t r0 = k * rpc, rows = std::min(rpc, R - r0);
      Bound bg = bind(grad, r0 * C, rows * C), br = bind(row, r0, rows);
      AdafactorPush p = base;
      p.n = u32(rows), p.o0 = bg.first, p.o1 = br.first;
      auto g = grid(static_cast<uint64_t>(rows) * 256, 256);
      dispatch(ShaderId::adafactor_row, {norm_or(bg), bg, br}, p, g[0], g[1]);
      p.o1 = u32(bpart.first + k * C);
      g = grid(C, 256);
      dispatch(ShaderId::adafactor_colp, {norm_or(bg), bg, bpart}, p, g[0], g[1]);
    }
    Bound bc = bind(col);
    AdafactorPush p = base;
    p.nparts = u32(nparts), p.o0 = bpart.first, p.o1 = bc.first;
    auto g = grid(C, 256);
    dispatch(ShaderId::adafactor_col, {norm_or(bpart), bpart, bc}, p, g[0], g[1]);
    rowsum = workspace({1}, DType::f32);
    sum(rowsum, row, 1.0f);
  }

  Tensor u = workspace({n}, DType::f32);
  Bound brow = factored ? bind(row) : Bound{}, bcol = factored ? bind(col) : Bound{};
  Bound brs = factored ? bind(rowsum) : Bound{};
  for_each_chunk(*this, n, 4, [&](int64_t s, int64_t c) {
    Bound bg = bind(grad, s, c), bu = bind(u, s, c);
    Bound bv = factored ? brow : bind(v, s, c);
    Bound bcl = factored ? bcol : bg, bs = factored ? brs : bg;  // unread when not factored
    AdafactorPush p = base;
    p.n = u32(c), p.s0 = u32(s), p.o0 = bg.first, p.o1 = bv.first, p.o2 = bcl.first;
    p.o3 = bs.first, p.o4 = bu.first;
    auto g = grid(c, 256);
    dispatch(ShaderId::adafactor_u, {norm_or(bg), bg, bv, bcl, bs, bu}, p, g[0], g[1]);
  });
  Tensor unorm = workspace({1}, DType::f32);
  norm(unorm, u);
  Bound bun = bind(unorm), bpn = bind(pnorm);
  for_each_chunk(*this, n, 4, [&](int64_t s, int64_t c) {
    Bound bp = bind(param, s, c), bu = bind(u, s, c);
    Bound be = ea ? bind(exp_avg, s, c) : bp;  // unused without beta1
    AdafactorPush p = base;
    p.n = u32(c), p.o0 = bp.first, p.o1 = bu.first, p.o2 = be.first, p.o3 = bun.first;
    p.o4 = bpn.first;
    auto g = grid(c, 256);
    dispatch(ShaderId::adafactor_apply, {norm_or(bu), bp, bu, be, bun, bpn}, p, g[0], g[1]);
  });
}

}  // namespace ct::vk
