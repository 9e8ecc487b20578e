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
// Mixed precision (GPT2Options::policy, dtypes per core/amp/precision.h): the f32 buffer above
// stays the master copy that the optimizer updates; a second flat buffer of the same layout in
// policy.compute (kWeights) holds the copy that matmuls read, refreshed by
// refresh_compute_weights(). LayerNorm weights, biases and the embedding lookups read the master.
// Parameter gradients are always f32.
//
// LoRA (GPT2Options::lora, Hu et al. 2021, as PEFT applies it to GPT-2's Conv1D layers): each
// targeted linear layer y = x @ W + b gains y += (alpha / r) * (x @ A^T) @ B^T with A [r, in]
// and B [out, r] (PEFT's lora_A / lora_B shapes). The base parameters are then frozen -- no
// gradients and no optimizer state -- and the adapters, in flat buffers of their own (master f32,
// a 16-bit compute copy under a mixed policy, f32 gradients), are what trainable_*() return.
// Under a mixed policy the frozen base is held in 16 bits only (base16()): no f32 master, the
// compute copy is the model -- as PyTorch holds a base loaded in bf16 -- and the embedding
// lookup reads the 16-bit tables; the LayerNorm and bias vectors (the no-decay region, ~0.1 %
// of the parameters) are widened once into an f32 buffer for the ops that take them in f32.
//
// Gradient checkpointing (GPT2Options::gradient_checkpointing): forward keeps only the residual
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
#include "core/model/model_util.h"
#include "core/tensor.h"

namespace ct {

// The parameter table for a config, in flat-buffer order (also the init order: tensor k of this
// table draws from Philox stream k).
std::vector<ParamInfo> gpt2_param_table(const GPT2Config& config);

struct GPT2Options {
  // Hugging Face --gradient_checkpointing: keep each block's input only, recompute the rest in
  // backward (one extra block forward per layer but the last; bitwise the same gradients).
  bool gradient_checkpointing = false;
  // Fused (flash) attention: only the per-row log-sum-exp is saved, not the (B,NH,T,T)
  // probabilities, and the backward recomputes them (Device::flash_attention_*). false: the
  // unfused ops, which store the probabilities.
  bool fused_attention = true;
  // Which tensors are f32 and which 16-bit (core/amp/precision.h); fp32 by default.
  PrecisionPolicy policy;
  // Low-rank adapters (core/model/lora.h); r = 0 (the default) trains the whole model.
  LoraOptions lora;
};

class GPT2 final : public Model {
 public:
  // Allocates parameters (kWeights; with a 16-bit policy also the compute copy) and, if
  // with_grads, gradients (kGrads); all uninitialised until init() / upload_params() /
  // zero_grad(). Validates the config; throws Error(kUnsupported) naming the op if the device
  // lacks an op the policy's 16-bit dtype needs (see Device::supports).
  GPT2(Device& device, const GPT2Config& config, bool with_grads = true,
       const GPT2Options& options = {});
  GPT2(const GPT2&) = delete;
  GPT2& operator=(const GPT2&) = delete;

  const GPT2Config& config() const { return config_; }
  const GPT2Options& options() const { return options_; }
  Device& device() const override { return device_; }
  std::string model_type() const override { return "gpt2"; }
  int block_size() const override { return config_.block_size; }
  int vocab_size() const override { return config_.vocab_size; }
  nlohmann::json hf_config() const override { return config_.to_hf_json(); }
  std::string config_str() const override { return config_.str(); }
  std::string config_mismatch(const nlohmann::json& saved) const override;
  std::string tied_head_source() const override { return "wte.weight"; }
  bool is_ignored_buffer(const std::string& name) const override;

  // GPT-2 initialisation, identical on every backend and in scripts/torch_gpt2.py: element j of
  // table tensor k = 0.02 * Philox(seed, k).normal(j) for matrices and embeddings (residual
  // projections attn.c_proj.weight / mlp.c_proj.weight also * 1/sqrt(2 n_layer)); biases 0;
  // LayerNorm weights 1. Also zeroes the gradients. With LoRA, adapter k of lora_params()
  // (in table order) draws from Philox stream params().size() + k: every lora_A uniform in
  // +-1/sqrt(in) (PEFT's kaiming_uniform(a=sqrt(5)) bound), every lora_B zero, so the adapted
  // model starts as the base.
  void init(uint64_t seed) override;

