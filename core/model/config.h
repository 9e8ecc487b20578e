// GPT-2 hyper-parameters: named presets, validation, parameter count, and the Hugging Face
// config.json form (model_type "gpt2") so checkpoints load in `transformers` unchanged.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ct {

struct GPT2Config {
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;
  int block_size = 1024;  // max sequence length (HF n_positions)
  int vocab_size = 50257;
  float layer_norm_epsilon = 1e-5f;
  // Special token ids written to config.json (-1: none, written as null). A byte-level model has
  // no end-of-text token; a model with GPT-2's BPE vocabulary uses <|endoftext|> for both.
  int bos_token_id = -1;
  int eos_token_id = -1;

  // "tiny" (6/6/384, block 256, vocab 256), "gpt2" (124M), "gpt2-medium" (350M).
  // Throws Error(kInvalidArgument) listing the presets for any other name.
  static GPT2Config preset(const std::string& name);
  static std::vector<std::string> preset_names();

  // Throws Error(kInvalidArgument) naming the offending flag, e.g.
  // "--n-head 5 does not divide --n-embd 384".
  void validate() const;

  // Number of scalars in the model (the LM head is tied to wte and not counted twice).
  int64_t num_parameters() const;

  // Hugging Face GPT2LMHeadModel config.json.
  nlohmann::json to_hf_json() const;
  // Reads n_layer, n_head, n_embd, n_positions, vocab_size, layer_norm_epsilon and the bos/eos
  // ids (kept only when inside the vocabulary); validates the result. Refuses, naming the key,
  // every option that would make a different model than crosstrain computes: a model_type other
  // than "gpt2", an activation_function other than the tanh GELU (gelu_new, gelu_pytorch_tanh,
  // gelu_fast), n_inner other than null or 4 * n_embd, scale_attn_weights false,
  // scale_attn_by_inverse_layer_idx or add_cross_attention true, tie_word_embeddings false, and
  // n_ctx other than n_positions. Dropout rates are not refused (see dropout_notice).
  static GPT2Config from_hf_json(const nlohmann::json& j);
  // "" when config.json asks for no dropout, else a one-line notice naming the *_pdrop keys that
  // are set: crosstrain trains without dropout, and says so rather than ignoring them silently.
  static std::string dropout_notice(const nlohmann::json& j);

  bool operator==(const GPT2Config&) const = default;
  std::string str() const;  // "n_layer=6 n_head=6 n_embd=384 block_size=256 vocab_size=256"
};

}  // namespace ct
