#include "core/model/llama_config.h"

#include <cmath>
#include <numbers>
#include <sstream>

#include "core/error.h"

namespace ct {

namespace {

LlamaConfig make_preset(int L, int NH, int NKV, int C, int F, int block, int V, bool tied, int bos,
                        int eos) {
  LlamaConfig c;
  c.n_layer = L;
  c.n_head = NH;
  c.n_kv_head = NKV;
  c.n_embd = C;
  c.intermediate_size = F;
  c.block_size = block;
  c.vocab_size = V;
  c.tie_word_embeddings = tied;
  c.bos_token_id = bos;
  c.eos_token_id = eos;
  return c;
}

struct Preset {
  const char* name;
  LlamaConfig config;
};

const std::vector<Preset>& presets() {
  // llama-tiny: GPT-2 tiny's size with 3 query heads per KV head and an untied head (so the
  // tests cover lm_head); smollm-135m: HuggingFaceTB/SmolLM-135M's config.json.
  static const std::vector<Preset> kPresets = {
      {"llama-tiny", make_preset(6, 6, 2, 384, 1024, 256, 256, false, -1, -1)},
      {"smollm-135m", make_preset(30, 9, 3, 576, 1536, 2048, 49152, true, 0, 0)},
  };
  return kPresets;
}

void require_positive(int value, const char* field) {
  if (value <= 0)
    fail(ErrorKind::kInvalidArgument,
         std::string(field) + " must be positive, got " + std::to_string(value));
}

}  // namespace

LlamaConfig LlamaConfig::preset(const std::string& name) {
  for (const Preset& p : presets())
    if (name == p.name) return p.config;
  std::string list;
  for (const Preset& p : presets()) list += std::string(list.empty() ? "" : ", ") + p.name;
  fail(ErrorKind::kInvalidArgument, "unknown Llama preset '" + name + "' (presets: " + list + ")");
}

std::vector<std::string> LlamaConfig::preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : presets()) names.push_back(p.name);
  return names;
}

void LlamaConfig::validate() const {
  require_positive(n_layer, "num_hidden_layers");
  require_positive(n_head, "num_attention_heads");
  require_positive(n_kv_head, "num_key_value_heads");
  require_positive(n_embd, "hidden_size");
  require_positive(intermediate_size, "intermediate_size");
  require_positive(block_size, "max_position_embeddings");
  require_positive(vocab_size, "vocab_size");
  if (n_embd % n_head != 0)
    fail(ErrorKind::kInvalidArgument, "num_attention_heads " + std::to_string(n_head) +
                                          " does not divide hidden_size " + std::to_string(n_embd));
  if (n_head % n_kv_head != 0)
    fail(ErrorKind::kInvalidArgument, "num_key_value_heads " + std::to_string(n_kv_head) +
                                          " does not divide num_attention_heads " +
                                          std::to_string(n_head));
  if (head_dim() % 2 != 0)
    fail(ErrorKind::kInvalidArgument,
         "the head size hidden_size / num_attention_heads = " + std::to_string(head_dim()) +
             " must be even for the rotary embedding");
  if (!(rms_norm_eps > 0.0f)) fail(ErrorKind::kInvalidArgument, "rms_norm_eps must be positive");
  if (!(rope_theta > 1.0f)) fail(ErrorKind::kInvalidArgument, "rope_theta must be above 1");
  if (rope_llama3) {
    const Llama3RopeScaling& s = rope_llama3_scaling;
    if (!(s.factor > 0.0f) || !(s.low_freq_factor > 0.0f) ||
        !(s.high_freq_factor > s.low_freq_factor) || s.original_max_position_embeddings <= 0)
      fail(ErrorKind::kInvalidArgument,
           "rope_scaling (llama3): factor, low_freq_factor and original_max_position_embeddings "
           "must be positive and high_freq_factor above low_freq_factor");
  }
  if (model_type != "llama" && model_type != "mistral" && model_type != "qwen2")
    fail(ErrorKind::kInvalidArgument,
         "model_type '" + model_type + "' is not one of llama, mistral, qwen2");
}

int64_t LlamaConfig::num_parameters() const {
  const int64_t C = n_embd, F = intermediate_size, V = vocab_size, L = n_layer;
  const int64_t per_layer = 2 * C                                 // the two RMSNorms
                            + C * qkv_width()                     // q_proj, k_proj, v_proj
                            + (attention_bias ? qkv_width() : 0)  // their biases
                            + C * C                               // o_proj
                            + 3 * C * F;                          // gate, up, down
  return V * C + L * per_layer + C + (tie_word_embeddings ? 0 : V * C);
}