  // Activation (and backward scratch) buffers for batches up to max_batch x max_seq
  // (max_seq <= block_size). forward() grows them on demand; call this up front to fix the peak.
  void allocate_activations(int max_batch, int max_seq) override;
  int max_batch() const override { return max_b_; }
  int max_seq() const override { return max_t_; }
  // Bytes of MemCategory::kActivations that allocate_activations(B, T) allocates for this config
  // and options (with_grads: including the backward scratch), counted from the list of tensors
  // and their dtypes, independently of the allocation code.
  static int64_t activation_bytes(const GPT2Config& config, const GPT2Options& options, int B,
                                  int T, bool with_grads = true);

  // tokens [B,T] i32 (values < vocab_size); targets [B,T] i32 or nullptr. T <= block_size.
  // Returns the mean cross-entropy loss as a device tensor [1] f32 when targets are given (an
  // undefined Tensor otherwise); logits() holds [B,T,V]. tokens and targets must stay unchanged
  // until backward() has been enqueued. Reads the compute weights: after the optimizer has
  // changed the master weights, call refresh_compute_weights() first.
  Tensor forward(const Tensor& tokens, const Tensor* targets, int B, int T) override;
  // Gradients of dloss_scale * (mean loss of the last forward) are ADDED (+=) into
  // grads_flat(), so several forward/backward pairs accumulate; the last forward must have had
  // targets. Overwrites logits() (dlogits is computed in place). dloss_scale carries both the
  // accumulation weight and the fp16 loss scale (the gradients come out multiplied by it).
  void backward(float dloss_scale = 1.0f) override;
  // grads (=) 0.
  void zero_grad() override;

  // Views valid after forward: logits [B,T,V] (of dtype policy.activations) and per-position
  // losses [B,T] (f32) of the last call.
  Tensor logits() const override;
  Tensor losses() const override;

  // Parameters and gradients.
  const std::vector<ParamInfo>& params() const override { return table_; }
  const ParamInfo& param_info(const std::string& name) const;  // kInvalidArgument if unknown
  // [num_parameters] f32 master; undefined when base16() (the base exists in 16 bits only).
  Tensor params_flat() const { return params_; }
  // LoRA under a 16-bit policy: the frozen base is held in policy.compute only.
  bool base16() const { return options_.lora.enabled() && options_.policy.mixed(); }
  // Bytes of kWeights the base parameters take for `options` (f32 master, 16-bit copy, or the
  // 16-bit base plus its widened no-decay region), adapters not included.
  static int64_t base_weight_bytes(const GPT2Config& config, const GPT2Options& options);
  // The copy matmuls read, [num_parameters] of policy.compute (params_flat() itself for fp32).
  Tensor compute_params_flat() const { return compute_; }
  // compute copy (=) master, rounded to nearest even. Call after every change of the master
  // weights made outside this class (the optimizer step); init() and upload_params() call it.
  // A no-op for fp32.
  void refresh_compute_weights() override;
  Tensor grads_flat() const;  // [num_parameters]
  // View with the table shape of what the ops read as the parameter: the f32 master, or when
  // base16() the 16-bit copy (matrices, embeddings) / the widened f32 vectors (no-decay region).
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;
  int64_t num_parameters() const override { return num_params_; }
  int64_t decay_count() const { return decay_count_; }
  // The two optimizer groups of the full model: [0, decay_count) and [decay_count,
  // num_parameters).
  Tensor params_decay() const;
  Tensor params_no_decay() const;
  Tensor grads_decay() const;
  Tensor grads_no_decay() const;

