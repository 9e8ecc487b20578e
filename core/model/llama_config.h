// Llama-family hyper-parameters (Llama, Mistral, Qwen2, SmolLM): named presets, validation,
// parameter count, the Hugging Face config.json form (model_type "llama", "mistral", "qwen2"),
// and the rotary-embedding tables (rope_theta, the "llama3" frequency scaling) computed as
// transformers computes them, so a checkpoint evaluates the same in both.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ct {

// rope_scaling {"rope_type": "llama3", ...} (Llama 3.1/3.2): low frequencies divided by factor,
// high ones kept, a smooth blend between.
struct Llama3RopeScaling {
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
  bool operator==(const Llama3RopeScaling&) const = default;
};

struct LlamaConfig {
  std::string model_type = "llama";  // written back to config.json: llama, mistral or qwen2
  int n_layer = 30;                  // num_hidden_layers
  int n_head = 9;                    // num_attention_heads
  int n_kv_head = 3;                 // num_key_value_heads (grouped-query attention)
  int n_embd = 576;                  // hidden_size
  int intermediate_size = 1536;      // the SwiGLU MLP's width
  int block_size = 2048;             // max_position_embeddings (max sequence length)
  int vocab_size = 49152;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  bool rope_llama3 = false;  // rope_scaling of type llama3 (rope_llama3_scaling), else none
  Llama3RopeScaling rope_llama3_scaling;
  bool tie_word_embeddings = true;  // lm_head is embed_tokens (no lm_head.weight)
  bool attention_bias = false;      // q/k/v projections with biases (Qwen2: always)
  int bos_token_id = -1;            // -1: none (null in config.json)
  int eos_token_id = -1;

  // "llama-tiny" (the size of GPT-2's tiny: 6 layers, width 384, 6 heads with 2 KV heads,
  // MLP 1024, block 256, vocabulary 256) and "smollm-135m" (SmolLM-135M's shape). Throws
  // Error(kInvalidArgument) listing the presets for any other name.
  static LlamaConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();

  // Throws Error(kInvalidArgument) naming the field: heads that do not divide the width, KV heads
  // that do not divide the heads, an odd head size, a non-positive size or epsilon.
  void validate() const;

  int head_dim() const { return n_embd / n_head; }
  // Width of the fused q|k|v projection: (n_head + 2 n_kv_head) * head_dim.
  int64_t qkv_width() const { return int64_t{n_head + 2 * n_kv_head} * head_dim(); }
  int64_t num_parameters() const;

  // Hugging Face LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM config.json.
  nlohmann::json to_hf_json() const;
  // Reads the sizes, rms_norm_eps, rope_theta, rope_scaling, tie_word_embeddings, attention_bias
  // and bos/eos ids (kept only when inside the vocabulary); validates the result. Refuses, naming
  // the key, every option that would make a different model than crosstrain computes:
  // model_type other than llama/mistral/qwen2, hidden_act other than silu, head_dim other than
  // hidden_size / num_attention_heads, mlp_bias true, a rope_scaling other than null or llama3,
  // pretraining_tp other than 1, a sliding window shorter than max_position_embeddings
  // (Mistral's sliding_window, Qwen2's use_sliding_window), attention_bias false for qwen2.
  static LlamaConfig from_hf_json(const nlohmann::json& j);

  // The per-pair inverse frequencies [head_dim / 2], in float32 as transformers computes them:
  // 1 / rope_theta^(2i / head_dim), then the llama3 scaling if configured.
  std::vector<float> rope_inv_freq() const;
  // cos and sin tables [T, head_dim / 2] for positions 0..T-1 (angle = float(t) * inv_freq[i] in
  // float32, as transformers' rotary embedding): what Device::rope_forward takes.
  void rope_tables(int T, std::vector<float>& cos, std::vector<float>& sin) const;

  bool operator==(const LlamaConfig&) const = default;
  std::string str() const;
};

}  // namespace ct