nlohmann::json LlamaConfig::to_hf_json() const {
  nlohmann::json j;
  j["model_type"] = model_type;
  const char* arch = model_type == "mistral" ? "MistralForCausalLM"
                     : model_type == "qwen2" ? "Qwen2ForCausalLM"
                                             : "LlamaForCausalLM";
  j["architectures"] = {arch};
  j["num_hidden_layers"] = n_layer;
  j["num_attention_heads"] = n_head;
  j["num_key_value_heads"] = n_kv_head;
  j["hidden_size"] = n_embd;
  j["head_dim"] = head_dim();
  j["intermediate_size"] = intermediate_size;
  j["max_position_embeddings"] = block_size;
  j["vocab_size"] = vocab_size;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  if (rope_llama3) {
    const Llama3RopeScaling& s = rope_llama3_scaling;
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", s.factor},
                         {"low_freq_factor", s.low_freq_factor},
                         {"high_freq_factor", s.high_freq_factor},
                         {"original_max_position_embeddings", s.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = tie_word_embeddings;
  if (model_type == "llama") {
    j["attention_bias"] = attention_bias;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  if (model_type == "mistral") j["sliding_window"] = nullptr;
  if (model_type == "qwen2") j["use_sliding_window"] = false;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = bos_token_id >= 0 ? nlohmann::json(bos_token_id) : nlohmann::json(nullptr);
  j["eos_token_id"] = eos_token_id >= 0 ? nlohmann::json(eos_token_id) : nlohmann::json(nullptr);
  return j;
}

LlamaConfig LlamaConfig::from_hf_json(const nlohmann::json& j) {
  if (!j.is_object()) fail(ErrorKind::kInvalidArgument, "config.json: expected a JSON object");
  if (!j.contains("model_type") || !j["model_type"].is_string())
    fail(ErrorKind::kInvalidArgument, "config.json: missing string 'model_type'");
  LlamaConfig c;
  c.model_type = j["model_type"].get<std::string>();
  if (c.model_type != "llama" && c.model_type != "mistral" && c.model_type != "qwen2")
    fail(ErrorKind::kInvalidArgument, "config.json: model_type \"" + c.model_type +
                                          "\" is not a Llama-family model (llama, mistral, qwen2)");
  auto get_int = [&](const char* key) -> int {
    if (!j.contains(key) || !j[key].is_number_integer())
      fail(ErrorKind::kInvalidArgument, std::string("config.json: missing integer '") + key + "'");
    return j[key].get<int>();
  };
  auto get_num = [&](const char* key, float fallback) -> float {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number())
      fail(ErrorKind::kInvalidArgument, std::string("config.json: '") + key + "' is not a number");
    return j[key].get<float>();
  };
  auto unsupported = [&](const char* key, const std::string& why) {
    fail(ErrorKind::kInvalidArgument, std::string("config.json: '") + key + "': " + j[key].dump() +
                                          " is not supported (" + why + ")");
  };
  auto has = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  c.n_layer = get_int("num_hidden_layers");
  c.n_head = get_int("num_attention_heads");
  c.n_kv_head = has("num_key_value_heads") ? get_int("num_key_value_heads") : c.n_head;
  c.n_embd = get_int("hidden_size");
  c.intermediate_size = get_int("intermediate_size");
  c.block_size = get_int("max_position_embeddings");
  c.vocab_size = get_int("vocab_size");
  c.rms_norm_eps = get_num("rms_norm_eps", 1e-6f);
  c.rope_theta = get_num("rope_theta", 10000.0f);
  if (has("hidden_act") && j["hidden_act"] != "silu")
    unsupported("hidden_act", "the MLP is SwiGLU: silu(gate) * up");
  if (has("head_dim") && !(j["head_dim"].is_number_integer() && c.n_head > 0 &&
                           j["head_dim"].get<int64_t>() == c.n_embd / c.n_head))
    unsupported("head_dim", "the head size is hidden_size / num_attention_heads");
  if (has("mlp_bias") && !(j["mlp_bias"].is_boolean() && !j["mlp_bias"].get<bool>()))
    unsupported("mlp_bias", "the MLP projections have no biases");
  if (has("pretraining_tp") &&
      !(j["pretraining_tp"].is_number_integer() && j["pretraining_tp"].get<int>() == 1))
    unsupported("pretraining_tp", "only 1, the exact computation");
  if (has("rope_scaling")) {
    const auto& rs = j["rope_scaling"];
    const std::string type =
        rs.is_object() && rs.contains("rope_type") && rs["rope_type"].is_string()
            ? rs["rope_type"].get<std::string>()
        : rs.is_object() && rs.contains("type") && rs["type"].is_string()
            ? rs["type"].get<std::string>()
            : "";
    if (type == "default") {
    } else if (type == "llama3") {
      c.rope_llama3 = true;
      auto field = [&](const char* key) -> double {
        if (!rs.contains(key) || !rs[key].is_number())
          fail(ErrorKind::kInvalidArgument,
               std::string("config.json: rope_scaling (llama3) lacks the number '") + key + "'");
        return rs[key].get<double>();
      };
      c.rope_llama3_scaling.factor = static_cast<float>(field("factor"));
      c.rope_llama3_scaling.low_freq_factor = static_cast<float>(field("low_freq_factor"));
      c.rope_llama3_scaling.high_freq_factor = static_cast<float>(field("high_freq_factor"));
      c.rope_llama3_scaling.original_max_position_embeddings =
          static_cast<int>(field("original_max_position_embeddings"));
    } else {
      unsupported("rope_scaling", "only null and rope_type llama3 are implemented");
    }
  }
  if (has("tie_word_embeddings")) {
    if (!j["tie_word_embeddings"].is_boolean())
      fail(ErrorKind::kInvalidArgument, "config.json: 'tie_word_embeddings' is not a boolean");
    c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  } else {
    c.tie_word_embeddings = false;  // the default of LlamaConfig, MistralConfig, Qwen2Config
  }
  if (c.model_type == "qwen2") {
    c.attention_bias = true;  // Qwen2's q/k/v projections always carry biases
    if (has("use_sliding_window") && j["use_sliding_window"] != false)
      unsupported("use_sliding_window", "attention is over the whole block");
  } else if (has("attention_bias")) {
    if (!j["attention_bias"].is_boolean())
      fail(ErrorKind::kInvalidArgument, "config.json: 'attention_bias' is not a boolean");
    c.attention_bias = j["attention_bias"].get<bool>();
  }
  if (c.model_type == "mistral" && has("sliding_window") &&
      !(j["sliding_window"].is_number_integer() &&
        j["sliding_window"].get<int64_t>() >= c.block_size))
    unsupported("sliding_window",
                "attention is over the whole block: the window must be null or "
                "at least max_position_embeddings");
  auto special = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_number_integer()) return -1;
    const int64_t id = j[key].get<int64_t>();
    return id >= 0 && id < c.vocab_size ? static_cast<int>(id) : -1;
  };
  c.bos_token_id = special("bos_token_id");
  c.eos_token_id = special("eos_token_id");
  c.validate();
  return c;
}

