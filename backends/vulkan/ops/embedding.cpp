// Token + position embedding, forward and deterministic backward. Shader: embedding.comp.
// wte is processed in vocabulary chunks that fit one binding (GPT-2's 50257 x 768 f32 table is
// larger than lavapipe's 128 MiB maxStorageBufferRange).
#include "backends/vulkan/ops/op_util.h"

namespace ct::vk {

struct EmbFwdPush {
  uint32_t n, T, C, v0, vc, oo, otok, owte, owpe, haswpe;
};
CT_VK_PUSH_SIZE(EmbFwdPush, embedding_fwd);
CT_VK_PUSH_MEMBER(EmbFwdPush, embedding_fwd, n);
CT_VK_PUSH_MEMBER(EmbFwdPush, embedding_fwd, T);
CT_VK_PUSH_MEMBER(EmbFwdPush, embedding_fwd, C);
CT_VK_PUSH_MEMBER(EmbFwdPush, embedding_fwd, v0);
CT_VK_PUSH_MEMBER(EmbFwdPush, embedding_fwd, vc);
CT_VK_PUSH_MEMBER(EmbFwdPush, embedding_fwd, oo);
CT_VK_PUSH_MEMBER(EmbFwdPush, embedding_fwd, otok);
CT_VK_PUSH_MEMBER(EmbFwdPush, embedding_fwd, owte);
CT_VK_PUSH_MEMBER(EmbFwdPush, embedding_fwd, owpe);
CT_VK_PUSH_MEMBER(EmbFwdPush, embedding_fwd, haswpe);
CT_VK_PUSH_SIZE(EmbFwdPush, embedding_fwd_f16);
CT_VK_PUSH_SIZE(EmbFwdPush, embedding_fwd_bf16);

struct EmbChainPush {
  uint32_t BT, otok, olink;
};
CT_VK_PUSH_SIZE(EmbChainPush, embedding_chain);
CT_VK_PUSH_MEMBER(EmbChainPush, embedding_chain, BT);
CT_VK_PUSH_MEMBER(EmbChainPush, embedding_chain, otok);
CT_VK_PUSH_MEMBER(EmbChainPush, embedding_chain, olink);

struct EmbWtePush {
  uint32_t n, C, v0, vc, odw, odo, otok, olink;
};
CT_VK_PUSH_SIZE(EmbWtePush, embedding_bwd_wte);
CT_VK_PUSH_MEMBER(EmbWtePush, embedding_bwd_wte, n);
CT_VK_PUSH_MEMBER(EmbWtePush, embedding_bwd_wte, C);
CT_VK_PUSH_MEMBER(EmbWtePush, embedding_bwd_wte, v0);
CT_VK_PUSH_MEMBER(EmbWtePush, embedding_bwd_wte, vc);
CT_VK_PUSH_MEMBER(EmbWtePush, embedding_bwd_wte, odw);
CT_VK_PUSH_MEMBER(EmbWtePush, embedding_bwd_wte, odo);
CT_VK_PUSH_MEMBER(EmbWtePush, embedding_bwd_wte, otok);
CT_VK_PUSH_MEMBER(EmbWtePush, embedding_bwd_wte, olink);

struct EmbWpePush {
  uint32_t n, B, T, C, odw, odo;
};
CT_VK_PUSH_SIZE(EmbWpePush, embedding_bwd_wpe);
CT_VK_PUSH_MEMBER(EmbWpePush, embedding_bwd_wpe, n);
CT_VK_PUSH_MEMBER(EmbWpePush, embedding_bwd_wpe, B);
CT_VK_PUSH_MEMBER(EmbWpePush, embedding_bwd_wpe, T);
CT_VK_PUSH_MEMBER(EmbWpePush, embedding_bwd_wpe, C);
CT_VK_PUSH_MEMBER(EmbWpePush, embedding_bwd_wpe, odw);
CT_VK_PUSH_MEMBER(EmbWpePush, embedding_bwd_wpe, odo);

namespace {
struct EmbShape {
  int64_t B, T, C, V;
};
// out (or dout) [B,T,C], wte [V,C]: checked by core/op_checks.cpp.
EmbShape dims(const Tensor& out, const Tensor& wte) {
  return {out.shape[0], out.shape[1], out.shape[2], wte.shape[0]};
}
}  // namespace

void VulkanDevice::embedding_forward_kernel(const Tensor& out, const Tensor& tokens,
                                            const Tensor& wte, const Tensor& wpe) {
  EmbShape s = dims(out, wte);
  int64_t n = s.B * s.T * s.C;
  if (n == 0) return;
  int64_t rows = std::max<int64_t>(1, max_elems(dtype_size(wte.dtype)) / s.C);
  // No position table: binding 3 gets a table it does not read (wte's first row).
  const bool pos = wpe.defined();
  Bound bo = bind(out), bt = bind(tokens), bp = pos ? bind(wpe, 0, s.T * s.C) : bind(wte, 0, s.C);
  auto g = grid(n, 256);
  const ShaderId id = h_variant(wte.dtype, ShaderId::embedding_fwd, ShaderId::embedding_fwd_f16,
                                ShaderId::embedding_fwd_bf16);
  for (int64_t v0 = 0; v0 < s.V; v0 += rows) {
    int64_t vc = std::min(rows, s.V - v0);
    Bound bw = bind(wte, v0 * s.C, vc * s.C);
    dispatch(id, {bo, bt, bw, bp},
             EmbFwdPush{u32(n), u32(s.T), u32(s.C), u32(v0), u32(vc), bo.first, bt.first, bw.first,
                        bp.first, pos ? 1u : 0u},
             g[0], g[1]);
  }
}

void VulkanDevice::embedding_backward_kernel(const Tensor& dwte, const Tensor& dwpe,
                                             const Tensor& dout, const Tensor& tokens) {
  EmbShape s = dims(dout, dwte);
  int64_t BT = s.B * s.T, n = BT * s.C;
  if (n == 0) return;
  // Per position: is it its token's first occurrence, and where the token occurs next. Each
  // dwte row is then summed by one invocation per channel walking that chain in (b,t) order.
  Tensor link = workspace({2 * BT}, DType::i32);
  Bound bl = bind(link), bt = bind(tokens), bd = bind(dout);
  auto gc = grid(BT, 256);
  dispatch(ShaderId::embedding_chain, {bl, bt}, EmbChainPush{u32(BT), bt.first, bl.first}, gc[0],
           gc[1]);
  int64_t rows = std::max<int64_t>(1, max_elems(4) / s.C);
  auto g = grid(n, 256);
  for (int64_t v0 = 0; v0 < s.V; v0 += rows) {
    int64_t vc = std::min(rows, s.V - v0);
    Bound bw = bind(dwte, v0 * s.C, vc * s.C);
    dispatch(ShaderId::embedding_bwd_wte, {bw, bd, bt, bl},
             EmbWtePush{u32(n), u32(s.C), u32(v0), u32(vc), bw.first, bd.first, bt.first, bl.first},
             g[0], g[1]);
  }
  if (!dwpe.defined()) return;  // no position table
  Bound bp = bind(dwpe, 0, s.T * s.C);
  auto gp = grid(s.T * s.C, 256);
  dispatch(ShaderId::embedding_bwd_wpe, {bp, bd},
           EmbWpePush{u32(s.T * s.C), u32(s.B), u32(s.T), u32(s.C), bp.first, bd.first}, gp[0],
           gp[1]);
}

}  // namespace ct::vk
