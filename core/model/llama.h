// A Llama-family decoder (Llama, Mistral, Qwen2, SmolLM; Touvron et al. 2023) built only from
// the device op set in core/device.h: RMSNorm, rotary position embeddings (rotate-half),
// grouped-query causal attention, a SwiGLU MLP, linear layers without biases (Qwen2's q/k/v
// biases optional), a tied or separate LM head.
//
// Parameters live in ONE contiguous f32 buffer (gradients in another of the same layout), with
// Hugging Face's LlamaForCausalLM names and nn.Linear's [out, in] layout, weight-decayed first:
//   [0, decay_count)   model.embed_tokens.weight; per layer self_attn.{q,k,v}_proj.weight
//                      (adjacent: together the fused [(NH + 2 NKV) hd, C] projection),
//                      self_attn.o_proj.weight, mlp.{gate,up}_proj.weight (adjacent: the fused
//                      [2F, C] projection the SwiGLU op reads), mlp.down_proj.weight; then
//                      lm_head.weight unless tied
//   [decay_count, N)   per layer input_layernorm.weight, post_attention_layernorm.weight and,
//                      with attention_bias, self_attn.{q,k,v}_proj.bias (adjacent); then
//                      model.norm.weight
//
// Mixed precision follows GPT-2's scheme (core/model/gpt2.h, core/amp/precision.h): the f32
// buffer is the master copy, a policy.compute copy feeds the matmuls, RMSNorm weights, biases and
// the embedding lookup read the master, gradients are f32.
//
// LoRA (LlamaOptions::lora, core/model/lora.h) adapts any of q_proj, k_proj, v_proj, o_proj,
// gate_proj, up_proj, down_proj as PEFT does (default q_proj and v_proj); the base is then frozen
// (no gradients, no optimizer state) and the adapters are what trainable_*() return. The fused
// q|k|v and gate|up projections take each adapter's update in their columns of the fused output.
// Under a mixed policy the frozen base is held in 16 bits only (base16(), as GPT-2's): no f32
// master, the embedding lookup reads the 16-bit table, and the RMSNorm weights and biases (the
// no-decay region) are widened once into an f32 buffer for the ops that take them in f32.
//
// Gradient checkpointing (LlamaOptions::gradient_checkpointing) keeps only the residual stream
// entering each block; backward re-runs a block's forward just before its backward, so the
// gradients are bitwise those of a run without it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/amp/precision.h"
#include "core/device.h"
#include "core/model/llama_config.h"
#include "core/model/lora.h"
#include "core/model/model.h"
#include "core/model/model_util.h"
#include "core/tensor.h"

namespace ct {

// The parameter table for a config, in flat-buffer order (tensor k of it draws its initial
// values from Philox stream k).
std::vector<ParamInfo> llama_param_table(const LlamaConfig& config);

struct LlamaOptions {
  bool gradient_checkpointing = false;
  // Fused (flash) attention saves the rows' log-sum-exp only; false: the unfused ops, which save
  // the (B,NH,T,T) probabilities.
  bool fused_attention = true;
  PrecisionPolicy policy;
  // Low-rank adapters; r = 0 (the default) trains the whole model.
  LoraOptions lora;
};

class Llama final : public Model {
 public:
  // Allocates parameters (kWeights; with a 16-bit policy also the compute copy), the rotary
  // tables and, if with_grads, gradients (kGrads). Validates the config; throws
  // Error(kUnsupported) naming the op when the device lacks one the policy's dtype needs.
  Llama(Device& device, const LlamaConfig& config, bool with_grads = true,
        const LlamaOptions& options = {});
  Llama(const Llama&) = delete;
  Llama& operator=(const Llama&) = delete;

  const LlamaConfig& config() const { return config_; }
  const LlamaOptions& options() const { return options_; }
  Device& device() const override { return device_; }
  std::string model_type() const override { return config_.model_type; }
  int block_size() const override { return config_.block_size; }
  int vocab_size() const override { return config_.vocab_size; }
  nlohmann::json hf_config() const override { return config_.to_hf_json(); }
  std::string config_str() const override { return config_.str(); }
  std::string config_mismatch(const nlohmann::json& saved) const override;
  std::string tied_head_source() const override {
    return config_.tie_word_embeddings ? "model.embed_tokens.weight" : "";
  }
  bool is_ignored_buffer(const std::string& name) const override;