  // What the optimizer updates: every parameter, or with LoRA the adapters only.
  LoraAdapters* adapters() const override { return lora_.get(); }
  const std::vector<ParamInfo>& trainable_params() const override {
    return lora() ? lora_->table() : table_;
  }
  Tensor trainable_flat() const override { return lora() ? lora_->params() : params_; }
  Tensor trainable_grads() const override;  // kInvalidArgument without gradients
  int64_t num_trainable() const override { return lora() ? lora_->count() : num_params_; }
  int64_t trainable_decay_count() const override { return lora() ? lora_->count() : decay_count_; }
  std::string peft_prefix() const override { return "base_model.model.transformer."; }
  bool peft_fan_in_fan_out() const override { return true; }  // Conv1D: W is [in, out]
  // The layers LoRA may adapt, site l * 4 + m: "h.<l>." + attn.c_attn, attn.c_proj, mlp.c_fc,
  // mlp.c_proj. PEFT's default target: c_attn.
  static std::vector<LoraSite> lora_sites(const GPT2Config& config);
  static LoraOptions resolved_lora(LoraOptions lora);  // empty target_modules -> {"c_attn"}
  // How many adapter parameters `lora` adds to a model of `config` (0 when not enabled).
  static int64_t lora_parameter_count(const GPT2Config& config, const LoraOptions& lora);

  // Host copies for checkpoints and tests (these wait for the device).
  std::vector<float> download_params() const override;
  std::vector<float> download_grads() const;
  std::map<std::string, std::vector<float>> download_param_map() const override;
  void upload_params(const std::vector<float>& flat);
  // Every table name must be present with the right element count; unknown names are errors.
  void upload_params(const std::map<std::string, std::vector<float>>& named) override;

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
  Tensor table_view(const Tensor& flat, const std::string& name) const;
  const LayerActs& acts(int l) const {
    return layers_[options_.gradient_checkpointing ? 0 : static_cast<size_t>(l)];
  }
  // Block l from residuals_[l]: fills acts(l) and, unless recompute, residuals_[l + 1].
  void block_forward(int l, int B, int T, bool recompute);
  void check_policy() const;
  // out (+=) the adapter's update of linear layer m of block l (no-op when not adapted).
  void lora_forward(int l, int m, const Tensor& out, const Tensor& x) const;
  // dinp (=) dout @ w^T for linear layer m of block l, plus the weight/bias gradients unless
  // the base is frozen, plus the adapter's part.
  void linear_bwd(int l, int m, const Tensor& dinp, const Tensor& dw, const Tensor& db,
                  const Tensor& dout, const Tensor& inp, const Tensor& w,
                  const Tensor* dbias_src) const;

  Device& device_;
  GPT2Config config_;
  GPT2Options options_;
  std::vector<ParamInfo> table_;
  std::map<std::string, size_t> index_;  // name -> row of table_
  int64_t num_params_ = 0;
  int64_t decay_count_ = 0;
  Tensor params_, grads_;
  Tensor small_;    // base16(): f32 [num_params - decay_count], the no-decay region widened
  Tensor compute_;  // policy.compute copy of params_ (params_ itself for fp32)
  std::unique_ptr<LoraAdapters> lora_;  // null without LoRA

  // Activations, sized for max_b_ x max_t_; views of the current (B,T) are taken per call.
  int max_b_ = 0, max_t_ = 0;
  // The residual stream, f32 (B,T,C): [0] the embedding output, [l + 1] block l's output.
  std::vector<Tensor> residuals_;
  std::vector<LayerActs> layers_;
  Tensor lnf_, lnf_mean_, lnf_rstd_;  // (B,T,C) h, (B,T), (B,T)
  Tensor logits_;                     // (B,T,V) h
  Tensor losses_;                     // (B,T)
  Tensor loss_;                       // [1]
  // Backward scratch, reused by every layer.
  Tensor dresidual_;            // (B,T,C) f32 gradient flowing along the residual stream
  Tensor dresidual_h_;          // (B,T,C) h: its copy as a matmul input (16-bit policies only)
  Tensor dbt_c_;                // (B,T,C) f32: gradients of LayerNorm outputs
  Tensor dbt_4c_a_, dbt_4c_b_;  // (B,T,4C) h
  Tensor frozen_ln_dw_, frozen_ln_db_;  // (C) f32: where a frozen LayerNorm's gradients go

  // The last forward's batch, kept for backward.
  model_util::ForwardBatch batch_;
};

}  // namespace ct
