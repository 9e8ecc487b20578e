// Llama forward, one banner section per layer (as GPT-2's, core/model/gpt2_forward.cpp). The
// residual stream, RMSNorm statistics and losses are f32; "h" is policy.activations.
#include <algorithm>

#include "core/error.h"
#include "core/model/gpt2_internal.h"
#include "core/model/llama.h"

namespace ct {

using gpt2_detail::view;

// =============================================================================================
// One decoder layer

Llama::NormSite Llama::input_norm(int l, int64_t BT) const {
  const int64_t C = config_.n_embd;
  if (l == config_.n_layer)
    return {view(lnf_, {BT, C}), view(lnf_rstd_, {BT}), param("model.norm.weight")};
  const LayerActs& a = acts(l);
  return {view(a.ln1, {BT, C}), view(a.ln1_rstd, {BT}), forward_params(l).ln1w};
}

void Llama::block_forward(int l, int B, int T, bool recompute, int kv_pos) {
  const int64_t C = config_.n_embd, NH = config_.n_head, NKV = config_.n_kv_head;
  const int64_t W = config_.qkv_width(), F = config_.intermediate_size, hd = config_.head_dim();
  const int64_t BT = int64_t{B} * T;
  const float eps = config_.rms_norm_eps;
  const LayerParams p = forward_params(l);
  const LayerActs& a = acts(l);
  Tensor residual = view(residuals_[static_cast<size_t>(l)], {BT, C});  // (B,T,C) layer input

  // ---- input RMSNorm ---------------------------------------------------------------------------
  // ln1 (B,T,C) h = RMSNorm(residual) * input_layernorm.w; after layer 0, the previous layer
  // computed it with its residual add, unless this is a recomputation
  Tensor ln1 = view(a.ln1, {BT, C});
  if (l == 0 || recompute)
    device_.rmsnorm_forward(ln1, view(a.ln1_rstd, {BT}), residual, p.ln1w, eps);

  // ---- attention -------------------------------------------------------------------------------
  // qkv (B,T,W) h = ln1 @ [q_proj; k_proj; v_proj]^T (+ biases): NH query heads, then NKV key
  // and NKV value heads of hd (forward_cached: into the cache's rows)
  const bool cached = kv_pos >= 0;
  const int64_t pos = cached ? kv_pos : 0;
  Tensor qkv = cached ? kv_rows(l, kv_pos, T) : view(a.qkv, {BT, W});
  device_.matmul(qkv, ln1, p.qkvw, false, true, 1.0f, 0.0f, p.qkvb.defined() ? &p.qkvb : nullptr);
  lora_forward(l, 0, 3, qkv, ln1);  // q_proj, k_proj, v_proj adapters, before the rotation
  // q and k rotated in place by position pos..pos+T-1 (rotate-half); v untouched
  Tensor qkv3 = qkv.reshape({B, T, W});
  const Tensor cs = rope_cos_.slice_flat(pos * hd / 2, {T, hd / 2}),
               sn = rope_sin_.slice_flat(pos * hd / 2, {T, hd / 2});
  device_.rope_forward(qkv3, qkv3, cs, sn, hd, NH + NKV);
  // atty (B,T,C) h = causal softmax(q k^T / sqrt(hd)) v, query head h reading kv head
  // h / (NH / NKV); saved: lse (B,NH,T) f32 when fused, the probabilities att otherwise.
  // forward_cached: the new rows' attention over every cached row of the sequence (B = 1)
  Tensor atty = block_attention(l, qkv3, a.atty, a.lse, a.att, kv_pos);
  // proj (B,T,C) h = atty @ o_proj^T
  Tensor proj = view(proj_, {BT, C});
  device_.matmul(proj, atty.reshape({BT, C}), p.ow, false, true);
  lora_forward(l, 3, 1, proj, atty.reshape({BT, C}));

  // ---- residual and post-attention RMSNorm -----------------------------------------------------
  // residual2 (B,T,C) f32 = residual + proj;  ln2 (B,T,C) h = RMSNorm(residual2) * w
  Tensor residual2 = view(a.residual2, {BT, C});
  Tensor ln2 = view(a.ln2, {BT, C});
  device_.residual_rmsnorm_forward(residual2, ln2, view(a.ln2_rstd, {BT}), residual, proj, p.ln2w,
                                   eps);

  // ---- SwiGLU MLP ------------------------------------------------------------------------------
  // gu (B,T,2F) h = ln2 @ [gate_proj; up_proj]^T;  act (B,T,F) h = silu(gate) * up
  Tensor gu = view(a.gu, {BT, 2 * F});
  device_.matmul(gu, ln2, p.guw, false, true);
  lora_forward(l, 4, 2, gu, ln2);
  Tensor act = view(a.act, {BT, F});
  device_.swiglu_forward(act, gu);
  // The recomputation inside backward stops here: backward does not read the block's output.
  if (recompute) return;
  // proj (B,T,C) h = act @ down_proj^T;  residual3 (B,T,C) f32 = residual2 + proj, the next
  // layer's input, and the RMSNorm that reads it: the next layer's ln1, or model.norm after the
  // last layer
  device_.matmul(proj, act, p.downw, false, true);
  lora_forward(l, 6, 1, proj, act);
  Tensor residual3 = view(residuals_[static_cast<size_t>(l) + 1], {BT, C});
  const NormSite next = input_norm(l + 1, BT);
  device_.residual_rmsnorm_forward(residual3, next.out, next.rstd, residual2, proj, next.w, eps);
}

// =============================================================================================
// The ends of the network (ModelBase::forward runs them around the blocks)

void Llama::embed(const Tensor& x, const Tensor& tokens, int /*pos*/) {
  device_.embedding_forward(x, tokens, param("model.embed_tokens.weight"));
}

Llama::NetShape Llama::net_shape() const {
  return {config_.n_layer,   config_.qkv_width(), config_.n_embd,           config_.n_head,
          config_.n_kv_head, config_.block_size,  "max_position_embeddings"};
}

}  // namespace ct
