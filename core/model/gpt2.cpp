// GPT-2: the parameter table, construction, initialisation, the compute-weight copy, and the host
// helpers (checkpoints, sampling). forward is in gpt2_forward.cpp, backward in
// gpt2_backward.cpp, the activation buffers in gpt2_memory.cpp. The host never touches device
// data except in the explicit host helpers.
#include "core/model/gpt2.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/model/model_util.h"
#include "core/philox.h"

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

GPT2::GPT2(Device& device, const GPT2Config& config, bool with_grads, const GPT2Options& options)
    : device_(device), config_(config), options_(options) {
  config_.validate();
  options_.lora = resolved_lora(options_.lora);
  check_policy();
  table_ = gpt2_param_table(config_);
  for (size_t i = 0; i < table_.size(); ++i) {
    index_[table_[i].name] = i;
    num_params_ += table_[i].numel;
    if (table_[i].decay) decay_count_ += table_[i].numel;
  }
  CT_CHECK(num_params_ == config_.num_parameters(), "parameter table disagrees with config");
  if (!base16()) params_ = device_.empty({num_params_}, DType::f32, MemCategory::kWeights);
  compute_ = options_.policy.mixed()
                 ? device_.empty({num_params_}, options_.policy.compute, MemCategory::kWeights)
                 : params_;
  if (base16())
    small_ = device_.empty({num_params_ - decay_count_}, DType::f32, MemCategory::kWeights);
  if (options_.lora.enabled()) {
    // The base is frozen: gradients (and so optimizer state) for the adapters only.
    lora_ = std::make_unique<LoraAdapters>(device_, options_.lora, lora_sites(config_),
                                           config_.n_layer, config_.n_embd, options_.policy.compute,
                                           with_grads, "GPT-2");
  } else if (with_grads) {
    grads_ = device_.empty({num_params_}, DType::f32, MemCategory::kGrads);
  }
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
  const PrecisionPolicy& pp = options_.policy;
  const std::pair<OpKind, const char*> needed[] = {{OpKind::kCopy, "copy"},
                                                   {OpKind::kAdd, "add"},
                                                   {OpKind::kLayerNorm, "layernorm"},
                                                   {OpKind::kMatmul, "matmul"},
                                                   {OpKind::kBiasGrad, "bias_backward"},
                                                   {OpKind::kAttention, "attention"},
                                                   {OpKind::kGelu, "gelu"},
                                                   {OpKind::kCrossEntropy, "crossentropy"}};
  const DType want = model_util::check_policy(device_, pp, "GPT-2", needed);
  if (base16() && !device_.supports(OpKind::kEmbedding, want))
    fail(ErrorKind::kUnsupported, "--" + pp.name() + " with LoRA: device " + device_.info().id() +
                                      " has no embedding op with " + dtype_name(want) +
                                      " tables (the frozen base is held in 16 bits)");
}

void GPT2::refresh_compute_weights() {
  if (!options_.policy.mixed()) return;
  if (lora())
    lora_->refresh_compute();  // the frozen base does not change
  else
    device_.copy(compute_, params_);
}

const ParamInfo& GPT2::param_info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    fail(ErrorKind::kInvalidArgument, "GPT-2 has no parameter named '" + name + "'");
  return table_[it->second];
}

Tensor GPT2::table_view(const Tensor& flat, const std::string& name) const {
  const ParamInfo& p = param_info(name);
  return flat.slice_flat(p.offset, p.shape);
}

Tensor GPT2::grads_flat() const {
  if (!grads_.defined())
    fail(ErrorKind::kInvalidArgument, "this GPT2 was created without gradients");
  return grads_;
}
Tensor GPT2::param(const std::string& name) const {
  if (!base16()) return table_view(params_, name);
  const ParamInfo& p = param_info(name);
  if (p.offset < decay_count_) return compute_.slice_flat(p.offset, p.shape);
  return small_.slice_flat(p.offset - decay_count_, p.shape);
}