std::vector<float> LlamaConfig::rope_inv_freq() const {
  const int D = head_dim();
  std::vector<float> inv(static_cast<size_t>(D / 2));
  // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in float32.
  for (int i = 0; i < D / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(D);
    inv[static_cast<size_t>(i)] = 1.0f / std::pow(rope_theta, e);
  }
  if (!rope_llama3) return inv;
  // The llama3 scaling: wavelengths above original/low_freq_factor are slowed by `factor`, those
  // below original/high_freq_factor kept, the band between blended linearly in 1/wavelength.
  const Llama3RopeScaling& s = rope_llama3_scaling;
  const float old_ctx = static_cast<float>(s.original_max_position_embeddings);
  const float low_wavelen = old_ctx / s.low_freq_factor;
  const float high_wavelen = old_ctx / s.high_freq_factor;
  for (float& f : inv) {
    const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
    if (wavelen > low_wavelen) {
      f = f / s.factor;
    } else if (!(wavelen < high_wavelen)) {
      const float smooth =
          (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = (1.0f - smooth) * f / s.factor + smooth * f;
    }
  }
  return inv;
}

void LlamaConfig::rope_tables(int T, std::vector<float>& cos, std::vector<float>& sin) const {
  const std::vector<float> inv = rope_inv_freq();
  const size_t H = inv.size();
  cos.resize(static_cast<size_t>(T) * H);
  sin.resize(static_cast<size_t>(T) * H);
  for (int t = 0; t < T; ++t)
    for (size_t i = 0; i < H; ++i) {
      const float angle = static_cast<float>(t) * inv[i];
      cos[static_cast<size_t>(t) * H + i] = std::cos(angle);
      sin[static_cast<size_t>(t) * H + i] = std::sin(angle);
    }
}

std::string LlamaConfig::str() const {
  std::ostringstream os;
  os << "model_type=" << model_type << " n_layer=" << n_layer << " n_head=" << n_head
     << " n_kv_head=" << n_kv_head << " n_embd=" << n_embd
     << " intermediate_size=" << intermediate_size << " block_size=" << block_size
     << " vocab_size=" << vocab_size;
  return os.str();
}

}  // namespace ct
