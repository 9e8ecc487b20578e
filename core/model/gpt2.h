// GPT-2 (Radford et al. 2019) built only from the device op set in core/device.h.
//
// Parameters live in ONE contiguous f32 buffer (and gradients in another of the same layout),
// ordered so the weight-decayed tensors come first:
//   [0, decay_count)            wte, wpe, then per layer c_attn.w, attn.c_proj.w, c_fc.w,
//                               mlp.c_proj.w                       (weight decay applies)
//   [decay_count, num_params)   per layer ln_1.w/b, c_attn.b, attn.c_proj.b, ln_2.w/b, c_fc.b,
//                               mlp.c_proj.b; then ln_f.w/b         (no weight decay)
// Names and shapes are Hugging Face's (GPT2Model, without the "transformer." prefix); linear
// weights use Conv1D layout [in, out]; the LM head is tied to wte (logits = x @ wte^T).
//
// Mixed precision (ModelOptions::policy, dtypes per core/amp/precision.h): the f32 buffer above
// stays the master copy that the optimizer updates; a second flat buffer of the same layout in
// policy.compute (kWeights) holds the copy that matmuls read, refreshed by
// refresh_compute_weights(). LayerNorm weights, biases and the embedding lookups read the master.
// Parameter gradients are always f32.
//
// LoRA (ModelOptions::lora, Hu et al. 2021, as PEFT applies it to GPT-2's Conv1D layers): each
// targeted linear layer y = x @ W + b gains y += (alpha / r) * (x @ A^T) @ B^T with A [r, in]
// and B [out, r] (PEFT's lora_A / lora_B shapes). The base parameters are then frozen -- no
// gradients and no optimizer state -- and the adapters, in flat buffers of their own (master f32,
// a 16-bit compute copy under a mixed policy, f32 gradients), are what trainable_*() return.
// Under a mixed policy the frozen base is held in 16 bits only (base16()): no f32 master, the
// compute copy is the model -- as PyTorch holds a base loaded in bf16 -- and the embedding
// lookup reads the 16-bit tables; the LayerNorm and bias vectors (the no-decay region, ~0.1 %
// of the parameters) are widened once into an f32 buffer for the ops that take them in f32.
//
// Gradient checkpointing (ModelOptions::gradient_checkpointing): forward keeps only the residual
// stream entering each block (plus the final one); the block internals live in one shared set of
// buffers, and backward re-runs each block's forward (the same ops on the same inputs) just
// before that block's backward, so the gradients are bitwise those of a run without it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/amp/precision.h"
#include "core/device.h"
#include "core/model/config.h"
#include "core/model/lora.h"
#include "core/model/model.h"
#include "core/model/model_base.h"
#include "core/tensor.h"

namespace ct {

// The parameter table for a config, in flat-buffer order (also the init order: tensor k of this
// table draws from Philox stream k).
std::vector<ParamInfo> gpt2_param_table(const GPT2Config& config);

class GPT2 final : public ModelBase {
 public:
  // Allocates parameters (kWeights; with a 16-bit policy also the compute copy) and, if
  // with_grads, gradients (kGrads); all uninitialised until init() / upload_params() /
  // zero_grad(). Validates the config; throws Error(kUnsupported) naming the op if the device
  // lacks an op the policy's 16-bit dtype needs (see Device::supports).
  GPT2(Device& device, const GPT2Config& config, bool with_grads = true,
       const ModelOptions& options = {});
  GPT2(const GPT2&) = delete;
  GPT2& operator=(const GPT2&) = delete;

  const GPT2Config& config() const { return config_; }
  std::string model_type() const override { return "gpt2"; }
  int block_size() const override { return config_.block_size; }
  int vocab_size() const override { return config_.vocab_size; }
  nlohmann::json hf_config() const override { return config_.to_hf_json(); }
  std::string config_str() const override { return config_.str(); }
  std::string config_mismatch(const nlohmann::json& saved) const override;
  std::string tied_head_source() const override { return "wte.weight"; }
  bool is_ignored_buffer(const std::string& name) const override;

  // GPT-2 initialisation (ModelBase::init), identical on every backend and in
  // scripts/torch_gpt2.py: matrices and embeddings 0.02 * N(0, 1) (residual projections
  // attn.c_proj.weight / mlp.c_proj.weight also * 1/sqrt(2 n_layer)); biases 0; LayerNorm
  // weights 1.
  float init_stddev(const ParamInfo& p) const override;
  float init_fill(const ParamInfo& p) const override;
  // Block l's rows (and adapters) after block l, ln_f before the blocks, wte (also the head) and
  // wpe at the end.
  int gradient_stage(const std::string& name) const override;

  // Activation (and backward scratch) buffers for batches up to max_batch x max_seq
  // (max_seq <= block_size). forward() grows them on demand; call this up front to fix the peak.
  void allocate_activations(int max_batch, int max_seq) override;
  // Bytes of MemCategory::kActivations that allocate_activations(B, T) allocates for this config
  // and options (with_grads: including the backward scratch), counted from the list of tensors
  // and their dtypes, independently of the allocation code.
  static int64_t activation_bytes(const GPT2Config& config, const ModelOptions& options, int B,
                                  int T, bool with_grads = true);

