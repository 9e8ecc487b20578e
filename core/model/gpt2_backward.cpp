// GPT-2 backward, the forward's sections in reverse. Parameter gradients are f32 and accumulated
// (+=); activation gradients that feed matmuls are policy.activations ("h"), the residual-stream
// gradient and the gradients of LayerNorm outputs are f32 (core/amp/precision.h).
#include "core/error.h"
#include "core/model/gpt2.h"
#include "core/model/gpt2_internal.h"

namespace ct {

using gpt2_detail::view;

void GPT2::backward(float dloss_scale) {
  // dlogits (B,T,Vp) h = dloss * (softmax(logits) - onehot(targets)), in place over the logits;
  // 0 in the padding columns
  const Tensor dlogits = loss_backward(dloss_scale);
  const int B = batch_.B(), T = batch_.T();
  const int64_t C = config_.n_embd, NH = config_.n_head;
  const int64_t BT = int64_t{B} * T;
  const int L = config_.n_layer;
  const bool mixed = options_.policy.mixed();
  const Tensor& g = grads_;
  // LoRA: the base is frozen. Its weight gradients are not computed, the LayerNorm ones (which
  // come with dx in one op) go to a scratch pair, and the adapters' are added per layer
  // (linear_bwd, core/model/gpt2_lora.cpp).
  const bool frozen = lora();
  auto ln_grad = [&](const std::string& name) {
    return frozen ? (name.find(".bias") != std::string::npos ? frozen_ln_db_ : frozen_ln_dw_)
                  : table_view(g, name);
  };
  // d loss / d (residual stream), (B,T,C) f32, and its copy as a matmul operand (h)
  Tensor dresidual = view(dresidual_, {BT, C});
  Tensor dresidual_mm = mixed ? view(dresidual_h_, {BT, C}) : dresidual;
  Tensor dln = view(dbt_c_, {BT, C});  // (B,T,C) f32: the gradient of a LayerNorm output

  // ---- LM head ---------------------------------------------------------------------------------
  // dlnf (B,T,C) f32 = dlogits @ wte;  dwte += dlogits^T @ lnf   (wte with its zero rows, whose
  // gradient rows get 0 from the padding columns)
  device_.matmul(dln, dlogits, head_view(compute_), false, false);
  if (!frozen) device_.matmul(head_view(g), dlogits, view(lnf_, {BT, C}), true, false, 1.0f, 1.0f);

  // ---- final layernorm -------------------------------------------------------------------------
  // dresidual (B,T,C) = d LayerNorm_f / d x  (the residual stream gradient starts here)
  device_.fill(dresidual, 0.0f);
  device_.layernorm_backward(dresidual, ln_grad("ln_f.weight"), ln_grad("ln_f.bias"), dln,
                             view(residuals_.back(), {BT, C}), param("ln_f.weight"),
                             view(lnf_mean_, {BT}), view(lnf_rstd_, {BT}));
  gradients_final(L);  // ln_f (data parallel: its bucket may start)

  for (int l = L - 1; l >= 0; --l) {
    // Checkpointing: re-run this block's forward into the shared buffers. The last block's
    // activations are still there from forward().
    if (options_.gradient_checkpointing && l != L - 1)
      block_forward(l, B, T, /*recompute=*/true, /*kv_pos=*/-1);
    const LayerParams p = forward_params(l);
    LayerParams dp;
    if (frozen)
      dp.ln1w = dp.ln2w = frozen_ln_dw_, dp.ln1b = dp.ln2b = frozen_ln_db_;
    else
      dp = layer_params(g, l);
    const LayerActs& a = acts(l);
    Tensor residual = view(residuals_[static_cast<size_t>(l)], {BT, C});
    Tensor dbt_4c_a = view(dbt_4c_a_, {BT, 4 * C});
    Tensor dbt_4c_b = view(dbt_4c_b_, {BT, 4 * C});

    // ---- MLP -----------------------------------------------------------------------------------
    // residual3 = residual2 + fcproj: d fcproj = dresidual, and dresidual flows on to residual2.
    // dfch_gelu (B,T,4C) h = dresidual @ mlp.c_proj.w^T
    // dfch (B,T,4C) h = gelu'(fch) * dfch_gelu: the GELU's backward in the product's epilogue,
    // unless a LoRA adapter on c_proj adds its part to dfch_gelu first
    if (mixed) device_.copy(dresidual_mm, dresidual);
    Tensor dfch = dbt_4c_b;
    if (!lora_adapted(l, 3)) {
      device_.matmul_gelu_backward(dfch, dresidual_mm, p.fcprojw, false, true,
                                   view(a.fch, {BT, 4 * C}));
      if (!frozen) {
        device_.matmul(dp.fcprojw, view(a.fch_gelu, {BT, 4 * C}), dresidual_mm, true, false, 1.0f,
                       1.0f);
        device_.bias_backward(dp.fcprojb, dresidual);
      }
    } else {
      Tensor dfch_gelu = dbt_4c_a;
      linear_bwd(l, 3, dfch_gelu, dp.fcprojw, dp.fcprojb, dresidual_mm,
                 view(a.fch_gelu, {BT, 4 * C}), p.fcprojw, &dresidual);
      device_.gelu_backward(dfch.reshape({BT * 4 * C}), view(a.fch, {BT * 4 * C}),
                            dfch_gelu.reshape({BT * 4 * C}));
    }
    // dln2 (B,T,C) f32 = dfch @ c_fc.w^T
    linear_bwd(l, 2, dln, dp.fcw, dp.fcb, dfch, view(a.ln2, {BT, C}), p.fcw, nullptr);

    // ---- layernorm 2 ---------------------------------------------------------------------------
    // dresidual (B,T,C) += d LayerNorm_2 / d residual2
    device_.layernorm_backward(dresidual, dp.ln2w, dp.ln2b, dln, view(a.residual2, {BT, C}), p.ln2w,
                               view(a.ln2_mean, {BT}), view(a.ln2_rstd, {BT}));

    // ---- attention -----------------------------------------------------------------------------
    // residual2 = residual + attproj: d attproj = dresidual, which flows on to residual.
    // datty (B,T,C) h = dresidual @ attn.c_proj.w^T
    if (mixed) device_.copy(dresidual_mm, dresidual);
    Tensor datty = view(dbt_4c_b_, {BT, C});
    linear_bwd(l, 1, datty, dp.attprojw, dp.attprojb, dresidual_mm, view(a.atty, {BT, C}),
               p.attprojw, &dresidual);
    // dqkv (B,T,3C) h from datty and the saved qkv and atty, lse (fused) or att (unfused)
    Tensor dqkv = view(dbt_4c_a_, {BT, 3 * C});
    if (options_.fused_attention)
      device_.flash_attention_backward(dqkv.reshape({B, T, 3 * C}), datty.reshape({B, T, C}),
                                       view(a.qkv, {B, T, 3 * C}), view(a.atty, {B, T, C}),
                                       view(a.lse, {B, NH, T}), config_.n_head);
    else
      device_.attention_backward(dqkv.reshape({B, T, 3 * C}), datty.reshape({B, T, C}),
                                 view(a.qkv, {B, T, 3 * C}), view(a.att, {B, NH, T, T}),
                                 config_.n_head);
    // dln1 (B,T,C) f32 = dqkv @ c_attn.w^T
    linear_bwd(l, 0, dln, dp.qkvw, dp.qkvb, dqkv, view(a.ln1, {BT, C}), p.qkvw, nullptr);

    // ---- layernorm 1 ---------------------------------------------------------------------------
    // dresidual (B,T,C) += d LayerNorm_1 / d residual
    device_.layernorm_backward(dresidual, dp.ln1w, dp.ln1b, dln, residual, p.ln1w,
                               view(a.ln1_mean, {BT}), view(a.ln1_rstd, {BT}));
    gradients_final(l);  // block l's weights, biases and adapters
  }

  // ---- encoder ---------------------------------------------------------------------------------
  // dwte += scatter of dresidual by token;  dwpe += sum of dresidual over the batch
  if (!frozen)
    device_.embedding_backward(table_view(g, "wte.weight"), table_view(g, "wpe.weight"),
                               dresidual.reshape({B, T, C}), batch_.tokens());
  batch_.consume_targets();  // the logits now hold dlogits
}

}  // namespace ct