int64_t GPT2::base_weight_bytes(const GPT2Config& config, const GPT2Options& options) {
  const int64_t n = config.num_parameters();
  if (!options.policy.mixed()) return n * 4;
  const int64_t h = static_cast<int64_t>(dtype_size(options.policy.compute));
  if (!options.lora.enabled()) return n * (4 + h);  // base16(): the base in 16 bits only
  int64_t no_decay = 0;
  for (const ParamInfo& p : gpt2_param_table(config))
    if (!p.decay) no_decay += p.numel;
  return n * h + no_decay * 4;
}
Tensor GPT2::grad(const std::string& name) const {
  return table_view(grads_flat(), name);
}
Tensor GPT2::params_decay() const {
  return params_.slice_flat(0, {decay_count_});
}
Tensor GPT2::params_no_decay() const {
  return params_.slice_flat(decay_count_, {num_params_ - decay_count_});
}
Tensor GPT2::grads_decay() const {
  return grads_flat().slice_flat(0, {decay_count_});
}
Tensor GPT2::grads_no_decay() const {
  return grads_flat().slice_flat(decay_count_, {num_params_ - decay_count_});
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

void GPT2::zero_grad() {
  device_.fill(trainable_grads(), 0.0f);
}

// =============================================================================================
// Initialisation

void GPT2::init(uint64_t seed) {
  std::vector<float> host(static_cast<size_t>(num_params_));
  const float proj_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(config_.n_layer));
  for (size_t k = 0; k < table_.size(); ++k) {
    const ParamInfo& p = table_[k];
    float* dst = host.data() + p.offset;
    if (p.decay) {  // matrices and embeddings: N(0, 0.02), residual projections scaled down
      float stddev = 0.02f;
      if (ends_with(p.name, "attn.c_proj.weight") || ends_with(p.name, "mlp.c_proj.weight"))
        stddev *= proj_scale;
      Philox rng(seed, k);
      for (int64_t j = 0; j < p.numel; ++j) dst[j] = stddev * rng.normal(static_cast<uint64_t>(j));
    } else {  // LayerNorm weights 1; biases (LayerNorm and linear) 0
      bool is_ln_weight = p.name.find(".ln_") != std::string::npos || p.name.rfind("ln_f", 0) == 0;
      float value = is_ln_weight && ends_with(p.name, ".weight") ? 1.0f : 0.0f;
      std::fill(dst, dst + p.numel, value);
    }
  }
  upload_params(host);
  if (lora()) lora_->init(seed, table_.size());
  if (grads_.defined() || (lora() && lora_->trains())) zero_grad();
}

// =============================================================================================
// Host helpers: checkpoints and sampling

std::vector<float> GPT2::download_params() const {
  if (base16()) return model_util::download_widened(device_, compute_);  // the 16-bit base
  std::vector<float> host(static_cast<size_t>(num_params_));
  device_.download(host.data(), params_, host.size() * sizeof(float));
  return host;
}

std::vector<float> GPT2::download_grads() const {
  std::vector<float> host(static_cast<size_t>(num_params_));
  device_.download(host.data(), grads_flat(), host.size() * sizeof(float));
  return host;
}

std::map<std::string, std::vector<float>> GPT2::download_param_map() const {
  return model_util::split(table_, download_params());
}

void GPT2::upload_params(const std::vector<float>& flat) {
  CT_REQUIRE(static_cast<int64_t>(flat.size()) == num_params_,
             "upload_params: got " + std::to_string(flat.size()) + " values, the model has " +
                 std::to_string(num_params_));
  if (base16()) {  // rounded to nearest even on the host: no f32 copy on the device
    model_util::upload_rounded(device_, compute_, flat);
    device_.copy(small_, compute_.slice_flat(decay_count_, {num_params_ - decay_count_}));
    return;
  }
  device_.upload(params_, flat.data(), flat.size() * sizeof(float));
  if (options_.policy.mixed()) device_.copy(compute_, params_);
}

void GPT2::upload_params(const std::map<std::string, std::vector<float>>& named) {
  upload_params(model_util::flatten(table_, num_params_, named));
}

}  // namespace ct
