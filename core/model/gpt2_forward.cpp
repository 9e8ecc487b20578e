// GPT-2 forward, one banner section per layer, in the style of llm.c's train_gpt2.c. Every op is
// a Device call on Tensors. Dtypes follow core/amp/precision.h: the residual stream, LayerNorm
// statistics and losses are f32; "h" (policy.activations) is f32 too in an fp32 run.

#include "core/error.h"
#include "core/model/gpt2.h"
#include "core/model/gpt2_internal.h"

namespace ct {

using gpt2_detail::linear_forward;
using gpt2_detail::view;

// =============================================================================================
// One transformer block

GPT2::NormSite GPT2::input_norm(int l, int64_t BT) const {
  const int64_t C = config_.n_embd;
  if (l == config_.n_layer)
    return {view(lnf_, {BT, C}), view(lnf_mean_, {BT}), view(lnf_rstd_, {BT}), param("ln_f.weight"),
            param("ln_f.bias")};
  const LayerActs& a = acts(l);
  const LayerParams p = forward_params(l);
  return {view(a.ln1, {BT, C}), view(a.ln1_mean, {BT}), view(a.ln1_rstd, {BT}), p.ln1w, p.ln1b};
}

void GPT2::block_forward(int l, int B, int T, bool recompute, int kv_pos) {
  const int64_t C = config_.n_embd;
  const int64_t BT = int64_t{B} * T;
  const float eps = config_.layer_norm_epsilon;
  const LayerParams p = forward_params(l);
  const LayerActs& a = acts(l);
  Tensor residual = view(residuals_[static_cast<size_t>(l)], {BT, C});  // (B,T,C) block input

  // ---- layernorm 1 -----------------------------------------------------------------------------
  // ln1 (B,T,C) h = LayerNorm(residual); after block 0, the previous block computed it with its
  // residual add, unless this is a recomputation
  Tensor ln1 = view(a.ln1, {BT, C});
  if (l == 0 || recompute)
    device_.layernorm_forward(ln1, view(a.ln1_mean, {BT}), view(a.ln1_rstd, {BT}), residual, p.ln1w,
                              p.ln1b, eps);

  // ---- attention -------------------------------------------------------------------------------
  // qkv (B,T,3C) h = ln1 @ c_attn.w + c_attn.b   (forward_cached: into the cache's rows)
  const bool cached = kv_pos >= 0;
  Tensor qkv = cached ? kv_rows(l, kv_pos, T) : view(a.qkv, {BT, 3 * C});
  linear_forward(device_, qkv, ln1, p.qkvw, p.qkvb);
  lora_forward(l, 0, 1, qkv, ln1);
  // atty (B,T,C) h = causal softmax(q k^T / sqrt(hs)) v per head; saved for the backward:
  // fused, the rows' log-sum-exp lse (B,NH,T) f32; unfused, the probabilities att (B,NH,T,T) h.
  // forward_cached: the new rows' attention over every cached row of the sequence (B = 1)
  Tensor atty = block_attention(l, qkv.reshape({B, T, 3 * C}), a.atty, a.lse, a.att, kv_pos);
  // attproj (B,T,C) h = atty @ attn.c_proj.w + attn.c_proj.b
  Tensor attproj = view(a.attproj, {BT, C});
  linear_forward(device_, attproj, atty.reshape({BT, C}), p.attprojw, p.attprojb);
  lora_forward(l, 1, 1, attproj, atty.reshape({BT, C}));

  // ---- residual and layernorm 2 ----------------------------------------------------------------
  // residual2 (B,T,C) f32 = residual + attproj;  ln2 (B,T,C) h = LayerNorm(residual2)
  Tensor residual2 = view(a.residual2, {BT, C});
  Tensor ln2 = view(a.ln2, {BT, C});
  device_.residual_layernorm_forward(residual2, ln2, view(a.ln2_mean, {BT}), view(a.ln2_rstd, {BT}),
                                     residual, attproj, p.ln2w, p.ln2b, eps);

  // ---- MLP -------------------------------------------------------------------------------------
  // fch (B,T,4C) h = ln2 @ c_fc.w + c_fc.b;  fch_gelu = gelu(fch): the GELU in the product's
  // epilogue, unless a LoRA adapter adds its update to fch first
  Tensor fch = view(a.fch, {BT, 4 * C});
  Tensor fch_gelu = view(a.fch_gelu, {BT, 4 * C});
  if (!lora_adapted(l, 2)) {
    device_.matmul_bias_gelu(fch_gelu, fch, ln2, p.fcw, false, false, p.fcb);
  } else {
    linear_forward(device_, fch, ln2, p.fcw, p.fcb);
    lora_forward(l, 2, 1, fch, ln2);
    device_.gelu_forward(fch_gelu.reshape({BT * 4 * C}), fch.reshape({BT * 4 * C}));
  }
  // fcproj (B,T,C) h = fch_gelu @ mlp.c_proj.w + mlp.c_proj.b
  Tensor fcproj = view(a.fcproj, {BT, C});
  linear_forward(device_, fcproj, fch_gelu, p.fcprojw, p.fcprojb);
  lora_forward(l, 3, 1, fcproj, fch_gelu);
  // The recomputation inside backward stops here: the block's output is kept already and
  // backward does not read it.
  if (recompute) return;
  // residual3 (B,T,C) f32 = residual2 + fcproj, the next block's input, and the LayerNorm that
  // reads it: the next block's ln1, or ln_f after the last block
  Tensor residual3 = view(residuals_[static_cast<size_t>(l) + 1], {BT, C});
  const NormSite next = input_norm(l + 1, BT);
  device_.residual_layernorm_forward(residual3, next.out, next.mean, next.rstd, residual2, fcproj,
                                     next.w, next.b, eps);
}

// =============================================================================================
// The ends of the network (ModelBase::forward runs them around the blocks)

void GPT2::embed(const Tensor& x, const Tensor& tokens, int pos) {
  const int64_t C = config_.n_embd, T = x.shape[1];
  device_.embedding_forward(x, tokens, param("wte.weight"),
                            param("wpe.weight").slice_flat(pos * C, {T, C}));
}

GPT2::NetShape GPT2::net_shape() const {
  return {config_.n_layer, 3 * int64_t{config_.n_embd}, config_.n_embd, config_.n_head,
          config_.n_head,  config_.block_size,          "block_size"};
}

}  // namespace ct
