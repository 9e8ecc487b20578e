// Which model a run builds: a GPT-2 or a Llama-family config, chosen by preset name or by
// config.json's model_type, and the one place that constructs the model for it.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "core/model/config.h"
#include "core/model/gpt2.h"
#include "core/model/llama_config.h"
#include "core/model/model.h"

namespace ct {

struct ModelConfig {
  std::variant<GPT2Config, LlamaConfig> config;

  bool is_llama() const { return std::holds_alternative<LlamaConfig>(config); }
  const GPT2Config& gpt2() const { return std::get<GPT2Config>(config); }
  const LlamaConfig& llama() const { return std::get<LlamaConfig>(config); }
  GPT2Config& gpt2() { return std::get<GPT2Config>(config); }
  LlamaConfig& llama() { return std::get<LlamaConfig>(config); }

  std::string model_type() const { return is_llama() ? llama().model_type : "gpt2"; }
  int block_size() const { return is_llama() ? llama().block_size : gpt2().block_size; }
  int vocab_size() const { return is_llama() ? llama().vocab_size : gpt2().vocab_size; }
  int64_t num_parameters() const {
    return is_llama() ? llama().num_parameters() : gpt2().num_parameters();
  }
  std::string str() const { return is_llama() ? llama().str() : gpt2().str(); }
  nlohmann::json to_hf_json() const {
    return is_llama() ? llama().to_hf_json() : gpt2().to_hf_json();
  }
  void validate() const {
    if (is_llama())
      llama().validate();
    else
      gpt2().validate();
  }

  // GPT-2's presets (tiny, gpt2, gpt2-medium) and the Llama family's (llama-tiny,
  // smollm-135m); Error(kInvalidArgument) listing them all for any other name.
  static ModelConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
  // By model_type: "gpt2" (or absent) through GPT2Config::from_hf_json, llama / mistral / qwen2
  // through LlamaConfig::from_hf_json; any other type is refused by name.
  static ModelConfig from_hf_json(const nlohmann::json& j);
};

// The model for `config` on `device` (an empty lora.target_modules takes the family's
// default).
std::unique_ptr<Model> make_model(Device& device, const ModelConfig& config, bool with_grads,
                                  const ModelOptions& options = {});

}  // namespace ct
