#include "core/model/config.h"

#include <sstream>

#include "core/error.h"

namespace ct {

namespace {

struct Preset {
  const char* name;
  GPT2Config config;
};

const Preset kPresets[] = {
    {"tiny", {6, 6, 384, 256, 256, 1e-5f, -1, -1}},
    {"gpt2", {12, 12, 768, 1024, 50257, 1e-5f, 50256, 50256}},
    {"gpt2-medium", {24, 16, 1024, 1024, 50257, 1e-5f, 50256, 50256}},
};

void require_positive(int value, const char* flag) {
  if (value <= 0)
    fail(ErrorKind::kInvalidArgument,
         std::string(flag) + " must be positive, got " + std::to_string(value));
}

}  // namespace

GPT2Config GPT2Config::preset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return p.config;
  std::string list;
  for (const Preset& p : kPresets) list += std::string(list.empty() ? "" : ", ") + p.name;
  fail(ErrorKind::kInvalidArgument, "unknown model preset '" + name + "' (presets: " + list + ")");
}

std::vector<std::string> GPT2Config::preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.push_back(p.name);
  return names;
}

void GPT2Config::validate() const {
  require_positive(n_layer, "--n-layer");
  require_positive(n_head, "--n-head");
  require_positive(n_embd, "--n-embd");
  require_positive(block_size, "--block-size");
  require_positive(vocab_size, "--vocab-size");
  if (n_embd % n_head != 0)
    fail(ErrorKind::kInvalidArgument, "--n-head " + std::to_string(n_head) +
                                          " does not divide --n-embd " + std::to_string(n_embd));
  if (!(layer_norm_epsilon > 0.0f))
    fail(ErrorKind::kInvalidArgument, "layer_norm_epsilon must be positive");
}

int64_t GPT2Config::num_parameters() const {
  const int64_t C = n_embd, L = n_layer;
  int64_t per_layer = 2 * C                // ln_1
                      + C * 3 * C + 3 * C  // attn.c_attn
                      + C * C + C          // attn.c_proj
                      + 2 * C              // ln_2
                      + C * 4 * C + 4 * C  // mlp.c_fc
                      + 4 * C * C + C;     // mlp.c_proj
  return int64_t{vocab_size} * C + int64_t{block_size} * C + L * per_layer + 2 * C;
}

nlohmann::json GPT2Config::to_hf_json() const {
  nlohmann::json j;
  j["model_type"] = "gpt2";
  j["architectures"] = {"GPT2LMHeadModel"};
  j["n_layer"] = n_layer;
  j["n_head"] = n_head;
  j["n_embd"] = n_embd;
  j["n_positions"] = block_size;
  j["n_ctx"] = block_size;
  j["vocab_size"] = vocab_size;
  j["layer_norm_epsilon"] = layer_norm_epsilon;
  j["activation_function"] = "gelu_new";
  j["tie_word_embeddings"] = true;
  // transformers' GPT2Config defaults both to 50256, which a smaller vocabulary does not have.
  j["bos_token_id"] = bos_token_id >= 0 ? nlohmann::json(bos_token_id) : nlohmann::json(nullptr);
  j["eos_token_id"] = eos_token_id >= 0 ? nlohmann::json(eos_token_id) : nlohmann::json(nullptr);
  return j;
}

GPT2Config GPT2Config::from_hf_json(const nlohmann::json& j) {
  if (!j.is_object()) fail(ErrorKind::kInvalidArgument, "config.json: expected a JSON object");
  if (j.contains("model_type") && j["model_type"] != "gpt2")
    fail(ErrorKind::kInvalidArgument,
         "config.json: model_type " + j["model_type"].dump() + " is not \"gpt2\"");
  auto get_int = [&](const char* key) -> int {
    if (!j.contains(key) || !j[key].is_number_integer())
      fail(ErrorKind::kInvalidArgument, std::string("config.json: missing integer '") + key + "'");
    return j[key].get<int>();
  };
  auto unsupported = [&](const char* key, const std::string& why) {
    fail(ErrorKind::kInvalidArgument, std::string("config.json: '") + key + "': " + j[key].dump() +
                                          " is not supported (" + why + ")");
  };
  GPT2Config c;
  c.n_layer = get_int("n_layer");
  c.n_head = get_int("n_head");
  c.n_embd = get_int("n_embd");
  c.block_size = get_int("n_positions");
  c.vocab_size = get_int("vocab_size");
  if (j.contains("layer_norm_epsilon")) {
    if (!j["layer_norm_epsilon"].is_number())
      fail(ErrorKind::kInvalidArgument, "config.json: 'layer_norm_epsilon' is not a number");
    c.layer_norm_epsilon = j["layer_norm_epsilon"].get<float>();
  }
  if (j.contains("activation_function")) {
    const auto& a = j["activation_function"];
    if (!(a == "gelu_new" || a == "gelu_pytorch_tanh" || a == "gelu_fast"))
      unsupported("activation_function", "crosstrain's GPT-2 MLP uses the tanh GELU, gelu_new");
  }
  if (j.contains("n_inner") && !j["n_inner"].is_null() &&
      !(j["n_inner"].is_number_integer() && j["n_inner"].get<int64_t>() == 4 * int64_t{c.n_embd}))
    unsupported("n_inner", "the MLP width is 4 * n_embd");
  if (j.contains("n_ctx") && !j["n_ctx"].is_null() &&
      !(j["n_ctx"].is_number_integer() && j["n_ctx"].get<int64_t>() == c.block_size))
    unsupported("n_ctx", "it must equal n_positions");
  auto require_bool = [&](const char* key, bool want, const char* why) {
    if (j.contains(key) && !(j[key].is_boolean() && j[key].get<bool>() == want))
      unsupported(key, why);
  };
  require_bool("scale_attn_weights", true, "attention scores are scaled by 1/sqrt(head size)");
  require_bool("scale_attn_by_inverse_layer_idx", false, "no per-layer attention scaling");
  require_bool("add_cross_attention", false, "a decoder-only model has no cross-attention");
  require_bool("tie_word_embeddings", true, "the LM head is tied to wte");
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

std::string GPT2Config::dropout_notice(const nlohmann::json& j) {
  std::string set;
  for (const char* key : {"embd_pdrop", "attn_pdrop", "resid_pdrop"}) {
    if (j.contains(key) && j[key].is_number() && j[key].get<double>() > 0.0)
      set += std::string(set.empty() ? "" : ", ") + key + " " + j[key].dump();
  }
  if (set.empty()) return "";
  return "config.json asks for dropout (" + set +
         "): crosstrain trains without dropout, so it is not applied";
}

std::string GPT2Config::str() const {
  std::ostringstream os;
  os << "n_layer=" << n_layer << " n_head=" << n_head << " n_embd=" << n_embd
     << " block_size=" << block_size << " vocab_size=" << vocab_size;
  return os.str();
}

}  // namespace ct