  // transformers' LlamaPreTrainedModel initialisation from crosstrain's Philox streams: element j
  // of table tensor k = 0.02 * Philox(seed, k).normal(j) for matrices and embeddings, biases 0,
  // RMSNorm weights 1. Also zeroes the gradients.
  void init(uint64_t seed) override;

  void allocate_activations(int max_batch, int max_seq) override;
  int max_batch() const override { return max_b_; }
  int max_seq() const override { return max_t_; }
  // Bytes of MemCategory::kActivations that allocate_activations(B, T) allocates, counted from
  // the list of tensors and their dtypes independently of the allocation code.
  static int64_t activation_bytes(const LlamaConfig& config, const LlamaOptions& options, int B,
                                  int T, bool with_grads = true);

  // As GPT2::forward / backward: tokens, targets [B,T] i32; returns the mean loss [1] f32 when
  // targets are given; backward adds dloss_scale * d(mean loss) into grads_flat().
  Tensor forward(const Tensor& tokens, const Tensor* targets, int B, int T) override;
  void backward(float dloss_scale = 1.0f) override;
  void zero_grad() override;
  Tensor logits() const override;  // [B,T,V] of policy.activations
  Tensor losses() const override;  // [B,T] f32

  const std::vector<ParamInfo>& params() const override { return table_; }
  const ParamInfo& param_info(const std::string& name) const;  // kInvalidArgument if unknown
  Tensor params_flat() const { return params_; }               // undefined when base16()
  // LoRA under a 16-bit policy: the frozen base is held in policy.compute only.
  bool base16() const { return options_.lora.enabled() && options_.policy.mixed(); }
  // Bytes of kWeights the base parameters and rotary tables take for `options` (f32 master and
  // 16-bit copy, or the 16-bit base and its widened no-decay region), adapters not included.
  static int64_t base_weight_bytes(const LlamaConfig& config, const LlamaOptions& options);
  // How many adapter parameters `lora` adds to a model of `config` (0 when not enabled).
  static int64_t lora_parameter_count(const LlamaConfig& config, const LoraOptions& lora);
  Tensor compute_params_flat() const { return compute_; }
  void refresh_compute_weights() override;  // compute copy (=) master; a no-op for fp32
  Tensor grads_flat() const;
  // What the ops read as the parameter: the f32 master, or when base16() the 16-bit base
  // (matrices, the embedding) / the widened f32 vectors (norms, biases).
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;
  int64_t num_parameters() const override { return num_params_; }
  int64_t decay_count() const { return decay_count_; }
  Tensor params_decay() const;
  Tensor params_no_decay() const;
  Tensor grads_decay() const;
  Tensor grads_no_decay() const;
  // Every parameter, or with LoRA the adapters.
  LoraAdapters* adapters() const override { return lora_.get(); }
  const std::vector<ParamInfo>& trainable_params() const override {
    return lora() ? lora_->table() : table_;
  }
  Tensor trainable_flat() const override { return lora() ? lora_->params() : params_; }
  Tensor trainable_grads() const override { return lora() ? lora_->grads() : grads_flat(); }
  int64_t num_trainable() const override { return lora() ? lora_->count() : num_params_; }
  int64_t trainable_decay_count() const override { return lora() ? lora_->count() : decay_count_; }
  std::string peft_prefix() const override { return "base_model.model."; }
  bool peft_fan_in_fan_out() const override { return false; }  // nn.Linear: W is [out, in]
  // The layers LoRA may adapt, site l * 7 + m: "model.layers.<l>." + self_attn.{q,k,v,o}_proj,
  // mlp.{gate,up,down}_proj; q/k/v write columns of the fused q|k|v output, gate/up of gate|up.
  static std::vector<LoraSite> lora_sites(const LlamaConfig& config);
  static constexpr int kLoraSitesPerLayer = 7;
  static LoraOptions resolved_lora(LoraOptions lora);  // empty targets -> q_proj, v_proj

