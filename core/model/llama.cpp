// Llama: the parameter table, construction, the per-layer parameter views, the initialisation
// scheme, the LoRA sites and the activation buffers; the parameter store, upload / download and
// the trainable set are ModelBase's (core/model/model_base.h). forward and backward are in
// llama_forward.cpp and llama_backward.cpp.
#include "core/model/llama.h"

#include <algorithm>

#include "core/error.h"
#include "core/model/model_util.h"

namespace ct {

// =============================================================================================
// The parameter table

std::vector<ParamInfo> llama_param_table(const LlamaConfig& cfg) {
  const int64_t C = cfg.n_embd, V = cfg.vocab_size, F = cfg.intermediate_size;
  const int64_t hd = cfg.head_dim(), Q = int64_t{cfg.n_head} * hd, KV = int64_t{cfg.n_kv_head} * hd;
  model_util::TableBuilder table;
  auto add = [&](const std::string& name, Shape shape, bool decay) {
    table.add(name, shape, decay);
  };
  auto layer = [](int l, const char* rest) {
    return "model.layers." + std::to_string(l) + "." + rest;
  };

  // Weight-decayed group: the embedding and the linear weights ([out, in]).
  add("model.embed_tokens.weight", {V, C}, true);
  for (int l = 0; l < cfg.n_layer; ++l) {
    add(layer(l, "self_attn.q_proj.weight"), {Q, C}, true);
    add(layer(l, "self_attn.k_proj.weight"), {KV, C}, true);
    add(layer(l, "self_attn.v_proj.weight"), {KV, C}, true);
    add(layer(l, "self_attn.o_proj.weight"), {C, Q}, true);
    add(layer(l, "mlp.gate_proj.weight"), {F, C}, true);
    add(layer(l, "mlp.up_proj.weight"), {F, C}, true);
    add(layer(l, "mlp.down_proj.weight"), {C, F}, true);
  }
  if (!cfg.tie_word_embeddings) add("lm_head.weight", {V, C}, true);
  // No decay: RMSNorm weights and biases.
  for (int l = 0; l < cfg.n_layer; ++l) {
    add(layer(l, "input_layernorm.weight"), {C}, false);
    add(layer(l, "post_attention_layernorm.weight"), {C}, false);
    if (cfg.attention_bias) {
      add(layer(l, "self_attn.q_proj.bias"), {Q}, false);
      add(layer(l, "self_attn.k_proj.bias"), {KV}, false);
      add(layer(l, "self_attn.v_proj.bias"), {KV}, false);
    }
  }
  add("model.norm.weight", {C}, false);
  return table.take();
}

// =============================================================================================
// Construction and parameter access

Llama::Llama(Device& device, const LlamaConfig& config, bool with_grads,
             const ModelOptions& options)
    : ModelBase(device, options, "Llama", kLoraSitesPerLayer), config_(config) {
  config_.validate();
  options_.lora = resolved_lora(options_.lora);
  check_policy();
  build_param_store(llama_param_table(config_), config_.num_parameters(), lora_sites(config_),
                    config_.n_layer, config_.n_embd, with_grads,
                    config_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  // The rotary tables for every position of the block, computed as transformers computes them.
  std::vector<float> cs, sn;
  config_.rope_tables(config_.block_size, cs, sn);
  const int64_t half = config_.head_dim() / 2;
  rope_cos_ = device_.empty({config_.block_size, half}, DType::f32, MemCategory::kWeights);
  rope_sin_ = device_.empty({config_.block_size, half}, DType::f32, MemCategory::kWeights);
  device_.upload(rope_cos_, cs.data(), cs.size() * sizeof(float));
  device_.upload(rope_sin_, sn.data(), sn.size() * sizeof(float));
}

std::string Llama::config_mismatch(const nlohmann::json& saved_json) const {
  const std::string type =
      saved_json.is_object() ? saved_json.value("model_type", std::string("?")) : "?";
  if (type != config_.model_type)
    return "a " + type + " model, not this run's " + config_.model_type;
  LlamaConfig saved = LlamaConfig::from_hf_json(saved_json);
  saved.bos_token_id = config_.bos_token_id;  // token ids, not shapes
  saved.eos_token_id = config_.eos_token_id;
  if (saved == config_) return "";
  return "a different model (" + saved.str() + ") than this run's (" + config_.str() + ")";
}

bool Llama::is_ignored_buffer(const std::string& name) const {
  return name.find("rotary_emb.inv_freq") != std::string::npos;  // older transformers saved it
}

void Llama::check_policy() const {
  const std::pair<OpKind, const char*> needed[] = {{OpKind::kCopy, "copy"},
                                                   {OpKind::kAdd, "add"},
                                                   {OpKind::kRMSNorm, "rmsnorm"},
                                                   {OpKind::kMatmul, "matmul"},
                                                   {OpKind::kBiasGrad, "bias_backward"},
                                                   {OpKind::kAttention, "attention"},
                                                   {OpKind::kRope, "rope"},
                                                   {OpKind::kSwiGLU, "swiglu"},
                                                   {OpKind::kCrossEntropy, "crossentropy"}};
  ModelBase::check_policy(needed);
}

int64_t Llama::base_weight_bytes(const LlamaConfig& config, const ModelOptions& options) {
  const int64_t rope = 2 * int64_t{config.block_size} * (config.head_dim() / 2) * 4;
  return param_store_bytes(llama_param_table(config), options,
                           head_padding(config.vocab_size, config.n_embd)) +
         rope;
}

int64_t Llama::lora_parameter_count(const LlamaConfig& config, const LoraOptions& lora) {
  return LoraAdapters::parameter_count(lora_sites(config), resolved_lora(lora));
}

std::vector<LoraSite> Llama::lora_sites(const LlamaConfig& cfg) {
  const int64_t C = cfg.n_embd, F = cfg.intermediate_size, W = cfg.qkv_width();
  const int64_t hd = cfg.head_dim(), Q = int64_t{cfg.n_head} * hd, KV = int64_t{cfg.n_kv_head} * hd;
  std::vector<LoraSite> sites;
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    sites.push_back({p + "self_attn.q_proj", C, Q, W, 0});
    sites.push_back({p + "self_attn.k_proj", C, KV, W, Q});
    sites.push_back({p + "self_attn.v_proj", C, KV, W, Q + KV});
    sites.push_back({p + "self_attn.o_proj", Q, C});
    sites.push_back({p + "mlp.gate_proj", C, F, 2 * F, 0});
    sites.push_back({p + "mlp.up_proj", C, F, 2 * F, F});
    sites.push_back({p + "mlp.down_proj", F, C});
  }
  return sites;
}

LoraOptions Llama::resolved_lora(LoraOptions lora) {
  if (lora.target_modules.empty()) lora.target_modules = {"q_proj", "v_proj"};  // PEFT's default
  return lora;
}

Tensor Llama::head_weight(const Tensor& flat) const {
  return head_view(flat);
}

// The fused projections are views spanning adjacent table rows: q|k|v weights (and biases) and
// gate|up weights.
Llama::LayerParams Llama::layer_params(const Tensor& flat, int l) const {
  const std::string p = "model.layers." + std::to_string(l) + ".";
  const int64_t C = config_.n_embd, W = config_.qkv_width(), F = config_.intermediate_size;
  auto at = [&](const char* rest) { return param_info(p + rest).offset; };
  LayerParams lp;
  lp.ln1w = table_view(flat, p + "input_layernorm.weight");
  lp.qkvw = flat.slice_flat(at("self_attn.q_proj.weight"), {W, C});
  if (config_.attention_bias) lp.qkvb = flat.slice_flat(at("self_attn.q_proj.bias"), {W});
  lp.ow = table_view(flat, p + "self_attn.o_proj.weight");
  lp.ln2w = table_view(flat, p + "post_attention_layernorm.weight");
  lp.guw = flat.slice_flat(at("mlp.gate_proj.weight"), {2 * F, C});
  lp.downw = table_view(flat, p + "mlp.down_proj.weight");
  return lp;
}

Llama::LayerParams Llama::forward_params(int l) const {
  LayerParams p = layer_params(compute_, l);  // params_ itself for fp32
  const std::string n = "model.layers." + std::to_string(l) + ".";
  p.ln1w = param(n + "input_layernorm.weight");
  p.ln2w = param(n + "post_attention_layernorm.weight");
  if (config_.attention_bias)
    p.qkvb = vector_view(param_info(n + "self_attn.q_proj.bias").offset, {config_.qkv_width()});
  return p;
}

// =============================================================================================
// Initialisation (ModelBase::init)

// Linear weights and the embedding: N(0, initializer_range 0.02).
float Llama::init_stddev(const ParamInfo&) const {
  return 0.02f;
}

// RMSNorm weights 1, biases 0.
float Llama::init_fill(const ParamInfo& p) const {
  const bool norm = p.name.find("layernorm") != std::string::npos || p.name == "model.norm.weight";
  return norm ? 1.0f : 0.0f;
}

int Llama::gradient_stage(const std::string& name) const {
  if (int l = block_in_name(name, "model.layers."); l >= 0) return l;
  const bool head_side = name == "model.norm.weight" || name == "lm_head.weight";
  return head_side ? config_.n_layer : kFinalAtEnd;
}

// =============================================================================================
// Activation buffers

void Llama::allocate_activations(int max_batch, int max_seq) {
  CT_REQUIRE(max_batch >= 1 && max_seq >= 1 && max_seq <= config_.block_size,
             "allocate_activations: batch " + std::to_string(max_batch) + " x sequence " +
                 std::to_string(max_seq) + " outside [1, block_size " +
                 std::to_string(config_.block_size) + "]");
  max_b_ = max_batch;
  max_t_ = max_seq;
  const int64_t B = max_batch, T = max_seq, BT = B * T;
  release_activations();  // the old buffers go first: the peak holds one set
  layers_.clear();
  const int64_t C = config_.n_embd, F = config_.intermediate_size;
  const int64_t W = config_.qkv_width(), NH = config_.n_head;
  const DType h = options_.policy.activations;
  auto act = [&](Shape s, DType dt) { return device_.empty(s, dt, MemCategory::kActivations); };
  allocate_residuals(config_.n_layer, BT, C);
  const int sets = options_.gradient_checkpointing ? 1 : config_.n_layer;
  for (int s = 0; s < sets; ++s) {
    LayerActs a;
    a.ln1 = act({BT * C}, h);
    a.ln1_rstd = act({BT}, DType::f32);
    a.qkv = act({BT * W}, h);
    if (options_.fused_attention)
      a.lse = act({B * NH * T}, DType::f32);
    else
      a.att = act({B * NH * T * T}, h);
    a.atty = act({BT * C}, h);
    a.residual2 = act({BT * C}, DType::f32);
    a.ln2 = act({BT * C}, h);
    a.ln2_rstd = act({BT}, DType::f32);
    a.gu = act({BT * 2 * F}, h);
    a.act = act({BT * F}, h);
    layers_.push_back(a);
  }
  proj_ = act({BT * C}, h);
  lnf_ = act({BT * C}, h);
  lnf_rstd_ = act({BT}, DType::f32);
  allocate_head(BT);
  if (lora()) {
    lora_->allocate(BT, h, trains());
    if (trains()) frozen_norm_dw_ = act({C}, DType::f32);
  }
  if (trains()) {
    allocate_dresidual(BT, C);
    dln_ = act({BT * C}, DType::f32);
    dwide_ = act({BT * std::max(F, W)}, h);
    datty_ = act({BT * C}, h);
  }
}

int64_t Llama::activation_bytes(const LlamaConfig& config, const ModelOptions& options, int B,
                                int T, bool with_grads) {
  const int64_t BT = int64_t{B} * T, C = config.n_embd, V = padded_vocab_size(config.vocab_size);
  const int64_t F = config.intermediate_size, W = config.qkv_width(), NH = config.n_head;
  const int64_t h = static_cast<int64_t>(dtype_size(options.policy.activations)), f = 4;
  const int64_t per_layer = BT * C * h + BT * f  // ln1, its rstd
                            + BT * W * h         // qkv
                            + (options.fused_attention ? B * NH * T * f : B * NH * T * T * h) +
                            BT * C * h + BT * C * f         // atty, residual2
                            + BT * C * h + BT * f           // ln2, its rstd
                            + BT * 2 * F * h + BT * F * h;  // gu, act
  const int64_t sets = options.gradient_checkpointing ? 1 : config.n_layer;
  int64_t total = (config.n_layer + 1) * BT * C * f + sets * per_layer;
  total += BT * C * h + BT * C * h + BT * f + BT * V * h + BT * f + f;  // proj, lnf, logits, loss
  if (with_grads) {
    total += BT * C * f + BT * C * f;                 // dresidual, dln
    if (options.policy.mixed()) total += BT * C * h;  // dresidual_h
    total += BT * std::max(F, W) * h + BT * C * h;    // dwide, datty
  }
  if (options.lora.enabled())  // the adapters' scratch, and the frozen norms' gradient sink
    total += LoraAdapters::activation_bytes(lora_sites(config), resolved_lora(options.lora), BT,
                                            options.policy.activations, with_grads) +
             (with_grads ? C * f : 0);
  return total;
}

}  // namespace ct
