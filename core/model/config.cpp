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
    {"tiny", {6, 6, 384, 256, 256, 1e-5f}},
    {"gpt2", {12, 12, 768, 1024, 50257, 1e-5f}},
    {"gpt2-medium", {24, 16, 1024, 1024, 50257, 1e-5f}},
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
  c.validate();
  return c;
}

std::string GPT2Config::str() const {
  std::ostringstream os;
  os << "n_layer=" << n_layer << " n_head=" << n_head << " n_embd=" << n_embd
     << " block_size=" << block_size << " vocab_size=" << vocab_size;
  return os.str();
}

}  // namespace ct