  std::vector<float> download_params() const override;
  std::vector<float> download_grads() const;
  std::map<std::string, std::vector<float>> download_param_map() const override;
  void upload_params(const std::vector<float>& flat);
  // Every table name must be present with the right element count; unknown names are errors.
  void upload_params(const std::map<std::string, std::vector<float>>& named) override;

 private:
  // A block's saved activations; one set per layer, or one shared set with checkpointing.
  // rstd f32, the rest policy.activations ("h").
  struct LayerActs {
    Tensor ln1, ln1_rstd;  // (B,T,C), (B,T)
    Tensor qkv;            // (B,T,W) after the rotary embedding, W = (NH + 2 NKV) hd
    Tensor att;            // (B,NH,T,T), unfused attention only
    Tensor lse;            // (B,NH,T) f32, fused attention only
    Tensor atty;           // (B,T,C)
    Tensor residual2;      // (B,T,C) f32
    Tensor ln2, ln2_rstd;  // (B,T,C), (B,T)
    Tensor gu;             // (B,T,2F): gate | up (its gradient overwrites it in backward)
    Tensor act;            // (B,T,F): silu(gate) * up
  };
  struct LayerParams {
    Tensor ln1w, qkvw, qkvb, ow, ln2w, guw, downw;  // qkvb undefined without attention_bias
  };

  LayerParams layer_params(const Tensor& flat, int l) const;
  LayerParams forward_params(int l) const;  // matrices from the compute copy, vectors master
  // The f32 vector at `offset` (a no-decay row or adjacent rows): master, or the widened copy.
  Tensor vector_view(int64_t offset, const Shape& shape) const;
  Tensor table_view(const Tensor& flat, const std::string& name) const;
  Tensor head_weight(const Tensor& flat) const;  // lm_head.weight, or embed_tokens when tied
  const LayerActs& acts(int l) const {
    return layers_[options_.gradient_checkpointing ? 0 : static_cast<size_t>(l)];
  }
  void block_forward(int l, int B, int T, bool recompute);
  void check_policy() const;
  // out (+=) the adapters' updates of sites [first, first + n) of layer l (no-op without LoRA).
  void lora_forward(int l, int first, int n, const Tensor& out, const Tensor& x) const;
  // dinp (=) dout @ w for linear layer `site` of layer l (one site, dinp of any dtype), plus the
  // weight gradient unless frozen, plus the adapter's part.
  void linear_bwd(int l, int site, const Tensor& dinp, const Tensor& dw, const Tensor& dout,
                  const Tensor& inp, const Tensor& w) const;

  Device& device_;
  LlamaConfig config_;
  LlamaOptions options_;
  std::vector<ParamInfo> table_;
  std::map<std::string, size_t> index_;
  int64_t num_params_ = 0;
  int64_t decay_count_ = 0;
  Tensor params_, grads_, compute_;
  Tensor small_;  // base16(): f32 [num_params - decay_count], the no-decay region widened
  Tensor rope_cos_, rope_sin_;          // [block_size, hd/2] f32
  std::unique_ptr<LoraAdapters> lora_;  // null without LoRA

  int max_b_ = 0, max_t_ = 0;
  std::vector<Tensor> residuals_;  // L + 1 of (B,T,C) f32
  std::vector<LayerActs> layers_;
  Tensor proj_;            // (B,T,C) h: o_proj / down_proj output before the residual add
  Tensor lnf_, lnf_rstd_;  // (B,T,C) h, (B,T)
  Tensor logits_, losses_, loss_;
  // Backward scratch, reused by every layer.
  Tensor dresidual_, dresidual_h_;  // (B,T,C) f32, and its h copy (16-bit policies)
  Tensor dln_;                      // (B,T,C) f32: gradient of an RMSNorm output
  Tensor dwide_;                    // (B,T,max(F,W)) h: dact, then dqkv
  Tensor datty_;                    // (B,T,C) h
  Tensor frozen_norm_dw_;           // (C) f32: where a frozen RMSNorm's weight gradient goes

  model_util::ForwardBatch batch_;
};

}  // namespace ct
