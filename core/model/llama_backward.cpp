// Llama backward, the forward's sections in reverse. Parameter gradients are f32 and accumulated
// (+=); activation gradients that feed matmuls are policy.activations ("h"); the residual-stream
// gradient and the gradients of RMSNorm outputs are f32. For a linear layer y = x @ w^T
// (w [out, in]): dx = dy @ w, dw += dy^T @ x.
#include "core/error.h"
#include "core/model/gpt2_internal.h"
#include "core/model/llama.h"

namespace ct {

using gpt2_detail::view;

// dinp (=) dout @ w (the frozen base: that only, with ModelBase::linear_backward_input adding
// the adapter's part), plus dw (+=) dout^T @ inp unless frozen.
void Llama::linear_bwd(int l, int site, const Tensor& dinp, const Tensor& dw, const Tensor& dout,
                       const Tensor& inp, const Tensor& w) const {
  linear_backward_input(l, site, dinp, dout, inp, w, /*transpose_w=*/false);
  if (!lora()) device_.matmul(dw, dout, inp, true, false, 1.0f, 1.0f);
}

void Llama::backward(float dloss_scale) {
  // dlogits (B,T,Vp) h = dloss * (softmax(logits) - onehot(targets)), in place over the logits;
  // 0 in the padding columns
  const Tensor dlogits = loss_backward(dloss_scale);
  const int B = batch_.B(), T = batch_.T();
  const int64_t C = config_.n_embd, NH = config_.n_head;
  const int64_t NKV = config_.n_kv_head, W = config_.qkv_width(), F = config_.intermediate_size;
  const int64_t hd = config_.head_dim(), BT = int64_t{B} * T;
  const int L = config_.n_layer;
  const bool mixed = options_.policy.mixed();
  const Tensor& g = grads_;
  // LoRA: the base is frozen. Its weight gradients are not computed, the RMSNorm ones (which come
  // with dx in one op) go to a scratch vector, and the adapters' are added per layer.
  const bool frozen = lora();
  auto norm_grad = [&](const Tensor& w) { return frozen ? frozen_norm_dw_ : w; };

  Tensor dresidual = view(dresidual_, {BT, C});
  Tensor dresidual_mm = mixed ? view(dresidual_h_, {BT, C}) : dresidual;
  Tensor dln = view(dln_, {BT, C});

  // ---- LM head ---------------------------------------------------------------------------------
  // dlnf (B,T,C) f32 = dlogits @ lm_head;  dlm_head += dlogits^T @ lnf
  device_.matmul(dln, dlogits, head_weight(compute_), false, false);
  if (!frozen)
    device_.matmul(head_weight(g), dlogits, view(lnf_, {BT, C}), true, false, 1.0f, 1.0f);

  // ---- final RMSNorm ---------------------------------------------------------------------------
  device_.fill(dresidual, 0.0f);
  device_.rmsnorm_backward(dresidual, frozen ? frozen_norm_dw_ : table_view(g, "model.norm.weight"),
                           dln, view(residuals_.back(), {BT, C}), param("model.norm.weight"),
                           view(lnf_rstd_, {BT}));
  gradients_final(L);  // model.norm and an untied lm_head (data parallel: their buckets may start)

  const Tensor cs = rope_cos_.slice_flat(0, {T, hd / 2}), sn = rope_sin_.slice_flat(0, {T, hd / 2});
  for (int l = L - 1; l >= 0; --l) {
    // Checkpointing: re-run this layer's forward into the shared buffers (the last layer's are
    // still there from forward()).
    if (options_.gradient_checkpointing && l != L - 1)
      block_forward(l, B, T, /*recompute=*/true, /*kv_pos=*/-1);
    const LayerParams p = forward_params(l);
    const LayerParams dp = frozen ? LayerParams{} : layer_params(g, l);
    const LayerActs& a = acts(l);
    Tensor residual = view(residuals_[static_cast<size_t>(l)], {BT, C});

    // ---- SwiGLU MLP ----------------------------------------------------------------------------
    // residual3 = residual2 + act @ down^T: d(down out) = dresidual, which flows on to residual2.
    // dact (B,T,F) h = dresidual @ down_proj;  ddown += dresidual^T @ act
    if (mixed) device_.copy(dresidual_mm, dresidual);
    Tensor act = view(a.act, {BT, F});
    Tensor dact = view(dwide_, {BT, F});
    linear_bwd(l, 6, dact, dp.downw, dresidual_mm, act, p.downw);
    // dgu (B,T,2F) h = d silu(gate) * up, written over gu
    Tensor gu = view(a.gu, {BT, 2 * F});
    device_.swiglu_backward(gu, gu, dact);
    const Tensor& dgu = gu;
    // dln2 (B,T,C) f32 = dgu @ [gate; up];  d[gate; up] += dgu^T @ ln2
    Tensor ln2 = view(a.ln2, {BT, C});
    device_.matmul(dln, dgu, p.guw, false, false);
    if (!frozen) device_.matmul(dp.guw, dgu, ln2, true, false, 1.0f, 1.0f);
    for (int m : {4, 5})  // gate_proj, up_proj adapters
      if (frozen) lora_->backward_add(l * kLoraSitesPerLayer + m, dln, dgu, ln2);

    // ---- post-attention RMSNorm ----------------------------------------------------------------
    device_.rmsnorm_backward(dresidual, norm_grad(dp.ln2w), dln, view(a.residual2, {BT, C}), p.ln2w,
                             view(a.ln2_rstd, {BT}));

    // ---- attention -----------------------------------------------------------------------------
    // datty (B,T,C) h = dresidual @ o_proj;  do_proj += dresidual^T @ atty
    if (mixed) device_.copy(dresidual_mm, dresidual);
    Tensor atty = view(a.atty, {BT, C});
    Tensor datty = view(datty_, {BT, C});
    linear_bwd(l, 3, datty, dp.ow, dresidual_mm, atty, p.ow);
    // dqkv (B,T,W) h, w.r.t. the rotated q and k (and v), from the saved qkv and lse / att
    Tensor qkv3 = view(a.qkv, {B, T, W});
    Tensor dqkv3 = view(dwide_, {B, T, W});
    if (options_.fused_attention)
      device_.flash_attention_backward(dqkv3, datty.reshape({B, T, C}), qkv3,
                                       atty.reshape({B, T, C}), view(a.lse, {B, NH, T}),
                                       config_.n_head, config_.n_kv_head);
    else
      device_.attention_backward(dqkv3, datty.reshape({B, T, C}), qkv3, view(a.att, {B, NH, T, T}),
                                 config_.n_head, config_.n_kv_head);
    // back through the rotation: the opposite angle, in place (v untouched)
    device_.rope_backward(dqkv3, dqkv3, cs, sn, hd, NH + NKV);
    // dln1 (B,T,C) f32 = dqkv @ [q; k; v];  d[q; k; v] += dqkv^T @ ln1;  dbias += sums of dqkv
    Tensor dqkv = dqkv3.reshape({BT, W});
    Tensor ln1 = view(a.ln1, {BT, C});
    device_.matmul(dln, dqkv, p.qkvw, false, false);
    if (!frozen) device_.matmul(dp.qkvw, dqkv, ln1, true, false, 1.0f, 1.0f);
    if (config_.attention_bias && !frozen) device_.bias_backward(dp.qkvb, dqkv);
    for (int m : {0, 1, 2})  // q_proj, k_proj, v_proj adapters
      if (frozen) lora_->backward_add(l * kLoraSitesPerLayer + m, dln, dqkv, ln1);

    // ---- input RMSNorm -------------------------------------------------------------------------
    device_.rmsnorm_backward(dresidual, norm_grad(dp.ln1w), dln, residual, p.ln1w,
                             view(a.ln1_rstd, {BT}));
    gradients_final(l);  // layer l's weights, biases and adapters
  }

  // ---- embedding -------------------------------------------------------------------------------
  // dembed_tokens += scatter of dresidual by token (no position table)
  if (!frozen)
    device_.embedding_backward(table_view(g, "model.embed_tokens.weight"), Tensor(),
                               dresidual.reshape({B, T, C}), batch_.tokens());
  batch_.consume_targets();  // the logits now hold dlogits
}

}  // namespace ct
