// GPT-2 activation buffers (MemCategory::kActivations): their allocation, and the same count
// predicted from the list of tensors, so tests can hold the two against each other.
#include "core/error.h"
#include "core/model/gpt2.h"

namespace ct {

// What allocate_activations holds, per tensor, with h = dtype_size(policy.activations):
//   residual stream   (L + 1) x BT*C*4            block inputs and the last block's output
//   per block set     ln1, atty, attproj, ln2, fcproj  5 x BT*C*h;  qkv BT*3C*h;
//                     att B*NH*T*T*h (unfused attention) or lse B*NH*T*4 (fused);
//                     fch, fch_gelu  2 x BT*4C*h;  residual2 BT*C*4;
//                     ln1/ln2 mean and rstd  4 x BT*4
//                     sets: L, or 1 with gradient checkpointing
//   head              lnf BT*C*h, its mean/rstd 2 x BT*4, logits BT*Vp*h (the padded vocabulary),
//                     losses BT*4, loss 4
//   backward scratch  dresidual and dln 2 x BT*C*4, two BT*4C*h, and under a 16-bit policy the
//                     copy of dresidual BT*C*h
//   LoRA              LoraAdapters::activation_bytes (u, du, the dropped-out input); with
//                     gradients the frozen LayerNorms' gradient sink 2 x C*4
int64_t GPT2::activation_bytes(const GPT2Config& config, const ModelOptions& options, int B, int T,
                               bool with_grads) {
  const int64_t L = config.n_layer, C = config.n_embd, NH = config.n_head;
  const int64_t V = padded_vocab_size(config.vocab_size);
  const int64_t BT = int64_t{B} * T, f = 4;
  const int64_t h = static_cast<int64_t>(dtype_size(options.policy.activations));
  const int64_t residual_stream = (L + 1) * BT * C * f;
  const int64_t attention = options.fused_attention ? int64_t{B} * NH * T * f       // lse
                                                    : int64_t{B} * NH * T * T * h;  // att
  const int64_t block =
      5 * BT * C * h + BT * 3 * C * h + attention + 2 * BT * 4 * C * h + BT * C * f + 4 * BT * f;
  const int64_t sets = options.gradient_checkpointing ? 1 : L;
  const int64_t head = BT * C * h + 2 * BT * f + BT * V * h + BT * f + f;
  int64_t scratch = 0;
  if (with_grads)
    scratch = 2 * BT * C * f + 2 * BT * 4 * C * h + (options.policy.mixed() ? BT * C * h : 0);
  int64_t lora = 0;
  if (options.lora.enabled())
    lora = LoraAdapters::activation_bytes(lora_sites(config), resolved_lora(options.lora), BT,
                                          options.policy.activations, with_grads) +
           (with_grads ? 2 * C * f : 0);
  return residual_stream + sets * block + head + scratch + lora;
}

void GPT2::allocate_activations(int max_batch, int max_seq) {
  CT_REQUIRE(max_batch >= 1, "max batch must be positive, got " + std::to_string(max_batch));
  CT_REQUIRE(max_seq >= 1 && max_seq <= config_.block_size,
             "sequence length " + std::to_string(max_seq) + " outside [1, block_size " +
                 std::to_string(config_.block_size) + "]");
  const int64_t BT = int64_t{max_batch} * max_seq, C = config_.n_embd;
  const int64_t NH = config_.n_head;
  const DType f32 = DType::f32, h = options_.policy.activations;
  // Drop the old buffers first so the peak holds one set, not two.
  release_activations();
  layers_.clear();
  lnf_ = lnf_mean_ = lnf_rstd_ = Tensor();
  dbt_c_ = dbt_4c_a_ = dbt_4c_b_ = Tensor();
  frozen_ln_dw_ = frozen_ln_db_ = Tensor();

  auto act = [&](int64_t n, DType dt) { return device_.empty({n}, dt, MemCategory::kActivations); };
  allocate_residuals(config_.n_layer, BT, C);
  layers_.resize(options_.gradient_checkpointing ? 1 : static_cast<size_t>(config_.n_layer));
  for (LayerActs& a : layers_) {
    a.ln1 = act(BT * C, h);
    a.ln1_mean = act(BT, f32);
    a.ln1_rstd = act(BT, f32);
    a.qkv = act(BT * 3 * C, h);
    if (options_.fused_attention)
      a.lse = act(int64_t{max_batch} * NH * max_seq, f32);
    else
      a.att = act(int64_t{max_batch} * NH * max_seq * max_seq, h);
    a.atty = act(BT * C, h);
    a.attproj = act(BT * C, h);
    a.residual2 = act(BT * C, f32);
    a.ln2 = act(BT * C, h);
    a.ln2_mean = act(BT, f32);
    a.ln2_rstd = act(BT, f32);
    a.fch = act(BT * 4 * C, h);
    a.fch_gelu = act(BT * 4 * C, h);
    a.fcproj = act(BT * C, h);
  }
  lnf_ = act(BT * C, h);
  lnf_mean_ = act(BT, f32);
  lnf_rstd_ = act(BT, f32);
  allocate_head(BT);
  if (lora()) {
    lora_->allocate(BT, h, trains());
    if (trains()) {
      frozen_ln_dw_ = act(C, f32);
      frozen_ln_db_ = act(C, f32);
    }
  }
  if (trains()) {
    allocate_dresidual(BT, C);
    dbt_c_ = act(BT * C, f32);
    dbt_4c_a_ = act(BT * 4 * C, h);
    dbt_4c_b_ = act(BT * 4 * C, h);
  }
  max_b_ = max_batch;
  max_t_ = max_seq;
}

}  // namespace ct
