// A model on disk in the layout Hugging Face's GPT2LMHeadModel / LlamaForCausalLM read and
// write: <dir>/config.json
// and the weights as <dir>/model.safetensors or as shards listed by
// <dir>/model.safetensors.index.json, with the tokenizer files beside them when there are any.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/model/model.h"
#include "core/model/model_config.h"

namespace ct {

// The tokenizer files Hugging Face keeps beside a model, copied along by save_model.
inline const std::vector<std::string>& tokenizer_file_names() {
  static const std::vector<std::string> names = {"tokenizer.json", "vocab.json", "merges.txt",
                                                 "tokenizer_config.json",
                                                 "special_tokens_map.json"};
  return names;
}

// Copies every tokenizer file of `from` into `to` (atomically each); none is an error only
// when `from` has none.
void copy_tokenizer_files(const std::string& from, const std::string& to);

// Writes config.json and model.safetensors (fp32, the model's HF names) into `dir` (created if
// missing), each atomically; then copies every tokenizer file of `tokenizer_dir` (when not empty)
// into `dir`, also atomically.
void save_model(const std::string& dir, const Model& model, const std::string& tokenizer_dir = "");

// The config of the model folder `dir` (ModelConfig::from_hf_json: GPT-2 or the Llama family);
// errors name the file. `notice`, when given, receives GPT2Config::dropout_notice of a GPT-2.
ModelConfig read_model_config(const std::string& dir, std::string* notice = nullptr);

// Reads <dir>/config.json and the weights (load_weights_from_folder) onto `device`, without
// gradients, built with `options` (a 16-bit policy: the products read a 16-bit copy of the
// weights, as transformers' torch_dtype). Errors name the file and what is wrong: missing file, a
// config crosstrain does not build, a tensor missing, of the wrong shape or dtype, or one the
// model does not have.
std::unique_ptr<Model> load_model(const std::string& dir, Device& device,
                                  const ModelOptions& options = {});

// Reads the weights of `model` from the folder `dir`: model.safetensors, else the shards named
// by model.safetensors.index.json (each tensor in the shard the index names). A folder with only
// pytorch_model.bin is refused (safetensors only). See load_weights for the rules per tensor.
void load_weights_from_folder(const std::string& dir, Model& model);

// Reads the weights of `model` from one safetensors file with the model's HF names. Per tensor:
// a "transformer." prefix is accepted; F32, F16 and BF16 are read (16-bit values widened
// exactly); every parameter must be present with the model's shape; for a tied head
// (Model::tied_head_source) a "lm_head.weight" is accepted only when it equals the embedding
// (an untied one is refused); buffers older transformers saved (Model::is_ignored_buffer: GPT-2's
// ".attn.bias", ".attn.masked_bias", Llama's "rotary_emb.inv_freq") are ignored; any other
// tensor is refused by name.
void load_weights(const std::string& weights_path, Model& model);

}  // namespace ct
