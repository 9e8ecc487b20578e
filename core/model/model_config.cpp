#include "core/model/model_config.h"

#include "core/error.h"
#include "core/model/llama.h"

namespace ct {

ModelConfig ModelConfig::preset(const std::string& name) {
  for (const std::string& n : GPT2Config::preset_names())
    if (n == name) return {GPT2Config::preset(name)};
  for (const std::string& n : LlamaConfig::preset_names())
    if (n == name) return {LlamaConfig::preset(name)};
  std::string list;
  for (const std::string& n : preset_names()) list += (list.empty() ? "" : ", ") + n;
  fail(ErrorKind::kInvalidArgument, "unknown model preset '" + name + "' (presets: " + list + ")");
}

std::vector<std::string> ModelConfig::preset_names() {
  std::vector<std::string> names = GPT2Config::preset_names();
  for (const std::string& n : LlamaConfig::preset_names()) names.push_back(n);
  return names;
}

ModelConfig ModelConfig::from_hf_json(const nlohmann::json& j) {
  if (!j.is_object()) fail(ErrorKind::kInvalidArgument, "config.json: expected a JSON object");
  const std::string type = j.contains("model_type") && j["model_type"].is_string()
                               ? j["model_type"].get<std::string>()
                               : "gpt2";
  if (type == "gpt2") return {GPT2Config::from_hf_json(j)};
  if (type == "llama" || type == "mistral" || type == "qwen2")
    return {LlamaConfig::from_hf_json(j)};
  fail(ErrorKind::kInvalidArgument, "config.json: model_type \"" + type +
                                        "\" is not supported (crosstrain builds gpt2, llama, "
                                        "mistral and qwen2)");
}

std::unique_ptr<Model> make_model(Device& device, const ModelConfig& config, bool with_grads,
                                  const ModelOptions& options) {
  if (!config.is_llama()) return std::make_unique<GPT2>(device, config.gpt2(), with_grads, options);
  return std::make_unique<Llama>(device, config.llama(), with_grads, options);
}

}  // namespace ct
