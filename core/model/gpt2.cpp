// GPT-2: the parameter table, construction, the per-block parameter views and the
// initialisation scheme; the parameter store, upload / download and the trainable set are
// ModelBase's (core/model/model_base.h). forward is in gpt2_forward.cpp, backward in
// gpt2_backward.cpp, the activation buffers in gpt2_memory.cpp, the LoRA sites in gpt2_lora.cpp.
#include "core/model/gpt2.h"

#include <cmath>

#include "core/error.h"
#include "core/model/model_util.h"

namespace ct {

// =============================================================================================
// The parameter table

std::vector<ParamInfo> gpt2_param_table(const GPT2Config& cfg) {
  const int64_t C = cfg.n_embd, V = cfg.vocab_size, maxT = cfg.block_size;
  model_util::TableBuilder table;
  auto add = [&](const std::string& name, Shape shape, bool decay) {
    table.add(name, shape, decay);
  };
  auto h = [](int l, const char* rest) { return "h." + std::to_string(l) + "." + rest; };

  // Weight-decayed group: embeddings and matmul weights.
  add("wte.weight", {V, C}, true);
  add("wpe.weight", {maxT, C}, true);
  for (int l = 0; l < cfg.n_layer; ++l) {
    add(h(l, "attn.c_attn.weight"), {C, 3 * C}, true);
    add(h(l, "attn.c_proj.weight"), {C, C}, true);
    add(h(l, "mlp.c_fc.weight"), {C, 4 * C}, true);
    add(h(l, "mlp.c_proj.weight"), {4 * C, C}, true);
  }
  // No decay: biases and LayerNorm parameters.
  for (int l = 0; l < cfg.n_layer; ++l) {
    add(h(l, "ln_1.weight"), {C}, false);
    add(h(l, "ln_1.bias"), {C}, false);
    add(h(l, "attn.c_attn.bias"), {3 * C}, false);
    add(h(l, "attn.c_proj.bias"), {C}, false);
    add(h(l, "ln_2.weight"), {C}, false);
    add(h(l, "ln_2.bias"), {C}, false);
    add(h(l, "mlp.c_fc.bias"), {4 * C}, false);
    add(h(l, "mlp.c_proj.bias"), {C}, false);
  }
  add("ln_f.weight", {C}, false);
  add("ln_f.bias", {C}, false);
  return table.take();
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

// =============================================================================================
// Construction and parameter access

GPT2::GPT2(Device& device, const GPT2Config& config, bool with_grads, const ModelOptions& options)
    : ModelBase(device, options, "GPT-2", 4), config_(config) {
  config_.validate();
  options_.lora = resolved_lora(options_.lora);
  check_policy();
  build_param_store(gpt2_param_table(config_), config_.num_parameters(), lora_sites(config_),
                    config_.n_layer, config_.n_embd, with_grads, "wte.weight");
}

std::string GPT2::config_mismatch(const nlohmann::json& saved_json) const {
  if (!saved_json.is_object() || saved_json.value("model_type", "gpt2") != "gpt2")
    return "a " + saved_json.value("model_type", std::string("?")) + " model, not this run's gpt2";
  GPT2Config saved = GPT2Config::from_hf_json(saved_json);
  // The special token ids name tokens, not shapes (and older checkpoints have none).
  saved.bos_token_id = config_.bos_token_id;
  saved.eos_token_id = config_.eos_token_id;
  if (saved == config_) return "";
  return "a different model (" + saved.str() + ") than this run's (" + config_.str() + ")";
}

bool GPT2::is_ignored_buffer(const std::string& name) const {
  return name.find(".attn.bias") != std::string::npos ||
         name.find(".attn.masked_bias") != std::string::npos;
}

void GPT2::check_policy() const {
  const std::pair<OpKind, const char*> needed[] = {{OpKind::kCopy, "copy"},
                                                   {OpKind::kAdd, "add"},
                                                   {OpKind::kLayerNorm, "layernorm"},
                                                   {OpKind::kMatmul, "matmul"},
                                                   {OpKind::kBiasGrad, "bias_backward"},
                                                   {OpKind::kAttention, "attention"},
                                                   {OpKind::kGelu, "gelu"},
                                                   {OpKind::kCrossEntropy, "crossentropy"}};
  ModelBase::check_policy(needed);
}

int64_t GPT2::base_weight_bytes(const GPT2Config& config, const ModelOptions& options) {
  return param_store_bytes(gpt2_param_table(config), options,
                           head_padding(config.vocab_size, config.n_embd));
}

GPT2::LayerParams GPT2::layer_params(const Tensor& flat, int l) const {
  const std::string h = "h." + std::to_string(l) + ".";
  auto v = [&](const char* rest) { return table_view(flat, h + rest); };
  return {v("ln_1.weight"),      v("ln_1.bias"),          v("attn.c_attn.weight"),
          v("attn.c_attn.bias"), v("attn.c_proj.weight"), v("attn.c_proj.bias"),
          v("ln_2.weight"),      v("ln_2.bias"),          v("mlp.c_fc.weight"),
          v("mlp.c_fc.bias"),    v("mlp.c_proj.weight"),  v("mlp.c_proj.bias")};
}

GPT2::LayerParams GPT2::forward_params(int l) const {
  if (base16()) {  // matrices from the 16-bit base, vectors from their widened copy
    const std::string h = "h." + std::to_string(l) + ".";
    auto v = [&](const char* rest) { return param(h + rest); };
    return {v("ln_1.weight"),      v("ln_1.bias"),          v("attn.c_attn.weight"),
            v("attn.c_attn.bias"), v("attn.c_proj.weight"), v("attn.c_proj.bias"),
            v("ln_2.weight"),      v("ln_2.bias"),          v("mlp.c_fc.weight"),
            v("mlp.c_fc.bias"),    v("mlp.c_proj.weight"),  v("mlp.c_proj.bias")};
  }
  LayerParams p = layer_params(params_, l);
  if (options_.policy.mixed()) {
    const LayerParams c = layer_params(compute_, l);
    p.qkvw = c.qkvw;
    p.attprojw = c.attprojw;
    p.fcw = c.fcw;
    p.fcprojw = c.fcprojw;
  }
  return p;
}

// =============================================================================================
// Initialisation (ModelBase::init)

// Matrices and embeddings: N(0, 0.02), the residual projections scaled down.
float GPT2::init_stddev(const ParamInfo& p) const {
  const float proj_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(config_.n_layer));
  float stddev = 0.02f;
  if (ends_with(p.name, "attn.c_proj.weight") || ends_with(p.name, "mlp.c_proj.weight"))
    stddev *= proj_scale;
  return stddev;
}

// LayerNorm weights 1; biases (LayerNorm and linear) 0.
float GPT2::init_fill(const ParamInfo& p) const {
  bool is_ln_weight = p.name.find(".ln_") != std::string::npos || p.name.rfind("ln_f", 0) == 0;
  return is_ln_weight && ends_with(p.name, ".weight") ? 1.0f : 0.0f;
}

int GPT2::gradient_stage(const std::string& name) const {
  if (int l = block_in_name(name, "h."); l >= 0) return l;
  return name.rfind("ln_f.", 0) == 0 ? config_.n_layer : kFinalAtEnd;
}

}  // namespace ct
