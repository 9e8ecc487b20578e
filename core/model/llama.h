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
// Mixed precision follows ModelBase's scheme (core/model/model_base.h, core/amp/precision.h): the
// f32 buffer is the master copy, a policy.compute copy feeds the matmuls, RMSNorm weights, biases
// and the embedding lookup read the master, gradients are f32.
//
// LoRA (ModelOptions::lora, core/model/lora.h) adapts any of q_proj, k_proj, v_proj, o_proj,
// gate_proj, up_proj, down_proj as PEFT does (default q_proj and v_proj); the base is then frozen
// (no gradients, no optimizer state) and the adapters are what trainable_*() return. The fused
// q|k|v and gate|up projections take each adapter's update in their columns of the fused output.
// Under a mixed policy the frozen base is held in 16 bits only (base16(), as GPT-2's): no f32
// master, the embedding lookup reads the 16-bit table, and the RMSNorm weights and biases (the
// no-decay region) are widened once into an f32 buffer for the ops that take them in f32.
//
// Gradient checkpointing (ModelOptions::gradient_checkpointing) keeps only the residual stream
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
#include "core/model/model_base.h"
#include "core/tensor.h"

namespace ct {

// The parameter table for a config, in flat-buffer order (tensor k of it draws its initial
// values from Philox stream k).
std::vector<ParamInfo> llama_param_table(const LlamaConfig& config);

class Llama final : public ModelBase {
 public:
  // Allocates parameters (kWeights; with a 16-bit policy also the compute copy), the rotary
  // tables and, if with_grads, gradients (kGrads). Validates the config; throws
  // Error(kUnsupported) naming the op when the device lacks one the policy's dtype needs.
  Llama(Device& device, const LlamaConfig& config, bool with_grads = true,
        const ModelOptions& options = {});
  Llama(const Llama&) = delete;
  Llama& operator=(const Llama&) = delete;

  const LlamaConfig& config() const { return config_; }
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
  // RMSNorm weights 1 (ModelBase::init). Also zeroes the gradients.
  float init_stddev(const ParamInfo& p) const override;
  float init_fill(const ParamInfo& p) const override;
  // Layer l's rows (and adapters) after layer l, model.norm and an untied lm_head before the
  // layers, embed_tokens (also a tied head) at the end.
  int gradient_stage(const std::string& name) const override;

  void allocate_activations(int max_batch, int max_seq) override;
  // Bytes of MemCategory::kActivations that allocate_activations(B, T) allocates, counted from
  // the list of tensors and their dtypes independently of the allocation code.
  static int64_t activation_bytes(const LlamaConfig& config, const ModelOptions& options, int B,
                                  int T, bool with_grads = true);

  // forward as GPT-2's (ModelBase's): tokens, targets [B,T] i32; returns the mean loss [1] f32
  // when targets are given; backward adds dloss_scale * d(mean loss) into grads_flat().
  void backward(float dloss_scale = 1.0f) override;

  // Bytes of kWeights the base parameters and rotary tables take for `options` (f32 master and
  // 16-bit copy, or the 16-bit base and its widened no-decay region), adapters not included.
  static int64_t base_weight_bytes(const LlamaConfig& config, const ModelOptions& options);
  // How many adapter parameters `lora` adds to a model of `config` (0 when not enabled).
  static int64_t lora_parameter_count(const LlamaConfig& config, const LoraOptions& lora);
  std::string peft_prefix() const override { return "base_model.model."; }
  bool peft_fan_in_fan_out() const override { return false; }  // nn.Linear: W is [out, in]
  // The layers LoRA may adapt, site l * 7 + m: "model.layers.<l>." + self_attn.{q,k,v,o}_proj,
  // mlp.{gate,up,down}_proj; q/k/v write columns of the fused q|k|v output, gate/up of gate|up.
  static std::vector<LoraSite> lora_sites(const LlamaConfig& config);
  static constexpr int kLoraSitesPerLayer = 7;
  static LoraOptions resolved_lora(LoraOptions lora);  // empty targets -> q_proj, v_proj

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
  // lm_head.weight, or embed_tokens when tied: [padded_vocab, C] with the zero rows
  Tensor head_weight(const Tensor& flat) const;
  const LayerActs& acts(int l) const {
    return layers_[options_.gradient_checkpointing ? 0 : static_cast<size_t>(l)];
  }
  // Layer l from residuals_[l]: fills acts(l) and, unless recompute, residuals_[l + 1] and the
  // RMSNorm that reads it (input_norm(l + 1)), fused with the residual add. So layer l > 0 finds
  // its ln1 done, except when it recomputes. kv_pos >= 0 (forward_cached, B = 1): the T rows
  // are positions [kv_pos, kv_pos + T), rotated as such, their qkv go to the key/value cache
  // and their attention reads it.
  void block_forward(int l, int B, int T, bool recompute, int kv_pos) override;
  // x (B,T,C) f32 = embed_tokens[tokens] (master weights; the positions enter by the rotation)
  void embed(const Tensor& x, const Tensor& tokens, int pos) override;
  Tensor lm_head() const override { return head_weight(compute_); }
  NetShape net_shape() const override;
  // The RMSNorm that reads residuals_[l]: layer l's input norm, or model.norm for l = n_layer.
  struct NormSite {
    Tensor out, rstd, w;  // (BT,C) h, (BT), (C)
  };
  NormSite input_norm(int l, int64_t BT) const;
  void check_policy() const;
  // dinp (=) dout @ w for linear layer `site` of layer l (one site, dinp of any dtype), plus the
  // weight gradient unless frozen, plus the adapter's part.
  void linear_bwd(int l, int site, const Tensor& dinp, const Tensor& dw, const Tensor& dout,
                  const Tensor& inp, const Tensor& w) const;

  LlamaConfig config_;
  Tensor rope_cos_, rope_sin_;  // [block_size, hd/2] f32

  // Activations (ModelBase holds the residual stream and the head's).
  std::vector<LayerActs> layers_;
  Tensor proj_;      // (B,T,C) h: o_proj / down_proj output before the residual add
  Tensor lnf_rstd_;  // (B,T): model.norm's statistics (lnf_ is ModelBase's)
  // Backward scratch, reused by every layer (and ModelBase's dresidual_).
  Tensor dln_;             // (B,T,C) f32: gradient of an RMSNorm output
  Tensor dwide_;           // (B,T,max(F,W)) h: dact, then dqkv
  Tensor datty_;           // (B,T,C) h
  Tensor frozen_norm_dw_;  // (C) f32: where a frozen RMSNorm's weight gradient goes
};

}  // namespace ct