  // forward (ModelBase's, with embed, block_forward and lm_head below): tokens [B,T] i32
  // (values < vocab_size); targets [B,T] i32 or nullptr. T <= block_size. Returns the mean
  // cross-entropy loss as a device tensor [1] f32 when targets are given (an undefined Tensor
  // otherwise); logits() holds [B,T,V]. tokens and targets must stay unchanged until backward()
  // has been enqueued. Reads the compute weights: after the optimizer has changed the master
  // weights, call refresh_compute_weights() first.
  // Gradients of dloss_scale * (mean loss of the last forward) are ADDED (+=) into
  // grads_flat(), so several forward/backward pairs accumulate; the last forward must have had
  // targets. Overwrites logits() (dlogits is computed in place). dloss_scale carries both the
  // accumulation weight and the fp16 loss scale (the gradients come out multiplied by it).
  void backward(float dloss_scale = 1.0f) override;

  // Bytes of kWeights the base parameters take for `options` (f32 master, 16-bit copy, or the
  // 16-bit base plus its widened no-decay region), adapters not included.
  static int64_t base_weight_bytes(const GPT2Config& config, const ModelOptions& options);
  std::string peft_prefix() const override { return "base_model.model.transformer."; }
  bool peft_fan_in_fan_out() const override { return true; }  // Conv1D: W is [in, out]
  // The layers LoRA may adapt, site l * 4 + m: "h.<l>." + attn.c_attn, attn.c_proj, mlp.c_fc,
  // mlp.c_proj. PEFT's default target: c_attn.
  static std::vector<LoraSite> lora_sites(const GPT2Config& config);
  static LoraOptions resolved_lora(LoraOptions lora);  // empty target_modules -> {"c_attn"}
  // How many adapter parameters `lora` adds to a model of `config` (0 when not enabled).
  static int64_t lora_parameter_count(const GPT2Config& config, const LoraOptions& lora);

 private:
  // A block's internal activations; one set per layer, or one shared set with checkpointing.
  // Dtypes: mean/rstd and residual2 f32, the rest policy.activations.
  struct LayerActs {
    Tensor ln1, ln1_mean, ln1_rstd;  // (B,T,C), (B,T), (B,T)
    Tensor qkv;                      // (B,T,3C)
    Tensor att;                      // (B,NH,T,T), unfused attention only
    Tensor lse;                      // (B,NH,T) f32, fused attention only
    Tensor atty;                     // (B,T,C)
    Tensor attproj;                  // (B,T,C)
    Tensor residual2;                // (B,T,C)
    Tensor ln2, ln2_mean, ln2_rstd;  // (B,T,C), (B,T), (B,T)
    Tensor fch, fch_gelu;            // (B,T,4C)
    Tensor fcproj;                   // (B,T,C)
  };
  struct LayerParams {
    Tensor ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
  };

  LayerParams layer_params(const Tensor& flat, int l) const;
  // What block l's forward reads: matmul weights from the compute copy, the rest from the master.
  LayerParams forward_params(int l) const;
  const LayerActs& acts(int l) const {
    return layers_[options_.gradient_checkpointing ? 0 : static_cast<size_t>(l)];
  }
  // Block l from residuals_[l]: fills acts(l) and, unless recompute, residuals_[l + 1] and the
  // LayerNorm that reads it (input_norm(l + 1)), fused with the residual add. So block l > 0
  // finds its ln1 done, except when it recomputes. kv_pos >= 0 (forward_cached, B = 1): the
  // T rows are positions [kv_pos, kv_pos + T), their qkv go to the key/value cache and their
  // attention reads it.
  void block_forward(int l, int B, int T, bool recompute, int kv_pos) override;
  // x (B,T,C) f32 = wte[tokens] + wpe[pos:pos+T] (master weights)
  void embed(const Tensor& x, const Tensor& tokens, int pos) override;
  // The tied head: the compute copy of wte with its zero rows
  Tensor lm_head() const override { return head_view(compute_); }
  NetShape net_shape() const override;
  // The LayerNorm that reads residuals_[l]: block l's ln1, or ln_f for l = n_layer.
  struct NormSite {
    Tensor out, mean, rstd, w, b;  // (BT,C) h, (BT), (BT), (C), (C)
  };
  NormSite input_norm(int l, int64_t BT) const;
  void check_policy() const;
  // dinp (=) dout @ w^T for linear layer m of block l, plus the weight/bias gradients unless
  // the base is frozen, plus the adapter's part.
  void linear_bwd(int l, int m, const Tensor& dinp, const Tensor& dw, const Tensor& db,
                  const Tensor& dout, const Tensor& inp, const Tensor& w,
                  const Tensor* dbias_src) const;

  GPT2Config config_;
  std::vector<LayerActs> layers_;
  Tensor lnf_mean_, lnf_rstd_;  // (B,T), (B,T): ln_f's statistics (lnf_ is ModelBase's)
  // Backward scratch, reused by every layer (and ModelBase's dresidual_).
  Tensor dbt_c_;                        // (B,T,C) f32: gradients of LayerNorm outputs
  Tensor dbt_4c_a_, dbt_4c_b_;          // (B,T,4C) h
  Tensor frozen_ln_dw_, frozen_ln_db_;  // (C) f32: where a frozen LayerNorm's gradients go
};

}  // namespace ct
